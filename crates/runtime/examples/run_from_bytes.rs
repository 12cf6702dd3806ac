//! Loads ONNX Runtime (provisioned by `just setup`), runs an ONNX model given as bytes on
//! borrowed inputs, and binds a flat parameter buffer so that a second run reads it in place.
//!
//! `cargo run -p ringtune-runtime --example run_from_bytes`

use ringtune_onnx_ir::{shape, DType, Graph};
use ringtune_runtime::{BoundTensor, FlatBinding, FlatBuffer, Runtime, Session, SessionOptions, TensorView};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // y = x @ w + b, built with ringtune-onnx-ir; any ONNX model's bytes would do.
    let mut g = Graph::new("linear");
    let x = g.input("x", DType::F32, shape(&[2, 3]))?;
    let w = g.input("w", DType::F32, shape(&[3, 2]))?;
    let b = g.input("b", DType::F32, shape(&[2]))?;
    let y = g.gemm(&x, &w, Some(&b), false, false)?;
    g.output_as(&y, "y")?;
    let model = g.to_bytes()?;

    let runtime = Runtime::get()?;
    println!("ONNX Runtime {} from {}", runtime.version(), runtime.library().display());
    let mut session =
        Session::from_bytes(runtime, &model, &SessionOptions { threads: 1, ..SessionOptions::default() })?;
    let (xs, ws, bs) = ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], [0.5, -0.5]);
    let feeds =
        [("x", TensorView::f32(&[2, 3], &xs)), ("w", TensorView::f32(&[3, 2], &ws)), ("b", TensorView::f32(&[2], &bs))];
    let out = session.run(&feeds, &["y"])?;
    println!("y = {:?}", out[0].as_f32());

    // The parameters as one flat buffer bound to the session: runs read them in place.
    let mut params = FlatBuffer::zeros(8);
    params[..6].copy_from_slice(&ws);
    params[6..].copy_from_slice(&bs);
    let bound = [
        BoundTensor { name: "w".into(), offset: 0, shape: vec![3, 2] },
        BoundTensor { name: "b".into(), offset: 6, shape: vec![2] },
    ];
    let mut binding = FlatBinding::new(&session, params, &bound, FlatBuffer::zeros(0), &[], &["y"])?;
    let out = binding.run(&mut session, &[("x", TensorView::f32(&[2, 3], &xs))])?;
    println!("y from the bound buffer = {:?}", out[0].as_f32());
    Ok(())
}
