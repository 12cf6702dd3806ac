//! Element types, dimensions and value types.

use std::fmt;

/// Element type of a tensor (the subset of ONNX's that ringtune uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float (finite-difference checks).
    F64,
    /// 16-bit brain float.
    BF16,
    /// 16-bit IEEE float.
    F16,
    /// 64-bit signed integer (ids, labels, shapes).
    I64,
    /// 32-bit signed integer.
    I32,
    /// 8-bit unsigned integer.
    U8,
    /// 8-bit signed integer (quantized weights).
    I8,
    /// Boolean.
    Bool,
}

impl DType {
    /// The `TensorProto.DataType` number.
    pub fn onnx(self) -> i32 {
        match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::BF16 => 16,
        }
    }

    /// The type for a `TensorProto.DataType` number.
    pub fn from_onnx(code: i64) -> Option<Self> {
        Some(match code {
            1 => DType::F32,
            2 => DType::U8,
            3 => DType::I8,
            6 => DType::I32,
            7 => DType::I64,
            9 => DType::Bool,
            10 => DType::F16,
            11 => DType::F64,
            16 => DType::BF16,
            _ => return None,
        })
    }

    /// Whether gradients flow through values of this type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::I8 | DType::Bool => 1,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::Bool => "bool",
        };
        f.write_str(s)
    }
}

/// One dimension of a shape: a number, a named symbol (`batch`), or unknown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Dim {
    /// A fixed size.
    Known(i64),
    /// A size fixed per run, named so that equal symbols mean equal sizes.
    Sym(String),
    /// Not known before running.
    Unknown,
}

impl Dim {
    /// A named symbolic dimension.
    pub fn sym(name: &str) -> Self {
        Dim::Sym(name.to_string())
    }

    /// The size, when fixed.
    pub fn known(&self) -> Option<i64> {
        match self {
            Dim::Known(n) => Some(*n),
            _ => None,
        }
    }
}

impl From<i64> for Dim {
    fn from(n: i64) -> Self {
        Dim::Known(n)
    }
}

impl From<i32> for Dim {
    fn from(n: i32) -> Self {
        Dim::Known(n as i64)
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Known(n as i64)
    }
}

impl From<&str> for Dim {
    fn from(s: &str) -> Self {
        Dim::sym(s)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A shape: one [`Dim`] per axis.
pub type Shape = Vec<Dim>;

/// Builds a shape from anything convertible to [`Dim`].
pub fn shape<D: Into<Dim> + Clone>(dims: &[D]) -> Shape {
    dims.iter().cloned().map(Into::into).collect()
}

/// The type of a value: element type and (when known) shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueType {
    /// Element type.
    pub dtype: DType,
    /// Shape, or `None` when even the rank is unknown.
    pub shape: Option<Shape>,
}

impl ValueType {
    /// A value of known rank.
    pub fn new(dtype: DType, shape: Shape) -> Self {
        ValueType { dtype, shape: Some(shape) }
    }

    /// A value of unknown rank.
    pub fn unranked(dtype: DType) -> Self {
        ValueType { dtype, shape: None }
    }

    /// The rank, when known.
    pub fn rank(&self) -> Option<usize> {
        self.shape.as_ref().map(Vec::len)
    }

    /// All dimensions as numbers, when every one is fixed.
    pub fn static_dims(&self) -> Option<Vec<i64>> {
        self.shape.as_ref()?.iter().map(Dim::known).collect()
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.dtype)?;
        match &self.shape {
            None => f.write_str("[*]"),
            Some(s) => {
                let dims: Vec<String> = s.iter().map(ToString::to_string).collect();
                write!(f, "[{}]", dims.join(","))
            }
        }
    }
}
