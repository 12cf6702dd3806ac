//! `LayerNormGrad(dY, X, scale, mean, invStd) -> (dX, dScale, dBias)` with attribute `axis`:
//! the gradients of ONNX's `LayerNormalization` in one pass over `dY` and `X`.
//!
//! Why: written with standard operators, the rule is a dozen elementwise and reduction nodes
//! over the `[tokens, hidden]` tensor (`x̂`, `dY ⊙ scale`, two row means, two column sums...),
//! each a pass over memory. Here each task takes a fixed run of rows: it recomputes `x̂` from
//! the forward statistics, writes `dX` row by row, and keeps its run's partial sums of `dY ⊙ x̂`
//! and `dY`; the runs' partial sums are then added in run order. So the result is the same bits
//! whatever the thread count.
//!
//! On the oneDNN path this operator's rule replaces the standard one of `LayerNormalization`;
//! the MLAS path keeps the plain chain.

use std::sync::Arc;

use ringtune_autodiff::{AutodiffError, RuleCtx};
use ringtune_onnx_ir::{Attribute, NodeSpec, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

use crate::fast_math::lanes;
use crate::shapes::{self, float, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "LayerNormGrad";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::OfOnnx { op_type: "LayerNormalization", rule: gradient_rule },
    kernel: KernelSource::OneDnn(|_| Arc::new(LayerNormGrad)),
};

/// Shape rule: `dX` like `X`, `dScale` and `dBias` like `scale`.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    for (i, what) in ["dY", "X", "scale", "mean", "invStd"].into_iter().enumerate() {
        float(inputs, i, what)?;
    }
    let scale = float(inputs, 2, "scale")?.like();
    Ok(vec![float(inputs, 1, "X")?.like(), scale.clone(), scale])
}

/// Gradient rule of ONNX's `LayerNormalization` over the last axis: one `LayerNormGrad` node,
/// reading the forward node's mean and inverse standard deviation.
pub(crate) fn gradient_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    if ctx.node().int("axis").unwrap_or(-1) != -1 {
        return Err(ctx.unsupported("the fused gradient normalises the last axis only"));
    }
    let stat = |i: usize| ctx.node().outputs.get(i).filter(|s| !s.is_empty()).map(|s| Value::named(s.as_str()));
    let (Some(mean), Some(inv_std)) = (stat(1), stat(2)) else {
        return Err(ctx.unsupported("the forward node must output Mean and InvStdDev"));
    };
    // `LayerNormalization` is a standard operator: the graph may not know ours yet.
    crate::register_shapes(ctx.graph());
    let (dy, x, scale) = (ctx.dy(0)?, ctx.input(0), ctx.input(1));
    let needs = [ctx.need(0), ctx.need(1), ctx.need(2)];
    let spec = NodeSpec {
        op_type: NAME,
        domain: DOMAIN,
        inputs: vec![Some(&dy), Some(&x), Some(&scale), Some(&mean), Some(&inv_std)],
        attributes: vec![("axis", Attribute::Int(-1))],
        outputs: 3,
    };
    let grads = ctx.graph().node(spec)?;
    Ok(grads.into_iter().zip(needs).map(|(g, need)| need.then_some(g)).collect())
}

/// Rows per task.
const RUN: usize = 64;

/// What one run of rows reads: `dY`, `X` (each `rows x width`), `scale`, and per row the mean
/// and inverse standard deviation.
#[derive(Debug, Clone, Copy)]
pub struct Rows<'a> {
    /// `dY`.
    pub dy: &'a [f32],
    /// `X`.
    pub x: &'a [f32],
    /// The scale (`width`).
    pub scale: &'a [f32],
    /// Per row, the mean.
    pub mean: &'a [f32],
    /// Per row, `1 / sqrt(var + eps)`.
    pub inv_std: &'a [f32],
}

/// `dX` of a run of rows, and the run's sums of `dY ⊙ x̂` and `dY` (`partial`: `2 x width`).
pub fn run_grads(rows: Rows<'_>, dx: &mut [f32], partial: &mut [f32]) {
    let width = rows.scale.len();
    let (d_scale, d_bias) = partial.split_at_mut(width);
    d_scale.fill(0.0);
    d_bias.fill(0.0);
    let (mut xhat, mut g) = (vec![0.0f32; width], vec![0.0f32; width]);
    let row_data = rows.dy.chunks_exact(width).zip(rows.x.chunks_exact(width)).zip(dx.chunks_exact_mut(width));
    for (((dy, x), dx), (&mean, &inv)) in row_data.zip(rows.mean.iter().zip(rows.inv_std)) {
        for ((h, g), ((x, dy), s)) in xhat.iter_mut().zip(g.iter_mut()).zip(x.iter().zip(dy).zip(rows.scale)) {
            *h = (x - mean) * inv;
            *g = dy * s;
        }
        let n = width as f32;
        let mean_g = lanes(&g, 0.0, |a, b| a + b) / n;
        let gx: Vec<f32> = g.iter().zip(&xhat).map(|(g, h)| g * h).collect();
        let mean_gx = lanes(&gx, 0.0, |a, b| a + b) / n;
        for ((dx, g), h) in dx.iter_mut().zip(&g).zip(&xhat) {
            *dx = inv * (g - mean_g - h * mean_gx);
        }
        for ((ds, db), (dy, h)) in d_scale.iter_mut().zip(d_bias.iter_mut()).zip(dy.iter().zip(&xhat)) {
            *ds += dy * h;
            *db += dy;
        }
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct LayerNormGrad;

impl CustomOp for LayerNormGrad {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32); 5]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32); 3]
    }

    fn kernel(&self, _attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(LayerNormGradKernel))
    }
}

struct LayerNormGradKernel;

/// The inputs, checked: shapes of `X` and the scale, and the run data.
fn operands<'a>(inputs: &[Option<TensorRef<'a>>]) -> Result<(Vec<i64>, Vec<i64>, Rows<'a>), String> {
    let names = ["dY", "X", "scale", "mean", "invStd"];
    let mut data = Vec::with_capacity(5);
    for (i, name) in names.iter().enumerate() {
        let t = inputs.get(i).copied().flatten().ok_or(format!("missing {name}"))?;
        data.push((t.shape().to_vec(), t.f32().ok_or(format!("{name} must be float"))?));
    }
    let [(dy_shape, dy), (x_shape, x), (scale_shape, scale), (_, mean), (_, inv_std)] = &data[..] else {
        return Err("five inputs expected".into());
    };
    let width = scale.len();
    let rows = x.len() / width.max(1);
    if dy_shape != x_shape || x_shape.last() != Some(&(width as i64)) || mean.len() != rows || inv_std.len() != rows {
        return Err(format!(
            "dY {dy_shape:?}, X {x_shape:?}, scale {scale_shape:?}, {} means and {} deviations do not fit",
            mean.len(),
            inv_std.len()
        ));
    }
    Ok((x_shape.clone(), scale_shape.clone(), Rows { dy, x, scale, mean, inv_std }))
}

impl Kernel for LayerNormGradKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        // The kernel's own reading of the operands refuses what it could not compute.
        operands(inputs)?;
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let (_, _, all) = operands(inputs)?;
        let width = all.scale.len();
        let [Some(TensorMut::F32(dx)), Some(TensorMut::F32(d_scale)), Some(TensorMut::F32(d_bias))] = outputs else {
            return Err("dX, dScale and dBias must all be asked for".into());
        };
        let runs = all.mean.len().div_ceil(RUN);
        let mut partials = vec![0.0f32; runs * 2 * width];
        let tasks = dx.chunks_mut(RUN * width).zip(partials.chunks_mut(2 * width)).collect();
        for_each_part(threads, tasks, |run, (dx, partial)| {
            let (rows, cells) = (run * RUN..(run * RUN + RUN).min(all.mean.len()), run * RUN * width);
            let part = Rows {
                dy: &all.dy[cells..cells + dx.len()],
                x: &all.x[cells..cells + dx.len()],
                scale: all.scale,
                mean: &all.mean[rows.clone()],
                inv_std: &all.inv_std[rows],
            };
            run_grads(part, dx, partial);
        });
        d_scale.fill(0.0);
        d_bias.fill(0.0);
        for partial in partials.chunks_exact(2 * width) {
            let (ds, db) = partial.split_at(width);
            d_scale.iter_mut().zip(ds).for_each(|(t, p)| *t += p);
            d_bias.iter_mut().zip(db).for_each(|(t, p)| *t += p);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ringtune_runtime::Serial;

    use super::*;

    /// Layer norm of each row of `x` in f64, with the statistics.
    fn forward(x: &[f64], scale: &[f64], bias: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let width = scale.len();
        let (mut y, mut means, mut invs) = (vec![], vec![], vec![]);
        for row in x.chunks(width) {
            let mean = row.iter().sum::<f64>() / width as f64;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
            let inv = 1.0 / (var + 1e-5).sqrt();
            y.extend(row.iter().zip(scale).zip(bias).map(|((v, s), b)| (v - mean) * inv * s + b));
            means.push(mean);
            invs.push(inv);
        }
        (y, means, invs)
    }

    fn values(seed: usize, n: usize) -> Vec<f64> {
        (0..n).map(|i| (((i + seed) * 7919 % 1009) as f64 / 1009.0 - 0.5) * (1.0 + (seed % 3) as f64)).collect()
    }

    /// Loss `sum(y * w)` over 70 rows of 13 (two runs and a part, odd widths): the kernel's
    /// gradients against central differences in f64.
    #[test]
    fn gradients_match_finite_differences() {
        let (rows, width) = (RUN + 6, 13);
        let (x, scale, bias, w) =
            (values(1, rows * width), values(2, width), values(3, width), values(4, rows * width));
        let loss = |x: &[f64], scale: &[f64], bias: &[f64]| -> f64 {
            forward(x, scale, bias).0.iter().zip(&w).map(|(y, w)| y * w).sum()
        };
        let (_, means, invs) = forward(&x, &scale, &bias);
        let f32s = |v: &[f64]| v.iter().map(|v| *v as f32).collect::<Vec<f32>>();
        let (dy, xf, sf, mf, inf) = (f32s(&w), f32s(&x), f32s(&scale), f32s(&means), f32s(&invs));
        let inputs = [&dy, &xf, &sf, &mf, &inf];
        let shapes = [
            vec![rows as i64, width as i64],
            vec![rows as i64, width as i64],
            vec![width as i64],
            vec![rows as i64, 1],
            vec![rows as i64, 1],
        ];
        let inputs: Vec<Option<TensorRef<'_>>> =
            inputs.iter().zip(&shapes).map(|(d, s)| Some(TensorRef::F32(s, d))).collect();
        let (mut dx, mut ds, mut db) = (vec![f32::NAN; rows * width], vec![f32::NAN; width], vec![f32::NAN; width]);
        let outputs =
            &mut [Some(TensorMut::F32(&mut dx)), Some(TensorMut::F32(&mut ds)), Some(TensorMut::F32(&mut db))];
        LayerNormGradKernel.compute(&inputs, outputs, &Serial).expect("compute");
        let h = 1e-6;
        let numeric = |i: usize, which: usize| -> f64 {
            let (mut x, mut scale, mut bias) = (x.clone(), scale.clone(), bias.clone());
            let v = match which {
                0 => &mut x[i],
                1 => &mut scale[i],
                _ => &mut bias[i],
            };
            *v += h;
            let up = loss(&x, &scale, &bias);
            let v = match which {
                0 => &mut x[i],
                1 => &mut scale[i],
                _ => &mut bias[i],
            };
            *v -= 2.0 * h;
            (up - loss(&x, &scale, &bias)) / (2.0 * h)
        };
        for (which, got) in [(0, &dx), (1, &ds), (2, &db)] {
            for i in (0..got.len()).step_by(5) {
                let want = numeric(i, which);
                let diff = (f64::from(got[i]) - want).abs();
                assert!(diff < 1e-4 * (1.0 + want.abs()), "input {which}, element {i}: {} against {want}", got[i]);
            }
        }
        let short = [inputs[0], inputs[1], inputs[2], Some(TensorRef::F32(&[3, 1], &mf[..3])), inputs[4]];
        assert!(LayerNormGradKernel.output_shapes(&short).expect_err("means").contains("do not fit"));
    }
}
