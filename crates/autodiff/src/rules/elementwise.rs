//! Elementwise family: `Add`, `Sub`, `Mul`, `Div`, `Pow`, `Neg`, `Reciprocal`, `Identity`,
//! `Sum`, `Where`, `Cast`, `Dropout`. Gradients of broadcast inputs are summed back to their shape.

use std::collections::HashMap;

use ringtune_onnx_ir::Value;

use super::{Rule, RuleCtx};
use crate::broadcast::reduce_to;
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Add", add);
    rules.insert("Sum", add);
    rules.insert("Sub", sub);
    rules.insert("Mul", mul);
    rules.insert("Div", div);
    rules.insert("Pow", pow);
    rules.insert("Neg", neg);
    rules.insert("Reciprocal", reciprocal);
    rules.insert("Identity", identity);
    rules.insert("Where", where_rule);
    rules.insert("Cast", cast);
    rules.insert("Dropout", dropout);
}

/// `grad` summed to input `i`'s shape.
fn to_input(ctx: &mut RuleCtx<'_>, grad: &Value, i: usize) -> Result<Value, AutodiffError> {
    let out = ctx.shape(&ctx.output(0))?;
    let input = ctx.input(i);
    reduce_to(ctx.graph, grad, &out, &input)
}

fn add(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let mut grads = Vec::new();
    for i in 0..ctx.node.inputs.len() {
        grads.push(if ctx.need(i) { Some(to_input(ctx, &dy, i)?) } else { None });
    }
    Ok(grads)
}

fn sub(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let da = if ctx.need(0) { Some(to_input(ctx, &dy, 0)?) } else { None };
    let db = if ctx.need(1) {
        let reduced = to_input(ctx, &dy, 1)?;
        Some(ctx.graph.neg(&reduced)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn mul(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let (a, b) = (ctx.input(0), ctx.input(1));
    let da = if ctx.need(0) {
        let g = ctx.graph.mul(&dy, &b)?;
        Some(to_input(ctx, &g, 0)?)
    } else {
        None
    };
    let db = if ctx.need(1) {
        let g = ctx.graph.mul(&dy, &a)?;
        Some(to_input(ctx, &g, 1)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn div(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let (b, y) = (ctx.input(1), ctx.output(0));
    let da = if ctx.need(0) {
        let g = ctx.graph.div(&dy, &b)?;
        Some(to_input(ctx, &g, 0)?)
    } else {
        None
    };
    let db = if ctx.need(1) {
        // d(a/b)/db = -y / b
        let g = ctx.graph.mul(&dy, &y)?;
        let g = ctx.graph.div(&g, &b)?;
        let g = to_input(ctx, &g, 1)?;
        Some(ctx.graph.neg(&g)?)
    } else {
        None
    };
    Ok(vec![da, db])
}

fn pow(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    if ctx.need(1) {
        return Err(ctx.unsupported("gradients with respect to the exponent are not supported"));
    }
    let exponent = ctx
        .graph
        .constant_value(&ctx.node.inputs[1])
        .and_then(|t| t.as_f64s())
        .filter(|v| v.len() == 1)
        .map(|v| v[0])
        .ok_or_else(|| ctx.unsupported("the exponent must be a constant scalar"))?;
    let (dy, x) = (ctx.dy(0)?, ctx.input(0));
    let p1 = ctx.scalar_like(&x, exponent - 1.0)?;
    let powered = ctx.graph.pow(&x, &p1)?;
    let scaled = ctx.graph.scale(&powered, exponent)?;
    let g = ctx.graph.mul(&dy, &scaled)?;
    Ok(vec![Some(to_input(ctx, &g, 0)?), None])
}

fn neg(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    Ok(vec![Some(ctx.graph.neg(&dy)?)])
}

fn reciprocal(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (dy, y) = (ctx.dy(0)?, ctx.output(0));
    let y2 = ctx.graph.mul(&y, &y)?;
    let g = ctx.graph.mul(&dy, &y2)?;
    Ok(vec![Some(ctx.graph.neg(&g)?)])
}

fn identity(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    Ok(vec![Some(ctx.dy(0)?)])
}

fn where_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (cond, dy) = (ctx.input(0), ctx.dy(0)?);
    let zero = ctx.scalar_like(&dy, 0.0)?;
    let dx = if ctx.need(1) {
        let g = ctx.graph.where_(&cond, &dy, &zero)?;
        Some(to_input(ctx, &g, 1)?)
    } else {
        None
    };
    let dz = if ctx.need(2) {
        let g = ctx.graph.where_(&cond, &zero, &dy)?;
        Some(to_input(ctx, &g, 2)?)
    } else {
        None
    };
    Ok(vec![None, dx, dz])
}

fn cast(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let x = ctx.input(0);
    let dtype = ctx.graph.dtype(&x)?;
    let dy = ctx.dy(0)?;
    Ok(vec![Some(ctx.graph.cast(&dy, dtype)?)])
}

/// `dx = dy * mask / (1 - ratio)`, reusing the forward mask; identity outside training mode.
fn dropout(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    let dy = ctx.dy(0)?;
    let mode = ctx.graph.dropout_mode(ctx.node).map_err(|reason| ctx.unsupported(&reason))?;
    if !mode.training {
        return Ok(vec![Some(dy), None, None]);
    }
    let ratio = mode.ratio;
    let mask = match ctx.node.outputs.get(1).filter(|m| !m.is_empty()) {
        Some(m) => Value::named(m.as_str()),
        None => return Err(ctx.unsupported("the forward node must output its mask")),
    };
    let scaled = ctx.graph.scale(&dy, 1.0 / (1.0 - ratio))?;
    let zero = ctx.scalar_like(&dy, 0.0)?;
    let dx = ctx.graph.where_(&mask, &scaled, &zero)?;
    Ok(vec![Some(dx), None, None])
}
