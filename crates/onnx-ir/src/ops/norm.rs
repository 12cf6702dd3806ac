//! Normalisations: `LayerNormalization` (with its mean and inverse-std outputs), `Softmax`,
//! `LogSoftmax`.

use std::collections::HashMap;

use super::{norm_axis, InferCtx, Inferred, Rule};
use crate::{Attribute, Dim, Graph, IrError, NodeSpec, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("LayerNormalization", layer_norm);
    rules.insert("Softmax", softmax);
    rules.insert("LogSoftmax", softmax);
}

fn layer_norm(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let x = ctx.ty(0)?.clone();
    let input = ctx.ranked(0)?;
    let axis = norm_axis(ctx.int("axis", -1), input.len())?;
    let stats: Vec<Dim> =
        input.iter().enumerate().map(|(i, d)| if i < axis { d.clone() } else { Dim::Known(1) }).collect();
    // Mean and InvStdDev are computed and returned in float32 (`stash_type` 1, the default).
    let stat_type = ValueType::new(crate::DType::F32, stats);
    Ok(Inferred::types(vec![x, stat_type.clone(), stat_type]))
}

fn softmax(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    if let Some(s) = ctx.shape(0)? {
        norm_axis(ctx.int("axis", -1), s.len())?;
    }
    Ok(Inferred::one(ctx.ty(0)?.clone()))
}

/// The outputs of a layer normalisation.
#[derive(Debug, Clone)]
pub struct LayerNormOutputs {
    /// The normalised, scaled and shifted values.
    pub y: Value,
    /// The mean over the normalised axes.
    pub mean: Value,
    /// `1 / sqrt(variance + epsilon)` over the normalised axes.
    pub inv_std: Value,
}

impl Graph {
    /// `LayerNormalization(x, scale, bias)` over the last axis, with its statistics outputs.
    pub fn layer_norm(
        &mut self,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<LayerNormOutputs, IrError> {
        let outs = self.node(NodeSpec {
            op_type: "LayerNormalization",
            domain: "",
            inputs: vec![Some(x), Some(scale), Some(bias)],
            attributes: vec![("axis", Attribute::Int(-1)), ("epsilon", Attribute::Float(epsilon))],
            outputs: 3,
        })?;
        match <[Value; 3]>::try_from(outs) {
            Ok([y, mean, inv_std]) => Ok(LayerNormOutputs { y, mean, inv_std }),
            Err(_) => Err(IrError::Invalid("LayerNormalization made the wrong number of outputs".into())),
        }
    }

    /// `Softmax(x)` over `axis`.
    pub fn softmax(&mut self, x: &Value, axis: i64) -> Result<Value, IrError> {
        self.op1("Softmax", &[x], vec![("axis", Attribute::Int(axis))])
    }

    /// `LogSoftmax(x)` over `axis`.
    pub fn log_softmax(&mut self, x: &Value, axis: i64) -> Result<Value, IrError> {
        self.op1("LogSoftmax", &[x], vec![("axis", Attribute::Int(axis))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{shape, DType};

    #[test]
    fn layer_norm_statistics_keep_rank() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&["b", "s", "h"])).expect("x");
        let gamma = g.input("g", DType::F32, shape(&["h"])).expect("g");
        let beta = g.input("beta", DType::F32, shape(&["h"])).expect("b");
        let ln = g.layer_norm(&x, &gamma, &beta, 1e-12).expect("ln");
        assert_eq!(g.shape(&ln.y).expect("y"), g.shape(&x).expect("x").clone().as_slice());
        assert_eq!(g.shape(&ln.mean).expect("m"), &shape(&[Dim::sym("b"), Dim::sym("s"), Dim::Known(1)]));
    }
}
