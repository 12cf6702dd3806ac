//! Shape operators: `Reshape`, `Transpose`, `Unsqueeze`, `Squeeze`, `Shape`, `Concat`, `Expand`,
//! `ConstantOfShape`, `Constant`, `Range`, `Pad`, `Slice`. Integer shape values are followed
//! symbolically (see [`Graph::sym_value`]) so that `batch` and `seq` survive reshapes.

use std::collections::HashMap;

use super::{elementwise::broadcast_shapes, norm_axis, InferCtx, Inferred, Rule};
use crate::{Attribute, DType, Dim, Graph, IrError, NodeSpec, Shape, Tensor, Value, ValueType};

pub(super) fn register(rules: &mut HashMap<&'static str, Rule>) {
    rules.insert("Reshape", reshape);
    rules.insert("Transpose", transpose);
    rules.insert("Unsqueeze", unsqueeze);
    rules.insert("Squeeze", squeeze);
    rules.insert("Shape", shape_of);
    rules.insert("Concat", concat);
    rules.insert("Expand", expand);
    rules.insert("ConstantOfShape", constant_of_shape);
    rules.insert("Constant", constant);
    rules.insert("Range", range);
    rules.insert("Pad", pad);
    rules.insert("Slice", slice);
}

/// The length of a 1-D integer input, when known.
fn vector_len(ctx: &InferCtx<'_>, i: usize) -> Result<Option<usize>, String> {
    Ok(match ctx.shape(i)? {
        Some(s) if s.len() == 1 => s[0].known().map(|n| n as usize),
        _ => None,
    })
}

fn reshape(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let Some(target) = ctx.sym(1)? else {
        let shape = vector_len(ctx, 1)?.map(|n| vec![Dim::Unknown; n]);
        return Ok(Inferred::one(ValueType { dtype, shape }));
    };
    let input = ctx.shape(0)?;
    let allow_zero = ctx.int("allowzero", 0) != 0;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, d) in target.iter().enumerate() {
        out.push(match d {
            Dim::Known(0) if !allow_zero => input
                .and_then(|s| s.get(i).cloned())
                .ok_or_else(|| format!("shape entry {i} is 0 but the input has no axis {i}"))?,
            Dim::Known(-1) => {
                if infer_at.replace(i).is_some() {
                    return Err("at most one -1 in the target shape".into());
                }
                Dim::Unknown
            }
            Dim::Known(n) if *n < 0 => return Err(format!("bad target dimension {n}")),
            other => other.clone(),
        });
    }
    if let (Some(at), Some(input)) = (infer_at, input) {
        out[at] = infer_remaining(input, &out, at);
    }
    if let (Some(input), None) = (input, infer_at) {
        check_same_size(input, &out)?;
    }
    Ok(Inferred::one(ValueType::new(dtype, out)))
}

/// The dimension at `at` that keeps the element count of `input` in `out`: cancels equal
/// dimensions, then divides what is left.
fn infer_remaining(input: &Shape, out: &Shape, at: usize) -> Dim {
    let mut rest: Vec<Dim> = input.clone();
    let mut divisor = 1i64;
    for (i, d) in out.iter().enumerate() {
        if i == at {
            continue;
        }
        if let Some(pos) = rest.iter().position(|r| r == d) {
            rest.remove(pos);
        } else if let Dim::Known(n) = d {
            divisor *= n;
        } else {
            return Dim::Unknown;
        }
    }
    let known: i64 = rest.iter().filter_map(Dim::known).product();
    let syms: Vec<String> = rest
        .iter()
        .filter_map(|d| match d {
            Dim::Sym(s) => Some(s.clone()),
            _ => None,
        })
        .collect();
    if rest.contains(&Dim::Unknown) || divisor == 0 || known % divisor != 0 {
        return Dim::Unknown;
    }
    match (known / divisor, syms.len()) {
        (q, 0) => Dim::Known(q),
        (1, 1) => Dim::Sym(syms[0].clone()),
        (1, _) => Dim::Sym(syms.join("*")),
        _ => Dim::Unknown,
    }
}

fn check_same_size(input: &Shape, out: &Shape) -> Result<(), String> {
    let count = |s: &Shape| s.iter().map(Dim::known).product::<Option<i64>>();
    match (count(input), count(out)) {
        (Some(a), Some(b)) if a != b => Err(format!("cannot reshape {a} elements into {b}")),
        _ => Ok(()),
    }
}

fn transpose(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let Some(input) = ctx.shape(0)? else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    let perm: Vec<i64> = match ctx.ints("perm") {
        Some(p) => p.to_vec(),
        None => (0..input.len() as i64).rev().collect(),
    };
    let mut seen = vec![false; input.len()];
    let mut out = Vec::with_capacity(perm.len());
    for &p in &perm {
        let p = usize::try_from(p).ok().filter(|&p| p < input.len() && !seen[p]).ok_or("bad perm")?;
        seen[p] = true;
        out.push(input[p].clone());
    }
    if out.len() != input.len() {
        return Err(format!("perm has {} entries for rank {}", out.len(), input.len()));
    }
    Ok(Inferred::one(ValueType::new(dtype, out)))
}

fn unsqueeze(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let axes = ctx.const_ints(1)?.ok_or("Unsqueeze needs constant axes")?;
    let Some(input) = ctx.shape(0)? else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    let rank = input.len() + axes.len();
    let mut axes: Vec<usize> = axes.iter().map(|&a| norm_axis(a, rank)).collect::<Result<_, _>>()?;
    axes.sort_unstable();
    let mut rest = input.iter();
    let out: Shape = (0..rank)
        .map(|i| if axes.contains(&i) { Some(Dim::Known(1)) } else { rest.next().cloned() })
        .collect::<Option<_>>()
        .ok_or("repeated axes")?;
    let mut inferred = Inferred::one(ValueType::new(dtype, out));
    inferred.sym_value = ctx.sym(0)?.filter(|v| v.len() == 1 && input.is_empty());
    Ok(inferred)
}

fn squeeze(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let input = ctx.ranked(0)?;
    let axes: Vec<usize> = if ctx.has_input(1) {
        let axes = ctx.const_ints(1)?.ok_or("Squeeze needs constant axes")?;
        axes.iter().map(|&a| norm_axis(a, input.len())).collect::<Result<_, _>>()?
    } else {
        (0..input.len()).filter(|&i| input[i] == Dim::Known(1)).collect()
    };
    for &a in &axes {
        if matches!(input[a], Dim::Known(n) if n != 1) {
            return Err(format!("axis {a} has size {} and cannot be squeezed", input[a]));
        }
    }
    let out = input.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| d.clone()).collect();
    let mut inferred = Inferred::one(ValueType::new(dtype, out));
    inferred.sym_value = ctx.sym(0)?.filter(|v| v.len() == 1);
    Ok(inferred)
}

fn shape_of(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let Some(input) = ctx.shape(0)? else {
        return Ok(Inferred::one(ValueType::new(DType::I64, vec![Dim::Unknown])));
    };
    let rank = input.len() as i64;
    let clamp = |v: i64| if v < 0 { (v + rank).max(0) } else { v.min(rank) } as usize;
    let start = clamp(ctx.int("start", 0));
    let end = clamp(ctx.int("end", rank)).max(start);
    let dims = input[start..end].to_vec();
    Ok(Inferred { types: vec![ValueType::new(DType::I64, vec![Dim::Known(dims.len() as i64)])], sym_value: Some(dims) })
}

fn concat(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let n = ctx.node.inputs.len();
    let shapes: Option<Vec<&Shape>> =
        (0..n).map(|i| ctx.shape(i)).collect::<Result<Vec<_>, _>>()?.into_iter().collect();
    let Some(shapes) = shapes else {
        return Ok(Inferred::one(ValueType::unranked(dtype)));
    };
    let rank = shapes[0].len();
    let axis = norm_axis(ctx.int("axis", 0), rank)?;
    let mut out = shapes[0].clone();
    for s in &shapes[1..] {
        if s.len() != rank {
            return Err("inputs of different ranks".into());
        }
        out[axis] = match (&out[axis], &s[axis]) {
            (Dim::Known(a), Dim::Known(b)) => Dim::Known(a + b),
            _ => Dim::Unknown,
        };
    }
    let mut inferred = Inferred::one(ValueType::new(dtype, out));
    if rank == 1 {
        inferred.sym_value =
            (0..n).map(|i| ctx.sym(i)).collect::<Result<Option<Vec<Vec<Dim>>>, _>>()?.map(|parts| parts.concat());
    }
    Ok(inferred)
}

fn expand(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let shape = match (ctx.shape(0)?, ctx.sym(1)?) {
        (Some(input), Some(target)) => Some(broadcast_shapes(input, &target)?),
        (Some(input), None) => vector_len(ctx, 1)?.map(|n| vec![Dim::Unknown; n.max(input.len())]),
        _ => None,
    };
    Ok(Inferred::one(ValueType { dtype, shape }))
}

fn constant_of_shape(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = match ctx.attr("value") {
        Some(Attribute::Tensor(t)) => t.dtype,
        _ => DType::F32,
    };
    let shape = match ctx.sym(0)? {
        Some(dims) => Some(dims),
        None => vector_len(ctx, 0)?.map(|n| vec![Dim::Unknown; n]),
    };
    Ok(Inferred::one(ValueType { dtype, shape }))
}

fn constant(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    match ctx.attr("value") {
        Some(Attribute::Tensor(t)) => {
            Ok(Inferred::one(ValueType::new(t.dtype, t.dims.iter().map(|&d| Dim::Known(d)).collect())))
        }
        _ => Err("Constant needs a tensor `value`".into()),
    }
}

fn range(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let scalar = |i: usize| -> Result<Option<Dim>, String> { Ok(ctx.sym(i)?.and_then(|v| v.first().cloned())) };
    let len = match (scalar(0)?, scalar(1)?, scalar(2)?) {
        (Some(Dim::Known(start)), Some(Dim::Known(limit)), Some(Dim::Known(delta))) if delta != 0 => {
            Dim::Known(((limit - start) as f64 / delta as f64).ceil().max(0.0) as i64)
        }
        (Some(Dim::Known(0)), Some(limit), Some(Dim::Known(1))) => limit,
        _ => Dim::Unknown,
    };
    Ok(Inferred::one(ValueType::new(dtype, vec![len])))
}

fn pad(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let input = ctx.ranked(0)?;
    let rank = input.len();
    let Some(pads) = ctx.const_ints(1)? else {
        // Computed pads: the rank stays, the sizes are known only when running.
        return Ok(Inferred::one(ValueType::new(dtype, vec![Dim::Unknown; rank])));
    };
    let axes: Vec<usize> = if ctx.has_input(3) {
        let axes = ctx.const_ints(3)?.ok_or("Pad needs constant axes")?;
        axes.iter().map(|&a| norm_axis(a, rank)).collect::<Result<_, _>>()?
    } else {
        (0..rank).collect()
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("{} pads for {} axes", pads.len(), axes.len()));
    }
    let mut out = input.clone();
    for (k, &a) in axes.iter().enumerate() {
        let grow = pads[k] + pads[k + axes.len()];
        out[a] = match &input[a] {
            Dim::Known(n) => Dim::Known(n + grow),
            d if grow == 0 => d.clone(),
            _ => Dim::Unknown,
        };
    }
    Ok(Inferred::one(ValueType::new(dtype, out)))
}

fn slice(ctx: &InferCtx<'_>) -> Result<Inferred, String> {
    let dtype = ctx.dtype(0)?;
    let input = ctx.ranked(0)?;
    let rank = input.len();
    let starts = ctx.const_ints(1)?.ok_or("Slice needs constant starts")?;
    let ends = ctx.const_ints(2)?.ok_or("Slice needs constant ends")?;
    let axes: Vec<usize> = if ctx.has_input(3) {
        let axes = ctx.const_ints(3)?.ok_or("Slice needs constant axes")?;
        axes.iter().map(|&a| norm_axis(a, rank)).collect::<Result<_, _>>()?
    } else {
        (0..starts.len()).collect()
    };
    let steps =
        if ctx.has_input(4) { ctx.const_ints(4)?.ok_or("Slice needs constant steps")? } else { vec![1; starts.len()] };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let mut out = input.clone();
    let mut ranges = Vec::new();
    for k in 0..starts.len() {
        let (d, s, e, step) = (&input[axes[k]], starts[k], ends[k], steps[k]);
        if step <= 0 {
            return Err("only positive steps are supported".into());
        }
        let sliced = sliced_dim(d, s, e, step);
        ranges.push((axes[k], s, e, step));
        out[axes[k]] = sliced;
    }
    let mut inferred = Inferred::one(ValueType::new(dtype, out));
    if rank == 1 {
        if let (Some(values), [(0, s, e, 1)]) = (ctx.sym(0)?, ranges.as_slice()) {
            let n = values.len() as i64;
            let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(n) } as usize;
            let (s, e) = (clamp(*s), clamp(*e));
            inferred.sym_value = Some(values[s..e.max(s)].to_vec());
        }
    }
    Ok(inferred)
}

/// The size of `d[start:end:step]`; for symbolic sizes only the cases that do not depend on
/// the size (a prefix `[0:k]` assumed in range, or the whole axis).
fn sliced_dim(d: &Dim, start: i64, end: i64, step: i64) -> Dim {
    const WHOLE: i64 = i64::MAX / 2;
    match d {
        Dim::Known(n) => {
            let clamp = |v: i64| if v < 0 { (v + n).max(0) } else { v.min(*n) };
            let (s, e) = (clamp(start), clamp(end));
            Dim::Known(((e - s).max(0) + step - 1) / step)
        }
        _ if start == 0 && end >= WHOLE && step == 1 => d.clone(),
        _ if start >= 0 && end >= start && end < WHOLE => Dim::Known((end - start + step - 1) / step),
        _ => Dim::Unknown,
    }
}

impl Graph {
    /// `Reshape(x, shape)` to a constant shape (0 copies the input's axis, -1 is inferred).
    pub fn reshape(&mut self, x: &Value, shape: &[i64]) -> Result<Value, IrError> {
        let s = self.const_i64(shape)?;
        self.op1("Reshape", &[x, &s], vec![])
    }

    /// `Reshape(x, shape)` to a shape computed in the graph.
    pub fn reshape_to(&mut self, x: &Value, shape: &Value) -> Result<Value, IrError> {
        self.op1("Reshape", &[x, shape], vec![])
    }

    /// `Transpose(x, perm)`.
    pub fn transpose(&mut self, x: &Value, perm: &[i64]) -> Result<Value, IrError> {
        self.op1("Transpose", &[x], vec![("perm", Attribute::Ints(perm.to_vec()))])
    }

    /// `Unsqueeze(x, axes)`.
    pub fn unsqueeze(&mut self, x: &Value, axes: &[i64]) -> Result<Value, IrError> {
        let a = self.const_i64(axes)?;
        self.op1("Unsqueeze", &[x, &a], vec![])
    }

    /// `Squeeze(x, axes)`.
    pub fn squeeze(&mut self, x: &Value, axes: &[i64]) -> Result<Value, IrError> {
        let a = self.const_i64(axes)?;
        self.op1("Squeeze", &[x, &a], vec![])
    }

    /// `Shape(x)`.
    pub fn shape_of(&mut self, x: &Value) -> Result<Value, IrError> {
        self.op1("Shape", &[x], vec![])
    }

    /// `Concat(xs, axis)`.
    pub fn concat(&mut self, xs: &[&Value], axis: i64) -> Result<Value, IrError> {
        self.op1("Concat", xs, vec![("axis", Attribute::Int(axis))])
    }

    /// `Expand(x, shape)`.
    pub fn expand(&mut self, x: &Value, shape: &Value) -> Result<Value, IrError> {
        self.op1("Expand", &[x, shape], vec![])
    }

    /// A tensor of `value` (a scalar tensor giving the element type) with a computed shape.
    pub fn constant_of_shape(&mut self, shape: &Value, value: Tensor) -> Result<Value, IrError> {
        self.op1("ConstantOfShape", &[shape], vec![("value", Attribute::Tensor(value))])
    }

    /// Zeros with the shape and element type of `x`.
    pub fn zeros_like(&mut self, x: &Value) -> Result<Value, IrError> {
        let dtype = self.dtype(x)?;
        let value = if dtype.is_float() { Tensor::scalar_float(dtype, 0.0) } else { Tensor::from_i64(&[1], &[0]) };
        let value = Tensor { dims: vec![1], ..value };
        match self.value_type(x)?.static_dims() {
            Some(dims) => {
                let s = self.const_i64(&dims)?;
                self.constant_of_shape(&s, value)
            }
            None => {
                let s = self.shape_of(x)?;
                self.constant_of_shape(&s, value)
            }
        }
    }

    /// `Range(start, limit, delta)`.
    pub fn range(&mut self, start: &Value, limit: &Value, delta: &Value) -> Result<Value, IrError> {
        self.op1("Range", &[start, limit, delta], vec![])
    }

    /// `Pad(x, pads)` with zeros; `pads` lists the begins then the ends of `axes`.
    pub fn pad(&mut self, x: &Value, pads: &[i64], axes: &[i64]) -> Result<Value, IrError> {
        let p = self.const_i64(pads)?;
        let a = self.const_i64(axes)?;
        let outs = self.node(NodeSpec {
            op_type: "Pad",
            domain: "",
            inputs: vec![Some(x), Some(&p), None, Some(&a)],
            attributes: vec![],
            outputs: 1,
        })?;
        outs.into_iter().next().ok_or_else(|| IrError::Invalid("Pad made no output".into()))
    }

    /// `Pad(x, pads)` with zeros and pads computed in the graph (begins then ends, all axes).
    pub fn pad_to(&mut self, x: &Value, pads: &Value) -> Result<Value, IrError> {
        self.op1("Pad", &[x, pads], vec![])
    }

    /// `Slice(x, starts, ends, axes)` with unit steps.
    pub fn slice(&mut self, x: &Value, starts: &[i64], ends: &[i64], axes: &[i64]) -> Result<Value, IrError> {
        let s = self.const_i64(starts)?;
        let e = self.const_i64(ends)?;
        let a = self.const_i64(axes)?;
        self.op1("Slice", &[x, &s, &e, &a], vec![])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape;

    fn bsh(g: &mut Graph) -> Value {
        g.input("x", DType::F32, shape(&[Dim::sym("batch"), Dim::sym("seq"), Dim::Known(12)])).expect("x")
    }

    #[test]
    fn reshape_keeps_symbols() {
        let mut g = Graph::new("t");
        let x = bsh(&mut g);
        let heads = g.reshape(&x, &[0, 0, 3, 4]).expect("split heads");
        assert_eq!(
            g.shape(&heads).expect("s"),
            &shape(&[Dim::sym("batch"), Dim::sym("seq"), Dim::Known(3), Dim::Known(4)])
        );
        let flat = g.reshape(&x, &[-1, 12]).expect("flatten");
        assert_eq!(g.shape(&flat).expect("s")[0], Dim::sym("batch*seq"));
        let back = g.reshape(&heads, &[0, 0, -1]).expect("merge heads");
        assert_eq!(g.shape(&back).expect("s")[2], Dim::Known(12));
        assert!(g.reshape(&heads, &[0, 0, 5]).is_ok(), "symbolic counts cannot be checked");
    }

    #[test]
    fn shape_values_flow_through_gather_concat_and_range() {
        let mut g = Graph::new("t");
        let x = bsh(&mut g);
        let s = g.shape_of(&x).expect("shape");
        let seq = g.slice(&s, &[1], &[2], &[0]).expect("slice");
        assert_eq!(g.sym_value(seq.name()), Some(vec![Dim::sym("seq")]));
        let heads = g.const_i64(&[3, 4]).expect("const");
        let target = g.concat(&[&s, &heads], 0).expect("concat");
        let y = g.reshape_to(&x, &target).expect("reshape");
        assert_eq!(g.rank_of(&y), Some(5));
        let zero = g.constant(Tensor::scalar_i64(0)).expect("0");
        let one = g.constant(Tensor::scalar_i64(1)).expect("1");
        let n = g.squeeze(&seq, &[0]).expect("scalar");
        let positions = g.range(&zero, &n, &one).expect("range");
        assert_eq!(g.shape(&positions).expect("s"), &vec![Dim::sym("seq")]);
    }

    #[test]
    fn slice_pad_transpose() {
        let mut g = Graph::new("t");
        let x = bsh(&mut g);
        let cls = g.slice(&x, &[0], &[1], &[1]).expect("slice");
        assert_eq!(g.shape(&cls).expect("s"), &shape(&[Dim::sym("batch"), Dim::Known(1), Dim::Known(12)]));
        let padded = g.pad(&cls, &[0, 2], &[1]).expect("pad");
        assert_eq!(g.shape(&padded).expect("s")[1], Dim::Known(3));
        let t = g.transpose(&x, &[0, 2, 1]).expect("transpose");
        assert_eq!(g.shape(&t).expect("s")[1], Dim::Known(12));
        assert!(g.transpose(&x, &[0, 0, 1]).is_err());
        let z = g.zeros_like(&x).expect("zeros");
        assert_eq!(g.shape(&z).expect("s"), g.shape(&x).expect("s").clone().as_ref() as &Shape);
    }
}
