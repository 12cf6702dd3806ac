//! Matrix products: `MatMul` (batched, numpy rules), `Gemm` (2-D with transposes),
//! `com.microsoft.FusedMatMul` (batched with transposes and a scale).

use std::collections::HashMap;

use super::{elementwise::broadcast_shapes, InferCtx, Inferred, Rule};
use crate::{Attribute, Dim, Graph, IrError, NodeSpec, Shape, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("MatMul", matmul);
    rules.insert("Gemm", gemm);
    rules.insert("com.microsoft.FusedMatMul", fused_matmul);
}

fn matmul(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    batched(ctx, false, false)
}

fn fused_matmul(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    batched(ctx, ctx.int("transA", 0) != 0, ctx.int("transB", 0) != 0)
}

fn batched(ctx: &InferCtx<'_>, trans_a: bool, trans_b: bool) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    if ctx.dtype(1)? != dtype {
        return Err(format!("element types differ: {dtype} and {}", ctx.dtype(1)?));
    }
    let (Some(a), Some(b)) = (ctx.shape(0)?, ctx.shape(1)?) else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    Ok(Inferred::one(ValueType::new(dtype, matmul_shape(a, b, trans_a, trans_b)?)))
}

/// The result shape of a batched matrix product, numpy rules, with optional transposes of the
/// last two axes.
pub fn matmul_shape(a: &Shape, b: &Shape, trans_a: bool, trans_b: bool) -> Result<Shape, String> {
    if a.is_empty() || b.is_empty() {
        return Err("MatMul inputs must have rank 1 or more".into());
    }
    let mut a = a.clone();
    let mut b = b.clone();
    let a_vec = a.len() == 1;
    let b_vec = b.len() == 1;
    if a_vec {
        a.insert(0, Dim::Known(1));
    }
    if b_vec {
        b.push(Dim::Known(1));
    }
    let (ar, br) = (a.len(), b.len());
    if trans_a {
        a.swap(ar - 2, ar - 1);
    }
    if trans_b {
        b.swap(br - 2, br - 1);
    }
    check_inner(&a[ar - 1], &b[br - 2])?;
    let batch = broadcast_shapes(&a[..ar - 2].to_vec(), &b[..br - 2].to_vec())?;
    let mut out = batch;
    if !a_vec {
        out.push(a[ar - 2].clone());
    }
    if !b_vec {
        out.push(b[br - 1].clone());
    }
    Ok(out)
}

fn check_inner(k_a: &Dim, k_b: &Dim) -> Result<(), String> {
    match (k_a, k_b) {
        (Dim::Known(x), Dim::Known(y)) if x != y => Err(format!("inner dimensions differ: {x} and {y}")),
        (Dim::Sym(x), Dim::Sym(y)) if x != y => Err(format!("inner dimensions differ: {x} and {y}")),
        _ => Ok(()),
    }
}

fn gemm(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let (a, b) = (ctx.ranked(0)?, ctx.ranked(1)?);
    if a.len() != 2 || b.len() != 2 {
        return Err(format!("Gemm takes 2-D inputs, got ranks {} and {}", a.len(), b.len()));
    }
    let (m, k_a) = if ctx.int("transA", 0) != 0 { (&a[1], &a[0]) } else { (&a[0], &a[1]) };
    let (k_b, n) = if ctx.int("transB", 0) != 0 { (&b[1], &b[0]) } else { (&b[0], &b[1]) };
    check_inner(k_a, k_b)?;
    let out = vec![m.clone(), n.clone()];
    if ctx.has_input(2) {
        if let Some(c) = ctx.shape(2)? {
            broadcast_shapes(&out, c).map_err(|e| format!("bias C: {e}"))?;
        }
    }
    Ok(Inferred::one(ValueType::new(dtype, out)))
}

impl Graph {
    /// `MatMul(a, b)`.
    pub fn matmul(&mut self, a: &Value, b: &Value) -> Result<Value, IrError> {
        self.op1("MatMul", &[a, b], vec![])
    }

    /// `Gemm(a, b, c)`: `op(a) @ op(b) + c`, `op` transposing when asked.
    pub fn gemm(
        &mut self,
        a: &Value,
        b: &Value,
        c: Option<&Value>,
        trans_a: bool,
        trans_b: bool,
    ) -> Result<Value, IrError> {
        let mut attributes = Vec::new();
        if trans_a {
            attributes.push(("transA", Attribute::Int(1)));
        }
        if trans_b {
            attributes.push(("transB", Attribute::Int(1)));
        }
        let outs = self.node(NodeSpec {
            op_type: "Gemm",
            domain: "",
            inputs: vec![Some(a), Some(b), c],
            attributes,
            outputs: 1,
        })?;
        outs.into_iter().next().ok_or_else(|| IrError::Invalid("Gemm made no output".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shape, DType};

    #[test]
    fn batched_shapes() {
        let a = shape(&[Dim::sym("b"), Dim::Known(12), Dim::sym("s"), Dim::Known(32)]);
        let b = shape(&[Dim::sym("b"), Dim::Known(12), Dim::Known(32), Dim::sym("s")]);
        let out = matmul_shape(&a, &b, false, false).expect("ok");
        assert_eq!(out, shape(&[Dim::sym("b"), Dim::Known(12), Dim::sym("s"), Dim::sym("s")]));
        let w = shape(&[32, 8]);
        assert_eq!(matmul_shape(&a, &w, false, false).expect("ok")[3], Dim::Known(8));
        assert!(matmul_shape(&w, &w, false, false).is_err());
        assert_eq!(matmul_shape(&w, &w, true, false).expect("ok"), shape(&[8, 8]));
        assert_eq!(matmul_shape(&shape(&[4]), &shape(&[4, 3]), false, false).expect("ok"), shape(&[3]));
    }

    #[test]
    fn gemm_with_transposes() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[Dim::sym("n"), Dim::Known(16)])).expect("x");
        let w = g.input("w", DType::F32, shape(&[8, 16])).expect("w");
        let b = g.input("b", DType::F32, shape(&[8])).expect("b");
        let y = g.gemm(&x, &w, Some(&b), false, true).expect("gemm");
        assert_eq!(g.shape(&y).expect("shape"), &shape(&[Dim::sym("n"), Dim::Known(8)]));
        let dw = g.gemm(&y, &x, None, true, false).expect("gemm");
        assert_eq!(g.shape(&dw).expect("shape"), &shape(&[8, 16]));
        // No bias: two inputs, not an empty third (which graph rewriters take for a value).
        let inputs = |value: &Value| g.producer(value.name()).map(|n| n.inputs.clone()).expect("a node");
        assert_eq!(inputs(&dw), vec![y.name().to_string(), "x".to_string()]);
        assert_eq!(inputs(&y).len(), 3);
        assert!(g.gemm(&x, &w, None, false, false).is_err());
    }
}
