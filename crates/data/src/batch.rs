//! Examples and padded batches, laid out as ONNX Runtime wants them (`i64`, row major).

use crate::{Encoded, Label};

/// One tokenized pair (or single text) with its label.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Token types.
    pub type_ids: Vec<u8>,
    /// The label, when the split has labels.
    pub label: Option<Label>,
    /// Whether truncation cut tokens.
    pub truncated: bool,
}

impl Example {
    /// An example from an encoding and a label.
    pub fn new(encoded: Encoded, label: Option<Label>) -> Self {
        Example { ids: encoded.ids, type_ids: encoded.type_ids, label, truncated: encoded.truncated }
    }

    /// The class id a batch carries for it (0 for a score or no label).
    pub fn class_id(&self) -> i64 {
        self.label.and_then(Label::class).map_or(0, i64::from)
    }

    /// The regression target a batch carries for it (0 for a class or no label).
    pub fn target(&self) -> f32 {
        self.label.and_then(Label::score).unwrap_or(0.0)
    }

    /// Tokens in the example.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it has no tokens.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// How rows of a batch are padded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// To the longest row of the batch.
    Dynamic,
    /// To a fixed length (benchmarks); longer rows are an error upstream (truncation).
    Fixed(usize),
}

/// A padded batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Rows.
    pub rows: usize,
    /// Tokens per row after padding.
    pub seq: usize,
    /// `[rows, seq]` token ids.
    pub input_ids: Vec<i64>,
    /// `[rows, seq]` token types.
    pub token_type_ids: Vec<i64>,
    /// `[rows, seq]` 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// `[rows]` class labels (0 where the split has none, or its labels are scores).
    pub labels: Vec<i64>,
    /// `[rows]` regression targets (0 where the split has none, or its labels are classes).
    pub scores: Vec<f32>,
    /// The examples' positions in their split.
    pub indices: Vec<usize>,
}

impl Batch {
    /// Pads the examples at `indices` into one batch, with `pad_id` in padded positions.
    pub fn new(examples: &[Example], indices: &[usize], padding: Padding, pad_id: i64) -> Self {
        let longest = indices.iter().map(|&i| examples[i].len()).max().unwrap_or(0);
        let seq = match padding {
            Padding::Dynamic => longest,
            Padding::Fixed(n) => n.max(longest),
        };
        let rows = indices.len();
        let mut b = Batch {
            rows,
            seq,
            input_ids: vec![pad_id; rows * seq],
            token_type_ids: vec![0; rows * seq],
            attention_mask: vec![0; rows * seq],
            labels: Vec::with_capacity(rows),
            scores: Vec::with_capacity(rows),
            indices: indices.to_vec(),
        };
        for (r, &i) in indices.iter().enumerate() {
            let e = &examples[i];
            let row = r * seq;
            for (k, (&id, &t)) in e.ids.iter().zip(&e.type_ids).enumerate() {
                b.input_ids[row + k] = id as i64;
                b.token_type_ids[row + k] = t as i64;
                b.attention_mask[row + k] = 1;
            }
            b.labels.push(e.class_id());
            b.scores.push(e.target());
        }
        b
    }

    /// `[rows, seq]` as ONNX dimensions.
    pub fn dims(&self) -> [i64; 2] {
        [self.rows as i64, self.seq as i64]
    }

    /// Real (unpadded) tokens in the batch.
    pub fn tokens(&self) -> usize {
        self.attention_mask.iter().filter(|&&m| m == 1).count()
    }
}

/// Cuts `order` into batches of `batch_size` (the last one may be smaller).
pub fn batches<'a>(
    examples: &'a [Example],
    order: &'a [usize],
    batch_size: usize,
    padding: Padding,
    pad_id: i64,
) -> impl Iterator<Item = Batch> + 'a {
    order.chunks(batch_size.max(1)).map(move |chunk| Batch::new(examples, chunk, padding, pad_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(n: usize, label: u32) -> Example {
        Example {
            ids: (1..=n as u32).collect(),
            type_ids: vec![0; n],
            label: Some(Label::Class(label)),
            truncated: false,
        }
    }

    #[test]
    fn dynamic_and_fixed_padding() {
        let examples = vec![ex(3, 1), ex(5, 0), ex(2, 1)];
        let b = Batch::new(&examples, &[0, 2], Padding::Dynamic, 0);
        assert_eq!((b.rows, b.seq), (2, 3));
        assert_eq!(b.input_ids, vec![1, 2, 3, 1, 2, 0]);
        assert_eq!(b.attention_mask, vec![1, 1, 1, 1, 1, 0]);
        assert_eq!((b.labels.as_slice(), b.scores.as_slice()), ([1, 1].as_slice(), [0.0, 0.0].as_slice()));
        let scored = Example { label: Some(Label::Score(2.5)), ..ex(2, 0) };
        let r = Batch::new(&[scored], &[0], Padding::Dynamic, 0);
        assert_eq!((r.labels[0], r.scores[0]), (0, 2.5));
        let f = Batch::new(&examples, &[1], Padding::Fixed(8), 1);
        assert_eq!((f.seq, f.input_ids[7], f.tokens()), (8, 1, 5));
        let all: Vec<Batch> = batches(&examples, &[2, 1, 0], 2, Padding::Dynamic, 0).collect();
        assert_eq!(all.iter().map(|b| b.rows).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(all[0].indices, vec![2, 1]);
    }
}
