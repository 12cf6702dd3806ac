//! Differentiates a small ONNX graph: a linear layer, ReLU and a squared-error loss. The
//! backward nodes are standard ONNX operators added to the same graph, and each parameter's
//! gradient becomes a named graph output.
//!
//! `cargo run -p ringtune-autodiff --example differentiate`

use ringtune_onnx_ir::{shape, DType, Graph};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut g = Graph::new("regression");
    let x = g.input("x", DType::F32, shape(&[4, 3]))?;
    let target = g.input("target", DType::F32, shape(&[4, 2]))?;
    let w = g.input("w", DType::F32, shape(&[2, 3]))?;
    let b = g.input("b", DType::F32, shape(&[2]))?;
    let y = g.gemm(&x, &w, Some(&b), false, true)?;
    let y = g.relu(&y)?;
    let err = g.sub(&y, &target)?;
    let squared = g.mul(&err, &err)?;
    let loss = g.reduce_sum(&squared, &[0, 1], false)?;
    g.output(&loss)?;
    let forward_nodes = g.nodes().len();
    let grads = ringtune_autodiff::backward(&mut g, &loss, &[w, b])?;
    ringtune_autodiff::name_gradients(&mut g, &grads, &["grad.w".into(), "grad.b".into()])?;
    g.prune();
    println!("{forward_nodes} forward nodes, {} in all after differentiation", g.nodes().len());
    for node in &g.nodes()[forward_nodes..] {
        println!("  {} {:?} -> {:?}", node.op_type, node.inputs, node.outputs);
    }
    println!("outputs: {:?}", g.outputs);
    Ok(())
}
