//! The int8 rewrite of a linear layer that reads a GELU or feeds one, run by ONNX Runtime against
//! the float layer: its input is quantized per row, so rows of very different magnitudes (and
//! signs) each keep their precision, which one scale for the whole batch would not; or, feeding a
//! GELU, smoothed per channel, so that a few channels of outlying values do not take the whole
//! batch's precision.

use std::collections::HashMap;

use ringtune_encoders::{quantize_linear_layers, FeedForwardInput, WeightRange};
use ringtune_onnx_ir::{DType, Dim, Graph, Tensor};
use ringtune_runtime::{Session, SessionOptions, TensorView};
use ringtune_tests::runtime;

const ROWS: usize = 6;
const INPUTS: usize = 64;
const OUTPUTS: usize = 8;

/// `Gelu(x) @ W^T + b` (`gelu_first`) or `x @ W^T + b` feeding a GELU, with seeded weights, as
/// ONNX bytes whose first output is the linear layer's; int8 when `quantized` says how.
fn layer(gelu_first: bool, quantized: Option<(WeightRange, FeedForwardInput<'_>)>) -> Vec<u8> {
    let mut g = Graph::new("layer");
    let x = g.input("x", DType::F32, vec![Dim::Known(ROWS as i64), Dim::Known(INPUTS as i64)]).expect("input");
    let input = if gelu_first { g.gelu(&x).expect("gelu") } else { x };
    let values =
        |n: usize, seed: usize| (0..n).map(|i| ((i * 37 + seed) % 101) as f32 / 101.0 - 0.5).collect::<Vec<_>>();
    let shape = [OUTPUTS as i64, INPUTS as i64];
    let w = g.initializer("w", Tensor::from_f32(&shape, &values(OUTPUTS * INPUTS, 3))).expect("w");
    let b = g.initializer("b", Tensor::from_f32(&[OUTPUTS as i64], &values(OUTPUTS, 7))).expect("b");
    let y = g.gemm(&input, &w, Some(&b), false, true).expect("gemm");
    g.output(&y).expect("output");
    if !gelu_first {
        let activated = g.gelu(&y).expect("gelu");
        g.output(&activated).expect("output");
    }
    if let Some((range, feed_forward)) = quantized {
        let report = quantize_linear_layers(&mut g, range, feed_forward, &|_| false).expect("quantized");
        assert_eq!(report.linear, ["w"]);
        let per_row = gelu_first || matches!(feed_forward, FeedForwardInput::PerToken);
        let smoothed = !gelu_first && matches!(feed_forward, FeedForwardInput::Smoothed(_));
        assert_eq!((report.per_row.len(), report.smoothed.len()), (usize::from(per_row), usize::from(smoothed)));
    }
    g.to_bytes().expect("bytes")
}

fn run(model: &[u8], x: &[f32]) -> Vec<f32> {
    let mut session = Session::from_bytes(runtime(), model, &SessionOptions::default()).expect("session");
    let input = TensorView::f32(&[ROWS as i64, INPUTS as i64], x);
    let out = session.run(&[("x", input)], &[]).expect("run");
    out[0].as_f32().expect("floats").to_vec()
}

/// Row r spans 10^(r + lowest): six decades; odd rows mostly negative.
fn rows(lowest: i32) -> Vec<f32> {
    (0..ROWS * INPUTS)
        .map(|i| {
            let sign = if (i / INPUTS) % 2 == 1 { -1.0 } else { 1.0 };
            sign * (((i * 53) % 97) as f32 / 97.0 - 0.3) * 10f32.powi((i / INPUTS) as i32 + lowest)
        })
        .collect()
}

/// Each row's (error of `int8` against `float`, norm of the float product without the bias).
fn row_errors(int8: &[f32], float: &[f32]) -> Vec<(f32, f32)> {
    int8.chunks(OUTPUTS)
        .zip(float.chunks(OUTPUTS))
        .map(|(a, b)| {
            let bias = (0..OUTPUTS).map(|o| ((o * 37 + 7) % 101) as f32 / 101.0 - 0.5);
            let signal: f32 = b.iter().zip(bias).map(|(y, c)| (y - c).powi(2)).sum::<f32>().sqrt();
            let error: f32 = a.iter().zip(b).map(|(p, q)| (p - q).powi(2)).sum::<f32>().sqrt();
            (error, signal)
        })
        .collect()
}

#[test]
fn a_layer_reading_or_feeding_a_gelu_keeps_every_rows_precision_in_int8() {
    for gelu_first in [true, false] {
        // From 0.01 to 1000; after a GELU from 1 up, as rows whose GELU outputs all stay below
        // its least bound's magnitude (0.1701) share that bound's step.
        let x = rows(if gelu_first { 0 } else { -2 });
        let float = run(&layer(gelu_first, None), &x);
        for range in [WeightRange::Full, WeightRange::Reduced, WeightRange::Unsigned] {
            let int8 = run(&layer(gelu_first, Some((range, FeedForwardInput::PerToken))), &x);
            for (r, (error, signal)) in row_errors(&int8, &float).into_iter().enumerate() {
                // 7- or 8-bit weights and 8-bit inputs: a few percent of the row's own product.
                assert!(
                    error <= 0.05 * signal,
                    "{range:?}, GELU first {gelu_first}, row {r}: error {error:e} of a product {signal:e}"
                );
            }
        }
    }
}

#[test]
fn a_layer_feeding_a_gelu_smoothed_keeps_the_precision_a_few_outlying_channels_would_take() {
    // Values within 1, but channels 5 and 40 reach 60 (as a few of MPNet's LayerNorm outputs).
    let x: Vec<f32> = (0..ROWS * INPUTS)
        .map(|i| {
            let v = ((i * 53) % 97) as f32 / 97.0 - 0.5;
            if matches!(i % INPUTS, 5 | 40) {
                v * 120.0
            } else {
                v
            }
        })
        .collect();
    let mut largest = vec![0.0f32; INPUTS];
    for row in x.chunks(INPUTS) {
        largest.iter_mut().zip(row).for_each(|(m, v)| *m = m.max(v.abs()));
    }
    let maxima = HashMap::from([("w".to_string(), largest)]);
    let float = run(&layer(false, None), &x);
    for range in [WeightRange::Full, WeightRange::Reduced, WeightRange::Unsigned] {
        let total = |feed_forward| -> f32 {
            let errors = row_errors(&run(&layer(false, Some((range, feed_forward))), &x), &float);
            errors.iter().map(|(error, _)| error * error).sum()
        };
        let (smoothed, per_batch) = (total(FeedForwardInput::Smoothed(&maxima)), total(FeedForwardInput::PerBatch));
        // The outlying channels set one scale's step for all: smoothing cuts the squared error
        // 15-fold with 8-bit weights, 5-fold with 7-bit ones (whose own rounding then counts).
        assert!(smoothed * 4.0 < per_batch, "{range:?}: squared errors smoothed {smoothed:e}, per batch {per_batch:e}");
    }
}
