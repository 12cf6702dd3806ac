//! MPNet's differences from BERT, exact to Hugging Face's `MPNetForSequenceClassification`:
//! positions counted over non-pad tokens from `padding_idx + 1`, no token types, one relative
//! attention bias table shared by every layer (T5-style bidirectional buckets: 32 buckets, max
//! distance 128, the logarithm in float32, from plain `0..len` positions), and a head of
//! dense + tanh on the first token followed by the output projection.

use ringtune_onnx_ir::{DType, Tensor, Value};

use crate::forward::Builder;
use crate::ModelError;

/// Buckets of the relative positions, whatever the config says (as Hugging Face computes them).
const BUCKETS: i64 = 32;
/// Distances at and beyond this share the last bucket.
const MAX_DISTANCE: f64 = 128.0;

impl Builder<'_> {
    /// word + position embeddings, LayerNorm, dropout; a token's position is
    /// `padding_idx + (number of non-pad tokens up to and including it)`, pads get `padding_idx`.
    pub(crate) fn mpnet_embeddings(&mut self, ids: &Value) -> Result<Value, ModelError> {
        let pad = self.config.pad_token_id;
        let word = self.param("mpnet.embeddings.word_embeddings.weight")?;
        let position = self.param("mpnet.embeddings.position_embeddings.weight")?;
        let pad_id = self.g.constant(Tensor::scalar_i64(pad))?;
        let is_pad = self.g.equal(ids, &pad_id)?;
        let real = self.g.not(&is_pad)?;
        let real = self.g.cast(&real, DType::I64)?;
        let counted = self.g.cumsum(&real, 1)?;
        let counted = self.g.mul(&counted, &real)?;
        let positions = self.g.add(&counted, &pad_id)?;
        let words = self.g.gather(&word, ids, 0)?;
        let position_rows = self.g.gather(&position, &positions, 0)?;
        let sum = self.g.add(&words, &position_rows)?;
        let normed = self.layer_norm(&sum, "mpnet.embeddings.LayerNorm")?;
        self.dropout(&normed, self.config.hidden_dropout)
    }

    /// `[1, heads, seq, seq]`: the shared table looked up at each (query, key) pair's bucket.
    pub(crate) fn mpnet_position_bias(&mut self, dims: &Value) -> Result<Value, ModelError> {
        let table = self.param("mpnet.encoder.relative_attention_bias.weight")?;
        let bucket = self.relative_buckets(dims)?;
        let rows = self.g.gather(&table, &bucket, 0)?;
        let per_head = self.g.transpose(&rows, &[2, 0, 1])?;
        Ok(self.g.unsqueeze(&per_head, &[0])?)
    }

    /// `[seq, seq]` bucket of `key - query`, as `MPNetEncoder.relative_position_bucket`.
    fn relative_buckets(&mut self, dims: &Value) -> Result<Value, ModelError> {
        let g = &mut self.g;
        let int = |g: &mut ringtune_onnx_ir::Graph, v: i64| g.constant(Tensor::scalar_i64(v));
        let (zero, one) = (int(g, 0)?, int(g, 1)?);
        let seq = g.gather(dims, &one, 0)?;
        let positions = g.range(&zero, &seq, &one)?;
        let memory = g.unsqueeze(&positions, &[0])?;
        let context = g.unsqueeze(&positions, &[1])?;
        let relative = g.sub(&memory, &context)?;
        let n = g.neg(&relative)?;
        let half = BUCKETS / 2;
        let max_exact = half / 2;
        let negative = g.less(&n, &zero)?;
        let negative = g.cast(&negative, DType::I64)?;
        let half_value = int(g, half)?;
        let base = g.mul(&negative, &half_value)?;
        let n = g.abs(&n)?;
        let exact = int(g, max_exact)?;
        let is_small = g.less(&n, &exact)?;
        // log(n / max_exact) / log(max_distance / max_exact) * (half - max_exact), in float32;
        // n = 0 takes the exact branch, so the logarithm sees at least 1.
        let at_least_one = g.max(&n, &one)?;
        let nf = g.cast(&at_least_one, DType::F32)?;
        let exact_f = g.scalar(DType::F32, max_exact as f64)?;
        let ratio = g.div(&nf, &exact_f)?;
        let log = g.log(&ratio)?;
        let denominator = g.scalar(DType::F32, (MAX_DISTANCE / max_exact as f64).ln())?;
        let scaled = g.div(&log, &denominator)?;
        let span = g.scalar(DType::F32, (half - max_exact) as f64)?;
        let scaled = g.mul(&scaled, &span)?;
        let large = g.cast(&scaled, DType::I64)?;
        let large = g.add(&large, &exact)?;
        let last = int(g, half - 1)?;
        let large = g.min(&large, &last)?;
        let offset = g.where_(&is_small, &n, &large)?;
        Ok(g.add(&base, &offset)?)
    }

    /// Dropout, dense + tanh, dropout, output projection on the first token.
    pub(crate) fn mpnet_head(&mut self, first: &Value) -> Result<Value, ModelError> {
        let p = self.config.classifier_dropout;
        let x = self.dropout(first, p)?;
        let x = self.dense(&x, "classifier.dense")?;
        let x = self.g.tanh(&x)?;
        let x = self.dropout(&x, p)?;
        self.dense(&x, "classifier.out_proj")
    }
}
