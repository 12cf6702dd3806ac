//! Elementwise functions in operations that compilers vectorise (libm's do not), shared by
//! the fused kernels.

/// Whether this CPU has AVX2 and FMA: the kernels then run a second build of the same code,
/// compiled for them.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// `e^x` to about 2 ulp, in operations that vectorise (libm's `expf` does not): `2^n e^r`
/// with `n = round(x / ln 2)` and Cephes' polynomial for `e^r`. Below -87 (masked scores)
/// it is exactly 0.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let clamped = x.clamp(-87.0, 88.0);
    let shifted = clamped * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = clamped - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = p * r + c;
    }
    let e_r = p * r * r + r + 1.0;
    let power = (shifted.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23;
    let y = e_r * f32::from_bits(power as u32);
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

/// `(Φ(x), e^(-x²/2))`: the standard normal distribution function and the exponential the
/// normal density shares with it. `Φ` comes from the Abramowitz-Stegun form of the error
/// function (7.1.26, absolute error below 1.5e-7), in operations that vectorise.
#[inline(always)]
pub(crate) fn normal_cdf(x: f32) -> (f32, f32) {
    // erf(z) = 1 - t (a1 + t (a2 + ...)) e^(-z²), t = 1 / (1 + p z).
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_7, -1.453_152, 1.061_405_4];
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let e = exp(-0.5 * x * x);
    // Φ(-|x|) = (1 - erf(|x| / sqrt 2)) / 2, without the cancellation of 1 - erf.
    let lower_tail = 0.5 * poly * e;
    (if x >= 0.0 { 1.0 - lower_tail } else { lower_tail }, e)
}

/// Elements per task of the elementwise kernels: a multiple of four, so dropout's quads of
/// draws stay whole.
pub(crate) const CHUNK: usize = 1 << 15;

/// Independent accumulators of a vectorised fold.
pub(crate) const LANES: usize = 8;

/// Folds `values` with `op` in eight independent lanes, then the lanes in order: vectorised,
/// and the same bits every time.
#[inline(always)]
pub(crate) fn lanes(values: &[f32], start: f32, op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [start; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for k in 0..LANES {
            acc[k] = op(acc[k], chunk[k]);
        }
    }
    tail.iter().fold(acc.into_iter().fold(start, &op), |a, b| op(a, *b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_two_ulp_and_zero_far_below() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            assert!(((got - want) / want).abs() < 2.5e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert_eq!(exp(f32::MIN), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
    }
}
