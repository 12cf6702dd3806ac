//! The oneDNN custom operators against ONNX Runtime's own kernels (MLAS) on odd shapes,
//! batched and transposed cases: fp32 within 1e-5 relative, bf16 within bf16 rounding.

use onnx_ir::{shape, Attribute, DType, Graph, NodeSpec, Value};
use runtime::kernels::{DOMAIN, GEMM, MATMUL};
use runtime::{Kernels, Precision, Runtime, Session, SessionOptions, TensorView};

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// One product both ways: ONNX ops (with explicit transposes) and the oneDNN operator.
struct Case {
    a: Vec<i64>,
    b: Vec<i64>,
    c: Option<Vec<i64>>,
    trans_a: bool,
    trans_b: bool,
    gemm: bool,
}

fn swap_last(rank: usize) -> Vec<i64> {
    let mut p: Vec<i64> = (0..rank as i64).collect();
    p.swap(rank - 2, rank - 1);
    p
}

fn graphs(case: &Case, precision: Precision) -> (Vec<u8>, Vec<u8>) {
    let build = |custom: bool| -> Vec<u8> {
        let mut g = Graph::new("k");
        let a = g.input("a", DType::F32, shape(&case.a)).expect("a");
        let b = g.input("b", DType::F32, shape(&case.b)).expect("b");
        let c = case.c.as_ref().map(|c| g.input("c", DType::F32, shape(c)).expect("c"));
        let y = if custom {
            let mut attrs =
                vec![("transA", Attribute::Int(case.trans_a as i64)), ("transB", Attribute::Int(case.trans_b as i64))];
            attrs.push(("precision", Attribute::Int(matches!(precision, Precision::Bf16) as i64)));
            let op = if case.gemm { GEMM } else { MATMUL };
            let mut inputs: Vec<Option<&Value>> = vec![Some(&a), Some(&b)];
            if c.is_some() {
                inputs.push(c.as_ref());
            }
            let spec = NodeSpec { op_type: op, domain: DOMAIN, inputs, attributes: attrs, outputs: 1 };
            // Custom operators have no shape inference in onnx-ir: build the node by hand.
            let node = onnx_ir::Node {
                name: "custom".into(),
                op_type: spec.op_type.into(),
                domain: spec.domain.into(),
                inputs: spec.inputs.iter().map(|v| v.map(|v| v.name().to_string()).unwrap_or_default()).collect(),
                outputs: vec!["y".into()],
                attributes: spec.attributes.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            };
            g.nodes.push(node);
            g.domains.insert(DOMAIN.into(), 1);
            g.outputs.push("y".into());
            return g.to_bytes_unchecked().expect("bytes");
        } else if case.gemm {
            g.gemm(&a, &b, c.as_ref(), case.trans_a, case.trans_b).expect("gemm")
        } else {
            let a = if case.trans_a { g.transpose(&a, &swap_last(case.a.len())).expect("t") } else { a };
            let b = if case.trans_b { g.transpose(&b, &swap_last(case.b.len())).expect("t") } else { b };
            g.matmul(&a, &b).expect("matmul")
        };
        g.output_as(&y, "y").expect("y");
        g.to_bytes().expect("bytes")
    };
    (build(false), build(true))
}

fn run(bytes: &[u8], kernels: Kernels, case: &Case) -> Vec<f32> {
    let rt = Runtime::get().expect("ONNX Runtime (`just setup`)");
    let options = SessionOptions { kernels, threads: 2, ..SessionOptions::default() };
    let mut s = Session::from_bytes(rt, bytes, &options).expect("session");
    let n = |d: &[i64]| d.iter().product::<i64>() as usize;
    let (a, b) = (values(n(&case.a), 1), values(n(&case.b), 2));
    let c = case.c.as_ref().map(|c| values(n(c), 3));
    let mut feeds = vec![("a", TensorView::f32(&case.a, &a)), ("b", TensorView::f32(&case.b, &b))];
    if let (Some(shape), Some(c)) = (&case.c, &c) {
        feeds.push(("c", TensorView::f32(shape, c)));
    }
    s.run(&feeds, &["y"]).expect("run")[0].as_f32().expect("f32").to_vec()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

fn cases() -> Vec<Case> {
    let mm = |a: &[i64], b: &[i64], ta, tb| Case {
        a: a.to_vec(),
        b: b.to_vec(),
        c: None,
        trans_a: ta,
        trans_b: tb,
        gemm: false,
    };
    let gemm = |a: &[i64], b: &[i64], c: Option<&[i64]>, ta, tb| Case {
        a: a.to_vec(),
        b: b.to_vec(),
        c: c.map(<[i64]>::to_vec),
        trans_a: ta,
        trans_b: tb,
        gemm: true,
    };
    vec![
        mm(&[7, 13], &[13, 5], false, false),
        mm(&[13, 7], &[5, 13], true, true),
        mm(&[3, 33, 65], &[65, 17], false, false),
        mm(&[2, 3, 9, 11], &[2, 3, 11, 6], false, false),
        mm(&[2, 3, 11, 9], &[2, 3, 11, 6], true, false),
        mm(&[2, 3, 9, 11], &[2, 3, 6, 11], false, true),
        mm(&[2, 1, 9, 11], &[1, 4, 11, 6], false, false),
        gemm(&[31, 47], &[19, 47], Some(&[19]), false, true),
        gemm(&[47, 31], &[47, 19], None, true, false),
        gemm(&[31, 47], &[47, 19], Some(&[31, 1]), false, false),
        gemm(&[47, 31], &[19, 47], Some(&[31, 19]), true, true),
    ]
}

#[test]
fn fp32_operators_match_mlas() {
    for case in cases() {
        let (plain, custom) = graphs(&case, Precision::F32);
        let want = run(&plain, Kernels::Mlas, &case);
        let got = run(&custom, Kernels::OneDnn(Precision::F32), &case);
        let r = rel(&got, &want);
        assert!(
            r < 1e-5,
            "{:?} x {:?} (trans {} {}, gemm {}): {r:e}",
            case.a,
            case.b,
            case.trans_a,
            case.trans_b,
            case.gemm
        );
    }
}

#[test]
fn bf16_operators_are_within_bf16_rounding_of_mlas() {
    for case in cases() {
        let (plain, custom) = graphs(&case, Precision::Bf16);
        let want = run(&plain, Kernels::Mlas, &case);
        let got = run(&custom, Kernels::OneDnn(Precision::Bf16), &case);
        let r = rel(&got, &want);
        assert!(r < 1e-2, "{:?} x {:?}: {r:e}", case.a, case.b);
    }
}
