//! Builds a small typed ONNX graph (a linear layer with GELU and LayerNorm over a symbolic
//! batch), validates it, prints it and serialises it.
//!
//! `cargo run -p ringtune-onnx-ir --example build_graph`

use ringtune_onnx_ir::{shape, DType, Dim, Graph, IrError};

fn main() -> Result<(), IrError> {
    let mut g = Graph::new("layer");
    let x = g.input("x", DType::F32, shape(&[Dim::sym("batch"), Dim::Known(8)]))?;
    let w = g.input("w", DType::F32, shape(&[16, 8]))?;
    let b = g.input("b", DType::F32, shape(&[16]))?;
    let gamma = g.input("gamma", DType::F32, shape(&[16]))?;
    let beta = g.input("beta", DType::F32, shape(&[16]))?;
    let y = g.gemm(&x, &w, Some(&b), false, true)?;
    let y = g.gelu(&y)?;
    let y = g.layer_norm(&y, &gamma, &beta, 1e-12)?.y;
    g.output(&y)?;
    g.validate()?;
    println!("{g}");
    println!("output shape {:?}, {} bytes of ONNX", g.shape(&y)?, g.to_bytes()?.len());
    Ok(())
}
