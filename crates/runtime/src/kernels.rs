//! Our ONNX Runtime custom operators, in the `ai.ringtune` domain: oneDNN matrix products,
//! seeded dropout ([`crate::dropout`]) and in-order scatter-add ([`crate::scatter`]).
//!
//! `DnnlMatMul(A, B)` is a batched product (numpy broadcasting of the batch axes) with
//! `transA`/`transB` on the last two axes; `DnnlGemm(A, B, C?)` is a 2-D product with
//! transposes and a broadcast bias (`alpha = beta = 1`). Attribute `precision` is 0 for fp32,
//! 1 for bf16 (inputs rounded to bf16, fp32 accumulation and output).

use std::sync::{Arc, OnceLock};

use onednn::{Bias, Engine, Matmul, Precision};
use ort::operator::{
    BoxedKernel, ComputeContext, KernelContext, Operator, OperatorDomain, OperatorInput, OperatorOutput,
};
use ort::value::TensorElementType;

use crate::dropout::SeededDropout;
use crate::scatter::ScatterNdAdd;
use crate::{Result, RuntimeError};

/// The custom-operator domain.
pub const DOMAIN: &str = "ai.ringtune";
/// Batched matrix product on oneDNN.
pub const MATMUL: &str = "DnnlMatMul";
/// 2-D product with bias on oneDNN.
pub const GEMM: &str = "DnnlGemm";

/// Which kernels run the matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kernels {
    /// ONNX Runtime's own (MLAS).
    #[default]
    Mlas,
    /// oneDNN, through the `ai.ringtune` custom operators, at this precision.
    OneDnn(Precision),
}

static ENGINE: OnceLock<std::result::Result<Arc<Engine>, String>> = OnceLock::new();

/// The process's oneDNN engine, loaded on first use.
pub fn onednn() -> Result<Arc<Engine>> {
    ENGINE
        .get_or_init(|| Engine::load_default().map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(RuntimeError::Binding)
}

/// The operator domain every session registers: seeded dropout, in-order scatter-add, and the
/// oneDNN products when `engine` is given.
pub(crate) fn domain(engine: Option<Arc<Engine>>) -> Result<OperatorDomain> {
    let build = || -> ort::Result<OperatorDomain> {
        let domain = OperatorDomain::new(DOMAIN)?.add(SeededDropout)?.add(ScatterNdAdd)?;
        match &engine {
            Some(engine) => domain.add(DnnlMatMul { engine: engine.clone() })?.add(DnnlGemm { engine: engine.clone() }),
            None => Ok(domain),
        }
    };
    build().map_err(|e| RuntimeError::Ort {
        context: "registering the ai.ringtune operators".into(),
        message: e.message().into(),
    })
}

fn precision(kctx: &KernelContext<'_>) -> Precision {
    match kctx.get::<i64>("precision") {
        Some(1) => Precision::Bf16,
        _ => Precision::F32,
    }
}

fn flag(kctx: &KernelContext<'_>, name: &str) -> bool {
    kctx.get::<i64>(name).unwrap_or(0) != 0
}

pub(crate) fn fail(msg: String) -> ort::Error {
    ort::Error::new(msg)
}

struct DnnlMatMul {
    engine: Arc<Engine>,
}

impl Operator for DnnlMatMul {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        MATMUL
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [OperatorInput::required(TensorElementType::Float32), OperatorInput::required(TensorElementType::Float32)]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let (trans_a, trans_b, precision) = (flag(kctx, "transA"), flag(kctx, "transB"), precision(kctx));
        let engine = self.engine.clone();
        Ok(Box::new(move |ctx: &ComputeContext| {
            let a = ctx.input(0)?.ok_or_else(|| fail("DnnlMatMul: missing A".into()))?;
            let b = ctx.input(1)?.ok_or_else(|| fail("DnnlMatMul: missing B".into()))?;
            let (a_shape, a) = a.try_extract_tensor::<f32>()?;
            let (b_shape, b) = b.try_extract_tensor::<f32>()?;
            let spec = batched_spec(a_shape, b_shape, trans_a, trans_b, precision).map_err(fail)?;
            let mut out_shape = spec.batch_out();
            // Leading axes of the longer operand only: keep the output's rank numpy-style.
            let rank = a_shape.len().max(b_shape.len());
            out_shape.drain(..out_shape.len() + 2 - rank);
            out_shape.extend([spec.m, spec.n]);
            let mut out = ctx.output(0, out_shape)?.ok_or_else(|| fail("DnnlMatMul: no output".into()))?;
            let (_, out) = out.try_extract_tensor_mut::<f32>()?;
            engine.matmul(&spec, a, b, None, out).map_err(|e| fail(e.to_string()))
        }))
    }
}

/// The product of `a` `[.., m, k]` (or `[.., k, m]` transposed) and `b`, batch axes padded
/// with ones to one rank.
fn batched_spec(
    a: &[i64],
    b: &[i64],
    trans_a: bool,
    trans_b: bool,
    precision: Precision,
) -> std::result::Result<Matmul, String> {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!("DnnlMatMul takes operands of rank 2 or more, got {a:?} and {b:?}"));
    }
    let (ra, rb) = (a.len(), b.len());
    let (m, ka) = if trans_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    let (kb, n) = if trans_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
    if ka != kb {
        return Err(format!("DnnlMatMul: inner sizes differ in {a:?} and {b:?}"));
    }
    let batch = ra.max(rb) - 2;
    let pad = |dims: &[i64]| -> Vec<i64> {
        let own = &dims[..dims.len() - 2];
        std::iter::repeat_n(1, batch - own.len()).chain(own.iter().copied()).collect()
    };
    Ok(Matmul { batch_a: pad(a), batch_b: pad(b), m, k: ka, n, trans_a, trans_b, bias: None, precision })
}

struct DnnlGemm {
    engine: Arc<Engine>,
}

impl Operator for DnnlGemm {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        GEMM
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::optional(TensorElementType::Float32),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let (trans_a, trans_b, precision) = (flag(kctx, "transA"), flag(kctx, "transB"), precision(kctx));
        let engine = self.engine.clone();
        Ok(Box::new(move |ctx: &ComputeContext| {
            let a = ctx.input(0)?.ok_or_else(|| fail("DnnlGemm: missing A".into()))?;
            let b = ctx.input(1)?.ok_or_else(|| fail("DnnlGemm: missing B".into()))?;
            let c = ctx.input(2)?;
            let (a_shape, a) = a.try_extract_tensor::<f32>()?;
            let (b_shape, b) = b.try_extract_tensor::<f32>()?;
            let mut spec = batched_spec(a_shape, b_shape, trans_a, trans_b, precision).map_err(fail)?;
            if !spec.batch_a.is_empty() {
                return Err(fail(format!("DnnlGemm takes 2-D operands, got {a_shape:?} and {b_shape:?}")));
            }
            let bias = match &c {
                None => None,
                Some(c) => {
                    let (c_shape, c) = c.try_extract_tensor::<f32>()?;
                    spec.bias = Some(bias_kind(c_shape, spec.m, spec.n).map_err(fail)?);
                    Some(c)
                }
            };
            let mut out = ctx.output(0, vec![spec.m, spec.n])?.ok_or_else(|| fail("DnnlGemm: no output".into()))?;
            let (_, out) = out.try_extract_tensor_mut::<f32>()?;
            engine.matmul(&spec, a, b, bias, out).map_err(|e| fail(e.to_string()))
        }))
    }
}

/// How a `Gemm` bias of shape `c` broadcasts over `[m, n]`.
pub fn bias_kind(c: &[i64], m: i64, n: i64) -> std::result::Result<Bias, String> {
    match c {
        [x] if *x == n => Ok(Bias::Row),
        [1, x] if *x == n => Ok(Bias::Row),
        [x, 1] if *x == m && m != 1 => Ok(Bias::Column),
        [x, y] if *x == m && *y == n => Ok(Bias::Full),
        _ => Err(format!("DnnlGemm: bias of shape {c:?} does not broadcast to [{m}, {n}]")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_from_shapes() {
        let s = batched_spec(&[2, 3, 4, 5], &[5, 6], false, false, Precision::F32).expect("spec");
        assert_eq!((s.batch_a, s.batch_b, s.m, s.k, s.n), (vec![2, 3], vec![1, 1], 4, 5, 6));
        let t = batched_spec(&[5, 4], &[6, 5], true, true, Precision::F32).expect("spec");
        assert_eq!((t.m, t.k, t.n), (4, 5, 6));
        assert!(batched_spec(&[4, 5], &[4, 5], false, false, Precision::F32).is_err());
        assert_eq!(bias_kind(&[6], 4, 6), Ok(Bias::Row));
        assert_eq!(bias_kind(&[4, 1], 4, 6), Ok(Bias::Column));
        assert!(bias_kind(&[3], 4, 6).is_err());
    }
}
