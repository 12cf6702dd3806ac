//! What a product is, independent of oneDNN: shapes, transposes, bias, precision, and the
//! strides that describe the operands as the caller stores them.

use crate::ffi::DNNL_MAX_NDIMS;
use crate::DnnlError;

/// The arithmetic of a product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    /// fp32 multiplies and accumulation.
    F32,
    /// bf16 multiplies (inputs rounded to bf16), fp32 accumulation and output.
    Bf16,
}

/// A bias added to the product (the `C` of a `Gemm` with `beta = 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bias {
    /// `[n]`, added to every row.
    Row,
    /// `[m, 1]`, added to every column.
    Column,
    /// `[m, n]`.
    Full,
}

/// An elementwise function the product applies to its output as it writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    /// The exact GELU, `x Φ(x)`.
    GeluErf,
}

/// `out[b] = act(op(A[b]) @ op(B[b]) (+ bias))`, batch axes broadcast numpy-style.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Matmul {
    /// A's leading axes (as many as B's; 1 where broadcast).
    pub batch_a: Vec<i64>,
    /// B's leading axes.
    pub batch_b: Vec<i64>,
    /// Rows of op(A).
    pub m: i64,
    /// Columns of op(A), rows of op(B).
    pub k: i64,
    /// Columns of op(B).
    pub n: i64,
    /// A is stored `[.., k, m]`.
    pub trans_a: bool,
    /// B is stored `[.., n, k]`.
    pub trans_b: bool,
    /// The bias, if any (2-D products only).
    pub bias: Option<Bias>,
    /// Arithmetic.
    pub precision: Precision,
    /// Applied to the output, after the bias.
    pub activation: Option<Activation>,
}

impl Matmul {
    /// A 2-D product of `[m, k]` by `[k, n]`.
    pub fn plain(m: i64, k: i64, n: i64, precision: Precision) -> Self {
        Matmul {
            batch_a: vec![],
            batch_b: vec![],
            m,
            k,
            n,
            trans_a: false,
            trans_b: false,
            bias: None,
            precision,
            activation: None,
        }
    }

    /// The output's batch axes.
    pub fn batch_out(&self) -> Vec<i64> {
        self.batch_a.iter().zip(&self.batch_b).map(|(&a, &b)| a.max(b)).collect()
    }

    fn count(dims: &[i64]) -> usize {
        dims.iter().product::<i64>().max(0) as usize
    }

    /// Elements of A, B, the bias and the output.
    pub fn lens(&self) -> (usize, usize, usize, usize) {
        let bias = match self.bias {
            None => 0,
            Some(Bias::Row) => self.n as usize,
            Some(Bias::Column) => self.m as usize,
            Some(Bias::Full) => (self.m * self.n) as usize,
        };
        (
            Self::count(&self.batch_a) * (self.m * self.k) as usize,
            Self::count(&self.batch_b) * (self.k * self.n) as usize,
            bias,
            Self::count(&self.batch_out()) * (self.m * self.n) as usize,
        )
    }

    /// Refuses products oneDNN cannot be asked for: ranks that differ or exceed its limit,
    /// empty sizes, batch axes that do not broadcast, a bias on a batched product.
    pub(crate) fn check(&self) -> Result<(), DnnlError> {
        let bad = |why: String| Err(DnnlError::Shape(why));
        if self.batch_a.len() != self.batch_b.len() || self.batch_a.len() + 2 > DNNL_MAX_NDIMS {
            return bad(format!(
                "batch axes {:?} and {:?} must have one rank (at most 10)",
                self.batch_a, self.batch_b
            ));
        }
        if self.m <= 0 || self.k <= 0 || self.n <= 0 {
            return bad(format!("empty product {}x{}x{}", self.m, self.k, self.n));
        }
        for (&a, &b) in self.batch_a.iter().zip(&self.batch_b) {
            if a != b && a != 1 && b != 1 {
                return bad(format!("batch axes {:?} and {:?} do not broadcast", self.batch_a, self.batch_b));
            }
        }
        if self.bias.is_some() && !self.batch_a.is_empty() {
            return bad("a bias is supported on 2-D products only".into());
        }
        Ok(())
    }

    /// Logical dims and strides of A as stored.
    pub(crate) fn a_layout(&self) -> (Vec<i64>, Vec<i64>) {
        operand(&self.batch_a, self.m, self.k, self.trans_a)
    }

    /// Logical dims and strides of B as stored.
    pub(crate) fn b_layout(&self) -> (Vec<i64>, Vec<i64>) {
        operand(&self.batch_b, self.k, self.n, self.trans_b)
    }

    /// Dims and strides of the dense output.
    pub(crate) fn out_layout(&self) -> (Vec<i64>, Vec<i64>) {
        let mut dims = self.batch_out();
        dims.extend([self.m, self.n]);
        let strides = dense_strides(&dims);
        (dims, strides)
    }

    /// Dims of the bias, broadcast to the product's rank.
    pub(crate) fn bias_dims(&self) -> Option<Vec<i64>> {
        let rank = self.batch_a.len() + 2;
        let mut dims = vec![1i64; rank];
        match self.bias? {
            Bias::Row => dims[rank - 1] = self.n,
            Bias::Column => dims[rank - 2] = self.m,
            Bias::Full => {
                dims[rank - 2] = self.m;
                dims[rank - 1] = self.n;
            }
        }
        Some(dims)
    }
}

/// Row-major strides of `dims`.
pub(crate) fn dense_strides(dims: &[i64]) -> Vec<i64> {
    let mut strides = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * dims[i + 1].max(1);
    }
    strides
}

/// Logical dims and strides of an operand stored with its last two axes swapped or not.
fn operand(batch: &[i64], rows: i64, cols: i64, transposed: bool) -> (Vec<i64>, Vec<i64>) {
    let stored_last: [i64; 2] = if transposed { [cols, rows] } else { [rows, cols] };
    let mut stored = batch.to_vec();
    stored.extend(stored_last);
    let mut strides = dense_strides(&stored);
    let r = strides.len();
    if transposed {
        strides.swap(r - 2, r - 1);
    }
    let mut dims = batch.to_vec();
    dims.extend([rows, cols]);
    (dims, strides)
}

/// Row-major strides in the storage order implied by `strides` (a transposed operand stays
/// transposed), for a copy of the same logical tensor.
pub(crate) fn dense_strides_like(dims: &[i64], strides: &[i64]) -> Vec<i64> {
    let mut order: Vec<usize> = (0..dims.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(strides[i]));
    let mut out = vec![0; dims.len()];
    let mut next = 1;
    for &i in order.iter().rev() {
        out[i] = next;
        next *= dims[i].max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposed_operands_are_strides() {
        assert_eq!(operand(&[], 2, 3, false), (vec![2, 3], vec![3, 1]));
        assert_eq!(operand(&[], 2, 3, true), (vec![2, 3], vec![1, 2]));
        assert_eq!(operand(&[4], 2, 3, true), (vec![4, 2, 3], vec![6, 1, 2]));
    }

    #[test]
    fn copies_keep_the_storage_order() {
        assert_eq!(dense_strides_like(&[2, 3], &[1, 2]), vec![1, 2]);
        assert_eq!(dense_strides_like(&[4, 2, 3], &[6, 1, 2]), vec![6, 1, 2]);
        assert_eq!(dense_strides_like(&[4, 2, 3], &[6, 3, 1]), vec![6, 3, 1]);
    }

    #[test]
    fn specs_are_checked() {
        let mut s = Matmul::plain(2, 3, 4, Precision::F32);
        assert_eq!(s.lens(), (6, 12, 0, 8));
        s.batch_a = vec![2];
        assert!(s.check().is_err(), "ranks differ");
        s.batch_b = vec![3];
        assert!(s.check().is_err(), "2 and 3 do not broadcast");
        s.batch_b = vec![1];
        assert!(s.check().is_ok());
        assert_eq!(s.batch_out(), vec![2]);
        let biased = Matmul { bias: Some(Bias::Column), ..Matmul::plain(2, 3, 4, Precision::F32) };
        assert_eq!(biased.bias_dims(), Some(vec![2, 1]));
        assert_eq!(biased.out_layout(), (vec![2, 4], vec![4, 1]));
    }
}
