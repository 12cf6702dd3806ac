//! `ScatterNdAdd(data, indices, updates)` in the `ai.ringtune` domain: ONNX `ScatterND` with
//! `reduction = add`, adding the updates in index order.
//!
//! Why not ONNX Runtime's own: with more than one thread it adds the updates of repeated
//! indices in whatever order its threads reach them, so the embedding gradients (where `[CLS]`,
//! `[SEP]` and token type 0 repeat in every row) differed in their last bits from run to run.
//! In order, on one thread, the result is the same bits every time; at a few megabytes per
//! step it costs about what the parallel version did.

use ort::operator::{BoxedKernel, ComputeContext, KernelContext, Operator, OperatorInput, OperatorOutput};
use ort::value::TensorElementType;

use crate::kernels::fail;

/// The operator's name in the `ai.ringtune` domain.
pub const SCATTER_ND_ADD: &str = "ScatterNdAdd";

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
        _ => return Err(format!("{SCATTER_ND_ADD}: indices of shape {indices_shape:?} for data {data_shape:?}")),
    };
    let dims: Vec<usize> = data_shape.iter().map(|&d| d.max(0) as usize).collect();
    let slice: usize = dims[k..].iter().product();
    let tuples = indices.len() / k;
    if data.len() != out.len() || updates.len() != tuples * slice {
        return Err(format!(
            "{SCATTER_ND_ADD}: {} updates for {tuples} indices of slices of {slice} (data {data_shape:?})",
            updates.len()
        ));
    }
    out.copy_from_slice(data);
    for (tuple, update) in indices.chunks_exact(k).zip(updates.chunks_exact(slice.max(1))) {
        let mut offset = 0usize;
        for (axis, (&index, &dim)) in tuple.iter().zip(&dims).enumerate() {
            let resolved = if index < 0 { index + dim as i64 } else { index };
            if !(0..dim as i64).contains(&resolved) {
                return Err(format!("{SCATTER_ND_ADD}: index {index} on axis {axis} of size {dim}"));
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

/// The operator: inputs `data` (f32), `indices` (int64), `updates` (f32); output like `data`.
pub(crate) struct ScatterNdAdd;

impl Operator for ScatterNdAdd {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        SCATTER_ND_ADD
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Int64),
            OperatorInput::required(TensorElementType::Float32),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32)]
    }

    fn create_kernel<'attr>(&self, _: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        Ok(Box::new(|ctx: &ComputeContext| {
            let input =
                |i: usize, what: &str| ctx.input(i)?.ok_or_else(|| fail(format!("{SCATTER_ND_ADD}: missing {what}")));
            let (data, indices, updates) = (input(0, "data")?, input(1, "indices")?, input(2, "updates")?);
            let (data_shape, data) = data.try_extract_tensor::<f32>()?;
            let (indices_shape, indices) = indices.try_extract_tensor::<i64>()?;
            let (_, updates) = updates.try_extract_tensor::<f32>()?;
            let mut out =
                ctx.output(0, data_shape.to_vec())?.ok_or_else(|| fail(format!("{SCATTER_ND_ADD}: no output")))?;
            let (_, out) = out.try_extract_tensor_mut::<f32>()?;
            scatter_nd_add(data_shape, data, indices_shape, indices, updates, out).map_err(fail)
        }))
    }
}

#[cfg(test)]
mod tests {
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
}
