//! `ScatterNdAdd(data, indices, updates)`: ONNX `ScatterND` with `reduction = add`, adding the
//! updates in index order.
//!
//! Why not ONNX Runtime's own: with more than one thread it adds the updates of repeated
//! indices in whatever order its threads reach them, so the embedding gradients (where `[CLS]`,
//! `[SEP]` and token type 0 repeat in every row) differed in their last bits from run to run.
//! In order, on one thread, the result is the same bits every time; at a few megabytes per
//! step it costs about what the parallel version did.
//!
//! The rewrite runs after differentiation (the embedding gradients are where the scatters come
//! from), so the operator has no gradient rule: a node of it before differentiation is an
//! error that names it.

use std::sync::Arc;

use ringtune_onnx_ir::{DType, Graph, IrError, Value, ValueType};
use ringtune_runtime::{Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN};

/// The operator's name in the `ai.ringtune` domain.
use crate::shapes::{self, input, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "ScatterNdAdd";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::None,
    kernel: KernelSource::Any(|| Arc::new(ScatterNdAdd)),
};

/// Shape rule: the output is like `data`.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    let data = input(inputs, 0, "data")?;
    if input(inputs, 1, "indices")?.dtype != DType::I64 {
        return Err("indices must be int64".into());
    }
    if input(inputs, 2, "updates")?.dtype != data.dtype {
        return Err("updates must have the element type of data".into());
    }
    Ok(vec![data.like()])
}

/// Swaps every float `ScatterND` with `reduction = add` for `ScatterNdAdd`; returns how many.
pub fn ordered_scatters(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        let float_data = node.input(0).is_some_and(|d| graph.dtype(&Value::named(d)).ok() == Some(DType::F32));
        let scatter_add =
            node.domain.is_empty() && node.op_type == "ScatterND" && node.string("reduction") == Some("add");
        (scatter_add && float_data).then(|| {
            let mut node = node.clone();
            node.op_type = NAME.into();
            node.domain = DOMAIN.into();
            node.attributes.remove("reduction");
            node
        })
    })
}

/// `out = data`, then for each index tuple `indices[i]` (the last axis of `indices` is the
/// tuple), `out[indices[i], ..] += updates[i, ..]`, in order. Negative indices count from the
/// end, as ONNX's do; one out of range is an error naming it.
pub fn scatter_nd_add(
    data_shape: &[i64],
    data: &[f32],
    indices_shape: &[i64],
    indices: &[i64],
    updates: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    let k = match indices_shape.last() {
        Some(&k) if k >= 1 && k as usize <= data_shape.len() => k as usize,
        _ => return Err(format!("indices of shape {indices_shape:?} for data {data_shape:?}")),
    };
    let dims: Vec<usize> = data_shape.iter().map(|&d| d.max(0) as usize).collect();
    let slice: usize = dims[k..].iter().product();
    let tuples = indices.len() / k;
    if data.len() != out.len() || updates.len() != tuples * slice {
        return Err(format!(
            "{} updates for {tuples} indices of slices of {slice} (data {data_shape:?})",
            updates.len()
        ));
    }
    out.copy_from_slice(data);
    for (tuple, update) in indices.chunks_exact(k).zip(updates.chunks_exact(slice.max(1))) {
        let mut offset = 0usize;
        for (axis, (&index, &dim)) in tuple.iter().zip(&dims).enumerate() {
            let resolved = if index < 0 { index + dim as i64 } else { index };
            if !(0..dim as i64).contains(&resolved) {
                return Err(format!("index {index} on axis {axis} of size {dim}"));
            }
            offset = offset * dim + resolved as usize;
        }
        let start = offset * slice;
        for (o, u) in out[start..start + slice].iter_mut().zip(update) {
            *o += u;
        }
    }
    Ok(())
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct ScatterNdAdd;

impl CustomOp for ScatterNdAdd {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::I64), Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, _: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(ScatterKernel))
    }
}

struct ScatterKernel;

impl Kernel for ScatterKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        let input = |i: usize, what: &str| inputs.get(i).copied().flatten().ok_or(format!("missing {what}"));
        let (data, indices, updates) = (input(0, "data")?, input(1, "indices")?, input(2, "updates")?);
        let Some(Some(TensorMut::F32(out))) = outputs.first_mut() else { return Err("no output".into()) };
        scatter_nd_add(
            data.shape(),
            data.f32().ok_or("data must be float")?,
            indices.shape(),
            indices.i64().ok_or("indices must be int64")?,
            updates.f32().ok_or("updates must be float")?,
            out,
        )
    }
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::{shape, Dim};

    use super::*;

    #[test]
    fn repeated_rows_add_up_in_order() {
        // A 4 x 2 table; rows 1, 3, 1 and -1 (= 3) of updates added in.
        let data = [1.0f32; 8];
        let updates = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut out = [0.0f32; 8];
        scatter_nd_add(&[4, 2], &data, &[4, 1], &[1, 3, 1, -1], &updates, &mut out).expect("scatter");
        assert_eq!(out, [1.0, 1.0, 7.0, 9.0, 1.0, 1.0, 11.0, 13.0]);
    }

    #[test]
    fn full_tuples_address_single_elements() {
        let mut out = [0.0f32; 6];
        scatter_nd_add(&[2, 3], &[0.0; 6], &[2, 2], &[0, 2, 1, 0], &[5.0, 6.0], &mut out).expect("scatter");
        assert_eq!(out, [0.0, 0.0, 5.0, 6.0, 0.0, 0.0]);
    }

    #[test]
    fn bad_indices_and_shapes_are_errors() {
        let mut out = [0.0f32; 4];
        let err = scatter_nd_add(&[2, 2], &[0.0; 4], &[1, 1], &[2], &[1.0, 1.0], &mut out).expect_err("range");
        assert!(err.contains("index 2 on axis 0 of size 2"), "{err}");
        assert!(scatter_nd_add(&[2, 2], &[0.0; 4], &[1, 1], &[0], &[1.0], &mut out).is_err(), "short update");
        assert!(scatter_nd_add(&[2, 2], &[0.0; 4], &[1, 3], &[0, 0, 0], &[1.0], &mut out).is_err(), "long tuple");
    }

    #[test]
    fn embedding_gradients_scatter_in_order() {
        let mut g = Graph::new("s");
        let table = g.input("table", DType::F32, shape(&[10, 4])).expect("table");
        let ids = g.input("ids", DType::I64, shape(&[Dim::sym("n")])).expect("ids");
        let rows = g.gather(&table, &ids, 0).expect("gather");
        let loss = g.reduce_sum(&rows, &[0, 1], false).expect("sum");
        g.output(&loss).expect("out");
        let grads = ringtune_autodiff::backward(&mut g, &loss, std::slice::from_ref(&table)).expect("backward");
        g.output(&grads[0]).expect("grad");
        assert_eq!(ordered_scatters(&mut g).expect("swapped"), 1);
        assert!(!g.nodes().iter().any(|n| n.op_type == "ScatterND"));
        let node = g.nodes().iter().find(|n| n.op_type == NAME && n.domain == DOMAIN).expect("swapped");
        assert_eq!(node.string("reduction"), None);
        assert_eq!(g.shape(&grads[0]).expect("typed"), &shape(&[10, 4]));
        assert!(g.to_bytes().is_ok());
    }
}
