//! Pieces several families share: BERT's layer names, the embeddings' positions, and the
//! dense + tanh head of MPNet and RoBERTa.

use ringtune_onnx_ir::{DType, Tensor, Value};

use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::ModelError;

/// BERT's layer `l` under `prefix` (`BertModel`'s module names, which RoBERTa and ELECTRA keep).
pub(crate) fn bert_layer_names(prefix: &str, l: usize) -> LayerNames {
    let p = format!("{prefix}encoder.layer.{l}.");
    LayerNames {
        query: format!("{p}attention.self.query"),
        key: format!("{p}attention.self.key"),
        value: format!("{p}attention.self.value"),
        attention_out: format!("{p}attention.output.dense"),
        attention_norm: format!("{p}attention.output.LayerNorm"),
        intermediate: format!("{p}intermediate.dense"),
        output: format!("{p}output.dense"),
        output_norm: format!("{p}output.LayerNorm"),
    }
}

impl Builder<'_> {
    /// `[seq]`: `0, 1, ...` (absolute positions, every sequence alike).
    pub(crate) fn absolute_positions(&mut self, dims: &Value) -> Result<Value, ModelError> {
        let one = self.g.constant(Tensor::scalar_i64(1))?;
        let zero = self.g.constant(Tensor::scalar_i64(0))?;
        let seq = self.g.gather(dims, &one, 0)?;
        Ok(self.g.range(&zero, &seq, &one)?)
    }

    /// `[batch, seq]`: a token's position is `padding_idx + (number of non-pad tokens up to
    /// and including it)`, a pad's `padding_idx` (MPNet's and RoBERTa's
    /// `create_position_ids_from_input_ids`).
    pub(crate) fn positions_after_padding(&mut self, ids: &Value) -> Result<Value, ModelError> {
        let pad_id = self.g.constant(Tensor::scalar_i64(self.config.pad_token_id))?;
        let is_pad = self.g.equal(ids, &pad_id)?;
        let real = self.g.not(&is_pad)?;
        let real = self.g.cast(&real, DType::I64)?;
        let counted = self.g.cumsum(&real, 1)?;
        let counted = self.g.mul(&counted, &real)?;
        Ok(self.g.add(&counted, &pad_id)?)
    }

    /// The rows of table `name` at `indices`.
    pub(crate) fn rows(&mut self, name: &str, indices: &Value) -> Result<Value, ModelError> {
        let table = self.param(name)?;
        Ok(self.g.gather(&table, indices, 0)?)
    }

    /// The sum of `parts`, then the LayerNorm `norm` and dropout: an embedding's output.
    pub(crate) fn embedding_sum(&mut self, parts: &[Value], norm: &str) -> Result<Value, ModelError> {
        let mut sum = parts[0].clone();
        for part in &parts[1..] {
            sum = self.g.add(&sum, part)?;
        }
        let normed = self.layer_norm(&sum, norm)?;
        self.dropout(&normed, self.config.hidden_dropout)
    }

    /// Dropout, `classifier.dense` + tanh, dropout, `classifier.out_proj` on the first token
    /// (MPNet's and RoBERTa's classification head).
    pub(crate) fn dense_tanh_head(&mut self, first: &Value) -> Result<Value, ModelError> {
        let p = self.config.classifier_dropout;
        let x = self.dropout(first, p)?;
        let x = self.dense(&x, "classifier.dense")?;
        let x = self.g.tanh(&x)?;
        let x = self.dropout(&x, p)?;
        self.dense(&x, "classifier.out_proj")
    }
}
