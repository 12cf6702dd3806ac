//! Training operators: `Dropout` (with its mask) and `SoftmaxCrossEntropyLoss`.

use std::collections::HashMap;

use super::{InferCtx, Inferred, Rule};
use crate::{Attribute, DType, Graph, IrError, NodeSpec, Tensor, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Dropout", dropout);
    rules.insert("SoftmaxCrossEntropyLoss", softmax_cross_entropy);
}

fn dropout(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let x = ctx.ty(0)?.clone();
    let mask = ValueType { dtype: DType::Bool, shape: x.shape.clone() };
    Ok(Inferred::types(vec![x, mask]))
}

fn softmax_cross_entropy(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let scores = ctx.ty(0)?.clone();
    if ctx.dtype(1)? != DType::I64 && ctx.dtype(1)? != DType::I32 {
        return Err("labels must be integers".into());
    }
    let loss_shape = match ctx.node.string("reduction").unwrap_or("mean") {
        "none" => scores.shape.as_ref().map(|s| vec![s[0].clone()]),
        "mean" | "sum" => Some(vec![]),
        other => return Err(format!("unknown reduction {other}")),
    };
    let loss = ValueType { dtype: scores.dtype, shape: loss_shape };
    Ok(Inferred::types(vec![loss, scores]))
}

/// The outputs of a dropout in training mode.
#[derive(Debug, Clone)]
pub struct DropoutOutputs {
    /// The kept values, scaled by `1 / (1 - ratio)`.
    pub y: Value,
    /// Which values were kept (bool).
    pub mask: Value,
}

/// What a `Dropout` node does, read from its constant inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DropoutMode {
    /// The probability of dropping an element (ONNX's default 0.5 when the input is absent).
    pub ratio: f64,
    /// Whether it drops at all (`training_mode`, false when absent).
    pub training: bool,
}

impl Graph {
    /// The ratio and mode of the `Dropout` node `node`, or why they are not known before
    /// running (an input that is not a constant).
    pub fn dropout_mode(&self, node: &crate::Node) -> Result<DropoutMode, String> {
        let training = match node.input(2) {
            None => false,
            Some(name) => self
                .constant_value(name)
                .filter(|t| t.dtype == DType::Bool)
                .map(|t| t.data.first() == Some(&1))
                .ok_or("training_mode must be a constant")?,
        };
        let ratio = match node.input(1) {
            None => 0.5,
            Some(name) => self
                .constant_value(name)
                .and_then(|t| t.as_f64s())
                .and_then(|v| v.first().copied())
                .ok_or("the ratio must be a constant")?,
        };
        Ok(DropoutMode { ratio, training })
    }

    /// `Dropout(x, ratio, training_mode = true)`, with its mask.
    pub fn dropout(&mut self, x: &Value, ratio: f32) -> Result<DropoutOutputs, IrError> {
        let dtype = self.dtype(x)?;
        let r = self.constant(Tensor::scalar_float(dtype, ratio as f64))?;
        let training = self.constant(Tensor { dtype: DType::Bool, dims: vec![], data: vec![1] })?;
        let outs = self.node(NodeSpec {
            op_type: "Dropout",
            domain: "",
            inputs: vec![Some(x), Some(&r), Some(&training)],
            attributes: vec![],
            outputs: 2,
        })?;
        match <[Value; 2]>::try_from(outs) {
            Ok([y, mask]) => Ok(DropoutOutputs { y, mask }),
            Err(_) => Err(IrError::Invalid("Dropout made the wrong number of outputs".into())),
        }
    }

    /// Mean `SoftmaxCrossEntropyLoss(scores [N, C], labels [N])`; returns (loss, log_prob).
    pub fn softmax_cross_entropy(&mut self, scores: &Value, labels: &Value) -> Result<(Value, Value), IrError> {
        let outs = self.node(NodeSpec {
            op_type: "SoftmaxCrossEntropyLoss",
            domain: "",
            inputs: vec![Some(scores), Some(labels)],
            attributes: vec![("reduction", Attribute::Str("mean".into()))],
            outputs: 2,
        })?;
        match <[Value; 2]>::try_from(outs) {
            Ok([loss, log_prob]) => Ok((loss, log_prob)),
            Err(_) => Err(IrError::Invalid("SoftmaxCrossEntropyLoss made the wrong number of outputs".into())),
        }
    }
}
