//! Matrix-product family: `MatMul` (2-D, batched, and batched-by-2-D) and `Gemm` (all
//! transpose combinations, `alpha`, `beta`, broadcast bias). Products of 2-D operands are
//! written as `Gemm` with transpose flags, never as an explicit `Transpose` before a `MatMul`.

use std::collections::HashMap;

use ringtune_onnx_ir::{Graph, Value};

use super::{Rule, RuleCtx};
use crate::broadcast::reduce_to;
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("MatMul", matmul);
    rules.insert("Gemm", gemm);
}

/// Swaps the last two axes.
fn swap_last(graph: &mut Graph, x: &Value, rank: usize) -> Result<Value, AutodiffError> {
    let mut perm: Vec<i64> = (0..rank as i64).collect();
    perm.swap(rank - 2, rank - 1);
    Ok(graph.transpose(x, &perm)?)
}

fn matmul(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (a, b, g) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let (ra, rb) = (ctx.shape(&a)?.len(), ctx.shape(&b)?.len());
    if ra < 2 || rb < 2 {
        return Err(ctx.unsupported("rank-1 operands are not supported"));
    }
    let (need_a, need_b) = (ctx.need(0), ctx.need(1));
    let graph = &mut *ctx.graph;
    let (da, db) = match (ra, rb) {
        (2, 2) => (
            need_a.then(|| graph.gemm(&g, &b, None, false, true)).transpose()?,
            need_b.then(|| graph.gemm(&a, &g, None, true, false)).transpose()?,
        ),
        (_, 2) => {
            // A [..., M, K] @ B [K, N]: dB sums over every leading axis, as one Gemm.
            let da = if need_a {
                let bt = graph.transpose(&b, &[1, 0])?;
                Some(graph.matmul(&g, &bt)?)
            } else {
                None
            };
            let db = if need_b {
                let k = graph.shape(&b)?[0].known().ok_or_else(|| ctx_unknown(&b))?;
                let n = graph.shape(&b)?[1].known().ok_or_else(|| ctx_unknown(&b))?;
                let a2 = graph.reshape(&a, &[-1, k])?;
                let g2 = graph.reshape(&g, &[-1, n])?;
                Some(graph.gemm(&a2, &g2, None, true, false)?)
            } else {
                None
            };
            (da, db)
        }
        _ => {
            let da = if need_a {
                let bt = swap_last(graph, &b, rb)?;
                let product = graph.matmul(&g, &bt)?;
                let shape = graph.shape(&product)?.clone();
                Some(reduce_to(graph, &product, &shape, &a)?)
            } else {
                None
            };
            let db = if need_b {
                let at = swap_last(graph, &a, ra)?;
                let product = graph.matmul(&at, &g)?;
                let shape = graph.shape(&product)?.clone();
                Some(reduce_to(graph, &product, &shape, &b)?)
            } else {
                None
            };
            (da, db)
        }
    };
    Ok(vec![da, db])
}

fn ctx_unknown(v: &Value) -> AutodiffError {
    AutodiffError::Graph(ringtune_onnx_ir::IrError::Invalid(format!("`{}` needs fixed dimensions", v.name())))
}

/// `Y = alpha * op(A) @ op(B) + beta * C`.
fn gemm(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (a, b, g) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let trans_a = ctx.node.int("transA").unwrap_or(0) != 0;
    let trans_b = ctx.node.int("transB").unwrap_or(0) != 0;
    let alpha = ctx.node.float("alpha").unwrap_or(1.0) as f64;
    let beta = ctx.node.float("beta").unwrap_or(1.0) as f64;
    let g = if alpha != 1.0 { ctx.graph.scale(&g, alpha)? } else { g };
    let graph = &mut *ctx.graph;
    let da = if ctx.needs.first() == Some(&true) {
        Some(match (trans_a, trans_b) {
            (false, false) => graph.gemm(&g, &b, None, false, true)?,
            (false, true) => graph.gemm(&g, &b, None, false, false)?,
            (true, false) => graph.gemm(&b, &g, None, false, true)?,
            (true, true) => graph.gemm(&b, &g, None, true, true)?,
        })
    } else {
        None
    };
    let db = if ctx.needs.get(1) == Some(&true) {
        Some(match (trans_a, trans_b) {
            (false, false) => graph.gemm(&a, &g, None, true, false)?,
            (false, true) => graph.gemm(&g, &a, None, true, false)?,
            (true, false) => graph.gemm(&a, &g, None, false, false)?,
            (true, true) => graph.gemm(&g, &a, None, true, true)?,
        })
    } else {
        None
    };
    let dc = if ctx.need(2) {
        let dy = ctx.dy(0)?;
        let scaled = if beta != 1.0 { ctx.graph.scale(&dy, beta)? } else { dy };
        let out = ctx.shape(&ctx.output(0))?;
        let c = ctx.input(2);
        Some(reduce_to(ctx.graph, &scaled, &out, &c)?)
    } else {
        None
    };
    Ok(vec![da, db, dc])
}
