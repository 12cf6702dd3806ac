//! `SeededDropout(X, ratio, seed)` with attribute `site`: dropout whose mask is a function of
//! the step's seed, the site and the element, so the backward pass redraws it instead of
//! storing it, and a run repeats bit for bit.
//!
//! Why not ONNX Runtime's own `Dropout`: it draws its masks on one thread from a generator it
//! seeds itself, so the same seed never gives the same run twice, and on MiniLM it took a fifth
//! of a training step. Here element `i` of site `site` is kept when its 16-bit quarter of a
//! SplitMix64 hash of `(seed, site, i / 4)` reaches `ratio` (to 1/65536); the masks are the same
//! whatever the thread count, and cheap enough to redraw.
//!
//! The rewrite runs before differentiation: every training-mode ONNX `Dropout` becomes a
//! `SeededDropout` fed the graph input [`SEED_INPUT`], and its gradient rule makes the backward
//! node (dropout is linear in `X`, so its gradient is the same dropout applied to `dY`).

use std::sync::Arc;

use ringtune_autodiff::{AutodiffError, RuleCtx};
use ringtune_onnx_ir::{shape, Attribute, DType, Graph, IrError, Node, NodeSpec, Value, ValueType};
use ringtune_runtime::{
    for_each_part, Attributes, CustomOp, ElementType, Kernel, Parallel, Port, TensorMut, TensorRef, DOMAIN,
};

use crate::attributes::AttributeSource;
use crate::fast_math::CHUNK;
use crate::shapes::{self, input, Operand};
use crate::{Gradient, KernelSource, Operator};

/// The operator's name in the `ai.ringtune` domain.
pub const NAME: &str = "SeededDropout";
/// The graph input holding the step's dropout seed (int64 `[1]`).
pub const SEED_INPUT: &str = "dropout_seed";

/// The operator's entry in the table of operators.
pub(crate) const OPERATOR: Operator = Operator {
    name: NAME,
    shape_rule: |ctx| shapes::in_graph(ctx, outputs),
    gradient: Gradient::Own(gradient_rule),
    kernel: KernelSource::Any(|| Arc::new(SeededDropout)),
};

/// The attributes: which dropout site of the graph a node is (forward and backward share it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutAttrs {
    /// The site number.
    pub site: u64,
}

impl DropoutAttrs {
    pub(crate) fn read(node: &(impl AttributeSource + ?Sized)) -> Self {
        DropoutAttrs { site: node.int("site").unwrap_or(0) as u64 }
    }

    pub(crate) fn write(self) -> Vec<(&'static str, Attribute)> {
        vec![("site", Attribute::Int(self.site as i64))]
    }
}

/// Shape rule: `Y` is like `X`, with a bool mask of the same shape when asked.
fn outputs(inputs: &[Option<Operand>]) -> Result<Vec<ValueType>, String> {
    let x = input(inputs, 0, "X")?.like();
    if input(inputs, 2, "the seed")?.dtype != DType::I64 {
        return Err("the seed must be int64".into());
    }
    let mask = ValueType { dtype: DType::Bool, shape: x.shape.clone() };
    Ok(vec![x, mask])
}

/// Gradient rule: `dX = SeededDropout(dY)` at the same site, seed and ratio.
pub(crate) fn gradient_rule(ctx: &mut RuleCtx<'_>) -> Result<Vec<Option<Value>>, AutodiffError> {
    ctx.only_first_output()?;
    let dy = ctx.dy(0)?;
    let (ratio, seed) = (ctx.input(1), ctx.input(2));
    let attributes = DropoutAttrs::read(ctx.node()).write();
    let spec = NodeSpec {
        op_type: NAME,
        domain: DOMAIN,
        inputs: vec![Some(&dy), Some(&ratio), Some(&seed)],
        attributes,
        outputs: 1,
    };
    let dx = ctx.graph().node(spec)?.remove(0);
    Ok(vec![Some(dx), None, None])
}

/// Swaps every training-mode `Dropout` for `SeededDropout(X, ratio, seed)` with its own site
/// number, in node order, adding the graph input [`SEED_INPUT`] when there is one; returns how
/// many. A mask that something reads is kept as the node's second output.
pub fn seed_dropouts(graph: &mut Graph) -> Result<usize, IrError> {
    crate::register_shapes(graph);
    let training = |graph: &Graph, node: &Node| {
        node.domain.is_empty() && node.op_type == "Dropout" && graph.dropout_mode(node).is_ok_and(|m| m.training)
    };
    if !graph.nodes().iter().any(|n| training(graph, n)) {
        return Ok(0);
    }
    graph.input(SEED_INPUT, DType::I64, shape(&[1]))?;
    let mut site = 0;
    graph.rewrite(|graph, i| {
        let node = &graph.nodes()[i];
        if !training(graph, node) {
            return None;
        }
        let ratio = match node.input(1) {
            Some(r) => r.to_string(),
            None => return None,
        };
        let mask = node.outputs.get(1).filter(|m| !m.is_empty() && is_read(graph, m)).cloned();
        let mut outputs = vec![node.outputs[0].clone()];
        outputs.extend(mask);
        let attributes = DropoutAttrs { site }.write().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        site += 1;
        Some(Node {
            name: node.name.clone(),
            op_type: NAME.into(),
            domain: DOMAIN.into(),
            inputs: vec![node.inputs[0].clone(), ratio, SEED_INPUT.into()],
            outputs,
            attributes,
        })
    })
}

fn is_read(graph: &Graph, value: &str) -> bool {
    !graph.consumers(value).is_empty() || graph.outputs.iter().any(|o| o == value)
}

/// SplitMix64's output function: a bijective mix whose consecutive inputs give independent
/// looking outputs.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The stream of one dropout site under one step's seed.
pub fn site_key(seed: u64, site: u64) -> u64 {
    mix(mix(seed.wrapping_add(GOLDEN)) ^ site.wrapping_mul(GOLDEN))
}

/// The keep-or-drop draws of one site under one step's seed: element `i` of the site's tensor
/// is kept when its 16-bit quarter of the hash of `i / 4` reaches `ratio * 2^16`, and a kept
/// element is scaled by `1 / (1 - ratio)`.
#[derive(Debug, Clone, Copy)]
pub struct Draws {
    key: u64,
    threshold: u64,
    scale: f32,
}

impl Draws {
    /// The draws of the stream `key` (see [`site_key`]) at `ratio`.
    pub fn new(key: u64, ratio: f32) -> Self {
        let threshold = (f64::from(ratio.clamp(0.0, 1.0)) * 65_536.0).round() as u64;
        let scale = if ratio < 1.0 { 1.0 / (1.0 - ratio) } else { 0.0 };
        Draws { key, threshold, scale }
    }

    /// The hash whose four 16-bit quarters decide elements `4 * quad .. 4 * quad + 4`.
    fn draw(&self, quad: usize) -> u64 {
        mix(self.key.wrapping_add((quad as u64).wrapping_mul(GOLDEN)))
    }

    /// Whether elements `4 * quad .. 4 * quad + 4` are kept.
    fn quad(&self, quad: usize) -> [bool; 4] {
        let draw = self.draw(quad);
        std::array::from_fn(|k| (draw >> (16 * k)) & 0xffff >= self.threshold)
    }

    /// What elements `first .. first + factors.len()` are multiplied by: 0 or the scale.
    pub fn factors(&self, first: usize, factors: &mut [f32]) {
        let factor = |draw: u64, k: usize| if (draw >> (16 * k)) & 0xffff >= self.threshold { self.scale } else { 0.0 };
        // Elements `from..from + out.len()` of quad `quad`, at the ends.
        let part = |quad: usize, from: usize, out: &mut [f32]| {
            let draw = self.draw(quad);
            for (k, f) in (from..).zip(out.iter_mut()) {
                *f = factor(draw, k);
            }
        };
        let lead = ((4 - first % 4) % 4).min(factors.len());
        let (head, rest) = factors.split_at_mut(lead);
        if !head.is_empty() {
            part(first / 4, first % 4, head);
        }
        let base = (first + lead) / 4;
        let full = rest.len() / 4;
        let mut quads = rest.chunks_exact_mut(4);
        for (quad, out) in (&mut quads).enumerate() {
            let draw = self.draw(base + quad);
            for (k, f) in out.iter_mut().enumerate() {
                *f = factor(draw, k);
            }
        }
        let tail = quads.into_remainder();
        if !tail.is_empty() {
            part(base + full, 0, tail);
        }
    }
}

/// The draws of a fused operator's optional `ratio` and `seed` inputs at `site`: none without
/// them or at ratio 0; a ratio outside [0, 1) is an error.
pub(crate) fn optional_draws(
    ratio: Option<TensorRef<'_>>,
    seed: Option<TensorRef<'_>>,
    site: u64,
) -> Result<Option<Draws>, String> {
    let ratio = ratio.and_then(|r| r.f32()).and_then(|r| r.first().copied());
    let seed = seed.and_then(|s| s.i64()).and_then(|s| s.first().copied());
    match (ratio, seed) {
        (Some(ratio), _) if !(0.0..1.0).contains(&ratio) => Err(format!("ratio {ratio} is outside [0, 1)")),
        (Some(ratio), Some(seed)) if ratio > 0.0 => Ok(Some(Draws::new(site_key(seed as u64, site), ratio))),
        _ => Ok(None),
    }
}

/// `y = x * mask / (1 - ratio)` with `mask[i]` kept at probability `1 - ratio`, drawn from
/// `key`, the mask also written out when asked. Dropout is linear in `x`, so the same call on
/// `dy` is its gradient.
pub fn apply(key: u64, ratio: f32, x: &[f32], y: &mut [f32], mask: Option<&mut [bool]>) {
    apply_from(&Draws::new(key, ratio), 0, x, y, mask);
}

/// [`apply`] to the elements `4 * first_quad ..` of a tensor, `x`, `y` and `mask` being theirs.
fn apply_from(draws: &Draws, first_quad: usize, x: &[f32], y: &mut [f32], mut mask: Option<&mut [bool]>) {
    assert!(x.len() == y.len(), "dropout buffers differ in length");
    assert!(mask.as_ref().is_none_or(|m| m.len() == x.len()), "dropout mask differs in length");
    let scale = draws.scale;
    let quads = x.len() / 4;
    let (x, x_tail) = x.split_at(4 * quads);
    let (y, y_tail) = y.split_at_mut(4 * quads);
    // Multiplying by 0 or the scale (not branching on the mask) lets the loop run branch-free.
    for (quad, (x, y)) in x.chunks_exact(4).zip(y.chunks_exact_mut(4)).enumerate() {
        let keep = draws.quad(first_quad + quad);
        for k in 0..4 {
            y[k] = x[k] * if keep[k] { scale } else { 0.0 };
        }
        if let Some(m) = mask.as_deref_mut() {
            m[4 * quad..4 * quad + 4].copy_from_slice(&keep);
        }
    }
    if !x_tail.is_empty() {
        let keep = draws.quad(first_quad + quads);
        for (k, (x, y)) in x_tail.iter().zip(y_tail.iter_mut()).enumerate() {
            *y = x * if keep[k] { scale } else { 0.0 };
        }
        if let Some(m) = mask {
            m[4 * quads..].copy_from_slice(&keep[..x_tail.len()]);
        }
    }
}

/// The operator, for ONNX Runtime sessions.
pub(crate) struct SeededDropout;

impl CustomOp for SeededDropout {
    fn name(&self) -> &'static str {
        NAME
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::required(ElementType::F32), Port::required(ElementType::I64)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::optional(ElementType::Bool)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(DropoutKernel(DropoutAttrs::read(attributes))))
    }
}

struct DropoutKernel(DropoutAttrs);

impl Kernel for DropoutKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        shapes::in_kernel(inputs, outputs)
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        threads: &dyn Parallel,
    ) -> Result<(), String> {
        let input = |i: usize, what: &str| inputs.get(i).copied().flatten().ok_or(format!("missing {what}"));
        let x = input(0, "X")?.f32().ok_or("X must be float")?;
        let ratio = input(1, "ratio")?.f32().and_then(|r| r.first().copied()).unwrap_or(0.5);
        let seed = input(2, "seed")?.i64().and_then(|s| s.first().copied()).unwrap_or(0) as u64;
        if !(0.0..1.0).contains(&ratio) {
            return Err(format!("ratio {ratio} is outside [0, 1)"));
        }
        let (y, rest) = outputs.split_first_mut().ok_or("no outputs")?;
        let Some(TensorMut::F32(y)) = y else { return Err("no Y".into()) };
        if y.len() != x.len() {
            return Err(format!("Y holds {} elements for X's {}", y.len(), x.len()));
        }
        let draws = Draws::new(site_key(seed, self.0.site), ratio);
        // In chunks of whole quads on ONNX Runtime's threads: each element's draw depends on its
        // index alone, so the result is the same whatever the thread count.
        let parts: Vec<(&mut [f32], Option<&mut [bool]>)> = match rest.first_mut() {
            Some(Some(TensorMut::Bool(m))) if m.len() == y.len() => {
                y.chunks_mut(CHUNK).zip(m.chunks_mut(CHUNK)).map(|(y, m)| (y, Some(m))).collect()
            }
            Some(Some(TensorMut::Bool(m))) => {
                return Err(format!("the mask holds {} elements for {}", m.len(), x.len()))
            }
            _ => y.chunks_mut(CHUNK).map(|y| (y, None)).collect(),
        };
        for_each_part(threads, parts, |chunk, (y, mask)| {
            let first = chunk * CHUNK;
            apply_from(&draws, first / 4, &x[first..first + y.len()], y, mask.as_deref_mut());
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringtune_runtime::Serial;

    fn run(key: u64, ratio: f32, n: usize) -> (Vec<f32>, Vec<bool>) {
        let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 3.0).collect();
        let (mut y, mut mask) = (vec![f32::NAN; n], vec![false; n]);
        apply(key, ratio, &x, &mut y, Some(&mut mask));
        let mut without_mask = vec![f32::NAN; n];
        apply(key, ratio, &x, &mut without_mask, None);
        assert_eq!(y, without_mask, "the mask output changes nothing");
        (y, mask)
    }

    #[test]
    fn keeps_one_minus_ratio_and_scales_what_it_keeps() {
        for ratio in [0.1f32, 0.5, 0.9] {
            let n = 1_000_001;
            let (y, mask) = run(site_key(7, 3), ratio, n);
            let kept = mask.iter().filter(|m| **m).count() as f64 / n as f64;
            // Binomial standard deviation is below 5e-4 here; 5 of them.
            assert!((kept - (1.0 - ratio as f64)).abs() < 2.5e-3, "ratio {ratio}: kept {kept}");
            for (i, (y, m)) in y.iter().zip(&mask).enumerate() {
                let want = (i as f32 * 0.25 - 3.0) * if *m { 1.0 / (1.0 - ratio) } else { 0.0 };
                assert_eq!(y.to_bits(), want.to_bits(), "element {i}");
            }
        }
    }

    #[test]
    fn masks_are_a_function_of_seed_and_site() {
        let one = run(site_key(1, 0), 0.1, 10_001);
        assert_eq!(one, run(site_key(1, 0), 0.1, 10_001));
        let differs = |a: &[bool], b: &[bool]| a.iter().zip(b).filter(|(a, b)| a != b).count();
        let other_site = run(site_key(1, 1), 0.1, 10_001);
        let other_seed = run(site_key(2, 0), 0.1, 10_001);
        // Independent masks at 0.1 disagree on 2 * 0.1 * 0.9 = 18% of elements.
        for other in [&other_site.1, &other_seed.1] {
            let share = differs(&one.1, other) as f64 / 10_001.0;
            assert!((share - 0.18).abs() < 0.03, "{share}");
        }
    }

    #[test]
    fn neighbouring_elements_are_independent() {
        // Quarters of one hash and adjacent hashes: P(both dropped) = ratio^2.
        let (_, mask) = run(site_key(5, 9), 0.5, 400_000);
        let both = mask.windows(2).filter(|w| !w[0] && !w[1]).count() as f64 / 399_999.0;
        assert!((both - 0.25).abs() < 5e-3, "{both}");
    }

    #[test]
    fn factors_of_any_range_are_those_of_the_whole_tensor() {
        let key = site_key(3, 4);
        let ones = vec![1.0f32; 103];
        let mut whole = vec![0.0f32; 103];
        apply(key, 0.3, &ones, &mut whole, None);
        let draws = Draws::new(key, 0.3);
        for (first, len) in [(0, 103), (1, 7), (5, 3), (6, 97), (100, 3), (40, 0)] {
            let mut factors = vec![f32::NAN; len];
            draws.factors(first, &mut factors);
            assert_eq!(factors, whole[first..first + len], "elements {first}..{}", first + len);
        }
    }

    #[test]
    fn ratio_zero_keeps_everything() {
        let (y, mask) = run(site_key(0, 0), 0.0, 33);
        assert!(mask.iter().all(|m| *m));
        assert_eq!(y[5], 5.0 * 0.25 - 3.0);
    }

    #[test]
    fn the_kernel_reads_its_inputs_and_fills_the_mask_only_when_asked() {
        // Two chunks and a part that is not whole quads: the same draws as one pass.
        let n = 2 * CHUNK + 9;
        let x: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32).collect();
        let (seed, ratio) = ([11i64], [0.5f32]);
        let dims = [n as i64];
        let inputs =
            [Some(TensorRef::F32(&dims, &x)), Some(TensorRef::F32(&[], &ratio)), Some(TensorRef::I64(&[1], &seed))];
        let kernel = DropoutKernel(DropoutAttrs { site: 2 });
        assert_eq!(kernel.output_shapes(&inputs).expect("shapes"), vec![vec![n as i64], vec![n as i64]]);
        let (mut y, mut mask) = (vec![0.0f32; n], vec![false; n]);
        kernel
            .compute(&inputs, &mut [Some(TensorMut::F32(&mut y)), Some(TensorMut::Bool(&mut mask))], &Serial)
            .expect("compute");
        let mut want = vec![0.0f32; n];
        apply(site_key(11, 2), 0.5, &x, &mut want, None);
        assert_eq!(y, want);
        assert!(mask.iter().zip(&y).all(|(m, y)| *m == (*y != 0.0)));
        let mut alone = vec![0.0f32; n];
        kernel.compute(&inputs, &mut [Some(TensorMut::F32(&mut alone)), None], &Serial).expect("no mask");
        assert_eq!(alone, y);
        let bad_ratio = [inputs[0], Some(TensorRef::F32(&[], &[1.0])), inputs[2]];
        let err =
            kernel.compute(&bad_ratio, &mut [Some(TensorMut::F32(&mut alone)), None], &Serial).expect_err("ratio 1");
        assert!(err.contains("ratio 1"), "{err}");
        let mut short_mask = vec![false; n - 1];
        let outputs = &mut [Some(TensorMut::F32(&mut alone)), Some(TensorMut::Bool(&mut short_mask))];
        let err = kernel.compute(&inputs, outputs, &Serial).expect_err("a short mask");
        assert!(err.contains("the mask holds"), "{err}");
    }

    #[test]
    fn the_fused_operators_dropout_inputs_are_optional_and_checked() {
        let (ratio, zero, seed) = ([0.25f32], [0.0f32], [9i64]);
        let (ratio, zero, seed) =
            (TensorRef::F32(&[], &ratio), TensorRef::F32(&[], &zero), TensorRef::I64(&[1], &seed));
        assert!(optional_draws(None, None, 3).expect("absent").is_none());
        assert!(optional_draws(Some(zero), Some(seed), 3).expect("ratio 0").is_none());
        let draws = optional_draws(Some(ratio), Some(seed), 3).expect("dropout").expect("draws");
        let (mut got, mut want) = ([0.0f32; 8], [0.0f32; 8]);
        draws.factors(0, &mut got);
        Draws::new(site_key(9, 3), 0.25).factors(0, &mut want);
        assert_eq!(got, want);
        let err = optional_draws(Some(TensorRef::F32(&[], &[1.5])), Some(seed), 3).expect_err("ratio 1.5");
        assert!(err.contains("outside [0, 1)"), "{err}");
    }

    #[test]
    fn training_dropouts_become_seeded_before_differentiation_and_redraw_in_the_backward_pass() {
        let mut g = Graph::new("t");
        let x = g.input("x", DType::F32, shape(&[3, 8])).expect("x");
        let a = g.dropout(&x, 0.1).expect("dropout");
        let b = g.dropout(&a.y, 0.25).expect("dropout");
        let squared = g.mul(&b.y, &b.y).expect("mul");
        let loss = g.reduce_sum(&squared, &[0, 1], false).expect("sum");
        g.output(&loss).expect("out");
        assert_eq!(seed_dropouts(&mut g).expect("seeded"), 2);
        assert!(g.inputs.iter().any(|i| i == SEED_INPUT));
        let grads = ringtune_autodiff::backward_with(
            &mut g,
            &loss,
            std::slice::from_ref(&x),
            &crate::gradient_rules(crate::Kernels::Mlas),
        )
        .expect("backward");
        g.output(&grads[0]).expect("grad");
        let seeded: Vec<&Node> = g.nodes().iter().filter(|n| n.op_type == NAME).collect();
        let sites: Vec<Option<i64>> = seeded.iter().map(|n| n.int("site")).collect();
        assert_eq!(sites, [Some(0), Some(1), Some(1), Some(0)], "forward sites in order, then the backward pass");
        assert!(seeded.iter().all(|n| n.outputs.len() == 1 && n.domain == DOMAIN && n.inputs[2] == SEED_INPUT));
        assert!(!g.nodes().iter().any(|n| n.op_type == "Dropout" || n.op_type == "Where"));
        assert!(g.to_bytes().is_ok());
        // A graph without training dropout gains no seed input.
        let mut plain = Graph::new("p");
        let x = plain.input("x", DType::F32, shape(&[2])).expect("x");
        plain.output(&x).expect("out");
        assert_eq!(seed_dropouts(&mut plain).expect("none"), 0);
        assert_eq!(plain.inputs.len(), 1);
    }

    #[test]
    fn a_mask_that_is_read_stays_an_output() {
        let mut g = Graph::new("m");
        let x = g.input("x", DType::F32, shape(&[4])).expect("x");
        let d = g.dropout(&x, 0.5).expect("dropout");
        g.output(&d.y).expect("y");
        g.output(&d.mask).expect("mask");
        assert_eq!(seed_dropouts(&mut g).expect("seeded"), 1);
        let node = g.producer(d.y.name()).expect("producer");
        assert_eq!((node.op_type.as_str(), node.outputs.len()), (NAME, 2));
        assert_eq!(g.dtype(&d.mask).expect("mask type"), DType::Bool);
    }
}
