//! Indexing: `Gather`, `GatherElements`, `ScatterND`, `ScatterElements`, `OneHot`, `NonZero`.

use std::collections::HashMap;

use super::{norm_axis, InferCtx, Inferred, Rule};
use crate::{Attribute, DType, Dim, Graph, IrError, NodeSpec, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Gather", gather);
    rules.insert("GatherElements", gather_elements);
    rules.insert("ScatterND", scatter);
    rules.insert("ScatterElements", scatter);
    rules.insert("OneHot", one_hot);
    rules.insert("NonZero", non_zero);
}

/// `NonZero(x)`: the indices of `x`'s nonzero elements, `[rank, found]` int64 (one column each).
fn non_zero(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let rank = ctx.ranked(0)?.len();
    Ok(Inferred::one(ValueType::new(DType::I64, vec![Dim::Known(rank as i64), Dim::Unknown])))
}

fn gather(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    if ctx.dtype(1)?.is_float() {
        return Err("indices must be integers".into());
    }
    let (Some(data), Some(indices)) = (ctx.shape(0)?, ctx.shape(1)?) else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    let axis = norm_axis(ctx.int("axis", 0), data.len())?;
    let mut out = data[..axis].to_vec();
    out.extend(indices.iter().cloned());
    out.extend(data[axis + 1..].iter().cloned());
    let mut inferred = Inferred::one(ValueType::new(dtype, out));
    if let (Some(values), Some(idx), 1) = (ctx.sym(0)?, ctx.const_ints(1)?, data.len()) {
        let n = values.len() as i64;
        inferred.sym_value =
            idx.iter().map(|&i| values.get((if i < 0 { i + n } else { i }) as usize).cloned()).collect();
    }
    Ok(inferred)
}

/// `GatherElements(data, indices)`: `data`'s element type, `indices`' shape.
fn gather_elements(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    if ctx.dtype(1)?.is_float() {
        return Err("indices must be integers".into());
    }
    Ok(Inferred::one(match ctx.shape(1)? {
        Some(indices) => ValueType::new(dtype, indices.clone()),
        None => ValueType::unranked(dtype),
    }))
}

fn scatter(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    if ctx.dtype(2)? != ctx.dtype(0)? {
        return Err("updates and data differ in element type".into());
    }
    Ok(Inferred::one(ctx.ty(0)?.clone()))
}

fn one_hot(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(2)?;
    let depth = ctx.sym(1)?.and_then(|v| v.first().cloned()).unwrap_or(Dim::Unknown);
    let shape = ctx.shape(0)?.map(|indices| {
        let rank = indices.len() + 1;
        let axis = norm_axis(ctx.int("axis", -1), rank).unwrap_or(rank - 1);
        let mut out = indices.clone();
        out.insert(axis, depth);
        out
    });
    Ok(Inferred::one(ValueType { dtype, shape }))
}

impl Graph {
    /// `Gather(data, indices, axis)`.
    pub fn gather(&mut self, data: &Value, indices: &Value, axis: i64) -> Result<Value, IrError> {
        self.op1("Gather", &[data, indices], vec![("axis", Attribute::Int(axis))])
    }

    /// `GatherElements(data, indices, axis)`: `out[.., i, ..] = data[.., indices[.., i, ..], ..]`
    /// along `axis`, every other index as `indices`' own.
    pub fn gather_elements(&mut self, data: &Value, indices: &Value, axis: i64) -> Result<Value, IrError> {
        self.op1("GatherElements", &[data, indices], vec![("axis", Attribute::Int(axis))])
    }

    /// `ScatterND(data, indices, updates)` with `reduction` (`none` or `add`).
    pub fn scatter_nd(
        &mut self,
        data: &Value,
        indices: &Value,
        updates: &Value,
        reduction: &str,
    ) -> Result<Value, IrError> {
        self.op1("ScatterND", &[data, indices, updates], vec![("reduction", Attribute::Str(reduction.into()))])
    }

    /// `ScatterElements(data, indices, updates, axis)` with `reduction`.
    pub fn scatter_elements(
        &mut self,
        data: &Value,
        indices: &Value,
        updates: &Value,
        axis: i64,
        reduction: &str,
    ) -> Result<Value, IrError> {
        self.op1(
            "ScatterElements",
            &[data, indices, updates],
            vec![("axis", Attribute::Int(axis)), ("reduction", Attribute::Str(reduction.into()))],
        )
    }

    /// `NonZero(x)`: `[rank, found]` indices of the nonzero elements, in row-major order.
    pub fn non_zero(&mut self, x: &Value) -> Result<Value, IrError> {
        self.op1("NonZero", &[x], vec![])
    }

    /// `OneHot(indices, depth, [off, on])` on the last axis.
    pub fn one_hot(&mut self, indices: &Value, depth: &Value, values: &Value) -> Result<Value, IrError> {
        let outs = self.node(NodeSpec {
            op_type: "OneHot",
            domain: "",
            inputs: vec![Some(indices), Some(depth), Some(values)],
            attributes: vec![("axis", Attribute::Int(-1))],
            outputs: 1,
        })?;
        outs.into_iter().next().ok_or_else(|| IrError::Invalid("OneHot made no output".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape;

    #[test]
    fn gather_shapes() {
        let mut g = Graph::new("t");
        let table = g.input("table", DType::F32, shape(&[1000, 32])).expect("t");
        let ids = g.input("ids", DType::I64, shape(&["batch", "seq"])).expect("ids");
        let emb = g.gather(&table, &ids, 0).expect("gather");
        assert_eq!(g.shape(&emb).expect("s"), &shape(&[Dim::sym("batch"), Dim::sym("seq"), Dim::Known(32)]));
        assert!(g.gather(&ids, &table, 0).is_err(), "float indices are refused");
    }

    #[test]
    fn non_zero_lists_one_column_of_indices_per_element_found() {
        let mut g = Graph::new("t");
        let mask = g.input("mask", DType::I64, shape(&["batch", "seq"])).expect("mask");
        let found = g.non_zero(&mask).expect("non_zero");
        assert_eq!(g.shape(&found).expect("s"), &vec![Dim::Known(2), Dim::Unknown]);
        assert_eq!(g.dtype(&found).expect("dtype"), DType::I64);
    }
}
