//! Finite-difference checks of the elementwise family.

mod common;

use common::{check, fixed, float, int};
use ringtune_onnx_ir::{DType, Dim, Graph, Tensor, Value};

#[test]
fn add_sub_with_broadcasting() {
    let a = float("a", &[2, 1, 3], -1.0, 1.0, 1);
    let b = float("b", &[4, 1], -1.0, 1.0, 2);
    check(DType::F64, &[a.clone(), b.clone()], |g, v| g.add(&v[0], &v[1]));
    check(DType::F64, &[a, b], |g, v| g.sub(&v[0], &v[1]));
    let bias = float("bias", &[3], -1.0, 1.0, 3);
    check(DType::F64, &[float("x", &[2, 3], -1.0, 1.0, 4), bias], |g, v| g.sub(&v[1], &v[0]));
}

#[test]
fn mul_div_with_a_value_used_twice() {
    let x = float("x", &[3, 4], -2.0, 2.0, 5);
    check(DType::F64, std::slice::from_ref(&x), |g, v| g.mul(&v[0], &v[0]));
    let y = float("y", &[1, 4], 0.5, 2.0, 6);
    check(DType::F64, &[x.clone(), y.clone()], |g, v| g.mul(&v[0], &v[1]));
    check(DType::F64, &[x.clone(), y], |g, v| {
        let q = g.div(&v[0], &v[1])?;
        g.add(&q, &v[0])
    });
    check(DType::F64, &[float("p", &[3, 4], 0.5, 2.0, 7)], |g, v| g.reciprocal(&v[0]));
}

#[test]
fn pow_neg_identity_sum() {
    let x = float("x", &[5], 0.5, 2.0, 8);
    check(DType::F64, std::slice::from_ref(&x), |g, v| {
        let three = g.scalar(DType::F64, 3.0)?;
        g.pow(&v[0], &three)
    });
    check(DType::F64, std::slice::from_ref(&x), |g, v| {
        let n = g.neg(&v[0])?;
        g.identity(&n)
    });
    let y = float("y", &[2, 5], -1.0, 1.0, 9);
    let z = float("z", &[2, 1], -1.0, 1.0, 10);
    check(DType::F64, &[x, y, z], |g, v| g.sum(&[&v[0], &v[1], &v[2]]));
}

#[test]
fn where_routes_each_branch() {
    let x = float("x", &[2, 3], -1.0, 1.0, 11);
    let y = float("y", &[3], -1.0, 1.0, 12);
    let c = fixed(float("c", &[2, 3], -1.0, 1.0, 13));
    check(DType::F64, &[x, y, c], |g: &mut Graph, v: &[Value]| {
        let zero = g.scalar(DType::F64, 0.0)?;
        let cond = g.greater(&v[2], &zero)?;
        g.where_(&cond, &v[0], &v[1])
    });
}

#[test]
fn cast_between_float_types() {
    check(DType::F32, &[float("x", &[4], -1.0, 1.0, 14)], |g, v| {
        let wide = g.cast(&v[0], DType::F64)?;
        let sq = g.mul(&wide, &wide)?;
        g.cast(&sq, DType::F32)
    });
    // An integer path feeding a float op carries no gradient and needs no rule.
    let ids = int("ids", &[3], vec![2, 0, 1]);
    check(DType::F64, &[float("x", &[3], -1.0, 1.0, 15), ids], |g, v| {
        let f = g.cast(&v[1], DType::F64)?;
        g.mul(&v[0], &f)
    });
}

#[test]
fn dropout_outside_training_is_identity() {
    check(DType::F32, &[float("x", &[6], -1.0, 1.0, 16)], |g, v| {
        let ratio = g.scalar(DType::F32, 0.3)?;
        let off = g.constant(Tensor { dtype: DType::Bool, dims: vec![], data: vec![0] })?;
        let outs = g.node(ringtune_onnx_ir::NodeSpec {
            op_type: "Dropout",
            domain: "",
            inputs: vec![Some(&v[0]), Some(&ratio), Some(&off)],
            attributes: vec![],
            outputs: 2,
        })?;
        Ok(outs[0].clone())
    });
}

/// Dropout's mask changes on every run, so instead of differences the gradient is checked
/// against the mask of the same run: `dx = dy * mask / (1 - p)`.
#[test]
fn dropout_gradient_reuses_the_mask() {
    let mut g = Graph::new("dropout");
    let x = g.input("x", DType::F32, vec![Dim::Known(4000)]).expect("x");
    let w = g.input("w", DType::F32, vec![Dim::Known(4000)]).expect("w");
    let d = g.dropout(&x, 0.25).expect("dropout");
    let y = g.mul(&d.y, &w).expect("mul");
    let loss = g.reduce_sum(&y, &[0], false).expect("sum");
    let loss = g.output_as(&loss, "loss").expect("loss");
    let grads = ringtune_autodiff::backward(&mut g, &loss, std::slice::from_ref(&x)).expect("backward");
    ringtune_autodiff::name_gradients(&mut g, &grads, &["x_grad".into()]).expect("names");
    let mask = g.cast(&d.mask, DType::F32).expect("cast");
    g.output_as(&mask, "mask").expect("mask");
    let rt = ringtune_runtime::Runtime::get().expect("runtime");
    let mut s =
        ringtune_runtime::Session::from_bytes(rt, &g.to_bytes().expect("bytes"), &Default::default()).expect("session");
    let xs = vec![1.0f32; 4000];
    let ws: Vec<f32> = (0..4000).map(|i| (i % 7) as f32 - 3.0).collect();
    let out = s
        .run(
            &[
                ("x", ringtune_runtime::TensorView::f32(&[4000], &xs)),
                ("w", ringtune_runtime::TensorView::f32(&[4000], &ws)),
            ],
            &["x_grad", "mask"],
        )
        .expect("run");
    let (dx, mask) = (out[0].as_f32().expect("dx"), out[1].as_f32().expect("mask"));
    let kept = mask.iter().filter(|&&m| m == 1.0).count() as f64 / 4000.0;
    assert!((kept - 0.75).abs() < 0.05, "about 75% kept, got {kept}");
    for i in 0..4000 {
        let want = ws[i] * mask[i] / 0.75;
        assert!((dx[i] - want).abs() < 1e-5, "element {i}: {} vs {want}", dx[i]);
    }
}
