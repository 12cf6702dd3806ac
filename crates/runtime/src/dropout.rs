//! Dropout with masks drawn from a counter-based generator: `SeededDropout(X, ratio, seed)`
//! in the `ai.ringtune` domain, with the outputs of ONNX `Dropout` in training mode (`Y`, and
//! optionally the bool `mask`).
//!
//! Why not ONNX Runtime's own `Dropout`: it draws its masks on one thread from a generator it
//! seeds itself, so the same seed never gives the same run twice, and on MiniLM it took a fifth
//! of a training step. Here element `i` of site `site` is kept when its 16-bit quarter of a
//! SplitMix64 hash of `(seed, site, i / 4)` reaches `ratio` (to 1/65536); that makes a step's
//! masks a pure function of the seed the trainer feeds, whatever the thread count, and cheap
//! enough to redraw in the backward pass instead of storing them.

use ort::operator::{BoxedKernel, ComputeContext, KernelContext, Operator, OperatorInput, OperatorOutput};
use ort::value::TensorElementType;

use crate::kernels::fail;

/// The operator's name in the `ai.ringtune` domain.
pub const SEEDED_DROPOUT: &str = "SeededDropout";
/// The graph input holding the step's dropout seed (int64 `[1]`).
pub const SEED_INPUT: &str = "dropout_seed";

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

/// `y = x * mask / (1 - ratio)` with `mask[i]` kept at probability `1 - ratio`, drawn from
/// `key`, the mask also written out when asked. Dropout is linear in `x`, so the same call on
/// `dy` is its gradient.
///
/// One thread, the caller's: between operators the pool threads of oneDNN (OpenMP) and ONNX
/// Runtime still spin on the other cores, and threads of our own competing with them made
/// MiniLM's step 20% slower, not faster.
pub fn apply(key: u64, ratio: f32, x: &[f32], y: &mut [f32], mut mask: Option<&mut [bool]>) {
    assert!(x.len() == y.len(), "dropout buffers differ in length");
    assert!(mask.as_ref().is_none_or(|m| m.len() == x.len()), "dropout mask differs in length");
    // Keep when the 16-bit draw is at or above ratio * 2^16.
    let threshold = (f64::from(ratio.clamp(0.0, 1.0)) * 65_536.0).round() as u64;
    let scale = if ratio < 1.0 { 1.0 / (1.0 - ratio) } else { 0.0 };
    let keep = |quad: usize| -> [bool; 4] {
        let draw = mix(key.wrapping_add((quad as u64).wrapping_mul(GOLDEN)));
        std::array::from_fn(|k| (draw >> (16 * k)) & 0xffff >= threshold)
    };
    let quads = x.len() / 4;
    let (x, x_tail) = x.split_at(4 * quads);
    let (y, y_tail) = y.split_at_mut(4 * quads);
    // Multiplying by 0 or the scale (not branching on the mask) lets the loop run branch-free.
    for (quad, (x, y)) in x.chunks_exact(4).zip(y.chunks_exact_mut(4)).enumerate() {
        let keep = keep(quad);
        for k in 0..4 {
            y[k] = x[k] * if keep[k] { scale } else { 0.0 };
        }
        if let Some(m) = mask.as_deref_mut() {
            m[4 * quad..4 * quad + 4].copy_from_slice(&keep);
        }
    }
    if !x_tail.is_empty() {
        let keep = keep(quads);
        for (k, (x, y)) in x_tail.iter().zip(y_tail.iter_mut()).enumerate() {
            *y = x * if keep[k] { scale } else { 0.0 };
        }
        if let Some(m) = mask {
            m[4 * quads..].copy_from_slice(&keep[..x_tail.len()]);
        }
    }
}

/// The operator: inputs `X` (f32), `ratio` (f32 scalar), `seed` (int64, one element);
/// attribute `site` (which dropout of the graph); outputs `Y` and, when asked, `mask`.
pub(crate) struct SeededDropout;

impl Operator for SeededDropout {
    type Kernel<'attr> = BoxedKernel<'attr>;

    fn name(&self) -> &str {
        SEEDED_DROPOUT
    }

    fn inputs(&self) -> impl IntoIterator<Item = OperatorInput> {
        [
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Float32),
            OperatorInput::required(TensorElementType::Int64),
        ]
    }

    fn outputs(&self) -> impl IntoIterator<Item = OperatorOutput> {
        [OperatorOutput::required(TensorElementType::Float32), OperatorOutput::optional(TensorElementType::Bool)]
    }

    fn create_kernel<'attr>(&self, kctx: &KernelContext<'attr>) -> ort::Result<Self::Kernel<'attr>> {
        let site = kctx.get::<i64>("site").unwrap_or(0) as u64;
        Ok(Box::new(move |ctx: &ComputeContext| {
            let input =
                |i: usize, what: &str| ctx.input(i)?.ok_or_else(|| fail(format!("{SEEDED_DROPOUT}: missing {what}")));
            let (x, ratio, seed) = (input(0, "X")?, input(1, "ratio")?, input(2, "seed")?);
            let (shape, x) = x.try_extract_tensor::<f32>()?;
            let ratio = ratio.try_extract_tensor::<f32>()?.1.first().copied().unwrap_or(0.5);
            let seed = seed.try_extract_tensor::<i64>()?.1.first().copied().unwrap_or(0) as u64;
            if !(0.0..1.0).contains(&ratio) {
                return Err(fail(format!("{SEEDED_DROPOUT}: ratio {ratio} is outside [0, 1)")));
            }
            let shape = shape.to_vec();
            let mut y = ctx.output(0, shape.clone())?.ok_or_else(|| fail(format!("{SEEDED_DROPOUT}: no Y")))?;
            let mut mask = ctx.output(1, shape)?;
            let (_, y) = y.try_extract_tensor_mut::<f32>()?;
            let mask = match mask.as_mut() {
                Some(m) => Some(m.try_extract_tensor_mut::<bool>()?.1),
                None => None,
            };
            apply(site_key(seed, site), ratio, x, y, mask);
            Ok(())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn ratio_zero_keeps_everything() {
        let (y, mask) = run(site_key(0, 0), 0.0, 33);
        assert!(mask.iter().all(|m| *m));
        assert_eq!(y[5], 5.0 * 0.25 - 3.0);
    }
}
