//! Shape and indexing family: `Reshape`, `Unsqueeze`, `Squeeze`, `Transpose`, `Slice`,
//! `Concat`, `Expand`, `Gather` (an embedding's gradient is a scatter-add into a zero table),
//! `GatherElements` (a scatter-add of elements, DeBERTa's relative positions),
//! `ReduceSum`, `ReduceMean`.

use std::collections::HashMap;

use ringtune_onnx_ir::{Dim, NodeSpec, Tensor, Value};

use super::{Rule, RuleCtx};
use crate::broadcast::reduce_to;
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Reshape", back_to_input_shape);
    rules.insert("Unsqueeze", back_to_input_shape);
    rules.insert("Squeeze", back_to_input_shape);
    rules.insert("Transpose", transpose);
    rules.insert("Slice", slice);
    rules.insert("Concat", concat);
    rules.insert("Expand", expand);
    rules.insert("Gather", gather);
    rules.insert("GatherElements", gather_elements);
    rules.insert("ReduceSum", reduce_sum);
    rules.insert("ReduceMean", reduce_mean);
}

/// A value's shape as a graph value: a constant when fixed, else `Shape(x)`.
fn shape_value(ctx: &mut RuleCtx<'_>, x: &Value) -> Result<Value, AutodiffError> {
    match ctx.graph.value_type(x)?.static_dims() {
        Some(dims) => Ok(ctx.graph.const_i64(&dims)?),
        None => Ok(ctx.graph.shape_of(x)?),
    }
}

fn back_to_input_shape(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (x, dy) = (ctx.input(0), ctx.dy(0)?);
    let target = shape_value(ctx, &x)?;
    Ok(vec![Some(ctx.graph.reshape_to(&dy, &target)?)])
}

fn transpose(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let rank = ctx.shape(&dy)?.len();
    let perm: Vec<i64> = ctx.node.ints("perm").map(<[i64]>::to_vec).unwrap_or_else(|| (0..rank as i64).rev().collect());
    let mut inverse = vec![0i64; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inverse[p as usize] = i as i64;
    }
    Ok(vec![Some(ctx.graph.transpose(&dy, &inverse)?)])
}

/// Pads the gradient with zeros back to the input's extent; pads that depend on a symbolic
/// size are computed from `Shape(x)`.
fn slice(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    const WHOLE: i64 = i64::MAX / 2;
    let (x, dy) = (ctx.input(0), ctx.dy(0)?);
    let x_shape = ctx.shape(&x)?;
    let rank = x_shape.len() as i64;
    let consts = |ctx: &RuleCtx<'_>, i: usize| {
        ctx.node.input(i).and_then(|n| ctx.graph.constant_value(n)).and_then(Tensor::as_i64s)
    };
    let (Some(starts), Some(ends)) = (consts(ctx, 1), consts(ctx, 2)) else {
        return Err(ctx.unsupported("starts and ends must be constants"));
    };
    let axes = match ctx.node.input(3) {
        Some(_) => consts(ctx, 3).ok_or_else(|| ctx.unsupported("axes must be constant"))?,
        None => (0..starts.len() as i64).collect(),
    };
    if ctx.node.input(4).is_some() && consts(ctx, 4).is_none_or(|s| s.iter().any(|&v| v != 1)) {
        return Err(ctx.unsupported("only unit steps are supported"));
    }
    let axes: Vec<i64> = axes.iter().map(|&a| if a < 0 { a + rank } else { a }).collect();
    let mut begins = Vec::new();
    let mut end_parts: Vec<Value> = Vec::new();
    let mut dims = None;
    for ((&axis, &start), &end) in axes.iter().zip(&starts).zip(&ends) {
        let dim = &x_shape[axis as usize];
        match dim {
            Dim::Known(n) => {
                let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(*n) };
                begins.push(clamp(start));
                end_parts.push(ctx.graph.const_i64(&[n - clamp(end).max(clamp(start))])?);
            }
            _ if start >= 0 && end >= WHOLE => {
                begins.push(start);
                end_parts.push(ctx.graph.const_i64(&[0])?);
            }
            _ if start >= 0 && end >= start => {
                begins.push(start);
                let shape = match &dims {
                    Some(d) => d,
                    None => dims.insert(ctx.graph.shape_of(&x)?),
                }
                .clone();
                let index = ctx.graph.const_i64(&[axis])?;
                let size = ctx.graph.gather(&shape, &index, 0)?;
                let e = ctx.graph.const_i64(&[end])?;
                end_parts.push(ctx.graph.sub(&size, &e)?);
            }
            _ => return Err(ctx.unsupported("negative bounds on a symbolic axis are not supported")),
        }
    }
    let begin = ctx.graph.const_i64(&begins)?;
    let mut parts: Vec<&Value> = vec![&begin];
    parts.extend(end_parts.iter());
    let pads = ctx.graph.concat(&parts, 0)?;
    let axes_value = ctx.graph.const_i64(&axes)?;
    let padded = ctx.graph.node(NodeSpec {
        op_type: "Pad",
        domain: "",
        inputs: vec![Some(&dy), Some(&pads), None, Some(&axes_value)],
        attributes: vec![],
        outputs: 1,
    })?;
    Ok(vec![padded.into_iter().next(), None, None, None, None])
}

fn concat(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let dy = ctx.dy(0)?;
    let rank = ctx.shape(&dy)?.len() as i64;
    let axis = ctx.node.int("axis").unwrap_or(0);
    let axis = if axis < 0 { axis + rank } else { axis };
    let mut offset = 0;
    let mut grads = Vec::new();
    for i in 0..ctx.node.inputs.len() {
        let x = ctx.input(i);
        let len =
            ctx.shape(&x)?[axis as usize].known().ok_or_else(|| ctx.unsupported("concatenated sizes must be fixed"))?;
        grads.push(if ctx.need(i) { Some(ctx.graph.slice(&dy, &[offset], &[offset + len], &[axis])?) } else { None });
        offset += len;
    }
    Ok(grads)
}

fn expand(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let (x, dy) = (ctx.input(0), ctx.dy(0)?);
    let out = ctx.shape(&ctx.output(0))?;
    Ok(vec![Some(reduce_to(ctx.graph, &dy, &out, &x)?), None])
}

/// `Gather(data, indices, axis 0)`: the data gradient adds each row of `dy` into a zero table
/// at its index (`ScatterND` with `reduction = add`); rows never gathered stay exactly zero.
fn gather(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    if ctx.node.int("axis").unwrap_or(0) != 0 {
        return Err(ctx.unsupported("only gathers along axis 0 are differentiable"));
    }
    let (data, indices, dy) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let zeros = ctx.graph.zeros_like(&data)?;
    let index = ctx.graph.unsqueeze(&indices, &[-1])?;
    Ok(vec![Some(ctx.graph.scatter_nd(&zeros, &index, &dy, "add")?), None])
}

/// `GatherElements(data, indices, axis)`: the data gradient adds each element of `dy` into a
/// zero tensor at its index along `axis` (`ScatterElements` with `reduction = add`); elements
/// never gathered stay exactly zero.
fn gather_elements(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let axis = ctx.node.int("axis").unwrap_or(0);
    let (data, indices, dy) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let zeros = ctx.graph.zeros_like(&data)?;
    Ok(vec![Some(ctx.graph.scatter_elements(&zeros, &indices, &dy, axis, "add")?), None])
}

/// The reduced axes (normalised), and whether they were kept.
fn reduced_axes(ctx: &RuleCtx<'_>, rank: usize) -> Result<(Vec<i64>, bool), AutodiffError> {
    let keep = ctx.node.int("keepdims").unwrap_or(1) != 0;
    let axes = match ctx.node.input(1) {
        Some(name) => ctx
            .graph
            .constant_value(name)
            .and_then(Tensor::as_i64s)
            .ok_or_else(|| ctx.unsupported("axes must be constant"))?,
        None => Vec::new(),
    };
    let axes = if axes.is_empty() { (0..rank as i64).collect() } else { axes };
    Ok((axes.iter().map(|&a| if a < 0 { a + rank as i64 } else { a }).collect(), keep))
}

/// `dy` with the reduced axes restored and broadcast to the input's shape.
fn spread(ctx: &mut RuleCtx<'_>) -> Result<(Value, Vec<i64>), AutodiffError> {
    let (x, dy) = (ctx.input(0), ctx.dy(0)?);
    let rank = ctx.shape(&x)?.len();
    let (axes, keep) = reduced_axes(ctx, rank)?;
    let kept = if keep { dy } else { ctx.graph.unsqueeze(&dy, &axes)? };
    let target = shape_value(ctx, &x)?;
    Ok((ctx.graph.expand(&kept, &target)?, axes))
}

fn reduce_sum(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    Ok(vec![Some(spread(ctx)?.0), None])
}

fn reduce_mean(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    let x_shape = ctx.shape(&ctx.input(0))?;
    let (spread, axes) = spread(ctx)?;
    let count: Option<i64> = axes.iter().map(|&a| x_shape[a as usize].known()).product();
    let count = count.ok_or_else(|| ctx.unsupported("the mean's count must be fixed"))?;
    Ok(vec![Some(ctx.graph.scale(&spread, 1.0 / count as f64)?), None])
}
