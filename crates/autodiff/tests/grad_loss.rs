//! Finite-difference checks of the loss family.

mod common;

use common::{check, float, int};
use ringtune_onnx_ir::DType;

#[test]
fn softmax_cross_entropy_mean() {
    let scores = float("scores", &[5, 3], -2.0, 2.0, 71);
    let labels = int("labels", &[5], vec![0, 2, 1, 1, 0]);
    check(DType::F32, &[scores, labels], |g, v| Ok(g.softmax_cross_entropy(&v[0], &v[1])?.0));
}
