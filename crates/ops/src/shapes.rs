//! One shape rule per operator, for the graph and for the kernel.
//!
//! An operator's rule maps its inputs ([`Operand`]s: element type and dimensions, `None` for an
//! absent optional input) and its parsed attributes to its outputs' types. A graph runs it on
//! symbolic dimensions ([`in_graph`], through `ringtune-onnx-ir`'s inference); a kernel on the
//! tensors' sizes ([`in_kernel`], when ONNX Runtime asks for the outputs' shapes). So the two
//! cannot disagree, as tract's op types own one `output_facts`.

use ringtune_onnx_ir::{DType, Dim, InferCtx, Shape, ValueType};
use ringtune_runtime::TensorRef;

/// An input as a shape rule sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Operand {
    pub(crate) dtype: DType,
    /// `None`: the rank is not known.
    pub(crate) dims: Option<Shape>,
}

impl Operand {
    /// The dimensions, which must be known (`what` names the input in the error).
    pub(crate) fn ranked(&self, what: &str) -> Result<&Shape, String> {
        self.dims.as_ref().ok_or_else(|| format!("{what} needs a known rank"))
    }

    /// An output of this input's type and dimensions.
    pub(crate) fn like(&self) -> ValueType {
        ValueType { dtype: self.dtype, shape: self.dims.clone() }
    }
}

/// Input `i` of `inputs`, which must be present (`what` names it in the error).
pub(crate) fn input<'a>(inputs: &'a [Option<Operand>], i: usize, what: &str) -> Result<&'a Operand, String> {
    inputs.get(i).and_then(Option::as_ref).ok_or_else(|| format!("{what} (input {i}) is required"))
}

/// Input `i`, which must be float.
pub(crate) fn float<'a>(inputs: &'a [Option<Operand>], i: usize, what: &str) -> Result<&'a Operand, String> {
    let operand = input(inputs, i, what)?;
    if operand.dtype != DType::F32 {
        return Err(format!("{what} must be float"));
    }
    Ok(operand)
}

/// Shape rule of the operators that pass their first input through (`ParamReady`,
/// `RunAfter`): the output has its type.
pub(crate) fn passed_through(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    Ok(vec![input(inputs, 0, "the value")?.like()])
}

/// Runs `rule` on a graph node's inputs.
pub(crate) fn in_graph(
    ctx: &InferCtx<'_>,
    rule: impl FnOnce(&[Option<Operand>]) -> Result<Vec<ValueType>, String>,
) -> Result<Vec<ValueType>, String> {
    let inputs: Vec<Option<Operand>> = (0..ctx.node().inputs.len())
        .map(|i| {
            let dtype = ctx.has_input(i).then(|| ctx.dtype(i).ok()).flatten()?;
            Some(Operand { dtype, dims: ctx.shape(i).ok().flatten().cloned() })
        })
        .collect();
    rule(&inputs)
}

/// Runs `rule` on a kernel's input tensors; the outputs' sizes.
pub(crate) fn in_kernel(
    tensors: &[Option<TensorRef<'_>>],
    rule: impl FnOnce(&[Option<Operand>]) -> Result<Vec<ValueType>, String>,
) -> Result<Vec<Vec<i64>>, String> {
    let inputs: Vec<Option<Operand>> = tensors
        .iter()
        .map(|t| {
            t.map(|t| {
                let dtype = match t {
                    TensorRef::F32(..) => DType::F32,
                    TensorRef::I64(..) => DType::I64,
                    TensorRef::Bool(..) => DType::Bool,
                };
                Operand { dtype, dims: Some(t.shape().iter().map(|&d| Dim::Known(d)).collect()) }
            })
        })
        .collect();
    rule(&inputs)?
        .into_iter()
        .enumerate()
        .map(|(o, ty)| {
            let dims = ty.shape.ok_or_else(|| format!("output {o} has no known rank"))?;
            dims.iter()
                .map(|d| match d {
                    Dim::Known(n) => Ok(*n),
                    other => Err(format!("output {o} has a dimension {other:?} the inputs do not fix")),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use ringtune_onnx_ir::shape;

    use super::*;

    fn last_axis(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
        let x = float(inputs, 0, "X")?.ranked("X")?;
        Ok(vec![ValueType::new(DType::F32, x[x.len() - 1..].to_vec())])
    }

    #[test]
    fn a_kernel_gets_sizes_from_the_rule_and_errors_name_the_input() {
        let data = [0.0f32; 6];
        let x = TensorRef::F32(&[2, 3], &data);
        assert_eq!(in_kernel(&[Some(x)], last_axis).expect("sizes"), vec![vec![3]]);
        assert!(in_kernel(&[None], last_axis).expect_err("absent").contains("X (input 0) is required"));
        let ids = TensorRef::I64(&[2], &[1, 2]);
        assert_eq!(in_kernel(&[Some(ids)], last_axis).expect_err("int"), "X must be float");
        let symbolic = |_: &[Option<Operand>]| Ok(vec![ValueType::new(DType::F32, shape(&["batch"]))]);
        assert!(in_kernel(&[], symbolic).expect_err("symbolic").contains("do not fix"));
    }
}
