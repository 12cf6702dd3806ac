//! A graph with a training-mode `Dropout` becomes one with our `SeededDropout`, is
//! differentiated with its gradient rule, and runs in ONNX Runtime with our kernels: the same
//! seed gives the same masks (and gradients), another seed other ones.
//!
//! `cargo run -p ringtune-ops --example seeded_dropout`

use ringtune_onnx_ir::{shape, DType, Graph};
use ringtune_ops::{custom_ops, gradient_rules, lower, seed_dropouts, Kernels, SEED_INPUT};
use ringtune_runtime::{Runtime, Session, SessionOptions, TensorView};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut g = Graph::new("dropout");
    let x = g.input("x", DType::F32, shape(&[2, 4]))?;
    let dropped = g.dropout(&x, 0.5)?;
    let squared = g.mul(&dropped.y, &dropped.y)?;
    let loss = g.reduce_sum(&squared, &[0, 1], false)?;
    g.output(&loss)?;
    println!("dropout sites seeded: {}", seed_dropouts(&mut g)?);
    let grads =
        ringtune_autodiff::backward_with(&mut g, &loss, std::slice::from_ref(&x), &gradient_rules(Kernels::Mlas))?;
    g.output_as(&grads[0], "grad.x")?;
    println!("{:?}", lower(&mut g, Kernels::Mlas)?);

    let options = SessionOptions { custom_ops: custom_ops(Kernels::Mlas, 1)?, ..SessionOptions::default() };
    let mut session = Session::from_bytes(Runtime::get()?, &g.to_bytes()?, &options)?;
    let xs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let mut run = |seed: i64| -> Result<Vec<f32>, ringtune_runtime::RuntimeError> {
        let seed = [seed];
        let feeds = [("x", TensorView::f32(&[2, 4], &xs)), (SEED_INPUT, TensorView::i64(&[1], &seed))];
        Ok(session.run(&feeds, &["grad.x"])?[0].as_f32().unwrap_or_default().to_vec())
    };
    let (a, again, other) = (run(7)?, run(7)?, run(8)?);
    println!("seed 7: {a:?}\nseed 7: {again:?}\nseed 8: {other:?}");
    assert_eq!(a, again);
    Ok(())
}
