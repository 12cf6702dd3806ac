//! `AddLayerNorm(X, R, scale, bias, ratio?, seed?) -> (Y, S, Mean, InvStdDev)`, attributes
//! `epsilon` and, with dropout, `site`: `S = dropout(X) + R` and `Y = LayerNorm(S)` over the
//! last axis, in one pass.
//!
//! Why: each BERT layer ends twice in `dropout -> Add(residual) -> LayerNormalization`, three
//! passes over the `[tokens, hidden]` tensor that write two intermediates; here each row is
//! dropped out, added and normalised while it is in cache, reading `X` and `R` and writing `Y`
//! and `S` (kept for the backward pass, as the unfused graph kept the sum). The dropout factors
//! are those `SeededDropout` draws at the same site, and `x * factor + r` is computed as the two
//! nodes computed it, so `S` is the same bits.
//!
//! Backward (the gradient rule): `LayerNormGrad(dY, S, scale, Mean, InvStdDev)` gives `dS`,
//! `dScale` and `dBias`; `dR = dS`, and `dX` is `dS` through the same dropout.
//!
//! The fusion pass ([`fuse`]) runs before differentiation, on the oneDNN path only.

mod fuse;

use std::sync::Arc;

use ringtune_autodiff::{AutodiffError, RuleCtx};
use ringtune_onnx_ir::{Attribute, DType, Dim, NodeSpec, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

pub use fuse::{drop_unread_outputs, fuse};

use crate::fast_math::{lanes, vector_builds};
use crate::seeded_dropout::{self, optional_draws, Draws, DropoutAttrs};
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "AddLayerNorm";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::Own(gradient_rule),
    kernel: KernelSource::OneDnn(|_| Arc::new(AddLayerNormOp)),
};

/// Rows per task.
const RUN: usize = 64;

/// Shape rule: `Y` and `S` like `X` (and `R`), `Mean` and `InvStdDev` like `X` with a last axis
/// of 1.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    for (i, what) in ["X", "R", "scale", "bias"].into_iter().enumerate() {
        float(inputs, i, what)?;
    }
    let (x, r) = (float(inputs, 0, "X")?.ranked("X")?, float(inputs, 1, "R")?.ranked("R")?);
    if x != r || x.is_empty() {
        return Err(format!("X {x:?} and R {r:?} must have one shape, of rank 1 or more"));
    }
    let mut stats = x.to_vec();
    if let Some(last) = stats.last_mut() {
        *last = Dim::Known(1);
    }
    let sum = ValueType::new(DType::F32, x.to_vec());
    let stat = ValueType::new(DType::F32, stats);
    Ok(vec![sum.clone(), sum, stat.clone(), stat])
}

/// Gradient rule: `LayerNormGrad` on the kept sum and statistics, then the dropout of `dS`
/// for `X`.
pub(crate) fn gradient_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    let saved = |i: usize| ctx.node().outputs.get(i).filter(|s| !s.is_empty()).map(|s| Value::named(s.as_str()));
    let (Some(sum), Some(mean), Some(inv_std)) = (saved(1), saved(2), saved(3)) else {
        return Err(ctx.unsupported("the forward node must output S, Mean and InvStdDev"));
    };
    let (dy, scale) = (ctx.dy(0)?, ctx.input(2));
    let spec = NodeSpec {
        op_type: crate::layer_norm_grad::NAME,
        domain: DOMAIN,
        inputs: vec![Some(&dy), Some(&sum), Some(&scale), Some(&mean), Some(&inv_std)],
        attributes: vec![("axis", Attribute::Int(-1))],
        outputs: 3,
    };
    let [d_sum, d_scale, d_bias]: [Value; 3] =
        ctx.graph().node(spec)?.try_into().map_err(|_| ctx.unsupported("LayerNormGrad made the wrong outputs"))?;
    let forward_inputs = ctx.node().inputs.len();
    let dx = if forward_inputs > 4 {
        let (ratio, seed) = (ctx.input(4), ctx.input(5));
        let spec = NodeSpec {
            op_type: seeded_dropout::NAME,
            domain: DOMAIN,
            inputs: vec![Some(&d_sum), Some(&ratio), Some(&seed)],
            attributes: DropoutAttrs::read(ctx.node()).write(),
            outputs: 1,
        };
        ctx.graph().node(spec)?.remove(0)
    } else {
        d_sum.clone()
    };
    let mut grads = vec![
        ctx.need(0).then_some(dx),
        ctx.need(1).then_some(d_sum),
        ctx.need(2).then_some(d_scale),
        ctx.need(3).then_some(d_bias),
    ];
    grads.resize(forward_inputs, None);
    Ok(grads)
}

/// The rows one task computes into: `Y`, and when asked `S`, `Mean` and `InvStdDev`.
pub struct RowsOut<'a> {
    /// `Y`.
    pub y: &'a mut [f32],
    /// `S`.
    pub sum: Option<&'a mut [f32]>,
    /// Per row, the mean of `S`.
    pub mean: Option<&'a mut [f32]>,
    /// Per row, `1 / sqrt(var + epsilon)`.
    pub inv_std: Option<&'a mut [f32]>,
}

/// What every row reads besides its `X` and `R`.
#[derive(Debug, Clone, Copy)]
pub struct Norm<'a> {
    /// The scale (`width`).
    pub scale: &'a [f32],
    /// The shift (`width`).
    pub bias: &'a [f32],
    /// Added to the variance.
    pub epsilon: f32,
    /// The dropout on `X`, if any.
    pub dropout: Option<Draws>,
}

vector_builds! {
    /// Rows `first..` of the tensor: `x` and `r` hold as many rows as `out.y`.
    pub fn rows(norm: &Norm<'_>, first: usize, x: &[f32], r: &[f32], out: RowsOut<'_>) {
        rows_portable(norm, first, x, r, out)
    }
}

#[inline(always)]
fn rows_portable(norm: &Norm<'_>, first: usize, x: &[f32], r: &[f32], out: RowsOut<'_>) {
    let width = norm.scale.len();
    let RowsOut { y, mut sum, mut mean, mut inv_std } = out;
    let (mut s, mut scratch) = (vec![0.0f32; width], vec![0.0f32; width]);
    let n = width as f32;
    for (row, ((x, r), y)) in
        x.chunks_exact(width).zip(r.chunks_exact(width)).zip(y.chunks_exact_mut(width)).enumerate()
    {
        // Multiplied by the factor and then added, as `SeededDropout` and `Add` did: the same
        // bits.
        match &norm.dropout {
            Some(draws) => {
                draws.factors((first + row) * width, &mut scratch);
                for ((s, (x, r)), f) in s.iter_mut().zip(x.iter().zip(r)).zip(&scratch) {
                    *s = x * f + r;
                }
            }
            None => s.iter_mut().zip(x.iter().zip(r)).for_each(|(s, (x, r))| *s = x + r),
        }
        let mu = lanes(&s, 0.0, |a, b| a + b) / n;
        for (d, s) in scratch.iter_mut().zip(&s) {
            *d = (s - mu) * (s - mu);
        }
        let inv = 1.0 / (lanes(&scratch, 0.0, |a, b| a + b) / n + norm.epsilon).sqrt();
        for (((y, s), scale), bias) in y.iter_mut().zip(&s).zip(norm.scale).zip(norm.bias) {
            *y = (s - mu) * inv * scale + bias;
        }
        if let Some(sum) = sum.as_deref_mut() {
            sum[row * width..(row + 1) * width].copy_from_slice(&s);
        }
        if let Some(mean) = mean.as_deref_mut() {
            mean[row] = mu;
        }
        if let Some(inv_std) = inv_std.as_deref_mut() {
            inv_std[row] = inv;
        }
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct AddLayerNormOp;

impl CustomOp for AddLayerNormOp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        let mut ports = vec![Port::required(ElementType::F32); 4];
        ports.extend([Port::optional(ElementType::F32), Port::optional(ElementType::I64)]);
        ports
    }

    fn outputs(&self) -> Vec<Port> {
        let mut ports = vec![Port::required(ElementType::F32)];
        ports.extend([Port::optional(ElementType::F32); 3]);
        ports
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        let epsilon = attributes.float("epsilon").ok_or("AddLayerNorm needs its epsilon")?;
        Ok(Box::new(AddLayerNormKernel { epsilon, dropout: DropoutAttrs::read(attributes) }))
    }
}

struct AddLayerNormKernel {
    epsilon: f32,
    dropout: DropoutAttrs,
}

/// `X`, `R`, scale and bias, checked against each other; the row width.
fn operands<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<([TensorRef<'a>; 4], usize), String> {
    let tensor = |i: usize, what: &str| inputs.get(i).copied().flatten().ok_or(format!("missing {what}"));
    let (x, r, scale, bias) = (tensor(0, "X")?, tensor(1, "R")?, tensor(2, "scale")?, tensor(3, "bias")?);
    let width = x.shape().last().copied().unwrap_or(0);
    if x.shape() != r.shape() || width <= 0 || scale.shape() != [width] || bias.shape() != [width] {
        return Err(format!(
            "X {:?} and R {:?} must have one shape, and scale {:?} and bias {:?} its last axis",
            x.shape(),
            r.shape(),
            scale.shape(),
            bias.shape()
        ));
    }
    Ok(([x, r, scale, bias], width as usize))
}

fn floats<'a>(tensor: TensorRef<'a>, what: &str) -> Result<&'a [f32], String> {
    tensor.f32().ok_or(format!("{what} must be float"))
}

/// An optional float output's buffer, when ONNX Runtime asked for it.
fn asked_for<'a>(output: &mut Option<TensorMut<'a>>) -> Option<&'a mut [f32]> {
    match output.take() {
        Some(TensorMut::F32(buffer)) => Some(buffer),
        _ => None,
    }
}

impl Kernel for AddLayerNormKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        // The kernel's own reading of the operands refuses what it could not compute.
        operands(inputs)?;
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let ([x, r, scale, bias], width) = operands(inputs)?;
        let (x, r) = (floats(x, "X")?, floats(r, "R")?);
        let dropout =
            optional_draws(inputs.get(4).copied().flatten(), inputs.get(5).copied().flatten(), self.dropout.site)?;
        let norm = Norm { scale: floats(scale, "scale")?, bias: floats(bias, "bias")?, epsilon: self.epsilon, dropout };
        let [y, sum, mean, inv_std] = outputs else { return Err("four outputs expected".into()) };
        let Some(TensorMut::F32(y)) = y else { return Err("no Y".into()) };
        let (mut sums, mut means, mut inv_stds) = (
            asked_for(sum).map(|s| s.chunks_mut(RUN * width)),
            asked_for(mean).map(|m| m.chunks_mut(RUN)),
            asked_for(inv_std).map(|i| i.chunks_mut(RUN)),
        );
        let parts: Vec<RowsOut<'_>> = y
            .chunks_mut(RUN * width)
            .map(|y| RowsOut {
                y,
                sum: sums.as_mut().and_then(Iterator::next),
                mean: means.as_mut().and_then(Iterator::next),
                inv_std: inv_stds.as_mut().and_then(Iterator::next),
            })
            .collect();
        for_each_part(threads, parts, |run, out| {
            let cells = run * RUN * width..run * RUN * width + out.y.len();
            let out = RowsOut {
                y: &mut *out.y,
                sum: out.sum.as_deref_mut(),
                mean: out.mean.as_deref_mut(),
                inv_std: out.inv_std.as_deref_mut(),
            };
            rows(&norm, run * RUN, &x[cells.clone()], &r[cells], out);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_runtime::Serial;

    use super::*;
    use crate::seeded_dropout::site_key;

    /// The build `rows` picks for this CPU gives the portable build's bits, with and without
    /// dropout, for a width that is not a multiple of the vectors.
    #[test]
    fn the_vector_build_gives_the_portable_builds_bits() {
        let (rows_n, width) = (5, 77);
        let (x, r) = (values(rows_n * width, 1), values(rows_n * width, 2));
        let (scale, bias) = (values(width, 3), values(width, 4));
        for dropout in [None, Some(Draws::new(site_key(7, 1), 0.1))] {
            let norm = Norm { scale: &scale, bias: &bias, epsilon: 1e-12, dropout };
            let run = |portable: bool| {
                let (mut y, mut sum, mut mean, mut inv_std) =
                    (vec![0.0f32; x.len()], vec![0.0f32; x.len()], vec![0.0f32; rows_n], vec![0.0f32; rows_n]);
                let out =
                    RowsOut { y: &mut y, sum: Some(&mut sum), mean: Some(&mut mean), inv_std: Some(&mut inv_std) };
                if portable {
                    rows_portable(&norm, 3, &x, &r, out);
                } else {
                    rows(&norm, 3, &x, &r, out);
                }
                [y, sum, mean, inv_std].map(|v| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(run(false), run(true), "dropout {:?}", dropout.is_some());
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 * 4.0 - 2.0).collect()
    }

    /// LayerNorm of `dropout(x) + r` in f64, the dropout by `SeededDropout`'s own `apply`.
    fn reference(x: &[f32], r: &[f32], scale: &[f32], bias: &[f32], dropout: Option<(u64, f32)>) -> Vec<f64> {
        let mut dropped = x.to_vec();
        if let Some((key, ratio)) = dropout {
            seeded_dropout::apply(key, ratio, x, &mut dropped, None);
        }
        let width = scale.len();
        let mut y = Vec::new();
        for (xs, rs) in dropped.chunks(width).zip(r.chunks(width)) {
            let s: Vec<f64> = xs.iter().zip(rs).map(|(x, r)| f64::from(*x) + f64::from(*r)).collect();
            let mean = s.iter().sum::<f64>() / width as f64;
            let var = s.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
            let inv = 1.0 / (var + 1e-12).sqrt();
            y.extend(
                s.iter()
                    .zip(scale.iter().zip(bias))
                    .map(|(v, (g, b))| (v - mean) * inv * f64::from(*g) + f64::from(*b)),
            );
        }
        y
    }

    #[test]
    fn matches_layer_norm_of_the_dropped_out_sum_over_runs_and_odd_widths() {
        // 70 rows: a whole run and a part; width 13: not a multiple of the lanes.
        let (rows_n, width) = (70, 13);
        let (x, r) = (values(rows_n * width, 1), values(rows_n * width, 2));
        let (scale, bias) = (values(width, 3), values(width, 4));
        for dropout in [None, Some((site_key(5, 1), 0.25f32))] {
            let (seed, ratio) = ([5i64], [0.25f32]);
            let (dims, width_dims) = ([rows_n as i64, width as i64], [width as i64]);
            let mut inputs = vec![
                Some(TensorRef::F32(&dims, &x)),
                Some(TensorRef::F32(&dims, &r)),
                Some(TensorRef::F32(&width_dims, &scale)),
                Some(TensorRef::F32(&width_dims, &bias)),
            ];
            if dropout.is_some() {
                inputs.extend([Some(TensorRef::F32(&[], &ratio)), Some(TensorRef::I64(&[1], &seed))]);
            }
            let kernel = AddLayerNormKernel { epsilon: 1e-12, dropout: DropoutAttrs { site: 1 } };
            let (mut y, mut sum) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
            let (mut mean, mut inv_std) = (vec![f32::NAN; rows_n], vec![f32::NAN; rows_n]);
            let mut outputs = [
                Some(TensorMut::F32(&mut y)),
                Some(TensorMut::F32(&mut sum)),
                Some(TensorMut::F32(&mut mean)),
                Some(TensorMut::F32(&mut inv_std)),
            ];
            kernel.compute(&inputs, &mut outputs, &Serial).expect("compute");
            let want = reference(&x, &r, &scale, &bias, dropout);
            for (got, want) in y.iter().zip(&want) {
                assert!((f64::from(*got) - want).abs() < 2e-5 * (1.0 + want.abs()), "{got} against {want}");
            }
            // S is bit for bit what SeededDropout followed by Add computes.
            let mut dropped = x.clone();
            if let Some((key, ratio)) = dropout {
                seeded_dropout::apply(key, ratio, &x, &mut dropped, None);
            }
            let added: Vec<f32> = dropped.iter().zip(&r).map(|(d, r)| d + r).collect();
            assert_eq!(sum, added, "dropout {dropout:?}");
            for (row, s) in added.chunks(width).enumerate() {
                let mu = s.iter().map(|v| f64::from(*v)).sum::<f64>() / width as f64;
                assert!((f64::from(mean[row]) - mu).abs() < 1e-5, "mean of row {row}");
                assert!(inv_std[row].is_finite() && inv_std[row] > 0.0);
            }
            // The statistics and the sum are optional outputs.
            let mut alone = vec![f32::NAN; x.len()];
            kernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut alone)), None, None, None], &Serial).expect("Y");
            assert_eq!(alone, y);
        }
    }

    #[test]
    fn refuses_operands_that_do_not_fit() {
        let kernel = AddLayerNormKernel { epsilon: 1e-5, dropout: DropoutAttrs { site: 0 } };
        let (x, r, g) = ([0.0f32; 6], [0.0f32; 6], [1.0f32; 3]);
        let inputs = [
            Some(TensorRef::F32(&[2, 3], &x)),
            Some(TensorRef::F32(&[3, 2], &r)),
            Some(TensorRef::F32(&[3], &g)),
            Some(TensorRef::F32(&[3], &g)),
        ];
        assert!(kernel.output_shapes(&inputs).expect_err("R differs").contains("one shape"));
        let fits = [inputs[0], Some(TensorRef::F32(&[2, 3], &r)), inputs[2], inputs[3]];
        assert_eq!(kernel.output_shapes(&fits).expect("fits"), vec![vec![2, 3], vec![2, 3], vec![2, 1], vec![2, 1]]);
    }
}
