//! Where typed attributes are read from: a graph node (when rewriting) or the node a kernel is
//! made for (at run time). Each operator's attribute struct reads both through this trait and
//! writes node attributes in one place, so the encoding exists once.

use ringtune_onnx_ir::{Attribute, Node};

/// Integer attributes by name.
pub(crate) trait AttributeSource {
    fn int(&self, name: &str) -> Option<i64>;

    fn flag(&self, name: &str) -> bool {
        self.int(name).unwrap_or(0) != 0
    }
}

impl AttributeSource for Node {
    fn int(&self, name: &str) -> Option<i64> {
        Node::int(self, name)
    }
}

impl AttributeSource for dyn ringtune_runtime::Attributes + '_ {
    fn int(&self, name: &str) -> Option<i64> {
        ringtune_runtime::Attributes::int(self, name)
    }
}

/// The `tensor` attribute of `GradReady` and `ParamReady`: which parameter (its index in the
/// layout) a node hands over or holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorIndex(pub(crate) usize);

impl TensorIndex {
    pub(crate) fn read(node: &(impl AttributeSource + ?Sized)) -> Result<Self, String> {
        match node.int("tensor") {
            Some(t) if t >= 0 => Ok(TensorIndex(t as usize)),
            other => Err(format!("the tensor attribute is {other:?}, not a parameter index")),
        }
    }

    pub(crate) fn write(self) -> (&'static str, Attribute) {
        ("tensor", Attribute::Int(self.0 as i64))
    }
}
