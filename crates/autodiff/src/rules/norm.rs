//! Normalisation family: `LayerNormalization` (reusing its forward mean and inverse standard
//! deviation), `Softmax` and `LogSoftmax` (reusing their forward output).

use std::collections::HashMap;

use ringtune_onnx_ir::Value;

use super::{Rule, RuleCtx};
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("LayerNormalization", layer_norm);
    rules.insert("Softmax", softmax);
    rules.insert("LogSoftmax", log_softmax);
}

fn axis(ctx: &RuleCtx<'_>, rank: usize) -> Result<usize, AutodiffError> {
    let a = ctx.node.int("axis").unwrap_or(-1);
    let a = if a < 0 { a + rank as i64 } else { a };
    usize::try_from(a).ok().filter(|&a| a < rank).ok_or_else(|| ctx.unsupported("axis out of range"))
}

/// With `xhat = (x - mean) * inv_std` and `g = dy * scale` over the normalised axes:
/// `dx = inv_std * (g - mean(g) - xhat * mean(g * xhat))`, `dscale = sum(dy * xhat)`,
/// `dbias = sum(dy)`, the sums over the leading axes.
fn layer_norm(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    let (x, scale, dy) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let stat = |i: usize| ctx.node.outputs.get(i).filter(|s| !s.is_empty()).map(|s| Value::named(s.as_str()));
    let (Some(mean), Some(inv_std)) = (stat(1), stat(2)) else {
        return Err(ctx.unsupported("the forward node must output Mean and InvStdDev"));
    };
    let rank = ctx.shape(&x)?.len();
    let axis = axis(ctx, rank)?;
    let normalised: Vec<i64> = (axis as i64..rank as i64).collect();
    let leading: Vec<i64> = (0..axis as i64).collect();
    let (need_x, need_scale, need_bias) = (ctx.need(0), ctx.need(1), ctx.need(2));
    let g = &mut *ctx.graph;
    let centred = g.sub(&x, &mean)?;
    let xhat = g.mul(&centred, &inv_std)?;
    let dscale = if need_scale {
        let p = g.mul(&dy, &xhat)?;
        Some(g.reduce_sum(&p, &leading, false)?)
    } else {
        None
    };
    let dbias = if need_bias { Some(g.reduce_sum(&dy, &leading, false)?) } else { None };
    let dx = if need_x {
        let gs = g.mul(&dy, &scale)?;
        let m1 = g.reduce_mean(&gs, &normalised, true)?;
        let gx = g.mul(&gs, &xhat)?;
        let m2 = g.reduce_mean(&gx, &normalised, true)?;
        let t = g.mul(&xhat, &m2)?;
        let d = g.sub(&gs, &m1)?;
        let d = g.sub(&d, &t)?;
        Some(g.mul(&d, &inv_std)?)
    } else {
        None
    };
    Ok(vec![dx, dscale, dbias])
}

/// `dx = y * (dy - sum(dy * y))` over the softmax axis.
fn softmax(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (y, dy) = (ctx.output(0), ctx.dy(0)?);
    let a = axis(ctx, ctx.shape(&y)?.len())? as i64;
    let p = ctx.graph.mul(&dy, &y)?;
    let s = ctx.graph.reduce_sum(&p, &[a], true)?;
    let d = ctx.graph.sub(&dy, &s)?;
    Ok(vec![Some(ctx.graph.mul(&y, &d)?)])
}

/// `dx = dy - exp(y) * sum(dy)` over the axis.
fn log_softmax(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (y, dy) = (ctx.output(0), ctx.dy(0)?);
    let a = axis(ctx, ctx.shape(&y)?.len())? as i64;
    let s = ctx.graph.reduce_sum(&dy, &[a], true)?;
    let p = ctx.graph.exp(&y)?;
    let t = ctx.graph.mul(&p, &s)?;
    Ok(vec![Some(ctx.graph.sub(&dy, &t)?)])
}
