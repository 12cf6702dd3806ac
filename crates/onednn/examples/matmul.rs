//! One matrix product on oneDNN (provisioned by `just setup`): B read transposed in place
//! through strides, the bias added, in fp32, then in bf16 where the CPU has it.
//!
//! `cargo run -p ringtune-onednn --example matmul`

use ringtune_onednn::{Bias, Engine, Matmul, Precision};

fn main() -> Result<(), ringtune_onednn::DnnlError> {
    let engine = Engine::load_default()?;
    println!("oneDNN from {}", engine.library().display());
    // out[2x2] = a[2x3] @ bᵀ (b stored [2x3]) + bias[2]
    let spec = Matmul { trans_b: true, bias: Some(Bias::Row), ..Matmul::plain(2, 3, 2, Precision::F32) };
    let (a, b, bias) = ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [1.0, 0.0, 1.0, 0.0, 1.0, 1.0], [0.5, -0.5]);
    let mut out = [0.0f32; 4];
    engine.matmul(&spec, &a, &b, Some(&bias), &mut out)?;
    println!("fp32 ({}): {out:?}", engine.implementation(&spec)?);
    if engine.supports(Precision::Bf16) {
        let bf16 = Matmul { precision: Precision::Bf16, ..spec };
        engine.matmul(&bf16, &a, &b, Some(&bias), &mut out)?;
        println!("bf16 ({}): {out:?}", engine.implementation(&bf16)?);
    } else {
        println!("bf16: not on this CPU (oneDNN needs AVX-512 for it)");
    }
    Ok(())
}
