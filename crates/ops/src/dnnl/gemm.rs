//! `DnnlGemm(A, B, C?)`: a 2-D product on oneDNN with transposes and a broadcast bias
//! (`alpha = beta = 1`), at a `precision` (see [`super::ProductAttrs`]).

use std::sync::Arc;

use ringtune_onednn::{Bias, Engine};
use ringtune_onnx_ir::{Dim, Graph, Node, ValueType};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef};

use super::{dims, operands, product_dims, ProductAttrs, Rewrite};
use crate::shapes::{self, input, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "DnnlGemm";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, |inputs| outputs(inputs, ProductAttrs::read(ctx.node()))),
    gradient: Gradient::None,
    kernel: KernelSource::OneDnn(|engine| Arc::new(DnnlGemm(engine.clone()))),
};

/// Shape rule: `[m, n]` of the transposed operands.
fn outputs(inputs: &[Option<Operand>], attrs: ProductAttrs) -> Result<Vec<ValueType>, String> {
    let a_in = input(inputs, 0, "A")?;
    let (a, b) = (a_in.ranked("A")?, input(inputs, 1, "B")?.ranked("B")?);
    if a.len() != 2 || b.len() != 2 {
        return Err(format!("{NAME} takes 2-D operands"));
    }
    let m = if attrs.trans_a { &a[1] } else { &a[0] };
    let n = if attrs.trans_b { &b[0] } else { &b[1] };
    Ok(vec![ValueType::new(a_in.dtype, vec![m.clone(), n.clone()])])
}

/// A `Gemm` with `alpha = beta = 1` whose bias broadcasts as a row, a column or a full matrix.
pub(crate) fn rewrite(graph: &Graph, node: &Node) -> Option<Rewrite> {
    if node.float("alpha").unwrap_or(1.0) != 1.0 || node.float("beta").unwrap_or(1.0) != 1.0 {
        return None;
    }
    let trans = (node.int("transA").unwrap_or(0) != 0, node.int("transB").unwrap_or(0) != 0);
    if let Some(c) = node.input(2) {
        let (a, b) = (dims(graph, node.input(0)?)?, dims(graph, node.input(1)?)?);
        let m = if trans.0 { &a[1] } else { &a[0] };
        let n = if trans.1 { &b[0] } else { &b[1] };
        let one = Dim::Known(1);
        let fits = match dims(graph, c)?.as_slice() {
            [x] => x == n,
            [x, y] => (x == &one && y == n) || (x == m && (y == n || (y == &one && m != &one))),
            _ => false,
        };
        if !fits {
            return None;
        }
    }
    Some((NAME, node.inputs.clone(), trans))
}

/// How a bias of shape `c` broadcasts over `[m, n]`.
pub(crate) fn bias_kind(c: &[i64], m: i64, n: i64) -> Result<Bias, String> {
    match c {
        [x] if *x == n => Ok(Bias::Row),
        [1, x] if *x == n => Ok(Bias::Row),
        // Also for m = 1: a symbolic batch the rewrite took for more can be 1 at run time.
        [x, 1] if *x == m => Ok(Bias::Column),
        [x, y] if *x == m && *y == n => Ok(Bias::Full),
        _ => Err(format!("bias of shape {c:?} does not broadcast to [{m}, {n}]")),
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct DnnlGemm(pub(crate) Arc<Engine>);

impl CustomOp for DnnlGemm {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::F32), Port::optional(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(GemmKernel { engine: self.0.clone(), attrs: ProductAttrs::read(attributes) }))
    }
}

struct GemmKernel {
    engine: Arc<Engine>,
    attrs: ProductAttrs,
}

impl GemmKernel {
    fn spec(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<ringtune_onednn::Matmul, String> {
        let (a, b) = operands(inputs)?;
        let mut spec = product_dims(a.shape(), b.shape(), self.attrs)?;
        if !spec.batch_a.is_empty() {
            return Err(format!("{NAME} takes 2-D operands, got {:?} and {:?}", a.shape(), b.shape()));
        }
        if let Some(Some(c)) = inputs.get(2) {
            spec.bias = Some(bias_kind(c.shape(), spec.m, spec.n)?);
        }
        Ok(spec)
    }
}

impl Kernel for GemmKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        // The kernel's own reading of the operands refuses what it could not compute.
        self.spec(inputs)?;
        shapes::in_kernel(inputs, |inputs| outputs(inputs, self.attrs))
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        let spec = self.spec(inputs)?;
        let (a, b) = operands(inputs)?;
        let bias = match inputs.get(2) {
            Some(Some(c)) => Some(c.f32().ok_or("C must be float")?),
            _ => None,
        };
        let Some(Some(TensorMut::F32(out))) = outputs.first_mut() else { return Err("no output".into()) };
        let (a, b) = (a.f32().ok_or("A must be float")?, b.f32().ok_or("B must be float")?);
        self.engine.matmul(&spec, a, b, bias, out).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn biases_broadcast_as_rows_columns_or_matrices() {
        assert_eq!(bias_kind(&[6], 4, 6), Ok(Bias::Row));
        assert_eq!(bias_kind(&[1, 6], 4, 6), Ok(Bias::Row));
        assert_eq!(bias_kind(&[4, 1], 4, 6), Ok(Bias::Column));
        assert_eq!(bias_kind(&[1, 1], 1, 6), Ok(Bias::Column));
        assert_eq!(bias_kind(&[4, 6], 4, 6), Ok(Bias::Full));
        assert!(bias_kind(&[3], 4, 6).is_err());
    }
}
