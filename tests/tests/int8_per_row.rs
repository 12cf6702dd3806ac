//! The int8 rewrite of a linear layer that reads a GELU or feeds one, run by ONNX Runtime against
//! the float layer: its input is quantized per row, so rows of very different magnitudes (and
//! signs) each keep their precision, which one scale for the whole batch would not.

use ringtune_bert::{quantize_linear_layers, PerToken, WeightRange};
use ringtune_onnx_ir::{DType, Dim, Graph, Tensor};
use ringtune_runtime::{Session, SessionOptions, TensorView};
use ringtune_tests::runtime;

const ROWS: usize = 6;
const INPUTS: usize = 64;
const OUTPUTS: usize = 8;

/// `Gelu(x) @ W^T + b` (`gelu_first`) or `x @ W^T + b` feeding a GELU, with seeded weights, as
/// ONNX bytes whose first output is the linear layer's; int8 when `range` is given.
fn layer(gelu_first: bool, range: Option<WeightRange>) -> Vec<u8> {
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
    if let Some(range) = range {
        let report = quantize_linear_layers(&mut g, range, PerToken::FeedForward, &|_| false).expect("quantized");
        assert_eq!((report.linear.clone(), report.per_row), (vec!["w".to_string()], vec!["w".to_string()]));
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

#[test]
fn a_layer_reading_or_feeding_a_gelu_keeps_every_rows_precision_in_int8() {
    for gelu_first in [true, false] {
        // From 0.01 to 1000; after a GELU from 1 up, as rows whose GELU outputs all stay below
        // its least bound's magnitude (0.1701) share that bound's step.
        let x = rows(if gelu_first { 0 } else { -2 });
        let float = run(&layer(gelu_first, None), &x);
        for range in [WeightRange::Full, WeightRange::Reduced, WeightRange::Unsigned] {
            let int8 = run(&layer(gelu_first, Some(range)), &x);
            for (r, (a, b)) in int8.chunks(OUTPUTS).zip(float.chunks(OUTPUTS)).enumerate() {
                let bias = (0..OUTPUTS).map(|o| ((o * 37 + 7) % 101) as f32 / 101.0 - 0.5);
                let signal: f32 = b.iter().zip(bias).map(|(y, c)| (y - c).powi(2)).sum::<f32>().sqrt();
                let error: f32 = a.iter().zip(b).map(|(p, q)| (p - q).powi(2)).sum::<f32>().sqrt();
                // 7- or 8-bit weights and 8-bit inputs: a few percent of the row's own product.
                assert!(
                    error <= 0.05 * signal,
                    "{range:?}, GELU first {gelu_first}, row {r}: error {error:e} of a product {signal:e}"
                );
            }
        }
    }
}
