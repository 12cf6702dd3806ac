//! Reducing a gradient over the axes that numpy broadcasting expanded.

use ringtune_onnx_ir::{Dim, Graph, Shape, Value};

use crate::AutodiffError;

/// Sums `grad`, shaped like a node output of shape `out`, down to the shape of `input`.
pub(crate) fn reduce_to(graph: &mut Graph, grad: &Value, out: &Shape, input: &Value) -> Result<Value, AutodiffError> {
    let in_shape = graph.shape(input)?.clone();
    if &in_shape == out {
        return Ok(grad.clone());
    }
    let undecidable = || {
        AutodiffError::Graph(ringtune_onnx_ir::IrError::Invalid(format!(
            "cannot tell which axes of `{}` ({in_shape:?}) were broadcast to {out:?}",
            input.name()
        )))
    };
    let lead = out.len().checked_sub(in_shape.len()).ok_or_else(undecidable)?;
    let mut axes: Vec<i64> = (0..lead as i64).collect();
    for (i, d) in in_shape.iter().enumerate() {
        match (d, &out[lead + i]) {
            (Dim::Known(1), Dim::Known(1)) => {}
            (Dim::Known(1), _) => axes.push((lead + i) as i64),
            (Dim::Unknown, o) if *o != Dim::Known(1) => return Err(undecidable()),
            _ => {}
        }
    }
    if axes.is_empty() {
        return Ok(grad.clone());
    }
    if axes.len() == lead {
        // Only leading axes: one reduction that drops them.
        return Ok(graph.reduce_sum(grad, &axes, false)?);
    }
    let reduced = graph.reduce_sum(grad, &axes, true)?;
    if lead == 0 {
        return Ok(reduced);
    }
    let leading: Vec<i64> = (0..lead as i64).collect();
    Ok(graph.squeeze(&reduced, &leading)?)
}
