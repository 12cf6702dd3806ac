//! Finite-difference checks of the normalisation family.

mod common;

use common::{check, float};
use ringtune_onnx_ir::DType;

#[test]
fn layer_norm_last_axis() {
    let x = float("x", &[2, 3, 8], -2.0, 2.0, 51);
    let scale = float("scale", &[8], 0.5, 1.5, 52);
    let bias = float("bias", &[8], -0.5, 0.5, 53);
    check(DType::F32, &[x, scale, bias], |g, v| Ok(g.layer_norm(&v[0], &v[1], &v[2], 1e-5)?.y));
}

#[test]
fn layer_norm_output_used_twice() {
    let x = float("x", &[4, 6], -2.0, 2.0, 54);
    let scale = float("scale", &[6], 0.5, 1.5, 55);
    let bias = float("bias", &[6], -0.5, 0.5, 56);
    check(DType::F32, &[x, scale, bias], |g, v| {
        let y = g.layer_norm(&v[0], &v[1], &v[2], 1e-12)?.y;
        let r = g.add(&y, &v[0])?;
        g.mul(&r, &y)
    });
}

#[test]
fn softmax_and_log_softmax() {
    let x = float("x", &[2, 3, 5], -2.0, 2.0, 57);
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.softmax(&v[0], -1));
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.softmax(&v[0], 1));
    check(DType::F32, &[x], |g, v| g.log_softmax(&v[0], -1));
}
