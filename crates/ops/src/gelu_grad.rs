//! `GeluGrad(dY, X) -> dX`: the gradient of the exact (erf) GELU in one pass over memory.
//!
//! Why: written with standard operators, `dY * (Φ(x) + x φ(x))` is ten elementwise nodes over
//! the `[tokens, intermediate]` tensor of every layer (a scale, `Erf`, `Exp`, five products and
//! sums), each reading and writing 25 MiB on MiniLM: 8% of a training step. Here `Φ` and `φ`
//! share one `e^(-x²/2)` (`fast_math::normal_cdf`), in operations that vectorise.
//!
//! On the oneDNN path the gradient rule of ONNX's `Gelu` is this operator's (a custom rule
//! replaces the standard one); the MLAS path keeps the plain chain.

use std::sync::Arc;

use ringtune_autodiff::{AutodiffError, RuleCtx};
use ringtune_onnx_ir::{NodeSpec, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

use crate::fast_math::{normal_cdf, vector_builds, CHUNK};
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "GeluGrad";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::OfOnnx { op_type: "Gelu", rule: gradient_rule },
    kernel: KernelSource::OneDnn(|_| Arc::new(GeluGrad)),
};

/// Shape rule: `dX` is like `X`.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    let (dy, x) = (float(inputs, 0, "dY")?, float(inputs, 1, "X")?);
    if let (Some(a), Some(b)) = (&dy.dims, &x.dims) {
        if a.len() != b.len() || a.iter().zip(b).any(|(a, b)| a.known().zip(b.known()).is_some_and(|(a, b)| a != b)) {
            return Err(format!("dY {a:?} and X {b:?} differ in shape"));
        }
    }
    Ok(vec![x.like()])
}

/// Gradient rule of ONNX's exact `Gelu`: one `GeluGrad(dY, X)` node.
pub(crate) fn gradient_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    if ctx.node().string("approximate").is_some_and(|a| a != "none") {
        return Err(ctx.unsupported("only the exact (erf) GELU is supported"));
    }
    // `Gelu` is a standard operator: the graph may not know ours yet.
    crate::register_shapes(ctx.graph());
    let (dy, x) = (ctx.dy(0)?, ctx.input(0));
    let spec =
        NodeSpec { op_type: NAME, domain: DOMAIN, inputs: vec![Some(&dy), Some(&x)], attributes: vec![], outputs: 1 };
    Ok(vec![Some(ctx.graph().node(spec)?.remove(0))])
}

/// `1 / sqrt(2 pi)`.
const INV_SQRT_2PI: f32 = 0.398_942_3;

vector_builds! {
    /// `dx = dy * (Φ(x) + x φ(x))`.
    pub fn gelu_grad(dy: &[f32], x: &[f32], dx: &mut [f32]) {
        gelu_grad_portable(dy, x, dx)
    }
}

#[inline(always)]
fn gelu_grad_portable(dy: &[f32], x: &[f32], dx: &mut [f32]) {
    for ((dx, dy), x) in dx.iter_mut().zip(dy).zip(x) {
        let (cdf, e) = normal_cdf(*x);
        *dx = dy * (cdf + x * INV_SQRT_2PI * e);
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct GeluGrad;

impl CustomOp for GeluGrad {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, _attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(GeluGradKernel))
    }
}

struct GeluGradKernel;

/// `dY` and `X`, of one shape.
fn operands<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<[TensorRef<'a>; 2], String> {
    let (Some(Some(dy)), Some(Some(x))) = (inputs.first(), inputs.get(1)) else { return Err("missing dY or X".into()) };
    if dy.shape() != x.shape() {
        return Err(format!("dY {:?} and X {:?} differ in shape", dy.shape(), x.shape()));
    }
    Ok([*dy, *x])
}

impl Kernel for GeluGradKernel {
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
        let [dy, x] = operands(inputs)?;
        let (dy, x) = (dy.f32().ok_or("dY must be float")?, x.f32().ok_or("X must be float")?);
        let Some(Some(TensorMut::F32(dx))) = outputs.first_mut() else { return Err("no dX".into()) };
        for_each_part(threads, dx.chunks_mut(CHUNK).collect(), |chunk, dx| {
            let range = chunk * CHUNK..chunk * CHUNK + dx.len();
            gelu_grad(&dy[range.clone()], &x[range], dx);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_runtime::Serial;

    use super::*;

    /// The build `gelu_grad` picks for this CPU gives the portable build's bits.
    #[test]
    fn the_vector_build_gives_the_portable_builds_bits() {
        let x: Vec<f32> = (0..1001).map(|i| i as f32 * 0.013 - 6.5).chain([f32::NAN, -0.0]).collect();
        let dy: Vec<f32> = (0..x.len()).map(|i| (i % 7) as f32 * 0.3 - 1.0).collect();
        let (mut got, mut want) = (vec![0.0f32; x.len()], vec![0.0f32; x.len()]);
        gelu_grad(&dy, &x, &mut got);
        gelu_grad_portable(&dy, &x, &mut want);
        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want));
    }

    /// erf by its Taylor series in f64 (to about 1e-13 for |z| up to 3.2).
    fn erf(z: f64) -> f64 {
        let (mut term, mut sum) = (z, z);
        for n in 1..150 {
            term *= -z * z / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    fn gelu(x: f64) -> f64 {
        x * 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
    }

    #[test]
    fn matches_finite_differences_of_gelu_in_f64_and_vanishes_in_the_tails() {
        let x: Vec<f32> = (0..901).map(|i| i as f32 * 0.01 - 4.5).collect();
        let dy: Vec<f32> = (0..x.len()).map(|i| 1.0 + (i % 3) as f32 * 0.5).collect();
        let mut dx = vec![f32::NAN; x.len()];
        gelu_grad(&dy, &x, &mut dx);
        for ((x, dy), got) in x.iter().zip(&dy).zip(&dx) {
            let (x, h) = (f64::from(*x), 1e-4);
            let want = f64::from(*dy) * (gelu(x + h) - gelu(x - h)) / (2.0 * h);
            assert!((f64::from(*got) - want).abs() < 1e-6 * (1.0 + want.abs()), "x {x}: {got} against {want}");
        }
        // Far out, the derivative is 1 above and 0 below, to float precision.
        let tails = [-30.0f32, -8.0, 8.0, 30.0];
        let mut dx = [f32::NAN; 4];
        gelu_grad(&[1.0; 4], &tails, &mut dx);
        assert!(dx[0] == 0.0 && dx[1].abs() < 1e-12 && (dx[2] - 1.0).abs() < 1e-7 && dx[3] == 1.0, "{dx:?}");
    }

    #[test]
    fn the_onednn_rules_differentiate_gelu_by_one_node_and_mlas_keeps_the_chain() {
        use ringtune_onnx_ir::{shape, DType, Graph};
        for (kernels, fused) in [(crate::Kernels::OneDnn(crate::Precision::F32), true), (crate::Kernels::Mlas, false)] {
            let mut g = Graph::new("gelu");
            let x = g.input("x", DType::F32, shape(&[2, 3])).expect("x");
            let y = g.gelu(&x).expect("gelu");
            let loss = g.reduce_sum(&y, &[0, 1], false).expect("sum");
            g.output(&loss).expect("out");
            let rules = crate::gradient_rules(kernels);
            let grads = ringtune_autodiff::backward_with(&mut g, &loss, &[x], &rules).expect("grads");
            g.output(&grads[0]).expect("grad");
            let count = |op: &str| g.nodes().iter().filter(|n| n.op_type == op).count();
            assert_eq!((count(NAME), count("Erf")), if fused { (1, 0) } else { (0, 1) }, "{kernels}");
            assert_eq!(g.shape(&grads[0]).expect("shape"), &shape(&[2, 3]));
        }
    }

    #[test]
    fn the_kernel_splits_any_length_and_refuses_shapes_that_differ() {
        let n = CHUNK * 2 + 7;
        let x: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.1 - 4.8).collect();
        let dy = vec![0.5f32; n];
        let shape = [n as i64];
        let inputs = [Some(TensorRef::F32(&shape, &dy)), Some(TensorRef::F32(&shape, &x))];
        let mut dx = vec![f32::NAN; n];
        GeluGradKernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut dx))], &Serial).expect("compute");
        let mut want = vec![0.0; n];
        gelu_grad(&dy, &x, &mut want);
        assert_eq!(dx, want);
        let other = [inputs[0], Some(TensorRef::F32(&[1, n as i64], &x))];
        assert!(GeluGradKernel.output_shapes(&other).expect_err("shapes").contains("differ"));
    }
}
