//! Finite-difference checks of the activation family.

mod common;

use common::{check, float};
use ringtune_onnx_ir::DType;

#[test]
fn tanh_sigmoid_exp_relu() {
    let x = float("x", &[3, 5], -2.0, 2.0, 21);
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.tanh(&v[0]));
    check(DType::F32, std::slice::from_ref(&x), |g, v| g.sigmoid(&v[0]));
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.exp(&v[0]));
    // Away from the kink at 0.
    let shifted = float("x", &[3, 5], 0.1, 2.0, 22);
    check(DType::F32, &[shifted], |g, v| {
        let half = g.scalar(DType::F32, 1.0)?;
        let centred = g.sub(&v[0], &half)?;
        let pos = g.relu(&centred)?;
        g.mul(&pos, &centred)
    });
}

#[test]
fn log_and_sqrt_on_positive_inputs() {
    let x = float("x", &[7], 0.5, 3.0, 23);
    check(DType::F32, std::slice::from_ref(&x), |g, v| g.log(&v[0]));
    check(DType::F64, &[x], |g, v| g.sqrt(&v[0]));
}

#[test]
fn erf_and_exact_gelu() {
    let x = float("x", &[4, 6], -3.0, 3.0, 24);
    check(DType::F32, std::slice::from_ref(&x), |g, v| g.erf(&v[0]));
    check(DType::F32, &[x], |g, v| g.gelu(&v[0]));
}
