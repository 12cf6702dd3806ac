//! `SumRows(X) -> Y`: the sum of `X` over every axis but the last (the gradient of a bias,
//! and of LayerNorm's scale and shift).
//!
//! Why not ONNX Runtime's `ReduceSum`: over the leading axis of a `[4096, 384]` gradient it
//! took about 2.7 ms on two cores, where reading the 6 MiB once takes well under one; MiniLM's
//! backward pass has 57 of them, 5% of a training step. Here each task sums a band of columns
//! down all rows, its running sums in registers, on ONNX Runtime's threads; the rows are summed
//! in fixed runs whose partial sums are then added in order, so the result is the same bits
//! whatever the thread count, and rounding grows with the square root of the run count rather
//! than with the row count.
//!
//! The rewrite runs after differentiation (the reductions come from it), on the oneDNN path
//! only: the MLAS path stays plain ONNX.

use std::sync::Arc;

use ringtune_onnx_ir::{DType, Graph, IrError, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "SumRows";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::None,
    kernel: KernelSource::OneDnn(|_| Arc::new(SumRows)),
};
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// Shape rule: the output is `X`'s last axis.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    let dims = float(inputs, 0, "X")?.ranked("X")?;
    let last = dims.last().ok_or("X must have rank 1 or more")?;
    Ok(vec![ValueType::new(DType::F32, vec![last.clone()])])
}

/// Swaps every float `ReduceSum` over all axes but the last, without kept axes, for
/// `SumRows`; returns how many.
pub fn lower(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        if !(node.domain.is_empty() && node.op_type == "ReduceSum") || node.int("keepdims").unwrap_or(1) != 0 {
            return None;
        }
        let x = Value::named(node.input(0)?);
        let rank = graph.rank_of(&x)?;
        let axes = graph.constant_value(node.input(1)?)?.as_i64s()?;
        let leading: Vec<i64> = (0..rank as i64 - 1).collect();
        let normalized: Vec<i64> = axes.iter().map(|&a| if a < 0 { a + rank as i64 } else { a }).collect();
        if rank < 2 || normalized != leading || graph.dtype(&x).ok()? != DType::F32 {
            return None;
        }
        let mut lowered = node.clone();
        lowered.op_type = NAME.into();
        lowered.domain = DOMAIN.into();
        lowered.inputs.truncate(1);
        lowered.attributes.clear();
        Some(lowered)
    })
}

/// Columns per task: eight vectors of eight, held in registers.
const BAND: usize = 64;
/// Rows per run whose partial sum is added to the total.
const RUN: usize = 128;

/// `sums[c] = sum over rows r of x[r * cols + c]`, for the columns of `sums`, starting at
/// column `first`.
fn sum_band(x: &[f32], cols: usize, first: usize, sums: &mut [f32]) {
    let width = sums.len();
    sums.fill(0.0);
    let mut partial = [0.0f32; BAND];
    for run in x.chunks(RUN * cols) {
        let partial = &mut partial[..width];
        partial.fill(0.0);
        for row in run.chunks_exact(cols) {
            for (p, v) in partial.iter_mut().zip(&row[first..first + width]) {
                *p += v;
            }
        }
        for (s, p) in sums.iter_mut().zip(partial.iter()) {
            *s += p;
        }
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct SumRows;

impl CustomOp for SumRows {
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
        Ok(Box::new(SumRowsKernel))
    }
}

struct SumRowsKernel;

fn operand<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<(&'a [i64], &'a [f32]), String> {
    let x = inputs.first().copied().flatten().ok_or("missing X")?;
    let cols = x.shape().last().ok_or("X must have rank 1 or more")?;
    if *cols <= 0 {
        return Err(format!("X has shape {:?}", x.shape()));
    }
    Ok((x.shape(), x.f32().ok_or("X must be float")?))
}

impl Kernel for SumRowsKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        // The kernel's own reading of the operands refuses what it could not compute.
        operand(inputs)?;
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let (shape, x) = operand(inputs)?;
        let cols = shape[shape.len() - 1] as usize;
        let Some(Some(TensorMut::F32(sums))) = outputs.first_mut() else { return Err("no Y".into()) };
        for_each_part(threads, sums.chunks_mut(BAND).collect(), |band, sums| sum_band(x, cols, band * BAND, sums));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::shape;
    use ringtune_runtime::Serial;

    use super::*;

    #[test]
    fn sums_every_row_of_odd_shapes() {
        for (rows, cols) in [(1, 1), (3, 70), (300, 130), (257, 5)] {
            let x: Vec<f32> = (0..rows * cols).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
            let shape = [rows as i64, 1, cols as i64];
            let inputs = [Some(TensorRef::F32(&shape, &x))];
            assert_eq!(SumRowsKernel.output_shapes(&inputs).expect("shape"), vec![vec![cols as i64]]);
            let mut sums = vec![f32::NAN; cols];
            SumRowsKernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut sums))], &Serial).expect("sum");
            for (c, s) in sums.iter().enumerate() {
                let want: f32 = (0..rows).map(|r| x[r * cols + c]).sum();
                assert_eq!(*s, want, "{rows} x {cols}, column {c}");
            }
        }
    }

    #[test]
    fn only_sums_over_all_leading_axes_are_lowered() {
        let mut g = Graph::new("sums");
        let x = g.input("x", DType::F32, shape(&[4, 3, 5])).expect("x");
        let lowered = g.reduce_sum(&x, &[0, 1], false).expect("leading");
        let negative = g.reduce_sum(&x, &[-3, -2], false).expect("negative axes");
        let kept = g.reduce_sum(&x, &[0, 1], true).expect("kept");
        let first_only = g.reduce_sum(&x, &[0], false).expect("first only");
        for v in [&lowered, &negative, &kept, &first_only] {
            g.output(v).expect("out");
        }
        assert_eq!(lower(&mut g).expect("lower"), 2);
        assert_eq!(g.producer(lowered.name()).expect("p").op_type, NAME);
        assert_eq!(g.shape(&lowered).expect("shape"), &shape(&[5]));
        assert_eq!(g.producer(kept.name()).expect("p").op_type, "ReduceSum");
        assert_eq!(g.producer(first_only.name()).expect("p").op_type, "ReduceSum");
        assert!(g.to_bytes().is_ok());
    }
}
