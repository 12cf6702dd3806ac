//! Loss family: `SoftmaxCrossEntropyLoss` (mean or sum reduction, no weights), reusing the
//! forward log-probabilities.

use std::collections::HashMap;

use ringtune_onnx_ir::{DType, Tensor, Value};

use super::{Rule, RuleCtx};
use crate::AutodiffError;

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("SoftmaxCrossEntropyLoss", softmax_cross_entropy);
}

/// `dscores = (softmax(scores) - onehot(labels)) * dloss`, divided by the batch for `mean`.
fn softmax_cross_entropy(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    if ctx.node.input(2).is_some() || ctx.node.int("ignore_index").is_some() {
        return Err(ctx.unsupported("class weights and ignore_index are not supported"));
    }
    let reduction = ctx.node.string("reduction").unwrap_or("mean").to_string();
    let log_prob = match ctx.node.outputs.get(1).filter(|s| !s.is_empty()) {
        Some(name) => Value::named(name.as_str()),
        None => return Err(ctx.unsupported("the forward node must output log_prob")),
    };
    let (scores, labels, dloss) = (ctx.input(0), ctx.input(1), ctx.dy(0)?);
    let shape = ctx.shape(&scores)?;
    if shape.len() != 2 {
        return Err(ctx.unsupported("scores must be [batch, classes]"));
    }
    let classes = shape[1].known().ok_or_else(|| ctx.unsupported("the class count must be fixed"))?;
    let dtype = ctx.graph.dtype(&scores)?;
    let g = &mut *ctx.graph;
    let probs = g.exp(&log_prob)?;
    let depth = g.constant(Tensor::scalar_i64(classes))?;
    let off_on = g.constant(match dtype {
        DType::F64 => Tensor::from_f64(&[2], &[0.0, 1.0]),
        _ => Tensor::from_f32(&[2], &[0.0, 1.0]),
    })?;
    let onehot = g.one_hot(&labels, &depth, &off_on)?;
    let diff = g.sub(&probs, &onehot)?;
    let scaled = match reduction.as_str() {
        "mean" => {
            let dims = g.shape_of(&scores)?;
            let zero = g.const_i64(&[0])?;
            let batch = g.gather(&dims, &zero, 0)?;
            let batch = g.cast(&batch, dtype)?;
            let per_row = g.div(&dloss, &batch)?;
            g.mul(&diff, &per_row)?
        }
        "sum" => g.mul(&diff, &dloss)?,
        other => return Err(ctx.unsupported(&format!("reduction `{other}` is not supported"))),
    };
    Ok(vec![Some(scaled), None, None])
}
