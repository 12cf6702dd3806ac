//! BERT (`BertForSequenceClassification`): word + token type + absolute position embeddings,
//! and a pooler (dense + tanh on the first token) before the classifier.

use ringtune_onnx_ir::Value;

use crate::families::rules::Rules;
use crate::families::shared::bert_layer_names;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};
use crate::{ModelConfig, ModelError, TOKEN_TYPE_IDS};

pub(crate) struct Bert;

impl Rules for Bert {
    /// Word, position and type tables and their LayerNorm, `embedding_size` wide (the hidden
    /// size but in ELECTRA, which reads these under its own prefix).
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        let (p, e) = (c.family.prefix(), c.embedding_size);
        add(format!("{p}embeddings.word_embeddings.weight"), vec![c.vocab_size, e]);
        add(format!("{p}embeddings.position_embeddings.weight"), vec![c.max_position_embeddings, e]);
        add(format!("{p}embeddings.token_type_embeddings.weight"), vec![c.type_vocab_size, e]);
        norm(add, &format!("{p}embeddings.LayerNorm"), e);
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        linear(add, &format!("{}pooler.dense", c.family.prefix()), c.hidden_size, c.hidden_size);
        linear(add, "classifier", c.hidden_size, c.num_labels);
    }

    fn layer_names(&self, c: &ModelConfig, layer: usize) -> Option<LayerNames> {
        Some(bert_layer_names(c.family.prefix(), layer))
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        types: Option<&Value>,
        dims: &Value,
    ) -> Result<Value, ModelError> {
        let types = types.ok_or_else(|| ringtune_onnx_ir::IrError::UnknownValue(TOKEN_TYPE_IDS.into()))?;
        let p = b.config.family.prefix();
        let words = b.rows(&format!("{p}embeddings.word_embeddings.weight"), ids)?;
        let type_rows = b.rows(&format!("{p}embeddings.token_type_embeddings.weight"), types)?;
        let positions = b.absolute_positions(dims)?;
        let position_rows = b.rows(&format!("{p}embeddings.position_embeddings.weight"), &positions)?;
        b.embedding_sum(&[words, type_rows, position_rows], &format!("{p}embeddings.LayerNorm"))
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        let pooled = b.dense(first, &format!("{}pooler.dense", b.config.family.prefix()))?;
        let pooled = b.g.tanh(&pooled)?;
        let pooled = b.dropout(&pooled, b.config.classifier_dropout)?;
        b.dense(&pooled, "classifier")
    }

    fn is_head(&self, name: &str) -> bool {
        name.starts_with("classifier.") || name.starts_with("bert.pooler.")
    }
}
