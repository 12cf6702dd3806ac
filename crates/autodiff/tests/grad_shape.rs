//! Finite-difference checks of the shape and indexing family.

mod common;

use common::{check, float, int};
use ringtune_onnx_ir::DType;

#[test]
fn reshape_transpose_unsqueeze_squeeze() {
    let x = float("x", &[2, 3, 4], -1.0, 1.0, 61);
    check(DType::F64, std::slice::from_ref(&x), |g, v| {
        let r = g.reshape(&v[0], &[0, -1])?;
        g.mul(&r, &r)
    });
    check(DType::F64, std::slice::from_ref(&x), |g, v| {
        let t = g.transpose(&v[0], &[2, 0, 1])?;
        let w = g.scalar(DType::F64, 2.0)?;
        let t = g.mul(&t, &w)?;
        g.reshape(&t, &[4, 6])
    });
    check(DType::F64, &[x], |g, v| {
        let u = g.unsqueeze(&v[0], &[1])?;
        let s = g.squeeze(&u, &[1])?;
        g.mul(&s, &v[0])
    });
}

#[test]
fn slice_concat_expand() {
    let x = float("x", &[3, 4, 5], -1.0, 1.0, 62);
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.slice(&v[0], &[0, 1], &[1, 3], &[1, 2]));
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.slice(&v[0], &[-2], &[i64::MAX], &[0]));
    let y = float("y", &[3, 2, 5], -1.0, 1.0, 63);
    check(DType::F64, &[x, y], |g, v| g.concat(&[&v[0], &v[1], &v[0]], 1));
    let b = float("b", &[1, 4], -1.0, 1.0, 64);
    check(DType::F64, &[b], |g, v| {
        let s = g.const_i64(&[3, 4])?;
        g.expand(&v[0], &s)
    });
}

#[test]
fn gather_rows_repeated_ids() {
    let table = float("table", &[6, 3], -1.0, 1.0, 65);
    let ids = int("ids", &[2, 4], vec![0, 5, 5, 2, 1, 0, 5, 3]);
    check(DType::F64, &[table, ids], |g, v| g.gather(&v[0], &v[1], 0));
}

/// DeBERTa's relative-position lookups: each row reads its own columns, many of them twice.
#[test]
fn gather_elements_along_the_last_axis_with_repeated_indices() {
    let scores = float("scores", &[2, 3, 5], -1.0, 1.0, 67);
    let index: Vec<i64> = (0..2 * 3 * 4).map(|i| [0, 4, 4, 2, 1, 1, 3, 0][i % 8]).collect();
    let index = int("index", &[2, 3, 4], index);
    check(DType::F64, &[scores, index], |g, v| g.gather_elements(&v[0], &v[1], 2));
    let rows = float("rows", &[4, 3], -1.0, 1.0, 68);
    let down = int("down", &[2, 3], vec![3, 0, 0, 3, 2, 1]);
    check(DType::F64, &[rows, down], |g, v| g.gather_elements(&v[0], &v[1], 0));
}

#[test]
fn reductions() {
    let x = float("x", &[2, 3, 4], -1.0, 1.0, 66);
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.reduce_sum(&v[0], &[0, 2], false));
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.reduce_sum(&v[0], &[1], true));
    check(DType::F64, &[x], |g, v| g.reduce_mean(&v[0], &[-1], false));
}
