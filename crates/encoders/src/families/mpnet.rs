//! MPNet's differences from BERT, exact to Hugging Face's `MPNetForSequenceClassification`:
//! positions counted over non-pad tokens from `padding_idx + 1`, no token types, one relative
//! attention bias table shared by every layer (T5-style bidirectional buckets: 32 buckets, max
//! distance 128, the logarithm in float32, from plain `0..len` positions), and a head of
//! dense + tanh on the first token followed by the output projection.

use ringtune_onnx_ir::{DType, Tensor, Value};

use crate::families::rules::Rules;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};
use crate::{ModelConfig, ModelError};

/// Buckets of the relative positions, whatever the config says (as Hugging Face computes them).
const BUCKETS: i64 = 32;
/// Distances at and beyond this share the last bucket.
const MAX_DISTANCE: f64 = 128.0;

pub(crate) struct MPNet;

impl Rules for MPNet {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        add("mpnet.embeddings.word_embeddings.weight".into(), vec![c.vocab_size, c.hidden_size]);
        add("mpnet.embeddings.position_embeddings.weight".into(), vec![c.max_position_embeddings, c.hidden_size]);
        norm(add, "mpnet.embeddings.LayerNorm", c.hidden_size);
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        add("mpnet.encoder.relative_attention_bias.weight".into(), vec![c.relative_attention_buckets, c.num_heads]);
        linear(add, "classifier.dense", c.hidden_size, c.hidden_size);
        linear(add, "classifier.out_proj", c.hidden_size, c.num_labels);
    }

    /// `MPNetModel`'s module names.
    fn layer_names(&self, _c: &ModelConfig, l: usize) -> Option<LayerNames> {
        let p = format!("mpnet.encoder.layer.{l}.");
        Some(LayerNames {
            query: format!("{p}attention.attn.q"),
            key: format!("{p}attention.attn.k"),
            value: format!("{p}attention.attn.v"),
            attention_out: format!("{p}attention.attn.o"),
            attention_norm: format!("{p}attention.LayerNorm"),
            intermediate: format!("{p}intermediate.dense"),
            output: format!("{p}output.dense"),
            output_norm: format!("{p}output.LayerNorm"),
        })
    }

    /// word + position embeddings, LayerNorm, dropout; positions counted after the padding.
    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        _types: Option<&Value>,
        _dims: &Value,
    ) -> Result<Value, ModelError> {
        let words = b.rows("mpnet.embeddings.word_embeddings.weight", ids)?;
        let positions = b.positions_after_padding(ids)?;
        let position_rows = b.rows("mpnet.embeddings.position_embeddings.weight", &positions)?;
        b.embedding_sum(&[words, position_rows], "mpnet.embeddings.LayerNorm")
    }

    fn position_bias(&self, b: &mut Builder<'_>, dims: &Value) -> Result<Option<Value>, ModelError> {
        Ok(Some(b.mpnet_position_bias(dims)?))
    }

    fn positions_follow_padding(&self) -> bool {
        true
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        b.dense_tanh_head(first)
    }
}

impl Builder<'_> {
    /// `[1, heads, seq, seq]`: the shared table looked up at each (query, key) pair's bucket.
    fn mpnet_position_bias(&mut self, dims: &Value) -> Result<Value, ModelError> {
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
}
