//! DistilBERT (`distilbert.`, exact to transformers' `DistilBertForSequenceClassification`):
//! word + absolute position embeddings, no token types; layers named `q_lin`, `k_lin`, `v_lin`,
//! `out_lin`, `sa_layer_norm`, `ffn.lin1`, `ffn.lin2`, `output_layer_norm`, with no dropout after
//! the attention's output projection; the head is `pre_classifier` + ReLU on the first token,
//! dropout (`seq_classif_dropout`), `classifier`. Its config names (`dim`, `n_layers`, ...) are
//! read as BERT's (`config.rs`).

use ringtune_onnx_ir::Value;

use crate::families::rules::Rules;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};
use crate::{ModelConfig, ModelError};

pub(crate) struct DistilBert;

impl Rules for DistilBert {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        add("distilbert.embeddings.word_embeddings.weight".into(), vec![c.vocab_size, c.hidden_size]);
        add("distilbert.embeddings.position_embeddings.weight".into(), vec![c.max_position_embeddings, c.hidden_size]);
        norm(add, "distilbert.embeddings.LayerNorm", c.hidden_size);
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        linear(add, "pre_classifier", c.hidden_size, c.hidden_size);
        linear(add, "classifier", c.hidden_size, c.num_labels);
    }

    fn layer_names(&self, _c: &ModelConfig, l: usize) -> Option<LayerNames> {
        let p = format!("distilbert.transformer.layer.{l}.");
        Some(LayerNames {
            query: format!("{p}attention.q_lin"),
            key: format!("{p}attention.k_lin"),
            value: format!("{p}attention.v_lin"),
            attention_out: format!("{p}attention.out_lin"),
            attention_norm: format!("{p}sa_layer_norm"),
            intermediate: format!("{p}ffn.lin1"),
            output: format!("{p}ffn.lin2"),
            output_norm: format!("{p}output_layer_norm"),
        })
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        _types: Option<&Value>,
        dims: &Value,
    ) -> Result<Value, ModelError> {
        let words = b.rows("distilbert.embeddings.word_embeddings.weight", ids)?;
        let positions = b.absolute_positions(dims)?;
        let position_rows = b.rows("distilbert.embeddings.position_embeddings.weight", &positions)?;
        b.embedding_sum(&[words, position_rows], "distilbert.embeddings.LayerNorm")
    }

    fn attention_output_dropout(&self) -> bool {
        false
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        let x = b.dense(first, "pre_classifier")?;
        let x = b.g.relu(&x)?;
        let x = b.dropout(&x, b.config.classifier_dropout)?;
        b.dense(&x, "classifier")
    }

    fn is_head(&self, name: &str) -> bool {
        name.starts_with("classifier.") || name.starts_with("pre_classifier.")
    }
}
