//! `DnnlMatMul(A, B)`: a batched product on oneDNN (numpy broadcasting of the batch axes) with
//! `transA`/`transB` on the last two axes and a `precision` (0 fp32, 1 bf16: inputs rounded to
//! bf16, fp32 accumulation and output).

use std::sync::Arc;

use ringtune_onednn::Engine;
use ringtune_onnx_ir::{matmul_shape, Graph, Node, ValueType};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef};

use super::{dims, operands, product_dims, ProductAttrs, Rewrite};
use crate::shapes::{self, input, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "DnnlMatMul";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, |inputs| outputs(inputs, ProductAttrs::read(ctx.node()))),
    gradient: Gradient::None,
    kernel: KernelSource::OneDnn(|engine| Arc::new(DnnlMatMul(engine.clone()))),
};

/// Shape rule: `MatMul`'s, with the transposes applied.
fn outputs(inputs: &[Option<Operand>], attrs: ProductAttrs) -> Result<Vec<ValueType>, String> {
    let a = input(inputs, 0, "A")?;
    let out = matmul_shape(a.ranked("A")?, input(inputs, 1, "B")?.ranked("B")?, attrs.trans_a, attrs.trans_b)?;
    Ok(vec![ValueType::new(a.dtype, out)])
}

/// A `MatMul` of rank 2 or more, with the swapping transposes it alone reads folded in.
pub(crate) fn rewrite(graph: &Graph, node: &Node) -> Option<Rewrite> {
    let mut inputs = node.inputs.clone();
    let mut trans = [false, false];
    for (k, slot) in inputs.iter_mut().enumerate().take(2) {
        if dims(graph, slot)?.len() < 2 {
            return None;
        }
        if let Some(source) = swapped_transpose_input(graph, slot) {
            *slot = source;
            trans[k] = true;
        }
    }
    Some((NAME, inputs, (trans[0], trans[1])))
}

/// The input of the `Transpose` producing `name`, when it only swaps the last two axes and
/// nothing else reads its output.
fn swapped_transpose_input(graph: &Graph, name: &str) -> Option<String> {
    let producer = graph.producer(name)?;
    if producer.op_type != "Transpose" || !producer.domain.is_empty() {
        return None;
    }
    let perm = producer.ints("perm")?;
    let r = perm.len();
    let swaps_last_two = r >= 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| p == i as i64)
        && perm[r - 2] == r as i64 - 1
        && perm[r - 1] == r as i64 - 2;
    let only_reader = graph.consumers(name).len() == 1 && !graph.outputs.iter().any(|o| o == name);
    (swaps_last_two && only_reader).then(|| producer.inputs[0].clone())
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct DnnlMatMul(pub(crate) Arc<Engine>);

impl CustomOp for DnnlMatMul {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(MatMulKernel { engine: self.0.clone(), attrs: ProductAttrs::read(attributes) }))
    }
}

struct MatMulKernel {
    engine: Arc<Engine>,
    attrs: ProductAttrs,
}

impl MatMulKernel {
    fn spec(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<ringtune_onednn::Matmul, String> {
        let (a, b) = operands(inputs)?;
        product_dims(a.shape(), b.shape(), self.attrs)
    }
}

impl Kernel for MatMulKernel {
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
        let Some(Some(TensorMut::F32(out))) = outputs.first_mut() else { return Err("no output".into()) };
        let (a, b) = (a.f32().ok_or("A must be float")?, b.f32().ok_or("B must be float")?);
        self.engine.matmul(&spec, a, b, None, out).map_err(|e| e.to_string())
    }
}
