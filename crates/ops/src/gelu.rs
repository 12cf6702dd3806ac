//! `Gelu(X) -> Y` in the `ai.ringtune` domain: the exact (erf) GELU, `x Φ(x)`, vectorised and
//! on ONNX Runtime's threads.
//!
//! Why not ONNX Runtime's `Gelu`: on the `[tokens, intermediate]` tensor of a MiniLM layer
//! (4096 x 1536) it took about 11 ms on two cores, one element at a time through libm's `erf`,
//! and a training step runs it twice per layer (the forward pass, and the recompute before the
//! next product's weight gradient): 4% of the step. Here `Φ` is `fast_math::normal_cdf`, the
//! one [`crate::gelu_grad`] uses, so the forward and backward passes agree on the function.
//!
//! The rewrite runs on finished graphs (after differentiation and recompute, so the copies are
//! swapped too), on the oneDNN path only: the MLAS path stays plain ONNX.

use std::sync::Arc;

use ringtune_onnx_ir::{DType, Graph, IrError, Node, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

use crate::fast_math::{normal_cdf, vector_builds, CHUNK};
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "Gelu";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::None,
    kernel: KernelSource::OneDnn(|_| Arc::new(GeluOp)),
};

/// Shape rule: `Y` is like `X`.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    Ok(vec![float(inputs, 0, "X")?.like()])
}

/// Whether `node` is ONNX's exact (erf) `Gelu`.
pub(crate) fn is_onnx_exact(node: &Node) -> bool {
    node.domain.is_empty() && node.op_type == "Gelu" && node.string("approximate").is_none_or(|a| a == "none")
}

/// Swaps every float exact `Gelu` of ONNX for ours; returns how many.
pub fn lower(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        if !is_onnx_exact(node) {
            return None;
        }
        if graph.dtype(&ringtune_onnx_ir::Value::named(node.input(0)?)).ok()? != DType::F32 {
            return None;
        }
        let mut lowered = node.clone();
        lowered.domain = DOMAIN.into();
        lowered.attributes.clear();
        Some(lowered)
    })
}

vector_builds! {
    /// `y = x Φ(x)`.
    pub fn gelu(x: &[f32], y: &mut [f32]) {
        gelu_portable(x, y)
    }
}

#[inline(always)]
fn gelu_portable(x: &[f32], y: &mut [f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y = x * normal_cdf(*x).0;
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct GeluOp;

impl CustomOp for GeluOp {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, _attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(GeluKernel))
    }
}

struct GeluKernel;

fn operand<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<TensorRef<'a>, String> {
    inputs.first().copied().flatten().ok_or_else(|| "missing X".into())
}

impl Kernel for GeluKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let x = operand(inputs)?.f32().ok_or("X must be float")?;
        let Some(Some(TensorMut::F32(y))) = outputs.first_mut() else { return Err("no Y".into()) };
        for_each_part(threads, y.chunks_mut(CHUNK).collect(), |chunk, y| {
            gelu(&x[chunk * CHUNK..chunk * CHUNK + y.len()], y);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::{shape, Attribute, NodeSpec};
    use ringtune_runtime::Serial;

    use super::*;

    /// The build `gelu` picks for this CPU (AVX-512 or AVX2 where it has them) gives the
    /// portable build's bits, tails, NaN and signed zero included.
    #[test]
    fn the_vector_build_gives_the_portable_builds_bits() {
        let x: Vec<f32> =
            (0..1001).map(|i| i as f32 * 0.013 - 6.5).chain([f32::NAN, f32::INFINITY, -f32::INFINITY, -0.0]).collect();
        let (mut got, mut want) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        gelu(&x, &mut got);
        gelu_portable(&x, &mut want);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    /// erf by its Taylor series in f64 (to about 1e-13 for |z| up to 3.2), then by the tail's
    /// asymptotic series.
    fn erf(z: f64) -> f64 {
        if z.abs() > 3.2 {
            let w = z.abs();
            let tail = (-w * w).exp() / (w * std::f64::consts::PI.sqrt()) * (1.0 - 0.5 / (w * w) + 0.75 / w.powi(4));
            return (1.0 - tail).copysign(z);
        }
        let (mut term, mut sum) = (z, z);
        for n in 1..150 {
            term *= -z * z / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn matches_gelu_in_f64_and_keeps_the_tails_and_nans() {
        let x: Vec<f32> = (0..2001).map(|i| i as f32 * 0.01 - 10.0).collect();
        let mut y = vec![f32::NAN; x.len()];
        gelu(&x, &mut y);
        for (x, got) in x.iter().zip(&y) {
            let x64 = f64::from(*x);
            let want = x64 * 0.5 * (1.0 + erf(x64 / std::f64::consts::SQRT_2));
            assert!((f64::from(*got) - want).abs() < 2e-7 * (1.0 + x64.abs()), "x {x}: {got} against {want}");
        }
        let tails = [-100.0f32, -20.0, 20.0, 100.0, f32::NAN];
        let mut y = [0.0f32; 5];
        gelu(&tails, &mut y);
        assert_eq!(&y[..4], &[0.0, 0.0, 20.0, 100.0]);
        assert!(y[4].is_nan(), "a NaN stays a NaN");
    }

    #[test]
    fn the_kernel_splits_any_length_into_the_same_bits() {
        let n = CHUNK * 2 + 5;
        let x: Vec<f32> = (0..n).map(|i| (i % 89) as f32 * 0.1 - 4.4).collect();
        let shape = [n as i64];
        let inputs = [Some(TensorRef::F32(&shape, &x))];
        let mut y = vec![f32::NAN; n];
        GeluKernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut y))], &Serial).expect("compute");
        let mut want = vec![0.0; n];
        gelu(&x, &mut want);
        assert_eq!(y, want);
        assert_eq!(GeluKernel.output_shapes(&inputs).expect("shape"), vec![vec![n as i64]]);
    }

    #[test]
    fn the_rewrite_swaps_exact_float_gelus_only() {
        let mut g = Graph::new("gelu");
        let x = g.input("x", DType::F32, shape(&[2, 3])).expect("x");
        let exact = g.gelu(&x).expect("gelu");
        g.output(&exact).expect("out");
        let tanh = NodeSpec {
            op_type: "Gelu",
            domain: "",
            inputs: vec![Some(&x)],
            attributes: vec![("approximate", Attribute::Str("tanh".into()))],
            outputs: 1,
        };
        let tanh = g.node(tanh).expect("tanh gelu").remove(0);
        g.output(&tanh).expect("out");
        assert_eq!(lower(&mut g).expect("lower"), 1);
        let ours: Vec<_> = g.nodes().iter().filter(|n| n.domain == DOMAIN && n.op_type == NAME).collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].outputs, [exact.name()]);
        assert_eq!(g.shape(&exact).expect("shape"), &shape(&[2, 3]));
    }
}
