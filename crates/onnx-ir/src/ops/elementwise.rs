//! Elementwise operators: unary maps, broadcasting binary operators, `Where`, `Cast`.

use std::collections::HashMap;

use super::{InferCtx, Inferred, Rule};
use crate::{Attribute, DType, Dim, Graph, IrError, NodeSpec, Shape, Value, ValueType};

const UNARY: &[&str] =
    &["Neg", "Exp", "Log", "Sqrt", "Tanh", "Erf", "Relu", "Sigmoid", "Reciprocal", "Abs", "Identity", "Gelu"];
const BINARY: &[&str] = &["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"];
const COMPARE: &[&str] = &["Equal", "Less", "Greater", "And", "Or"];

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    for op in UNARY {
        rules.insert(op, unary);
    }
    for op in BINARY {
        rules.insert(op, binary);
    }
    for op in COMPARE {
        rules.insert(op, compare);
    }
    rules.insert("Not", unary);
    rules.insert("Sum", sum_rule);
    rules.insert("Where", where_rule);
    rules.insert("Cast", cast);
}

fn unary(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    Ok(Inferred::one(ctx.ty(0)?.clone()))
}

fn broadcast_inputs(ctx: &InferCtx<'_>, inputs: &[usize]) -> Result<Option<Shape>, String> {
    let mut out: Option<Shape> = Some(Vec::new());
    for &i in inputs {
        out = match (out, ctx.shape(i)?) {
            (Some(acc), Some(s)) => Some(broadcast_shapes(&acc, s)?),
            _ => None,
        };
    }
    Ok(out)
}

fn binary(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let (a, b) = (ctx.dtype(0)?, ctx.dtype(1)?);
    if a != b && ctx.node.op_type != "Pow" {
        return Err(format!("element types differ: {a} and {b}"));
    }
    Ok(Inferred::one(ValueType { dtype: a, shape: broadcast_inputs(ctx, &[0, 1])? }))
}

fn sum_rule(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let n = ctx.node.inputs.len();
    let dtype = ctx.dtype(0)?;
    for i in 1..n {
        if ctx.dtype(i)? != dtype {
            return Err("element types differ".into());
        }
    }
    Ok(Inferred::one(ValueType { dtype, shape: broadcast_inputs(ctx, &(0..n).collect::<Vec<_>>())? }))
}

fn compare(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    Ok(Inferred::one(ValueType { dtype: DType::Bool, shape: broadcast_inputs(ctx, &[0, 1])? }))
}

fn where_rule(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    if ctx.dtype(0)? != DType::Bool {
        return Err("the condition must be bool".into());
    }
    Ok(Inferred::one(ValueType { dtype: ctx.dtype(1)?, shape: broadcast_inputs(ctx, &[0, 1, 2])? }))
}

fn cast(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let to = match ctx.attr("to") {
        Some(Attribute::Int(code)) => DType::from_onnx(*code).ok_or_else(|| format!("unsupported `to` {code}"))?,
        _ => return Err("Cast needs an integer `to`".into()),
    };
    let mut out = Inferred::one(ValueType { dtype: to, shape: ctx.shape(0)?.cloned() });
    out.sym_value = ctx.sym(0)?.filter(|_| matches!(to, DType::I64 | DType::I32));
    Ok(out)
}

/// Multidirectional (numpy) broadcasting of two shapes.
pub fn broadcast_shapes(a: &Shape, b: &Shape) -> Result<Shape, String> {
    let rank = a.len().max(b.len());
    let at = |s: &Shape, i: usize| -> Dim {
        let pad = rank - s.len();
        if i < pad {
            Dim::Known(1)
        } else {
            s[i - pad].clone()
        }
    };
    (0..rank)
        .map(|i| broadcast_dim(&at(a, i), &at(b, i)))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot broadcast {} with {}: {e}", show(a), show(b)))
}

fn broadcast_dim(a: &Dim, b: &Dim) -> Result<Dim, String> {
    Ok(match (a, b) {
        _ if a == b => a.clone(),
        (Dim::Known(1), x) | (x, Dim::Known(1)) => x.clone(),
        (Dim::Known(n), Dim::Known(m)) => return Err(format!("{n} vs {m}")),
        (Dim::Known(n), _) | (_, Dim::Known(n)) => Dim::Known(*n),
        _ => Dim::Unknown,
    })
}

fn show(s: &Shape) -> String {
    let dims: Vec<String> = s.iter().map(ToString::to_string).collect();
    format!("[{}]", dims.join(","))
}

macro_rules! unary_helpers {
    ($($fn_name:ident => $op:literal),* $(,)?) => {
        impl Graph {
            $(
                #[doc = concat!("`", $op, "(x)`.")]
                pub fn $fn_name(&mut self, x: &Value) -> Result<Value, IrError> {
                    self.op1($op, &[x], vec![])
                }
            )*
        }
    };
}

macro_rules! binary_helpers {
    ($($fn_name:ident => $op:literal),* $(,)?) => {
        impl Graph {
            $(
                #[doc = concat!("`", $op, "(a, b)` with broadcasting.")]
                pub fn $fn_name(&mut self, a: &Value, b: &Value) -> Result<Value, IrError> {
                    self.op1($op, &[a, b], vec![])
                }
            )*
        }
    };
}

unary_helpers! {
    neg => "Neg", exp => "Exp", log => "Log", sqrt => "Sqrt", tanh => "Tanh", erf => "Erf",
    relu => "Relu", sigmoid => "Sigmoid", reciprocal => "Reciprocal", abs => "Abs",
    identity => "Identity", not => "Not",
}

binary_helpers! {
    add => "Add", sub => "Sub", mul => "Mul", div => "Div", pow => "Pow", equal => "Equal",
    less => "Less", greater => "Greater", min => "Min", max => "Max",
}

impl Graph {
    /// A single-output standard operator.
    pub fn op1(
        &mut self,
        op_type: &str,
        inputs: &[&Value],
        attributes: Vec<(&str, Attribute)>,
    ) -> Result<Value, IrError> {
        let outs = self.node(NodeSpec {
            op_type,
            domain: "",
            inputs: inputs.iter().map(|v| Some(*v)).collect(),
            attributes,
            outputs: 1,
        })?;
        outs.into_iter().next().ok_or_else(|| IrError::Invalid(format!("{op_type} made no output")))
    }

    /// `Sum(xs...)` with broadcasting.
    pub fn sum(&mut self, xs: &[&Value]) -> Result<Value, IrError> {
        self.op1("Sum", xs, vec![])
    }

    /// `Gelu(x)` (opset 20), exact (`erf`) form.
    pub fn gelu(&mut self, x: &Value) -> Result<Value, IrError> {
        self.op1("Gelu", &[x], vec![("approximate", Attribute::Str("none".into()))])
    }

    /// `Where(cond, x, y)`.
    pub fn where_(&mut self, cond: &Value, x: &Value, y: &Value) -> Result<Value, IrError> {
        self.op1("Where", &[cond, x, y], vec![])
    }

    /// `Cast(x, to)`.
    pub fn cast(&mut self, x: &Value, to: DType) -> Result<Value, IrError> {
        self.op1("Cast", &[x], vec![("to", Attribute::Int(to.onnx() as i64))])
    }

    /// `x * scalar`, the scalar of `x`'s element type.
    pub fn scale(&mut self, x: &Value, factor: f64) -> Result<Value, IrError> {
        let dtype = self.dtype(x)?;
        let c = self.scalar(dtype, factor)?;
        self.mul(x, &c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape;

    #[test]
    fn broadcasting_follows_numpy() {
        let a = shape(&[Dim::sym("b"), Dim::Known(1), Dim::Known(4)]);
        let b = shape(&[Dim::Known(3), Dim::Known(1)]);
        assert_eq!(broadcast_shapes(&a, &b).expect("ok"), shape(&[Dim::sym("b"), Dim::Known(3), Dim::Known(4)]));
        assert!(broadcast_shapes(&shape(&[2]), &shape(&[3])).is_err());
        let sym = broadcast_shapes(&shape(&["s"]), &shape(&[5])).expect("ok");
        assert_eq!(sym, shape(&[5]));
    }

    #[test]
    fn helpers_infer_types() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&["b", "s", "h"])).expect("x");
        let m = g.input("m", DType::F32, shape(&[Dim::sym("b"), Dim::Known(1), Dim::sym("s")])).expect("m");
        let y = g.add(&x, &m).expect("add");
        assert_eq!(
            g.shape(&y).expect("shape"),
            &shape(&["b", "s", "h"])
                .iter()
                .enumerate()
                .map(|(i, d)| if i == 2 { Dim::Unknown } else { d.clone() })
                .collect::<Vec<_>>()
        );
        let c = g.cast(&x, DType::I64).expect("cast");
        assert_eq!(g.dtype(&c).expect("dtype"), DType::I64);
        let i = g.input("i", DType::I64, shape(&[2])).expect("i");
        assert!(g.add(&x, &i).is_err(), "mixed element types are refused");
    }
}
