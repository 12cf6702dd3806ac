//! Elementwise functions in operations that compilers vectorise (libm's do not), shared by
//! the fused kernels.

/// The widest vectors of this CPU that the kernels have a build for.
#[cfg(target_arch = "x86_64")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vectors {
    /// Neither of the others: the portable build.
    Baseline,
    /// AVX2 with fused multiply-adds.
    Avx2Fma,
    /// AVX-512 (foundation, byte/word, doubleword/quadword and vector-length) besides AVX2 and
    /// FMA.
    Avx512,
}

#[cfg(target_arch = "x86_64")]
impl Vectors {
    /// This CPU's.
    pub(crate) fn detect() -> Self {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma")) {
            Vectors::Baseline
        } else if has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl") {
            Vectors::Avx512
        } else {
            Vectors::Avx2Fma
        }
    }
}

/// Defines `fn $name(args)` that runs `$body` compiled for the widest vectors this CPU has
/// ([`Vectors`]): the body is written once and built three times, with AVX-512, with AVX2 and
/// FMA, and portably. The body may read a constant `FMA`, whether fused multiply-adds are
/// native: true in the vector builds, false in the portable one.
///
/// The builds give the same bits when the body asks for the same operations: compilers do not
/// reorder floating-point sums or fuse a multiply and an add on their own, so wider vectors
/// only do the same operations more at a time. A body reading `FMA` rounds once per multiply-add
/// in the vector builds and twice in the portable one.
macro_rules! vector_builds {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        #[allow(unsafe_code)]
        $vis fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::fast_math::Vectors;
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
                fn avx512($($arg: $ty),*) {
                    #[allow(dead_code)]
                    const FMA: bool = true;
                    $body
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2_fma($($arg: $ty),*) {
                    #[allow(dead_code)]
                    const FMA: bool = true;
                    $body
                }
                match Vectors::detect() {
                    // SAFETY: `detect` found the build's features on this CPU.
                    Vectors::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    Vectors::Avx2Fma => return unsafe { avx2_fma($($arg),*) },
                    Vectors::Baseline => {}
                }
            }
            #[allow(dead_code)]
            const FMA: bool = false;
            $body
        }
    };
}
pub(crate) use vector_builds;

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
