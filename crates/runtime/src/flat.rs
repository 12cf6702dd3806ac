//! Flat `f32` buffers: one allocation, 64-byte aligned, never moved or resized.

use std::ops::{Deref, DerefMut};

/// One cache line of floats; the unit of allocation that gives the alignment.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// A fixed-length `f32` buffer whose storage is 64-byte aligned and stays at one address for
/// its whole life, so that ONNX Runtime can read from and write into it across runs.
pub struct FlatBuffer {
    lines: Box<[Line]>,
    len: usize,
}

impl FlatBuffer {
    /// A buffer of `len` zeros.
    pub fn zeros(len: usize) -> Self {
        FlatBuffer { lines: vec![Line([0.0; 16]); len.div_ceil(16)].into_boxed_slice(), len }
    }

    /// A buffer holding a copy of `values`.
    pub fn from_slice(values: &[f32]) -> Self {
        let mut buf = Self::zeros(values.len());
        buf.copy_from_slice(values);
        buf
    }
}

impl Deref for FlatBuffer {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl DerefMut for FlatBuffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

impl Clone for FlatBuffer {
    fn clone(&self) -> Self {
        FlatBuffer { lines: self.lines.clone(), len: self.len }
    }
}

impl std::fmt::Debug for FlatBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FlatBuffer({} floats)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_sized() {
        for len in [0, 1, 15, 16, 17, 1000] {
            let buf = FlatBuffer::zeros(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % 64, 0);
        }
        let buf = FlatBuffer::from_slice(&[1.0, 2.0, 3.0]);
        assert_eq!(&buf[..], &[1.0, 2.0, 3.0]);
    }
}
