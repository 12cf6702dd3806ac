//! Loads the provisioned ONNX Runtime, runs a model built with onnx-protobuf and checks the numbers.

use onnx_protobuf::{
    tensor_proto::DataType, tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use protobuf::Message;
use ringtune_runtime::{
    BoundTensor, FlatBinding, FlatBuffer, Provider, Runtime, RuntimeError, Session, SessionOptions, TensorView,
};

fn value(name: &str, dims: &[i64]) -> ValueInfoProto {
    let mut shape = TensorShapeProto::new();
    for &d in dims {
        let mut dim = tensor_shape_proto::Dimension::new();
        dim.value = Some(tensor_shape_proto::dimension::Value::DimValue(d));
        shape.dim.push(dim);
    }
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = DataType::FLOAT as i32;
    tensor.shape = protobuf::MessageField::some(shape);
    let mut ty = TypeProto::new();
    ty.value = Some(type_proto::Value::TensorType(tensor));
    let mut info = ValueInfoProto::new();
    info.name = name.into();
    info.type_ = protobuf::MessageField::some(ty);
    info
}

fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    let mut n = NodeProto::new();
    n.op_type = op.into();
    n.name = outputs[0].into();
    n.input = inputs.iter().map(|s| s.to_string()).collect();
    n.output = outputs.iter().map(|s| s.to_string()).collect();
    n
}

/// y = (x @ w) + b, and z = y * y: x [2,3], w [3,2], b [2].
fn tiny_model() -> Vec<u8> {
    let mut graph = GraphProto::new();
    graph.name = "tiny".into();
    graph.node.push(node("MatMul", &["x", "w"], &["xw"]));
    graph.node.push(node("Add", &["xw", "b"], &["y"]));
    graph.node.push(node("Mul", &["y", "y"], &["z"]));
    graph.input = vec![value("x", &[2, 3]), value("w", &[3, 2]), value("b", &[2])];
    graph.output = vec![value("y", &[2, 2]), value("z", &[2, 2])];
    let mut opset = OperatorSetIdProto::new();
    opset.version = 21;
    let mut model = ModelProto::new();
    model.ir_version = 10;
    model.opset_import.push(opset);
    model.graph = protobuf::MessageField::some(graph);
    model.write_to_bytes().expect("serialise")
}

const X: [f32; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
const W: [f32; 6] = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
const B: [f32; 2] = [0.5, -0.5];
// x @ w = [[4, 5], [10, 11]]; + b = [[4.5, 4.5], [10.5, 10.5]]
const Y: [f32; 4] = [4.5, 4.5, 10.5, 10.5];

fn runtime() -> &'static Runtime {
    Runtime::get().expect("ONNX Runtime must be provisioned: run `just setup`")
}

#[test]
fn reports_version_and_cpu_provider() {
    let rt = runtime();
    assert_eq!(rt.version(), ringtune_runtime::ORT_VERSION);
    assert!(rt.providers().iter().any(|p| p == "CPUExecutionProvider"), "{:?}", rt.providers());
}

#[test]
fn runs_a_model_on_borrowed_inputs() {
    let mut session = Session::from_bytes(runtime(), &tiny_model(), &SessionOptions::default()).expect("session");
    assert_eq!(session.input_names(), ["x", "w", "b"]);
    let out = session
        .run(
            &[
                ("x", TensorView::f32(&[2, 3], &X)),
                ("w", TensorView::f32(&[3, 2], &W)),
                ("b", TensorView::f32(&[2], &B)),
            ],
            &["z", "y"],
        )
        .expect("run");
    assert_eq!(out[1].shape, vec![2, 2]);
    assert_eq!(out[1].as_f32().expect("f32"), Y);
    let z: Vec<f32> = Y.iter().map(|v| v * v).collect();
    assert_eq!(out[0].as_f32().expect("f32"), z.as_slice());
    let err = session.run(&[], &["nope"]).expect_err("unknown output");
    assert!(err.to_string().contains("no output `nope`"), "{err}");
}

#[test]
fn flat_binding_reads_and_writes_in_place() {
    let mut session = Session::from_bytes(runtime(), &tiny_model(), &SessionOptions::default()).expect("session");
    // Parameters w and b at 64-byte aligned offsets in one buffer, output y into another.
    let mut params = FlatBuffer::zeros(32);
    params[..6].copy_from_slice(&W);
    params[16..18].copy_from_slice(&B);
    let inputs = [
        BoundTensor { name: "w".into(), offset: 0, shape: vec![3, 2] },
        BoundTensor { name: "b".into(), offset: 16, shape: vec![2] },
    ];
    let outputs = [BoundTensor { name: "y".into(), offset: 4, shape: vec![2, 2] }];
    let mut bound = FlatBinding::new(&session, params, &inputs, FlatBuffer::zeros(8), &outputs, &["z"]).expect("bind");
    let fetched = bound.run(&mut session, &[("x", TensorView::f32(&[2, 3], &X))]).expect("run");
    assert_eq!(&bound.outputs()[4..8], Y);
    assert_eq!(fetched[0].as_f32().expect("z")[0], 4.5 * 4.5);

    // A change to the parameters between runs is seen by the next run, with no rebinding.
    bound.inputs_mut().floats_mut().expect("not lent")[16] = 1.5;
    bound.run(&mut session, &[("x", TensorView::f32(&[2, 3], &X))]).expect("run");
    assert_eq!(&bound.outputs()[4..8], [5.5, 4.5, 11.5, 10.5]);

    let too_far = [BoundTensor { name: "b".into(), offset: 31, shape: vec![2] }];
    let err = FlatBinding::new(&session, FlatBuffer::zeros(32), &too_far, FlatBuffer::zeros(0), &[], &[])
        .err()
        .expect("out of bounds");
    assert!(err.to_string().contains("does not fit"), "{err}");
}

#[test]
fn an_absent_provider_is_an_error_listing_the_present_ones() {
    let options = SessionOptions { provider: Provider::OpenVino, ..SessionOptions::default() };
    let err = Session::from_bytes(runtime(), &tiny_model(), &options).err().expect("no OpenVINO in the CPU build");
    assert!(matches!(err, RuntimeError::ProviderUnavailable { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("openvino") && msg.contains("CPUExecutionProvider"), "{msg}");

    let auto = SessionOptions { provider: Provider::Auto, ..SessionOptions::default() };
    let session = Session::from_bytes(runtime(), &tiny_model(), &auto).expect("auto falls back to CPU");
    assert_eq!(session.provider(), "CPUExecutionProvider");
}
