//! `Attention(Q, Kᵀ, V, mask[, ratio, seed]) -> (out, lse)` with attribute `site`: the core of
//! self-attention, `dropout(softmax(Q Kᵀ + mask)) V`, in one operator, and its backward
//! operator `AttentionGrad(dOut, Q, Kᵀ, V, mask, out, lse[, ratio, seed]) -> (dQ, dKᵀ, dV)`.
//!
//! Why: unfused, each layer writes the `batch x heads x queries x keys` scores, the masked
//! scores, the probabilities and the dropped-out probabilities to memory and reads them back,
//! forward and backward, through five operators. Fused, a row of scores lives in cache from
//! the product that makes it to the product that consumes it ([`math`]); the backward pass
//! recomputes it from Q, Kᵀ and the row statistic `lse`, so nothing of the size of the scores
//! is kept between the passes. The dropout mask is the one `SeededDropout` would draw at the
//! same site for the probability tensor, so the fused and unfused graphs compute the same
//! function.
//!
//! Q comes scaled (the scale stays a plain `Mul` before it); Kᵀ is `[batch, heads, depth,
//! keys]` as the graph makes it; the mask is additive, broadcasts to the scores and gets no
//! gradient. The fusion pass ([`fuse`]) runs before differentiation, so the operator's gradient
//! rule makes the backward node.

pub mod fuse;
pub mod math;

use std::sync::Arc;

use ringtune_autodiff::{AutodiffError, RuleCtx};
use ringtune_onnx_ir::{DType, NodeSpec, Shape, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

pub use fuse::fuse;
use math::{Call, HeadGrads, HeadInputs, Mask, Saved, Sizes};

use crate::seeded_dropout::{optional_draws, DropoutAttrs};
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The forward operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "Attention";
/// The backward operator's name.
pub const GRAD_NAME: &str = "AttentionGrad";

/// `Attention`'s entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::Own(gradient_rule),
    kernel: KernelSource::OneDnn(|_| Arc::new(AttentionOp)),
};

/// `AttentionGrad`'s entry in the table of operators.
pub(crate) const GRAD_OPERATOR: Operator = Operator {
    name: GRAD_NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, grad_outputs),
    gradient: Gradient::None,
    kernel: KernelSource::OneDnn(|_| Arc::new(AttentionGradOp)),
};

/// Input `i`, float of rank 4.
fn rank4<'a>(inputs: &'a [Option<Operand>], i: usize, what: &str) -> Result<&'a Shape, String> {
    let dims = float(inputs, i, what)?.ranked(what)?;
    if dims.len() != 4 {
        return Err(format!("{what} must have rank 4, not {}", dims.len()));
    }
    Ok(dims)
}

/// Shape rule of `Attention`: the output `[batch, heads, queries, V's width]`, the statistics
/// `[batch, heads, queries]`.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    let q = rank4(inputs, 0, "Q")?;
    rank4(inputs, 1, "Kᵀ")?;
    let v = rank4(inputs, 2, "V")?;
    rank4(inputs, 3, "the mask")?;
    let out = vec![q[0].clone(), q[1].clone(), q[2].clone(), v[3].clone()];
    Ok(vec![ValueType::new(DType::F32, out), ValueType::new(DType::F32, q[..3].to_vec())])
}

/// Shape rule of `AttentionGrad`: the gradients are like Q, Kᵀ and V.
fn grad_outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    rank4(inputs, 0, "dOut")?;
    let like = |i: usize, what: &str| -> Result<ValueType, String> {
        Ok(ValueType::new(DType::F32, rank4(inputs, i, what)?.to_vec()))
    };
    Ok(vec![like(1, "Q")?, like(2, "Kᵀ")?, like(3, "V")?])
}

/// Gradient rule: one `AttentionGrad` node gives the gradients of Q, Kᵀ and V.
pub(crate) fn gradient_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    if ctx.need(3) {
        return Err(ctx.unsupported("the additive mask of a fused attention has no gradient"));
    }
    let d_out = ctx.dy(0)?;
    let forward_inputs = ctx.node().inputs.len();
    let mut inputs: Vec<Value> = vec![d_out];
    inputs.extend((0..4).map(|i| ctx.input(i)));
    inputs.extend([ctx.output(0), ctx.output(1)]);
    inputs.extend((4..forward_inputs).map(|i| ctx.input(i)));
    let spec = NodeSpec {
        op_type: GRAD_NAME,
        domain: DOMAIN,
        inputs: inputs.iter().map(Some).collect(),
        attributes: DropoutAttrs::read(ctx.node()).write(),
        outputs: 3,
    };
    let mut grads: Vec<Option<Value>> = ctx.graph().node(spec)?.into_iter().map(Some).collect();
    grads.resize(forward_inputs, None);
    Ok(grads)
}

/// The forward operator, for ONNX Runtime sessions.
pub(crate) struct AttentionOp;

/// The backward operator, for ONNX Runtime sessions.
pub(crate) struct AttentionGradOp;

fn floats(n: usize) -> Vec<Port> {
    vec![Port::required(ElementType::F32); n]
}

/// The optional dropout inputs: ratio and seed.
fn dropout_ports() -> [Port; 2] {
    [Port::optional(ElementType::F32), Port::optional(ElementType::I64)]
}

impl CustomOp for AttentionOp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        let mut ports = floats(4);
        ports.extend(dropout_ports());
        ports
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::optional(ElementType::F32)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(Forward(DropoutAttrs::read(attributes))))
    }
}

impl CustomOp for AttentionGradOp {
    fn name(&self) -> &'static str {
        GRAD_NAME
    }

    fn inputs(&self) -> Vec<Port> {
        let mut ports = floats(7);
        ports.extend(dropout_ports());
        ports
    }

    fn outputs(&self) -> Vec<Port> {
        floats(3)
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(Backward(DropoutAttrs::read(attributes))))
    }
}

/// Input `i` as float data and its shape.
fn input<'a>(inputs: &[Option<TensorRef<'a>>], i: usize, what: &str) -> Result<(Vec<usize>, &'a [f32]), String> {
    let tensor = inputs.get(i).copied().flatten().ok_or(format!("missing {what}"))?;
    let data = tensor.f32().ok_or(format!("{what} must be float"))?;
    Ok((tensor.shape().iter().map(|d| *d as usize).collect(), data))
}

/// The sizes from Q, Kᵀ and V, checked against each other.
fn sizes(q: &[usize], kt: &[usize], v: &[usize]) -> Result<Sizes, String> {
    let (Ok([batch, heads, queries, depth]), Ok([kb, kh, kd, keys]), Ok([vb, vh, vk, width])) =
        (<[usize; 4]>::try_from(q), <[usize; 4]>::try_from(kt), <[usize; 4]>::try_from(v))
    else {
        return Err(format!("Q {q:?}, Kᵀ {kt:?} and V {v:?} must have rank 4"));
    };
    if (kb, kh, kd) != (batch, heads, depth) || (vb, vh, vk) != (batch, heads, keys) {
        return Err(format!("Q {q:?}, Kᵀ {kt:?} and V {v:?} do not fit together"));
    }
    Ok(Sizes { batch, heads, queries, keys, depth, width })
}

/// The call's sizes, mask and dropout from inputs Q, Kᵀ, V and mask at `first`, ratio and seed
/// at `first + 4`.
fn call<'a>(inputs: &[Option<TensorRef<'a>>], first: usize, site: u64) -> Result<(Call<'a>, [&'a [f32]; 3]), String> {
    let (q_dims, q) = input(inputs, first, "Q")?;
    let (kt_dims, kt) = input(inputs, first + 1, "Kᵀ")?;
    let (v_dims, v) = input(inputs, first + 2, "V")?;
    let (mask_dims, mask) = input(inputs, first + 3, "the mask")?;
    let sizes = sizes(&q_dims, &kt_dims, &v_dims)?;
    let mask = Mask::new(mask, &mask_dims, sizes)?;
    let dropout =
        optional_draws(inputs.get(first + 4).copied().flatten(), inputs.get(first + 5).copied().flatten(), site)?;
    Ok((Call { sizes, mask, dropout }, [q, kt, v]))
}

/// Head `head`'s slices of Q, Kᵀ and V.
fn head_inputs<'a>(sizes: Sizes, [q, kt, v]: [&'a [f32]; 3], head: usize) -> HeadInputs<'a> {
    let (nq, nk, nv, _) = sizes.per_head();
    HeadInputs { q: &q[head * nq..][..nq], kt: &kt[head * nk..][..nk], v: &v[head * nv..][..nv] }
}

fn float_output<'o, 'a>(outputs: &'o mut [Option<TensorMut<'a>>], i: usize) -> Option<&'o mut [f32]> {
    match outputs.get_mut(i) {
        Some(Some(TensorMut::F32(data))) => Some(&mut **data),
        _ => None,
    }
}

struct Forward(DropoutAttrs);

impl Kernel for Forward {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        // The kernel's own reading of the operands refuses what it could not compute.
        call(inputs, 0, self.0.site)?;
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let (call, tensors) = call(inputs, 0, self.0.site)?;
        let sizes = call.sizes;
        let (_, _, _, per_out) = sizes.per_head();
        let heads = sizes.batch * sizes.heads;
        let (first, rest) = outputs.split_at_mut(1);
        let out = float_output(first, 0).ok_or("no output")?;
        // Without the lse output (inference), the heads write their statistics to scratch.
        let mut scratch;
        let lse = match float_output(rest, 0) {
            Some(lse) => lse,
            None => {
                scratch = vec![0.0; heads * sizes.queries];
                &mut scratch[..]
            }
        };
        let tasks = out.chunks_mut(per_out).zip(lse.chunks_mut(sizes.queries)).collect();
        for_each_part(threads, tasks, |head, (out, lse)| {
            math::forward_head(&call, head, head_inputs(sizes, tensors, head), out, lse);
        });
        Ok(())
    }
}

struct Backward(DropoutAttrs);

impl Kernel for Backward {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, grad_outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        // Inputs: dOut, then Q, Kᵀ, V, mask, then out and lse, then ratio and seed.
        let mut forward_inputs: Vec<Option<TensorRef<'_>>> = inputs.get(1..5).ok_or("missing inputs")?.to_vec();
        forward_inputs.extend(inputs.iter().skip(7).copied());
        let (call, tensors) = call(&forward_inputs, 0, self.0.site)?;
        let sizes = call.sizes;
        let (nq, nk, nv, per_out) = sizes.per_head();
        let (out_dims, d_out) = input(inputs, 0, "dOut")?;
        let (saved_dims, out) = input(inputs, 5, "the forward output")?;
        let (lse_dims, lse) = input(inputs, 6, "the row statistics")?;
        let out_shape = [sizes.batch, sizes.heads, sizes.queries, sizes.width];
        if out_dims != out_shape || saved_dims != out_shape || lse_dims != out_shape[..3] {
            return Err(format!(
                "dOut {out_dims:?}, the output {saved_dims:?} and the statistics {lse_dims:?} do not fit {out_shape:?}"
            ));
        }
        let [dq, dkt, dv] = outputs else { return Err("three outputs expected".into()) };
        let (Some(TensorMut::F32(dq)), Some(TensorMut::F32(dkt)), Some(TensorMut::F32(dv))) = (dq, dkt, dv) else {
            return Err("dQ, dKᵀ and dV must all be asked for".into());
        };
        let tasks = dq
            .chunks_mut(nq)
            .zip(dkt.chunks_mut(nk))
            .zip(dv.chunks_mut(nv))
            .map(|((dq, dkt), dv)| HeadGrads { dq, dkt, dv })
            .collect();
        for_each_part(threads, tasks, |head, HeadGrads { dq, dkt, dv }| {
            let grads = HeadGrads { dq, dkt, dv };
            let saved = Saved {
                out: &out[head * per_out..][..per_out],
                lse: &lse[head * sizes.queries..][..sizes.queries],
                d_out: &d_out[head * per_out..][..per_out],
            };
            math::backward_head(&call, head, head_inputs(sizes, tensors, head), saved, grads);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_runtime::Serial;

    use super::*;

    #[test]
    fn the_kernels_read_shapes_run_without_statistics_and_refuse_what_does_not_fit() {
        let (q, kt, v) = (vec![0.5f32; 2 * 3 * 4], vec![0.25f32; 2 * 4 * 5], vec![1.0f32; 2 * 5 * 6]);
        let mask = vec![0.0f32; 5];
        let (ratio, seed) = ([0.2f32], [3i64]);
        let inputs = [
            Some(TensorRef::F32(&[1, 2, 3, 4], &q)),
            Some(TensorRef::F32(&[1, 2, 4, 5], &kt)),
            Some(TensorRef::F32(&[1, 2, 5, 6], &v)),
            Some(TensorRef::F32(&[1, 1, 1, 5], &mask)),
            Some(TensorRef::F32(&[], &ratio)),
            Some(TensorRef::I64(&[1], &seed)),
        ];
        let forward = Forward(DropoutAttrs { site: 1 });
        assert_eq!(forward.output_shapes(&inputs).expect("shapes"), vec![vec![1, 2, 3, 6], vec![1, 2, 3]]);
        let (mut out, mut lse) = (vec![0.0f32; 36], vec![0.0f32; 6]);
        forward
            .compute(&inputs, &mut [Some(TensorMut::F32(&mut out)), Some(TensorMut::F32(&mut lse))], &Serial)
            .expect("forward");
        // Uniform scores: every kept probability is 1/5 scaled by 1/0.8, times V's ones.
        assert!(out.iter().all(|o| o.rem_euclid(0.25) < 1e-6 && *o <= 1.25 + 1e-6), "{out:?}");
        let mut alone = vec![0.0f32; 36];
        forward.compute(&inputs, &mut [Some(TensorMut::F32(&mut alone)), None], &Serial).expect("no statistics");
        assert_eq!(alone, out);

        let d_out = vec![1.0f32; 36];
        let mut grad_inputs = vec![Some(TensorRef::F32(&[1, 2, 3, 6], &d_out))];
        grad_inputs.extend_from_slice(&inputs[..4]);
        grad_inputs.extend([Some(TensorRef::F32(&[1, 2, 3, 6], &out)), Some(TensorRef::F32(&[1, 2, 3], &lse))]);
        grad_inputs.extend_from_slice(&inputs[4..]);
        let backward = Backward(DropoutAttrs { site: 1 });
        assert_eq!(
            backward.output_shapes(&grad_inputs).expect("shapes"),
            vec![vec![1, 2, 3, 4], vec![1, 2, 4, 5], vec![1, 2, 5, 6]]
        );
        let (mut dq, mut dkt, mut dv) = (vec![f32::NAN; 24], vec![f32::NAN; 40], vec![f32::NAN; 60]);
        let outputs =
            &mut [Some(TensorMut::F32(&mut dq)), Some(TensorMut::F32(&mut dkt)), Some(TensorMut::F32(&mut dv))];
        backward.compute(&grad_inputs, outputs, &Serial).expect("backward");
        assert!(dq.iter().chain(&dkt).chain(&dv).all(|g| g.is_finite()));

        let short_v = [inputs[0], inputs[1], Some(TensorRef::F32(&[1, 2, 4, 6], &v[..48])), inputs[3]];
        let err = forward.output_shapes(&short_v).expect_err("V has 4 keys");
        assert!(err.contains("do not fit"), "{err}");
        let wide_mask = [inputs[0], inputs[1], inputs[2], Some(TensorRef::F32(&[1, 1, 2, 5], &[0.0; 10]))];
        assert!(forward.output_shapes(&wide_mask).expect_err("mask").contains("does not broadcast"));
    }
}
