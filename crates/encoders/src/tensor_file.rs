//! Named f32/i64 tensors in a safetensors file: batches, outputs and gradients exchanged with
//! tools and reference fixtures.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::checkpoint::write_atomically;
use crate::ModelError;

/// A tensor held in memory.
#[derive(Debug, Clone, PartialEq)]
pub enum HostTensor {
    /// 32-bit floats.
    F32 {
        /// Dimensions.
        shape: Vec<usize>,
        /// Row-major values.
        data: Vec<f32>,
    },
    /// 64-bit integers.
    I64 {
        /// Dimensions.
        shape: Vec<usize>,
        /// Row-major values.
        data: Vec<i64>,
    },
}

impl HostTensor {
    /// Dimensions.
    pub fn shape(&self) -> &[usize] {
        match self {
            HostTensor::F32 { shape, .. } | HostTensor::I64 { shape, .. } => shape,
        }
    }

    /// Float values, if it holds floats.
    pub fn f32s(&self) -> Option<&[f32]> {
        match self {
            HostTensor::F32 { data, .. } => Some(data),
            HostTensor::I64 { .. } => None,
        }
    }

    /// Integer values, if it holds integers.
    pub fn i64s(&self) -> Option<&[i64]> {
        match self {
            HostTensor::I64 { data, .. } => Some(data),
            HostTensor::F32 { .. } => None,
        }
    }
}

/// Reads every F32 and I64 tensor of a safetensors file (F64 is narrowed to f32).
pub fn read_tensor_file(path: &Path) -> Result<BTreeMap<String, HostTensor>, ModelError> {
    let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
    let file = SafeTensors::deserialize(&bytes)
        .map_err(|e| ModelError::Checkpoint { path: path.into(), reason: e.to_string() })?;
    let mut out = BTreeMap::new();
    for (name, view) in file.tensors() {
        let shape = view.shape().to_vec();
        let data = view.data();
        let tensor = match view.dtype() {
            Dtype::F32 => HostTensor::F32 {
                shape,
                data: data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            },
            Dtype::F64 => HostTensor::F32 {
                shape,
                data: data
                    .chunks_exact(8)
                    .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
                    .collect(),
            },
            Dtype::I64 => HostTensor::I64 {
                shape,
                data: data
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            },
            other => return Err(ModelError::DType { path: path.into(), name, dtype: format!("{other:?}") }),
        };
        out.insert(name, tensor);
    }
    Ok(out)
}

/// Writes tensors to a safetensors file (atomically).
pub fn write_tensor_file(path: &Path, tensors: &BTreeMap<String, HostTensor>) -> Result<(), ModelError> {
    let encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| match t {
            HostTensor::F32 { shape, data } => {
                (name.clone(), Dtype::F32, shape.clone(), data.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
            HostTensor::I64 { shape, data } => {
                (name.clone(), Dtype::I64, shape.clone(), data.iter().flat_map(|v| v.to_le_bytes()).collect())
            }
        })
        .collect();
    let bad = |e: safetensors::SafeTensorError| ModelError::Checkpoint { path: path.into(), reason: e.to_string() };
    let views = encoded
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            Ok((name.clone(), TensorView::new(*dtype, shape.clone(), bytes).map_err(bad)?))
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    let bytes = safetensors::serialize(views, None).map_err(bad)?;
    write_atomically(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut t = BTreeMap::new();
        t.insert("a".to_string(), HostTensor::F32 { shape: vec![2], data: vec![1.5, -2.0] });
        t.insert("b".to_string(), HostTensor::I64 { shape: vec![1, 2], data: vec![3, 4] });
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("t.safetensors");
        write_tensor_file(&path, &t).expect("write");
        assert_eq!(read_tensor_file(&path).expect("read"), t);
    }
}
