//! Finite-difference gradient checks through ONNX Runtime.
//!
//! Each check builds `loss = sum(op(inputs) * R)` with a fixed random `R`, derives the backward
//! graph, runs it, and compares every analytic gradient with central differences of the loss.
//! Every differentiable input is checked alone and together with the others ("toggled on and
//! off"), so rules must cope with any subset of inputs needing a gradient.

#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ringtune_onnx_ir::{shape, DType, Graph, IrError, Tensor, Value};
use ringtune_runtime::{OwnedTensor, Runtime, Session, SessionOptions, TensorView};

/// An input of the op under test.
#[derive(Clone)]
pub(crate) struct Input {
    pub name: &'static str,
    pub shape: Vec<i64>,
    pub data: Data,
    /// Whether to differentiate with respect to it.
    pub grad: bool,
}

#[derive(Clone)]
pub(crate) enum Data {
    Float(Vec<f64>),
    Int(Vec<i64>),
}

/// A float input with values uniform in `[lo, hi)`, from `seed`.
pub(crate) fn float(name: &'static str, shape: &[i64], lo: f64, hi: f64, seed: u64) -> Input {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = shape.iter().product::<i64>() as usize;
    Input {
        name,
        shape: shape.to_vec(),
        data: Data::Float((0..n).map(|_| rng.random_range(lo..hi)).collect()),
        grad: true,
    }
}

/// An integer input (indices, labels): never differentiated.
pub(crate) fn int(name: &'static str, shape: &[i64], values: Vec<i64>) -> Input {
    Input { name, shape: shape.to_vec(), data: Data::Int(values), grad: false }
}

/// A float input that is not differentiated.
pub(crate) fn fixed(input: Input) -> Input {
    Input { grad: false, ..input }
}

/// Checks `build` in `dtype` (`F64` where ONNX Runtime has double kernels, else `F32`).
pub(crate) fn check(dtype: DType, inputs: &[Input], build: impl Fn(&mut Graph, &[Value]) -> Result<Value, IrError>) {
    let differentiable: Vec<usize> = (0..inputs.len()).filter(|&i| inputs[i].grad).collect();
    assert!(!differentiable.is_empty(), "nothing to check");
    let mut subsets = vec![differentiable.clone()];
    if differentiable.len() > 1 {
        subsets.extend(differentiable.iter().map(|&i| vec![i]));
    }
    for subset in subsets {
        check_subset(dtype, inputs, &subset, &build);
    }
}

fn check_subset(
    dtype: DType,
    inputs: &[Input],
    wrt: &[usize],
    build: &impl Fn(&mut Graph, &[Value]) -> Result<Value, IrError>,
) {
    let mut g = Graph::new("fd");
    let values: Vec<Value> = inputs
        .iter()
        .map(|i| {
            let t = match i.data {
                Data::Float(_) => dtype,
                Data::Int(_) => DType::I64,
            };
            g.input(i.name, t, shape(&i.shape)).expect("input")
        })
        .collect();
    let y = build(&mut g, &values).expect("forward op");
    let dims = g.value_type(&y).expect("type").static_dims().expect("the op's output must have a fixed shape");
    let n: i64 = dims.iter().product();
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let weights: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let r = g.constant(tensor(dtype, &dims, &weights)).expect("weights");
    let weighted = g.mul(&y, &r).expect("mul");
    let axes: Vec<i64> = (0..dims.len() as i64).collect();
    let loss = if axes.is_empty() { weighted } else { g.reduce_sum(&weighted, &axes, false).expect("sum") };
    let loss = g.output_as(&loss, "loss").expect("loss");
    let targets: Vec<Value> = wrt.iter().map(|&i| values[i].clone()).collect();
    let grads = ringtune_autodiff::backward(&mut g, &loss, &targets).expect("backward");
    let names: Vec<String> = wrt.iter().map(|&i| format!("{}_grad", inputs[i].name)).collect();
    ringtune_autodiff::name_gradients(&mut g, &grads, &names).expect("names");

    let rt = Runtime::get().expect("ONNX Runtime (run `just setup`)");
    let bytes = g.to_bytes().unwrap_or_else(|e| panic!("{e}\n{g}"));
    let mut session = Session::from_bytes(rt, &bytes, &SessionOptions { threads: 1, ..SessionOptions::default() })
        .unwrap_or_else(|e| panic!("{e}\n{g}"));
    let mut data: Vec<Data> = inputs.iter().map(|i| i.data.clone()).collect();
    let fetch: Vec<&str> = names.iter().map(String::as_str).collect();
    let analytic = run(&mut session, dtype, inputs, &data, &fetch);

    let eps = if dtype == DType::F64 { 1e-6 } else { 1e-2 };
    let tol = if dtype == DType::F64 { 1e-5 } else { 2e-2 };
    for (k, &i) in wrt.iter().enumerate() {
        let got = analytic[k].to_f64s().expect("float gradient");
        let len = got.len();
        let step = (len / 48).max(1);
        for j in (0..len).step_by(step) {
            let mut probe = |delta: f64| {
                if let Data::Float(v) = &mut data[i] {
                    v[j] += delta;
                }
                let l = run(&mut session, dtype, inputs, &data, &["loss"])[0].to_f64s().expect("loss")[0];
                if let Data::Float(v) = &mut data[i] {
                    v[j] -= delta;
                }
                l
            };
            let numeric = (probe(eps) - probe(-eps)) / (2.0 * eps);
            let err = (got[j] - numeric).abs();
            assert!(
                err <= tol * numeric.abs().max(1.0),
                "d loss / d {}[{j}] with respect to {:?}: analytic {} vs numeric {numeric} (error {err})\n{g}",
                inputs[i].name,
                wrt.iter().map(|&w| inputs[w].name).collect::<Vec<_>>(),
                got[j]
            );
        }
    }
}

fn tensor(dtype: DType, dims: &[i64], values: &[f64]) -> Tensor {
    match dtype {
        DType::F64 => Tensor::from_f64(dims, values),
        _ => Tensor::from_f32(dims, &values.iter().map(|&v| v as f32).collect::<Vec<_>>()),
    }
}

/// Runs the session on the inputs (as `dtype`) and fetches `outputs`.
pub(crate) fn run(
    session: &mut Session,
    dtype: DType,
    inputs: &[Input],
    data: &[Data],
    outputs: &[&str],
) -> Vec<OwnedTensor> {
    let narrowed: Vec<Vec<f32>> = data
        .iter()
        .map(|d| match d {
            Data::Float(v) => v.iter().map(|&x| x as f32).collect(),
            Data::Int(_) => Vec::new(),
        })
        .collect();
    let feeds: Vec<(&str, TensorView<'_>)> = inputs
        .iter()
        .zip(data)
        .zip(&narrowed)
        .map(|((i, d), f32s)| {
            let view = match d {
                Data::Int(v) => TensorView::i64(&i.shape, v),
                Data::Float(v) if dtype == DType::F64 => TensorView::f64(&i.shape, v),
                Data::Float(_) => TensorView::f32(&i.shape, f32s),
            };
            (i.name, view)
        })
        .collect();
    session.run(&feeds, outputs).expect("run")
}
