//! The oneDNN products against ONNX Runtime's own kernels (MLAS) on odd shapes, batched and
//! transposed cases: each graph is built once with standard ops and run as built, then lowered
//! by the pass (transposes folded into the flags) and run on our operators. fp32 within 1e-5
//! relative, bf16 within bf16 rounding.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ringtune_onnx_ir::{shape, DType, Graph};
use ringtune_ops::{custom_ops, dnnl, Kernels, Precision};
use ringtune_runtime::{Runtime, Session, SessionOptions, TensorView};

/// One product: `MatMul` (explicit transposes) or `Gemm` (transpose flags, optional bias).
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

fn graph(case: &Case) -> Graph {
    let mut g = Graph::new("k");
    let a = g.input("a", DType::F32, shape(&case.a)).expect("a");
    let b = g.input("b", DType::F32, shape(&case.b)).expect("b");
    let c = case.c.as_ref().map(|c| g.input("c", DType::F32, shape(c)).expect("c"));
    let y = if case.gemm {
        g.gemm(&a, &b, c.as_ref(), case.trans_a, case.trans_b).expect("gemm")
    } else {
        let a = if case.trans_a { g.transpose(&a, &swap_last(case.a.len())).expect("t") } else { a };
        let b = if case.trans_b { g.transpose(&b, &swap_last(case.b.len())).expect("t") } else { b };
        g.matmul(&a, &b).expect("matmul")
    };
    g.output_as(&y, "y").expect("y");
    g
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn run(graph: &Graph, kernels: Kernels, case: &Case) -> Vec<f32> {
    let rt = Runtime::get().expect("ONNX Runtime (`just setup`)");
    let options =
        SessionOptions { custom_ops: custom_ops(kernels, 2).expect("ops"), threads: 2, ..SessionOptions::default() };
    let mut s = Session::from_bytes(rt, &graph.to_bytes().expect("bytes"), &options).expect("session");
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

/// Every case lowered at `precision`, its largest relative error against MLAS.
fn worst_error(precision: Precision) -> f64 {
    let mut worst: f64 = 0.0;
    for case in cases() {
        let plain = graph(&case);
        let want = run(&plain, Kernels::Mlas, &case);
        let mut lowered = plain.clone();
        assert_eq!(dnnl::lower_products(&mut lowered, precision).expect("lowered"), 1);
        assert!(
            lowered
                .nodes()
                .iter()
                .all(|n| n.op_type != "Transpose" && n.domain == ringtune_runtime::DOMAIN || n.op_type == "Identity"),
            "{:?}: {:?}",
            case.a,
            lowered.nodes().iter().map(|n| &n.op_type).collect::<Vec<_>>()
        );
        let got = run(&lowered, Kernels::OneDnn(precision), &case);
        let r = rel(&got, &want);
        assert!(r.is_finite(), "{:?} x {:?}", case.a, case.b);
        worst = worst.max(r);
    }
    worst
}

#[test]
fn fp32_operators_match_mlas() {
    let worst = worst_error(Precision::F32);
    assert!(worst < 1e-5, "{worst:e}");
}

#[test]
fn bf16_operators_are_within_bf16_rounding_of_mlas() {
    if let Err(e) = custom_ops(Kernels::OneDnn(Precision::Bf16), 2) {
        // No bf16 products on this CPU: asking for them must say so, with what to do.
        assert!(e.to_string().contains("--precision fp32"), "{e}");
        eprintln!("bf16 accuracy not checked on this CPU: {e}");
        return;
    }
    let worst = worst_error(Precision::Bf16);
    assert!(worst < 1e-2, "{worst:e}");
}
