//! Serialisation to ONNX protobuf.

use onnx_protobuf::{
    attribute_proto::AttributeType, tensor_shape_proto, type_proto, AttributeProto, GraphProto, Message, ModelProto,
    NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};

use crate::{Attribute, Dim, Graph, IrError, Node, Tensor, ValueType};

/// The ONNX IR version written (ONNX Runtime 1.31 reads up to 13).
pub const IR_VERSION: i64 = 10;
/// The standard-domain opset written (`Gelu` needs 20).
pub const OPSET: i64 = 21;

impl Graph {
    /// The graph as an ONNX model (not validated; [`Graph::to_bytes`] validates).
    pub fn to_model(&self) -> Result<ModelProto, IrError> {
        let mut graph = GraphProto::new();
        graph.name = self.name.clone();
        graph.node = self.nodes().iter().map(node_proto).collect();
        graph.initializer = self.initializers.iter().map(|(name, t)| tensor_proto(name, t)).collect();
        graph.input =
            self.inputs.iter().map(|n| Ok(value_info(n, self.type_of(n)?))).collect::<Result<_, IrError>>()?;
        graph.output = self
            .outputs
            .iter()
            .map(|n| self.type_of(n).map(|t| value_info(n, t)).unwrap_or_else(|_| untyped_output(n)))
            .collect();
        let mut model = ModelProto::new();
        model.ir_version = IR_VERSION;
        model.producer_name = "ringtune".into();
        model.producer_version = env!("CARGO_PKG_VERSION").into();
        let mut standard = OperatorSetIdProto::new();
        standard.version = OPSET;
        model.opset_import.push(standard);
        for (domain, version) in &self.domains {
            let mut set = OperatorSetIdProto::new();
            set.domain = domain.clone();
            set.version = *version;
            model.opset_import.push(set);
        }
        model.graph = protobuf::MessageField::some(graph);
        Ok(model)
    }

    /// The graph as serialised ONNX bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, IrError> {
        self.validate()?;
        self.to_bytes_unchecked()
    }

    /// Serialises without validating (for graphs whose custom nodes the builder does not
    /// know, assembled by hand).
    pub fn to_bytes_unchecked(&self) -> Result<Vec<u8>, IrError> {
        self.to_model()?.write_to_bytes().map_err(|e| IrError::Serialize(e.to_string()))
    }
}

fn node_proto(node: &Node) -> NodeProto {
    let mut p = NodeProto::new();
    p.name = node.name.clone();
    p.op_type = node.op_type.clone();
    p.domain = node.domain.clone();
    p.input = node.inputs.clone();
    p.output = node.outputs.clone();
    p.attribute = node.attributes.iter().map(|(name, value)| attribute_proto(name, value)).collect();
    p
}

fn attribute_proto(name: &str, value: &Attribute) -> AttributeProto {
    let mut a = AttributeProto::new();
    a.name = name.to_string();
    let kind = match value {
        Attribute::Int(v) => {
            a.i = *v;
            AttributeType::INT
        }
        Attribute::Float(v) => {
            a.f = *v;
            AttributeType::FLOAT
        }
        Attribute::Ints(v) => {
            a.ints = v.clone();
            AttributeType::INTS
        }
        Attribute::Floats(v) => {
            a.floats = v.clone();
            AttributeType::FLOATS
        }
        Attribute::Str(v) => {
            a.s = v.as_bytes().to_vec();
            AttributeType::STRING
        }
        Attribute::Tensor(t) => {
            a.t = protobuf::MessageField::some(tensor_proto("", t));
            AttributeType::TENSOR
        }
    };
    a.type_ = kind.into();
    a
}

fn tensor_proto(name: &str, t: &Tensor) -> TensorProto {
    let mut p = TensorProto::new();
    p.name = name.to_string();
    p.dims = t.dims.clone();
    p.data_type = t.dtype.onnx();
    p.raw_data = t.data.clone();
    p
}

/// A float output whose shape only ONNX Runtime knows (a custom operator's).
fn untyped_output(name: &str) -> ValueInfoProto {
    value_info(name, &ValueType::unranked(crate::DType::F32))
}

fn value_info(name: &str, ty: &ValueType) -> ValueInfoProto {
    let mut tensor = type_proto::Tensor::new();
    tensor.elem_type = ty.dtype.onnx();
    if let Some(dims) = &ty.shape {
        let mut shape = TensorShapeProto::new();
        for d in dims {
            let mut dim = tensor_shape_proto::Dimension::new();
            dim.value = match d {
                Dim::Known(n) => Some(tensor_shape_proto::dimension::Value::DimValue(*n)),
                Dim::Sym(s) => Some(tensor_shape_proto::dimension::Value::DimParam(s.clone())),
                Dim::Unknown => None,
            };
            shape.dim.push(dim);
        }
        tensor.shape = protobuf::MessageField::some(shape);
    }
    let mut t = TypeProto::new();
    t.value = Some(type_proto::Value::TensorType(tensor));
    let mut info = ValueInfoProto::new();
    info.name = name.to_string();
    info.type_ = protobuf::MessageField::some(t);
    info
}
