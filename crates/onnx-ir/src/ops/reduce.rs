//! Reductions: `ReduceSum`, `ReduceMean`, `ReduceMax`, `ReduceMin` (axes as an input, opset 18), and
//! `CumSum`.

use std::collections::HashMap;

use super::{norm_axis, InferCtx, Inferred, Rule};
use crate::{Attribute, Dim, Graph, IrError, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    for op in ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"] {
        rules.insert(op, reduce);
    }
    rules.insert("CumSum", cumsum);
}

fn cumsum(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    if let Some(s) = ctx.shape(0)? {
        let axis = ctx.const_ints(1)?.and_then(|a| a.first().copied()).ok_or("CumSum needs a constant axis")?;
        norm_axis(axis, s.len())?;
    }
    Ok(Inferred::one(ctx.ty(0)?.clone()))
}

fn reduce(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let Some(input) = ctx.shape(0)? else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    let axes: Vec<usize> = if ctx.has_input(1) {
        let axes = ctx.const_ints(1)?.ok_or("reductions need constant axes")?;
        axes.iter().map(|&a| norm_axis(a, input.len())).collect::<Result<_, _>>()?
    } else {
        Vec::new()
    };
    let all = axes.is_empty() && ctx.int("noop_with_empty_axes", 0) == 0;
    let keep = ctx.int("keepdims", 1) != 0;
    let out = input
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (all || axes.contains(&i), keep) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(Dim::Known(1)),
            (true, false) => None,
        })
        .collect();
    Ok(Inferred::one(ValueType::new(dtype, out)))
}

impl Graph {
    /// `ReduceSum(x, axes, keepdims)`.
    pub fn reduce_sum(&mut self, x: &Value, axes: &[i64], keepdims: bool) -> Result<Value, IrError> {
        self.reduce("ReduceSum", x, axes, keepdims)
    }

    /// `ReduceMean(x, axes, keepdims)`.
    pub fn reduce_mean(&mut self, x: &Value, axes: &[i64], keepdims: bool) -> Result<Value, IrError> {
        self.reduce("ReduceMean", x, axes, keepdims)
    }

    /// `CumSum(x, axis)` (inclusive, forward).
    pub fn cumsum(&mut self, x: &Value, axis: i64) -> Result<Value, IrError> {
        let a = self.constant(crate::Tensor::scalar_i64(axis))?;
        self.op1("CumSum", &[x, &a], vec![])
    }

    fn reduce(&mut self, op: &str, x: &Value, axes: &[i64], keepdims: bool) -> Result<Value, IrError> {
        let a = self.const_i64(axes)?;
        self.op1(op, &[x, &a], vec![("keepdims", Attribute::Int(keepdims as i64))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shape, DType};

    #[test]
    fn reduce_shapes() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&["b", "s", "h"])).expect("x");
        let r = g.reduce_sum(&x, &[0, 1], false).expect("sum");
        assert_eq!(g.shape(&r).expect("s"), &shape(&["h"]));
        let m = g.reduce_mean(&x, &[-1], true).expect("mean");
        assert_eq!(g.shape(&m).expect("s")[2], Dim::Known(1));
    }
}
