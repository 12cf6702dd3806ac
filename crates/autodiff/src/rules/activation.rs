//! Activation family: `Relu`, `Sigmoid`, `Tanh`, `Exp`, `Log`, `Sqrt`, `Erf`, `Gelu`. Where the
//! derivative is a function of the output (`Tanh`, `Sigmoid`, `Exp`, `Sqrt`), the forward
//! output is reused rather than recomputed.

use std::collections::HashMap;

use ringtune_onnx_ir::Value;

use super::{Rule, RuleCtx};
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Relu", relu);
    rules.insert("Sigmoid", sigmoid);
    rules.insert("Tanh", tanh);
    rules.insert("Exp", exp);
    rules.insert("Log", log);
    rules.insert("Sqrt", sqrt);
    rules.insert("Erf", erf);
    rules.insert("Gelu", gelu);
}

fn relu(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    let zero = ctx.scalar_like(&dy, 0.0)?;
    let positive = ctx.graph.greater(&y, &zero)?;
    Ok(vec![Some(ctx.graph.where_(&positive, &dy, &zero)?)])
}

fn sigmoid(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    let one = ctx.scalar_like(&y, 1.0)?;
    let rest = ctx.graph.sub(&one, &y)?;
    let d = ctx.graph.mul(&y, &rest)?;
    Ok(vec![Some(ctx.graph.mul(&dy, &d)?)])
}

/// `dx = dy * (1 - y^2)`.
fn tanh(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    let y2 = ctx.graph.mul(&y, &y)?;
    let one = ctx.scalar_like(&y, 1.0)?;
    let d = ctx.graph.sub(&one, &y2)?;
    Ok(vec![Some(ctx.graph.mul(&dy, &d)?)])
}

fn exp(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    Ok(vec![Some(ctx.graph.mul(&dy, &y)?)])
}

fn log(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, x) = (ctx.dy(0)?, ctx.input(0));
    Ok(vec![Some(ctx.graph.div(&dy, &x)?)])
}

/// `dx = dy / (2 y)`.
fn sqrt(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    let half = ctx.graph.scale(&dy, 0.5)?;
    Ok(vec![Some(ctx.graph.div(&half, &y)?)])
}

/// `dx = dy * 2/sqrt(pi) * exp(-x^2)`.
fn erf(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, x) = (ctx.dy(0)?, ctx.input(0));
    let x2 = ctx.graph.mul(&x, &x)?;
    let neg = ctx.graph.neg(&x2)?;
    let e = ctx.graph.exp(&neg)?;
    let d = ctx.graph.scale(&e, 2.0 / std::f64::consts::PI.sqrt())?;
    Ok(vec![Some(ctx.graph.mul(&dy, &d)?)])
}

/// Exact GELU: `dx = dy * (Phi(x) + x * phi(x))`, written as
/// `dy * 0.5 * (1 + erf(x/sqrt2) + x * 2*phi(x))` with `2*phi(x) = exp(ln(2/sqrt(2pi)) - x^2/2)`,
/// which keeps the chain at ten elementwise nodes.
fn gelu(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    if ctx.node.string("approximate").is_some_and(|a| a != "none") {
        return Err(ctx.unsupported("only the exact (erf) GELU is supported"));
    }
    let (dy, x) = (ctx.dy(0)?, ctx.input(0));
    let t = ctx.graph.scale(&x, std::f64::consts::FRAC_1_SQRT_2)?;
    let erf_t = ctx.graph.erf(&t)?;
    let half_x2 = ctx.graph.mul(&t, &t)?;
    let log_two_over_sqrt_two_pi = (2.0 / (2.0 * std::f64::consts::PI).sqrt()).ln();
    let c = ctx.scalar_like(&x, log_two_over_sqrt_two_pi)?;
    let exponent = ctx.graph.sub(&c, &half_x2)?;
    let two_phi = ctx.graph.exp(&exponent)?;
    let x_two_phi = ctx.graph.mul(&x, &two_phi)?;
    let sum = ctx.graph.add(&erf_t, &x_two_phi)?;
    let one = ctx.scalar_like(&x, 1.0)?;
    let sum = ctx.graph.add(&sum, &one)?;
    let g = ctx.graph.mul(&dy, &sum)?;
    Ok(vec![Some(ctx.graph.scale(&g, 0.5)?)])
}
