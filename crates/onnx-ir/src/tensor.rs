//! Constant tensors: initialisers and `Constant` node values.

use crate::DType;

/// A tensor with its data, stored as little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// Element type.
    pub dtype: DType,
    /// Dimensions (empty for a scalar).
    pub dims: Vec<i64>,
    /// Little-endian element bytes, `dims.product() * dtype.size()` of them.
    pub data: Vec<u8>,
}

macro_rules! typed_tensor {
    ($from:ident, $scalar:ident, $to:ident, $t:ty, $dtype:expr) => {
        /// A tensor of this element type from values in row-major order.
        pub fn $from(dims: &[i64], values: &[$t]) -> Self {
            debug_assert_eq!(dims.iter().product::<i64>() as usize, values.len());
            Tensor { dtype: $dtype, dims: dims.to_vec(), data: values.iter().flat_map(|v| v.to_le_bytes()).collect() }
        }

        /// A scalar (rank 0) tensor.
        pub fn $scalar(value: $t) -> Self {
            Self::$from(&[], &[value])
        }

        /// The values, when the tensor has this element type.
        pub fn $to(&self) -> Option<Vec<$t>> {
            const N: usize = std::mem::size_of::<$t>();
            (self.dtype == $dtype).then(|| {
                self.data
                    .chunks_exact(N)
                    .map(|c| {
                        let mut b = [0u8; N];
                        b.copy_from_slice(c);
                        <$t>::from_le_bytes(b)
                    })
                    .collect()
            })
        }
    };
}

impl Tensor {
    typed_tensor!(from_f32, scalar_f32, to_f32, f32, DType::F32);
    typed_tensor!(from_f64, scalar_f64, to_f64, f64, DType::F64);
    typed_tensor!(from_i64, scalar_i64, to_i64, i64, DType::I64);
    typed_tensor!(from_i8, scalar_i8, to_i8, i8, DType::I8);
    typed_tensor!(from_u8, scalar_u8, to_u8, u8, DType::U8);

    /// A scalar of a floating type holding `value` (rounded to that type).
    pub fn scalar_float(dtype: DType, value: f64) -> Self {
        match dtype {
            DType::F64 => Self::scalar_f64(value),
            DType::BF16 => Tensor { dtype, dims: vec![], data: bf16_bits(value as f32).to_le_bytes().to_vec() },
            _ => Self::scalar_f32(value as f32),
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.dims.iter().product::<i64>() as usize
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values as `i64` for integer tensors (shape and axis arguments).
    pub fn as_i64s(&self) -> Option<Vec<i64>> {
        match self.dtype {
            DType::I64 => self.to_i64(),
            DType::I32 => {
                Some(self.data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect())
            }
            _ => None,
        }
    }

    /// Values as `f64` for float tensors (for printing and folding).
    pub fn as_f64s(&self) -> Option<Vec<f64>> {
        match self.dtype {
            DType::F32 => self.to_f32().map(|v| v.into_iter().map(f64::from).collect()),
            DType::F64 => self.to_f64(),
            _ => None,
        }
    }
}

/// Round-to-nearest-even bfloat16 bits of an `f32`.
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounding = 0x7fff + ((bits >> 16) & 1);
    ((bits + rounding) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_values() {
        let t = Tensor::from_f32(&[2, 2], &[1.0, -2.0, 3.5, 0.0]);
        assert_eq!(t.to_f32(), Some(vec![1.0, -2.0, 3.5, 0.0]));
        assert_eq!(t.to_i64(), None);
        assert_eq!(Tensor::from_i64(&[3], &[0, -1, 7]).as_i64s(), Some(vec![0, -1, 7]));
        assert_eq!(Tensor::scalar_float(DType::BF16, 1.0).data, 0x3f80u16.to_le_bytes());
    }
}
