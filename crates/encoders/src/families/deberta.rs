//! DeBERTa-v2 and v3 (`deberta.`, exact to transformers' `DebertaV2ForSequenceClassification`):
//! BERT's post-norm layers around a disentangled attention. Besides content to content, a query
//! reads the relative position of each key (`c2p`) and a key that of each query (`p2c`), through
//! one table of relative embeddings shared by every layer (normalised where `norm_rel_ebd` says
//! `layer_norm`), projected by the layer's key and query projections (`share_att_key`) or its
//! own; relative positions are log-bucketed past half the buckets; the scores are scaled by
//! `sqrt(d * (1 + terms))`. The embeddings add absolute positions only where
//! `position_biased_input`, token types only where there are some; the head is the first
//! token's dense + GELU (`ContextPooler`), dropout, `classifier`.

use ringtune_onnx_ir::{DType, Tensor, Value};

use crate::families::rules::Rules;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};
use crate::{DebertaSettings, ModelConfig, ModelError, RelativeAttention};

pub(crate) struct Deberta;

/// The DeBERTa settings of a config that [`ModelConfig::from_json`] made for this family.
fn settings(c: &ModelConfig) -> Result<&DebertaSettings, ModelError> {
    c.deberta.as_ref().ok_or_else(|| ringtune_onnx_ir::IrError::Invalid("a DeBERTa without its settings".into()).into())
}

/// The table of relative embeddings, and its norm.
const RELATIVE: &str = "deberta.encoder.rel_embeddings.weight";
const RELATIVE_NORM: &str = "deberta.encoder.LayerNorm";

/// Layer `l`'s names (`DebertaV2Layer`'s modules).
fn layer_names(l: usize) -> LayerNames {
    let p = format!("deberta.encoder.layer.{l}.");
    LayerNames {
        query: format!("{p}attention.self.query_proj"),
        key: format!("{p}attention.self.key_proj"),
        value: format!("{p}attention.self.value_proj"),
        attention_out: format!("{p}attention.output.dense"),
        attention_norm: format!("{p}attention.output.LayerNorm"),
        intermediate: format!("{p}intermediate.dense"),
        output: format!("{p}output.dense"),
        output_norm: format!("{p}output.LayerNorm"),
    }
}

fn layer_prefix(l: usize) -> String {
    format!("deberta.encoder.layer.{l}.attention.self.")
}

impl Rules for Deberta {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        let e = c.embedding_size;
        add("deberta.embeddings.word_embeddings.weight".into(), vec![c.vocab_size, e]);
        if c.deberta.as_ref().is_some_and(|d| d.position_biased_input) {
            add("deberta.embeddings.position_embeddings.weight".into(), vec![c.max_position_embeddings, e]);
        }
        if c.type_vocab_size > 0 {
            add("deberta.embeddings.token_type_embeddings.weight".into(), vec![c.type_vocab_size, e]);
        }
        if e != c.hidden_size {
            add("deberta.embeddings.embed_proj.weight".into(), vec![c.hidden_size, e]);
        }
        norm(add, "deberta.embeddings.LayerNorm", c.hidden_size);
    }

    fn layer_params(&self, c: &ModelConfig, l: usize, add: AddParam<'_>) {
        if let Some(names) = self.layer_names(c, l) {
            names.params(c.hidden_size, c.intermediate_size, add);
        }
        if let Some(rel) = c.deberta.as_ref().and_then(|d| d.relative.as_ref()).filter(|r| !r.share_att_key) {
            let p = layer_prefix(l);
            if rel.c2p {
                linear(add, &format!("{p}pos_key_proj"), c.hidden_size, c.hidden_size);
            }
            if rel.p2c {
                linear(add, &format!("{p}pos_query_proj"), c.hidden_size, c.hidden_size);
            }
        }
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        if let Some(rel) = c.deberta.as_ref().and_then(|d| d.relative.as_ref()) {
            add(RELATIVE.into(), vec![2 * rel.span, c.hidden_size]);
            if rel.normalized {
                norm(add, RELATIVE_NORM, c.hidden_size);
            }
        }
        linear(add, "pooler.dense", c.hidden_size, c.hidden_size);
        linear(add, "classifier", c.hidden_size, c.num_labels);
    }

    fn layer_names(&self, _c: &ModelConfig, l: usize) -> Option<LayerNames> {
        Some(layer_names(l))
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        types: Option<&Value>,
        dims: &Value,
    ) -> Result<Value, ModelError> {
        let c = b.config;
        let biased = settings(c)?.position_biased_input;
        let mut sum = b.rows("deberta.embeddings.word_embeddings.weight", ids)?;
        if biased {
            let positions = b.absolute_positions(dims)?;
            let rows = b.rows("deberta.embeddings.position_embeddings.weight", &positions)?;
            sum = b.g.add(&sum, &rows)?;
        }
        if let Some(types) = types {
            let rows = b.rows("deberta.embeddings.token_type_embeddings.weight", types)?;
            sum = b.g.add(&sum, &rows)?;
        }
        if c.embedding_size != c.hidden_size {
            let rows = b.g.reshape(&sum, &[-1, c.embedding_size as i64])?;
            let w = b.param("deberta.embeddings.embed_proj.weight")?;
            sum = b.g.gemm(&rows, &w, None, false, true)?;
        }
        let normed = b.layer_norm(&sum, "deberta.embeddings.LayerNorm")?;
        b.dropout(&normed, c.hidden_dropout)
    }

    fn encoder(&self, b: &mut Builder<'_>, x: &Value, mask: &Value, dims: &Value) -> Result<Option<Value>, ModelError> {
        Ok(Some(b.deberta_encoder(x, mask, dims)?))
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        let pooler_dropout = settings(b.config)?.pooler_dropout;
        let x = b.dropout(first, pooler_dropout)?;
        let x = b.dense(&x, "pooler.dense")?;
        let x = b.g.gelu(&x)?;
        let x = b.dropout(&x, b.config.classifier_dropout)?;
        b.dense(&x, "classifier")
    }

    fn is_head(&self, name: &str) -> bool {
        name.starts_with("classifier.") || name.starts_with("pooler.")
    }
}

/// DeBERTa's bucket of relative position `relative` (`make_log_bucket_position`, in float32 as
/// transformers computes it): itself within half the buckets, else the sign times
/// `ceil(log(|r| / mid) / log((max_position - 1) / mid) * (mid - 1)) + mid`.
pub(crate) fn log_bucket(relative: i64, buckets: usize, max_position: usize) -> i64 {
    let mid = (buckets / 2) as i64;
    let distance = if relative < mid && relative > -mid { mid - 1 } else { relative.abs() };
    if distance <= mid {
        return relative;
    }
    let denominator = (((max_position - 1) as f64 / mid as f64) as f32).ln();
    let log_position = ((distance as f32 / mid as f32).ln() / denominator * (mid - 1) as f32).ceil() + mid as f32;
    (log_position * relative.signum() as f32) as i64
}

/// For every distance `q - k` of `positions` tokens (`q - k + positions - 1` indexes it), the
/// column of the relative table a query reads for a key (`c2p`: bucket + span) and a key for a
/// query (`p2c`: span - bucket), clamped to the table.
fn relative_columns(rel: &RelativeAttention, positions: usize) -> (Vec<i64>, Vec<i64>) {
    let span = rel.span as i64;
    let bucket = |d: i64| if rel.buckets > 0 { log_bucket(d, rel.buckets, rel.max_relative) } else { d };
    let distances = -(positions as i64 - 1)..positions as i64;
    let c2p = distances.clone().map(|d| (bucket(d) + span).clamp(0, 2 * span - 1)).collect();
    let p2c = distances.map(|d| (span - bucket(d)).clamp(0, 2 * span - 1)).collect();
    (c2p, p2c)
}

/// What every layer's relative scores read: the settings, the (normalised) table, and the
/// columns each term gathers.
struct Relative {
    rel: RelativeAttention,
    table: Value,
    c2p: Option<Value>,
    p2c: Option<Value>,
}

impl Builder<'_> {
    /// `[batch, heads, seq, seq]` columns to gather: `lookup[q - k + positions - 1]`.
    fn relative_index(&mut self, lookup: Vec<i64>, dims: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let offset = (lookup.len() / 2) as i64;
        let table = self.g.constant(Tensor::from_i64(&[lookup.len() as i64], &lookup))?;
        let positions = self.absolute_positions(dims)?;
        let queries = self.g.unsqueeze(&positions, &[1])?;
        let keys = self.g.unsqueeze(&positions, &[0])?;
        let distance = self.g.sub(&queries, &keys)?;
        let shift = self.g.constant(Tensor::scalar_i64(offset))?;
        let at = self.g.add(&distance, &shift)?;
        let columns = self.g.gather(&table, &at, 0)?;
        let zero = self.g.const_i64(&[0])?;
        let batch = self.g.gather(dims, &zero, 0)?;
        let heads = self.g.const_i64(&[c.num_heads as i64])?;
        let one = self.g.const_i64(&[1])?;
        let seq = self.g.gather(dims, &one, 0)?;
        let shape = self.g.concat(&[&batch, &heads, &seq, &seq], 0)?;
        Ok(self.g.expand(&columns, &shape)?)
    }

    /// `[heads, 2 span, head size]`: the relative table through the projection `prefix`, with
    /// its bias or (`bias` false) without.
    fn relative_heads(&mut self, table: &Value, prefix: &str, bias: bool) -> Result<Value, ModelError> {
        let c = self.config;
        let projected = if bias { self.dense(table, prefix)? } else { self.dense_without_bias(table, prefix)? };
        let split = self.g.reshape(&projected, &[-1, c.num_heads as i64, c.head_size() as i64])?;
        Ok(self.g.transpose(&split, &[1, 0, 2])?)
    }

    /// Layer `l`'s content-to-position and position-to-content scores (`[batch, heads, seq,
    /// seq]`, unscaled) from its queries and keys (`[batch, heads, seq, head size]`).
    fn relative_scores(
        &mut self,
        Relative { rel, table, c2p, p2c }: &Relative,
        (q, k): (&Value, &Value),
        names: &LayerNames,
        l: usize,
    ) -> Result<Value, ModelError> {
        let table = self.dropout(table, self.config.hidden_dropout)?;
        let p = layer_prefix(l);
        let mut terms = Vec::new();
        if let Some(index) = c2p {
            let projection = if rel.share_att_key { names.key.clone() } else { format!("{p}pos_key_proj") };
            let position_keys = self.relative_heads(&table, &projection, false)?;
            let position_keys = self.g.transpose(&position_keys, &[0, 2, 1])?;
            let by_column = self.g.matmul(q, &position_keys)?;
            terms.push(self.g.gather_elements(&by_column, index, 3)?);
        }
        if let Some(index) = p2c {
            let projection = if rel.share_att_key { names.query.clone() } else { format!("{p}pos_query_proj") };
            let position_queries = self.relative_heads(&table, &projection, true)?;
            let position_queries = self.g.transpose(&position_queries, &[0, 2, 1])?;
            let by_column = self.g.matmul(k, &position_queries)?;
            let read = self.g.gather_elements(&by_column, index, 3)?;
            terms.push(self.g.transpose(&read, &[0, 1, 3, 2])?);
        }
        let mut sum = terms.first().cloned().ok_or_else(|| ringtune_onnx_ir::IrError::Invalid("no term".into()))?;
        for term in &terms[1..] {
            sum = self.g.add(&sum, term)?;
        }
        Ok(sum)
    }

    /// Every layer, then each sequence's first token (`[batch, hidden]`).
    fn deberta_encoder(&mut self, x: &Value, mask: &Value, dims: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let d = settings(c)?.clone();
        let h = c.hidden_size as i64;
        // The embeddings are zero at the padding (DebertaV2Embeddings multiplies by the mask).
        let weights = self.g.cast(mask, DType::F32)?;
        let weights = self.g.unsqueeze(&weights, &[2])?;
        let x = self.g.mul(x, &weights)?;
        let mut x = self.g.reshape(&x, &[-1, h])?;
        let additive_mask = self.additive_mask(mask)?;
        let split_heads = self.split_heads(dims)?;
        let terms = 1 + d.relative.as_ref().map_or(0, |r| r.c2p as usize + r.p2c as usize);
        let scale = 1.0 / ((c.head_size() * terms) as f64).sqrt();
        let relative = match &d.relative {
            Some(rel) => {
                let table = self.param(RELATIVE)?;
                let table = if rel.normalized { self.layer_norm(&table, RELATIVE_NORM)? } else { table };
                let (c2p, p2c) = relative_columns(rel, c.max_position_embeddings);
                let c2p = if rel.c2p { Some(self.relative_index(c2p, dims)?) } else { None };
                let p2c = if rel.p2c { Some(self.relative_index(p2c, dims)?) } else { None };
                Some(Relative { rel: rel.clone(), table, c2p, p2c })
            }
            None => None,
        };
        for l in 0..c.num_layers {
            self.g.push_scope(&crate::layer_scope(l));
            let names = layer_names(l);
            let heads = |b: &mut Self, projected: Value| -> Result<Value, ModelError> {
                let split = b.g.reshape_to(&projected, &split_heads)?;
                Ok(b.g.transpose(&split, &[0, 2, 1, 3])?)
            };
            let q = self.dense(&x, &names.query)?;
            let q = heads(self, q)?;
            // A key bias adds the same `q . b` to every score of a query's row (in the content
            // and the content-to-position terms alike), which softmax cancels exactly: left out
            // unless position-to-content reads the keys, its gradient is exactly zero, as BERT's.
            let keys_read_positions = relative.as_ref().is_some_and(|r| r.rel.p2c);
            let k = if keys_read_positions {
                self.dense(&x, &names.key)?
            } else {
                self.dense_without_bias(&x, &names.key)?
            };
            let k = heads(self, k)?;
            let v = self.dense(&x, &names.value)?;
            let v = heads(self, v)?;
            let kt = self.g.transpose(&k, &[0, 1, 3, 2])?;
            let mut scores = self.g.matmul(&q, &kt)?;
            if let Some(relative) = &relative {
                let terms = self.relative_scores(relative, (&q, &k), &names, l)?;
                scores = self.g.add(&scores, &terms)?;
            }
            let scores = self.g.scale(&scores, scale)?;
            let context = self.attend(&scores, &additive_mask, &v)?;
            x = self.post_norm_output(&names, &context, &x)?;
            self.g.pop_scope();
        }
        let hidden = self.g.const_i64(&[h])?;
        let unflatten = self.g.concat(&[dims, &hidden], 0)?;
        let x3 = self.g.reshape_to(&x, &unflatten)?;
        let first = self.g.slice(&x3, &[0], &[1], &[1])?;
        Ok(self.g.reshape(&first, &[-1, h])?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' `make_log_bucket_position` of every distance, for v3-base's 256 buckets
    /// over 512 positions and the tiny fixture's 8 over 40 (`tests/fixtures/families`).
    #[test]
    fn buckets_are_transformers_own() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/families/deberta-buckets.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let table: std::collections::HashMap<String, Vec<i64>> = serde_json::from_str(&text).expect("json");
        for (buckets, positions) in [(256usize, 512usize), (8, 40)] {
            let theirs = &table[&format!("{buckets},{positions}")];
            let ours: Vec<i64> =
                (-(positions as i64 - 1)..positions as i64).map(|d| log_bucket(d, buckets, positions)).collect();
            assert_eq!(&ours, theirs, "{buckets} buckets over {positions}");
        }
    }
}
