//! Finite-difference checks of the matrix-product family.

mod common;

use common::{check, float};
use ringtune_onnx_ir::DType;

#[test]
fn matmul_2d_3d_and_batched() {
    let a = float("a", &[3, 4], -1.0, 1.0, 31);
    let b = float("b", &[4, 5], -1.0, 1.0, 32);
    check(DType::F64, &[a, b.clone()], |g, v| g.matmul(&v[0], &v[1]));
    let a3 = float("a", &[2, 3, 4], -1.0, 1.0, 33);
    check(DType::F64, &[a3, b], |g, v| g.matmul(&v[0], &v[1]));
    let q = float("q", &[2, 3, 4, 5], -1.0, 1.0, 34);
    let k = float("k", &[2, 3, 5, 4], -1.0, 1.0, 35);
    check(DType::F64, &[q, k], |g, v| g.matmul(&v[0], &v[1]));
}

#[test]
fn matmul_with_broadcast_batch_axes() {
    let a = float("a", &[2, 1, 3, 4], -1.0, 1.0, 36);
    let b = float("b", &[1, 5, 4, 2], -1.0, 1.0, 37);
    check(DType::F64, &[a, b], |g, v| g.matmul(&v[0], &v[1]));
    let a2 = float("a", &[3, 4], -1.0, 1.0, 38);
    let b3 = float("b", &[2, 4, 5], -1.0, 1.0, 39);
    check(DType::F64, &[a2, b3], |g, v| g.matmul(&v[0], &v[1]));
}

#[test]
fn gemm_every_transpose_with_bias_forms() {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = float("a", if ta { &[4, 3] } else { &[3, 4] }, -1.0, 1.0, 40);
        let b = float("b", if tb { &[5, 4] } else { &[4, 5] }, -1.0, 1.0, 41);
        let bias = float("c", &[5], -1.0, 1.0, 42);
        check(DType::F64, &[a.clone(), b.clone(), bias], |g, v| g.gemm(&v[0], &v[1], Some(&v[2]), ta, tb));
        let column = float("c", &[3, 1], -1.0, 1.0, 43);
        check(DType::F64, &[a, b, column], |g, v| g.gemm(&v[0], &v[1], Some(&v[2]), ta, tb));
    }
}

#[test]
fn gemm_alpha_beta() {
    let a = float("a", &[3, 4], -1.0, 1.0, 44);
    let b = float("b", &[5, 4], -1.0, 1.0, 45);
    let c = float("c", &[3, 5], -1.0, 1.0, 46);
    check(DType::F64, &[a, b, c], |g, v| {
        g.op1(
            "Gemm",
            &[&v[0], &v[1], &v[2]],
            vec![
                ("transB", ringtune_onnx_ir::Attribute::Int(1)),
                ("alpha", ringtune_onnx_ir::Attribute::Float(0.5)),
                ("beta", ringtune_onnx_ir::Attribute::Float(-2.0)),
            ],
        )
    });
}
