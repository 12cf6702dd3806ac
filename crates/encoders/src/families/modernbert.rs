//! ModernBERT (`model.`, exact to transformers' `ModernBertForSequenceClassification`): its own
//! pre-norm layers (no norm before the first layer's attention), biases only where the config
//! turns them on, one `Wqkv` projection, rotary positions with one theta for global layers and
//! another for sliding-window ones (a token sees those at most `local_attention / 2` away), a
//! GeGLU feed-forward (`Wi` gives the input and its gate), a final norm; the head pools the first
//! token or the real tokens' mean, then dense + GELU + norm, dropout, `classifier`.

use ringtune_onnx_ir::{DType, Tensor, Value};

use crate::families::rules::Rules;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::norm;
use crate::param_shapes::AddParam;
use crate::{ModelConfig, ModelError, ModernBertSettings};

pub(crate) struct ModernBert;

/// The ModernBERT settings of a config that [`ModelConfig::from_json`] made for this family.
fn settings(c: &ModelConfig) -> Result<&ModernBertSettings, ModelError> {
    c.modernbert
        .as_ref()
        .ok_or_else(|| ringtune_onnx_ir::IrError::Invalid("a ModernBERT without its settings".into()).into())
}

/// A linear layer's weight `[out, in]`, and its bias where `bias`.
fn linear(add: AddParam<'_>, prefix: &str, inputs: usize, outputs: usize, bias: bool) {
    add(format!("{prefix}.weight"), vec![outputs, inputs]);
    if bias {
        add(format!("{prefix}.bias"), vec![outputs]);
    }
}

/// A norm's scale, and its shift where `bias`.
fn scale_norm(add: AddParam<'_>, prefix: &str, width: usize, bias: bool) {
    if bias {
        norm(add, prefix, width);
    } else {
        add(format!("{prefix}.weight"), vec![width]);
    }
}

impl Rules for ModernBert {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        let bias = c.modernbert.as_ref().is_some_and(|m| m.norm_bias);
        add("model.embeddings.tok_embeddings.weight".into(), vec![c.vocab_size, c.hidden_size]);
        scale_norm(add, "model.embeddings.norm", c.hidden_size, bias);
    }

    fn layer_params(&self, c: &ModelConfig, l: usize, add: AddParam<'_>) {
        let Some(m) = c.modernbert.as_ref() else { return };
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let p = format!("model.layers.{l}.");
        if l > 0 {
            scale_norm(add, &format!("{p}attn_norm"), h, m.norm_bias);
        }
        linear(add, &format!("{p}attn.Wqkv"), h, 3 * h, m.attention_bias);
        linear(add, &format!("{p}attn.Wo"), h, h, m.attention_bias);
        scale_norm(add, &format!("{p}mlp_norm"), h, m.norm_bias);
        linear(add, &format!("{p}mlp.Wi"), h, 2 * i, m.mlp_bias);
        linear(add, &format!("{p}mlp.Wo"), i, h, m.mlp_bias);
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        let Some(m) = c.modernbert.as_ref() else { return };
        let h = c.hidden_size;
        scale_norm(add, "model.final_norm", h, m.norm_bias);
        linear(add, "head.dense", h, h, m.classifier_bias);
        scale_norm(add, "head.norm", h, m.norm_bias);
        linear(add, "classifier", h, c.num_labels, true);
    }

    fn layer_names(&self, _c: &ModelConfig, _layer: usize) -> Option<LayerNames> {
        None
    }

    fn word_embeddings(&self, _c: &ModelConfig) -> String {
        "model.embeddings.tok_embeddings.weight".into()
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        _types: Option<&Value>,
        _dims: &Value,
    ) -> Result<Value, ModelError> {
        let m = settings(b.config)?.clone();
        let words = b.rows("model.embeddings.tok_embeddings.weight", ids)?;
        let normed = b.modern_norm(&words, "model.embeddings.norm", m.norm_bias)?;
        b.dropout(&normed, m.embedding_dropout)
    }

    fn encoder(&self, b: &mut Builder<'_>, x: &Value, mask: &Value, dims: &Value) -> Result<Option<Value>, ModelError> {
        Ok(Some(b.modern_encoder(x, mask, dims)?))
    }

    fn head(&self, b: &mut Builder<'_>, pooled: &Value) -> Result<Value, ModelError> {
        let m = settings(b.config)?.clone();
        let x = b.modern_linear(pooled, "head.dense", m.classifier_bias)?;
        let x = b.g.gelu(&x)?;
        let x = b.modern_norm(&x, "head.norm", m.norm_bias)?;
        let x = b.dropout(&x, b.config.classifier_dropout)?;
        b.dense(&x, "classifier")
    }

    fn is_head(&self, name: &str) -> bool {
        name.starts_with("classifier.") || name.starts_with("head.")
    }
}

/// `[positions, head size]` cosines and sines of rotary positions at `theta`, as transformers
/// computes them in float32: `inv_freq_j = 1 / theta^(2j / d)`, angle `p * inv_freq_j`, each
/// frequency twice (`cat(freqs, freqs)`).
fn rotary_tables(positions: usize, head_size: usize, theta: f64) -> (Tensor, Tensor) {
    let half = head_size / 2;
    let inv_freq: Vec<f32> = (0..half).map(|j| 1.0 / (theta as f32).powf((2 * j) as f32 / head_size as f32)).collect();
    let (mut cos, mut sin) = (Vec::with_capacity(positions * head_size), Vec::with_capacity(positions * head_size));
    for p in 0..positions {
        for j in 0..head_size {
            let angle = p as f32 * inv_freq[j % half];
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    let dims = [positions as i64, head_size as i64];
    (Tensor::from_f32(&dims, &cos), Tensor::from_f32(&dims, &sin))
}

/// What every layer of one attention type reads: the additive mask and the rotary tables cut
/// to the batch's length.
struct AttentionKind {
    mask: Value,
    cos: Value,
    sin: Value,
}

impl Builder<'_> {
    /// A linear layer, with its bias where `bias`.
    fn modern_linear(&mut self, x: &Value, prefix: &str, bias: bool) -> Result<Value, ModelError> {
        if bias {
            self.dense(x, prefix)
        } else {
            self.dense_without_bias(x, prefix)
        }
    }

    /// A LayerNorm, shifted only where `bias` (else by zeros, as `bias=False` computes it).
    fn modern_norm(&mut self, x: &Value, prefix: &str, bias: bool) -> Result<Value, ModelError> {
        if bias {
            return self.layer_norm(x, prefix);
        }
        let scale = self.param(&format!("{prefix}.weight"))?;
        let zeros = self
            .g
            .constant(Tensor::from_f32(&[self.config.hidden_size as i64], &vec![0.0; self.config.hidden_size]))?;
        Ok(self.g.layer_norm(x, &scale, &zeros, self.config.layer_norm_eps as f32)?.y)
    }

    /// The mask and rotary tables of the global layers (`window` `None`) or the sliding ones.
    fn attention_kind(
        &mut self,
        padding: &Value,
        dims: &Value,
        theta: f64,
        window: Option<usize>,
    ) -> Result<AttentionKind, ModelError> {
        let c = self.config;
        let (cos, sin) = rotary_tables(c.max_position_embeddings, c.head_size(), theta);
        let (cos, sin) = (self.g.constant(cos)?, self.g.constant(sin)?);
        let positions = self.absolute_positions(dims)?;
        let (cos, sin) = (self.g.gather(&cos, &positions, 0)?, self.g.gather(&sin, &positions, 0)?);
        let mask = match window {
            None => padding.clone(),
            Some(window) => {
                // |query - key| <= window, else masked as padding is (one minimum, never two).
                let queries = self.g.unsqueeze(&positions, &[1])?;
                let keys = self.g.unsqueeze(&positions, &[0])?;
                let distance = self.g.sub(&queries, &keys)?;
                let distance = self.g.abs(&distance)?;
                let limit = self.g.constant(Tensor::scalar_i64(window as i64 + 1))?;
                let near = self.g.less(&distance, &limit)?;
                let masked = self.g.scalar(DType::F32, f32::MIN as f64)?;
                self.g.where_(&near, padding, &masked)?
            }
        };
        Ok(AttentionKind { mask, cos, sin })
    }

    /// `x * cos + rotate_half(x) * sin` over the last axis of `[batch, heads, seq, head size]`.
    fn rotate(&mut self, x: &Value, kind: &AttentionKind) -> Result<Value, ModelError> {
        let d = self.config.head_size() as i64;
        let first = self.g.slice(x, &[0], &[d / 2], &[3])?;
        let second = self.g.slice(x, &[d / 2], &[d], &[3])?;
        let negated = self.g.neg(&second)?;
        let rotated = self.g.concat(&[&negated, &first], 3)?;
        let straight = self.g.mul(x, &kind.cos)?;
        let turned = self.g.mul(&rotated, &kind.sin)?;
        Ok(self.g.add(&straight, &turned)?)
    }

    /// Every layer, the final norm, and the pooling: `[batch, hidden]`.
    fn modern_encoder(&mut self, x: &Value, mask: &Value, dims: &Value) -> Result<Value, ModelError> {
        let c = self.config;
        let m = settings(c)?.clone();
        let (h, i) = (c.hidden_size as i64, c.intermediate_size as i64);
        let mut x = self.g.reshape(x, &[-1, h])?;
        let padding = self.additive_mask(mask)?;
        let global = self.attention_kind(&padding, dims, m.global_theta, None)?;
        let local = self.attention_kind(&padding, dims, m.local_theta, Some(m.sliding_window))?;
        let split_heads = self.split_heads(dims)?;
        let scale = 1.0 / (c.head_size() as f64).sqrt();
        for (l, &is_global) in m.global_layers.iter().enumerate() {
            self.g.push_scope(&crate::layer_scope(l));
            let p = format!("model.layers.{l}.");
            let kind = if is_global { &global } else { &local };
            let normed = if l == 0 { x.clone() } else { self.modern_norm(&x, &format!("{p}attn_norm"), m.norm_bias)? };
            let qkv = self.modern_linear(&normed, &format!("{p}attn.Wqkv"), m.attention_bias)?;
            let mut heads = Vec::new();
            for part in 0..3 {
                let columns = self.g.slice(&qkv, &[part * h], &[(part + 1) * h], &[1])?;
                let split = self.g.reshape_to(&columns, &split_heads)?;
                heads.push(self.g.transpose(&split, &[0, 2, 1, 3])?);
            }
            let q = self.rotate(&heads[0], kind)?;
            let k = self.rotate(&heads[1], kind)?;
            let k = self.g.transpose(&k, &[0, 1, 3, 2])?;
            let scores = self.g.matmul(&q, &k)?;
            let scores = self.g.scale(&scores, scale)?;
            let context = self.attend(&scores, &kind.mask, &heads[2])?;
            let attended = self.modern_linear(&context, &format!("{p}attn.Wo"), m.attention_bias)?;
            let attended = self.dropout(&attended, c.attention_dropout)?;
            x = self.g.add(&x, &attended)?;
            let normed = self.modern_norm(&x, &format!("{p}mlp_norm"), m.norm_bias)?;
            let both = self.modern_linear(&normed, &format!("{p}mlp.Wi"), m.mlp_bias)?;
            let input = self.g.slice(&both, &[0], &[i], &[1])?;
            let gate = self.g.slice(&both, &[i], &[2 * i], &[1])?;
            let activated = self.g.gelu(&input)?;
            let gated = self.g.mul(&activated, &gate)?;
            let gated = self.dropout(&gated, c.hidden_dropout)?;
            let out = self.modern_linear(&gated, &format!("{p}mlp.Wo"), m.mlp_bias)?;
            x = self.g.add(&x, &out)?;
            self.g.pop_scope();
        }
        let x = self.modern_norm(&x, "model.final_norm", m.norm_bias)?;
        let hidden = self.g.const_i64(&[h])?;
        let unflatten = self.g.concat(&[dims, &hidden], 0)?;
        let x3 = self.g.reshape_to(&x, &unflatten)?;
        if m.mean_pooling {
            // The real tokens' mean: sum(x * mask) / sum(mask) over the sequence.
            let weights = self.g.cast(mask, DType::F32)?;
            let weights = self.g.unsqueeze(&weights, &[2])?;
            let kept = self.g.mul(&x3, &weights)?;
            let total = self.g.reduce_sum(&kept, &[1], false)?;
            let count = self.g.reduce_sum(&weights, &[1], false)?;
            Ok(self.g.div(&total, &count)?)
        } else {
            let first = self.g.slice(&x3, &[0], &[1], &[1])?;
            Ok(self.g.reshape(&first, &[-1, h])?)
        }
    }
}
