//! Tensors passed to and returned from sessions.

use ort::session::SessionInputValue;
use ort::value::{DynValue, TensorElementType, TensorRef};

use crate::{Result, RuntimeError};

/// A borrowed tensor: ONNX Runtime reads the caller's memory directly.
#[derive(Debug, Clone)]
pub enum TensorView<'a> {
    /// 32-bit floats.
    F32 {
        /// Dimensions.
        shape: Vec<i64>,
        /// Row-major values.
        data: &'a [f32],
    },
    /// 64-bit floats (finite-difference checks).
    F64 {
        /// Dimensions.
        shape: Vec<i64>,
        /// Row-major values.
        data: &'a [f64],
    },
    /// 64-bit integers.
    I64 {
        /// Dimensions.
        shape: Vec<i64>,
        /// Row-major values.
        data: &'a [i64],
    },
}

impl<'a> TensorView<'a> {
    /// A float tensor over `data`.
    pub fn f32(shape: &[i64], data: &'a [f32]) -> Self {
        TensorView::F32 { shape: shape.to_vec(), data }
    }

    /// A double tensor over `data`.
    pub fn f64(shape: &[i64], data: &'a [f64]) -> Self {
        TensorView::F64 { shape: shape.to_vec(), data }
    }

    /// An integer tensor over `data`.
    pub fn i64(shape: &[i64], data: &'a [i64]) -> Self {
        TensorView::I64 { shape: shape.to_vec(), data }
    }

    pub(crate) fn to_ort(&self, name: &str) -> Result<SessionInputValue<'a>> {
        let bad = |e: ort::Error| RuntimeError::Binding(format!("input `{name}`: {}", e.message()));
        Ok(match self {
            TensorView::F32 { shape, data } => TensorRef::from_array_view((shape.clone(), *data)).map_err(bad)?.into(),
            TensorView::F64 { shape, data } => TensorRef::from_array_view((shape.clone(), *data)).map_err(bad)?.into(),
            TensorView::I64 { shape, data } => TensorRef::from_array_view((shape.clone(), *data)).map_err(bad)?.into(),
        })
    }
}

/// Values of an owned tensor.
#[derive(Debug, Clone, PartialEq)]
pub enum TensorData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 64-bit floats.
    F64(Vec<f64>),
    /// 64-bit integers.
    I64(Vec<i64>),
}

/// A tensor copied out of a session's outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct OwnedTensor {
    /// Dimensions.
    pub shape: Vec<i64>,
    /// Row-major values.
    pub data: TensorData,
}

impl OwnedTensor {
    /// The values, when they are floats.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            TensorData::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The values, when they are doubles.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            TensorData::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The values, when they are integers.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &self.data {
            TensorData::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The values as doubles, whatever the float type.
    pub fn to_f64s(&self) -> Option<Vec<f64>> {
        match &self.data {
            TensorData::F32(v) => Some(v.iter().map(|&x| x as f64).collect()),
            TensorData::F64(v) => Some(v.clone()),
            TensorData::I64(_) => None,
        }
    }

    /// A borrowed view, to feed the tensor back in.
    pub fn view(&self) -> TensorView<'_> {
        match &self.data {
            TensorData::F32(v) => TensorView::f32(&self.shape, v),
            TensorData::F64(v) => TensorView::f64(&self.shape, v),
            TensorData::I64(v) => TensorView::i64(&self.shape, v),
        }
    }

    pub(crate) fn from_ort(name: &str, value: &DynValue) -> Result<Self> {
        let bad = |e: ort::Error| RuntimeError::Binding(format!("output `{name}`: {}", e.message()));
        match value.data_type() {
            TensorElementType::Float32 => {
                let (shape, data) = value.try_extract_tensor::<f32>().map_err(bad)?;
                Ok(OwnedTensor { shape: shape.to_vec(), data: TensorData::F32(data.to_vec()) })
            }
            TensorElementType::Float64 => {
                let (shape, data) = value.try_extract_tensor::<f64>().map_err(bad)?;
                Ok(OwnedTensor { shape: shape.to_vec(), data: TensorData::F64(data.to_vec()) })
            }
            TensorElementType::Int64 => {
                let (shape, data) = value.try_extract_tensor::<i64>().map_err(bad)?;
                Ok(OwnedTensor { shape: shape.to_vec(), data: TensorData::I64(data.to_vec()) })
            }
            other => Err(RuntimeError::Binding(format!(
                "output `{name}` has element type {other:?}; only f32, f64 and i64 outputs are read"
            ))),
        }
    }
}
