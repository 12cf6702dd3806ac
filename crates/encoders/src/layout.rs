//! The flat parameter layout: every parameter's name, offset and shape in one `f32` buffer.
//!
//! Gradients, optimizer state, checkpoints and the all-reduce all use this one layout. Each
//! tensor starts on a 64-byte boundary so that views of it are aligned for vector kernels.

use sha2::{Digest, Sha256};

use crate::ModelError;

/// Floats per alignment unit (64 bytes).
pub const ALIGN_FLOATS: usize = 16;

/// One parameter inside the flat buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamEntry {
    /// Hugging Face name (`bert.encoder.layer.0.attention.self.query.weight`).
    pub name: String,
    /// Offset of its first element, in floats (a multiple of [`ALIGN_FLOATS`]).
    pub offset: usize,
    /// Dimensions.
    pub shape: Vec<usize>,
}

impl ParamEntry {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element range in the flat buffer.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.len()
    }

    /// Dimensions as ONNX wants them.
    pub fn dims_i64(&self) -> Vec<i64> {
        self.shape.iter().map(|&d| d as i64).collect()
    }
}

/// The parameters of a model, in a fixed order, packed into one aligned buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamLayout {
    entries: Vec<ParamEntry>,
    total: usize,
}

impl ParamLayout {
    /// Packs `(name, shape)` pairs in the order given.
    pub fn new(params: Vec<(String, Vec<usize>)>) -> Self {
        let mut offset = 0;
        let entries = params
            .into_iter()
            .map(|(name, shape)| {
                let entry = ParamEntry { name, offset, shape };
                offset = (offset + entry.len()).div_ceil(ALIGN_FLOATS) * ALIGN_FLOATS;
                entry
            })
            .collect();
        ParamLayout { entries, total: offset }
    }

    /// The entries, in buffer order.
    pub fn entries(&self) -> &[ParamEntry] {
        &self.entries
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&ParamEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// Length of the flat buffer in floats (padding included).
    pub fn total_len(&self) -> usize {
        self.total
    }

    /// Number of trainable values (padding excluded).
    pub fn num_params(&self) -> usize {
        self.entries.iter().map(ParamEntry::len).sum()
    }

    /// A hash of names, shapes and offsets: equal on two nodes only if their buffers line up.
    pub fn hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        for e in &self.entries {
            h.update(e.name.as_bytes());
            h.update([0]);
            for d in &e.shape {
                h.update((*d as u64).to_le_bytes());
            }
            h.update((e.offset as u64).to_le_bytes());
        }
        h.finalize().into()
    }

    /// Checks that a buffer has the layout's length.
    pub fn check_len(&self, len: usize) -> Result<(), ModelError> {
        if len == self.total {
            Ok(())
        } else {
            Err(ModelError::BufferLength { found: len, expected: self.total })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_aligned_and_packed_in_order() {
        let layout = ParamLayout::new(vec![("a".into(), vec![3, 5]), ("b".into(), vec![7]), ("c".into(), vec![16])]);
        let e = layout.entries();
        assert_eq!((e[0].offset, e[1].offset, e[2].offset), (0, 16, 32));
        assert_eq!(layout.total_len(), 48);
        assert_eq!(layout.num_params(), 15 + 7 + 16);
        assert_eq!(layout.get("b").map(ParamEntry::range), Some(16..23));
        let other = ParamLayout::new(vec![("a".into(), vec![5, 3]), ("b".into(), vec![7]), ("c".into(), vec![16])]);
        assert_ne!(layout.hash(), other.hash());
        assert!(layout.check_len(47).is_err());
    }
}
