//! The `Kernel` trait through ONNX Runtime: a custom operator of the `ai.ringtune` domain gets
//! its inputs as slices, reports its output shapes, fills the outputs asked for (an optional
//! one only when something reads it), and an error it returns reaches the caller with its name.

use std::sync::Arc;

use ringtune_onnx_ir::{shape, DType, Graph, InferCtx, NodeSpec, ValueType};
use ringtune_runtime::{
    Attributes, CustomOp, CustomOps, ElementType, Kernel, Parallel, Port, Runtime, Session, SessionOptions, TensorMut,
    TensorRef, DOMAIN,
};

/// `Scale(x) -> (y = factor * x, positive?)`; a negative input is an error.
struct Scale;

struct ScaleKernel(f32);

impl CustomOp for Scale {
    fn name(&self) -> &'static str {
        "Scale"
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32), Port::optional(ElementType::Bool)]
    }

    fn kernel(&self, attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(ScaleKernel(attributes.int("factor").ok_or("no factor")? as f32)))
    }
}

impl Kernel for ScaleKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        let x = inputs[0].ok_or("no x")?;
        Ok(vec![x.shape().to_vec(), x.shape().to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        let x = inputs[0].and_then(|x| x.f32()).ok_or("no x")?;
        if x.iter().any(|v| *v < 0.0) {
            return Err("negative input".into());
        }
        if let Some(TensorMut::F32(y)) = &mut outputs[0] {
            y.iter_mut().zip(x).for_each(|(y, x)| *y = self.0 * x);
        }
        if let Some(TensorMut::Bool(p)) = &mut outputs[1] {
            p.iter_mut().zip(x).for_each(|(p, x)| *p = *x > 0.0);
        }
        Ok(())
    }
}

fn shape_rule(ctx: &InferCtx<'_>) -> Result<Vec<ValueType>, String> {
    let x = ctx.ranked(0)?.clone();
    Ok(vec![ValueType::new(DType::F32, x.clone()), ValueType::new(DType::Bool, x)])
}

fn model(with_mask: bool) -> Vec<u8> {
    let mut g = Graph::new("scale");
    g.register_op(DOMAIN, "Scale", shape_rule);
    let x = g.input("x", DType::F32, shape(&[3])).expect("x");
    let attributes = vec![("factor", ringtune_onnx_ir::Attribute::Int(3))];
    let out = g
        .node(NodeSpec { op_type: "Scale", domain: DOMAIN, inputs: vec![Some(&x)], attributes, outputs: 2 })
        .expect("node");
    g.output_as(&out[0], "y").expect("y");
    if with_mask {
        let as_float = g.cast(&out[1], DType::F32).expect("cast");
        g.output_as(&as_float, "positive").expect("mask");
    }
    g.to_bytes().expect("bytes")
}

fn session(with_mask: bool) -> Session {
    let runtime = Runtime::get().expect("ONNX Runtime (`just setup`)");
    let options = SessionOptions { custom_ops: CustomOps(vec![Arc::new(Scale)]), ..SessionOptions::default() };
    Session::from_bytes(runtime, &model(with_mask), &options).expect("session")
}

#[test]
fn kernels_see_slices_and_fill_the_outputs_asked_for() {
    let x = [0.0f32, 1.0, 2.5];
    let out = session(true).run(&[("x", ringtune_runtime::TensorView::f32(&[3], &x))], &[]).expect("run");
    assert_eq!(out[0].as_f32(), Some(&[0.0f32, 3.0, 7.5][..]));
    assert_eq!(out[1].as_f32(), Some(&[0.0f32, 1.0, 1.0][..]));
    let alone = session(false).run(&[("x", ringtune_runtime::TensorView::f32(&[3], &x))], &["y"]).expect("run");
    assert_eq!(alone[0].as_f32(), Some(&[0.0f32, 3.0, 7.5][..]));
}

#[test]
fn a_kernel_error_names_the_operator() {
    let x = [1.0f32, -1.0, 2.0];
    let err = session(false).run(&[("x", ringtune_runtime::TensorView::f32(&[3], &x))], &["y"]).expect_err("negative");
    let msg = err.to_string();
    assert!(msg.contains("Scale: negative input"), "{msg}");
}

/// `Hold` passes its input through (and only records that it ran); `Peek` records the address
/// of its input and copies it out.
struct Recorder {
    name: &'static str,
    passes: bool,
    seen: Arc<std::sync::Mutex<Vec<(&'static str, usize)>>>,
}

impl CustomOp for Recorder {
    fn name(&self) -> &'static str {
        self.name
    }

    fn inputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn outputs(&self) -> Vec<Port> {
        vec![Port::required(ElementType::F32)]
    }

    fn kernel(&self, _attributes: &dyn Attributes) -> Result<Box<dyn Kernel>, String> {
        Ok(Box::new(RecorderKernel { name: self.name, seen: self.seen.clone() }))
    }

    fn passes_through(&self) -> bool {
        self.passes
    }
}

struct RecorderKernel {
    name: &'static str,
    seen: Arc<std::sync::Mutex<Vec<(&'static str, usize)>>>,
}

impl Kernel for RecorderKernel {
    fn output_shapes(&self, inputs: &[Option<TensorRef<'_>>]) -> Result<Vec<Vec<i64>>, String> {
        Ok(vec![inputs[0].ok_or("no x")?.shape().to_vec()])
    }

    fn compute(
        &self,
        inputs: &[Option<TensorRef<'_>>],
        outputs: &mut [Option<TensorMut<'_>>],
        _threads: &dyn Parallel,
    ) -> Result<(), String> {
        let mut seen = self.seen.lock().map_err(|e| e.to_string())?;
        let Some(x) = inputs.first().copied().flatten().and_then(|x| x.f32()) else {
            // A pass-through kernel sees no data.
            seen.push((self.name, 0));
            return Ok(());
        };
        seen.push((self.name, x.as_ptr() as usize));
        if let Some(Some(TensorMut::F32(y))) = outputs.first_mut() {
            y.copy_from_slice(x);
        }
        Ok(())
    }
}

#[test]
fn a_pass_through_operator_hands_on_its_input_buffer_itself() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let op = |name, passes| -> Arc<dyn CustomOp> { Arc::new(Recorder { name, passes, seen: seen.clone() }) };
    let mut g = Graph::new("hold");
    let same = |ctx: &InferCtx<'_>| Ok(vec![ValueType::new(DType::F32, ctx.ranked(0)?.clone())]);
    g.register_op(DOMAIN, "Hold", same);
    g.register_op(DOMAIN, "Peek", same);
    let x = g.input("x", DType::F32, shape(&[4])).expect("x");
    let node = |g: &mut Graph, op_type, x| {
        let spec = NodeSpec { op_type, domain: DOMAIN, inputs: vec![Some(x)], attributes: vec![], outputs: 1 };
        g.node(spec).expect("node").remove(0)
    };
    let direct = node(&mut g, "Peek", &x);
    let held = node(&mut g, "Hold", &x);
    let peeked = node(&mut g, "Peek", &held);
    g.output_as(&direct, "direct").expect("direct");
    g.output_as(&peeked, "y").expect("y");
    let runtime = Runtime::get().expect("ONNX Runtime (`just setup`)");
    let options = SessionOptions {
        custom_ops: CustomOps(vec![op("Hold", true), op("Peek", false)]),
        ..SessionOptions::default()
    };
    let mut session = Session::from_bytes(runtime, &g.to_bytes().expect("bytes"), &options).expect("session");
    let x = [1.0f32, -2.0, 3.5, 0.0];
    let out = session.run(&[("x", ringtune_runtime::TensorView::f32(&[4], &x))], &["y", "direct"]).expect("run");
    assert_eq!(out[0].as_f32(), Some(&x[..]));
    let seen = seen.lock().expect("lock").clone();
    let hold = seen.iter().position(|(n, _)| *n == "Hold").expect("Hold ran");
    assert_eq!(seen[hold].1, 0, "a pass-through kernel is handed no data");
    let peeks: Vec<usize> = seen.iter().filter(|(n, _)| *n == "Peek").map(|(_, a)| *a).collect();
    assert_eq!(peeks.len(), 2);
    assert_eq!(peeks[0], peeks[1], "Peek reads x's own buffer through Hold: nothing was copied");
}
