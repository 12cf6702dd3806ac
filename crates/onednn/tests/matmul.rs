//! oneDNN products against a plain f64 reference: odd shapes, batches with broadcasting,
//! transposed operands, biases, a GELU applied as the output is written; fp32 within 1e-5
//! relative, bf16 within bf16 rounding.

use ringtune_onednn::{Activation, Bias, Engine, Matmul, Precision};

fn engine() -> Engine {
    Engine::load_default().unwrap_or_else(|e| panic!("{e}"))
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The exact GELU in f64, `erfc` from Numerical Recipes' Chebyshev fit (relative error below
/// 1.2e-7).
fn gelu(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let c = [
        -1.265_512_23,
        1.000_023_68,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_203_98,
        1.488_515_87,
        -0.822_152_23,
        0.170_872_77,
    ];
    let poly = c.iter().rev().fold(0.0, |acc, ci| acc * t + ci);
    let erfc = t * (-z * z + poly).exp();
    let cdf = if x >= 0.0 { 1.0 - 0.5 * erfc } else { 0.5 * erfc };
    x * cdf
}

/// The product computed plainly, in f64.
fn reference(spec: &Matmul, a: &[f32], b: &[f32], bias: Option<&[f32]>) -> Vec<f64> {
    let (m, k, n) = (spec.m as usize, spec.k as usize, spec.n as usize);
    let out_batch = spec.batch_out();
    let batches: usize = out_batch.iter().product::<i64>() as usize;
    let mut out = vec![0.0; batches * m * n];
    let index = |batch: &[i64], flat: usize| -> usize {
        // Map an output batch index to an operand's (broadcast) batch index.
        let mut rem = flat;
        let mut idx = 0;
        let mut stride = 1;
        for d in (0..out_batch.len()).rev() {
            let i = rem % out_batch[d] as usize;
            rem /= out_batch[d] as usize;
            idx += if batch[d] == 1 { 0 } else { i } * stride;
            stride *= batch[d] as usize;
        }
        idx
    };
    for bt in 0..batches {
        let (ba, bb) = (index(&spec.batch_a, bt), index(&spec.batch_b, bt));
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for p in 0..k {
                    let av = if spec.trans_a { a[ba * m * k + p * m + i] } else { a[ba * m * k + i * k + p] };
                    let bv = if spec.trans_b { b[bb * k * n + j * k + p] } else { b[bb * k * n + p * n + j] };
                    acc += av as f64 * bv as f64;
                }
                acc += match (spec.bias, bias) {
                    (Some(Bias::Row), Some(c)) => c[j] as f64,
                    (Some(Bias::Column), Some(c)) => c[i] as f64,
                    (Some(Bias::Full), Some(c)) => c[i * n + j] as f64,
                    _ => 0.0,
                };
                out[bt * m * n + i * n + j] = match spec.activation {
                    Some(Activation::GeluErf) => gelu(acc),
                    None => acc,
                };
            }
        }
    }
    out
}

fn check(engine: &Engine, spec: Matmul, tolerance: f64) {
    let (la, lb, lbias, lout) = spec.lens();
    let a = values(la, 1 + la as u64);
    let b = values(lb, 2 + lb as u64);
    let bias = (lbias > 0).then(|| values(lbias, 3));
    let mut out = vec![0.0f32; lout];
    engine.matmul(&spec, &a, &b, bias.as_deref(), &mut out).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
    let want = reference(&spec, &a, &b, bias.as_deref());
    let num: f64 = out.iter().zip(&want).map(|(g, w)| (*g as f64 - w).powi(2)).sum();
    let den: f64 = want.iter().map(|w| w * w).sum();
    let rel = (num / den.max(1e-30)).sqrt();
    assert!(
        rel <= tolerance,
        "{spec:?} ({}): relative error {rel:e}",
        engine.implementation(&spec).unwrap_or_default()
    );
}

fn specs(precision: Precision) -> Vec<Matmul> {
    let mut out = Vec::new();
    for (m, k, n) in [(1, 1, 1), (7, 13, 5), (33, 65, 17), (128, 384, 96)] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let mut s = Matmul::plain(m, k, n, precision);
            (s.trans_a, s.trans_b) = (ta, tb);
            out.push(s.clone());
            for bias in [Bias::Row, Bias::Column, Bias::Full] {
                out.push(Matmul { bias: Some(bias), ..s.clone() });
            }
            out.push(Matmul { batch_a: vec![2, 3], batch_b: vec![2, 3], ..s.clone() });
            out.push(Matmul { batch_a: vec![3, 1], batch_b: vec![1, 2], ..s.clone() });
            out.push(Matmul { batch_a: vec![4], batch_b: vec![1], ..s.clone() });
            out.push(Matmul { activation: Some(Activation::GeluErf), ..s.clone() });
            out.push(Matmul { activation: Some(Activation::GeluErf), bias: Some(Bias::Row), ..s });
        }
    }
    out
}

#[test]
fn fp32_products_match_the_reference() {
    let e = engine();
    for spec in specs(Precision::F32) {
        check(&e, spec, 1e-5);
    }
}

#[test]
fn bf16_products_are_within_bf16_rounding() {
    let e = engine();
    if !e.supports(Precision::Bf16) {
        // oneDNN 3.2 has bf16 products only on AVX-512 CPUs: elsewhere asking for one must
        // fail with a message that says what to do, not with a bare status code.
        let spec = Matmul::plain(2, 2, 2, Precision::Bf16);
        let err = e.matmul(&spec, &[0.0; 4], &[0.0; 4], None, &mut [0.0; 4]).expect_err("no bf16").to_string();
        assert!(err.contains("no bf16") && err.contains("--precision fp32"), "{err}");
        eprintln!("bf16 accuracy not checked on this CPU: {err}");
        return;
    }
    for spec in specs(Precision::Bf16) {
        check(&e, spec, 1e-2);
    }
    // The bf16 path really rounds: its error is far above fp32's on a long inner product.
    let big = Matmul::plain(64, 768, 64, Precision::Bf16);
    let name = e.implementation(&big).expect("impl");
    eprintln!("bf16 implementation: {name}");
    let (la, lb, _, lout) = big.lens();
    let (a, b) = (values(la, 5), values(lb, 6));
    let mut out = vec![0.0f32; lout];
    e.matmul(&big, &a, &b, None, &mut out).expect("bf16 product");
    let want = reference(&big, &a, &b, None);
    let err = out.iter().zip(&want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max);
    assert!(err > 1e-4, "bf16 rounding leaves a visible error (max {err:e}, {name})");
}

#[test]
fn wrong_buffer_lengths_are_refused() {
    let e = engine();
    let spec = Matmul::plain(2, 3, 4, Precision::F32);
    let err = e.matmul(&spec, &[0.0; 5], &[0.0; 12], None, &mut [0.0; 8]).expect_err("short A").to_string();
    assert!(err.contains("needs 6"), "{err}");
    let missing = Engine::load(std::path::Path::new("/nonexistent/libdnnl.so.3")).err().expect("missing").to_string();
    assert!(missing.contains("/nonexistent/libdnnl.so.3") && missing.contains("just setup"), "{missing}");
}
