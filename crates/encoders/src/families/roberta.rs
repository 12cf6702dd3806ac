//! RoBERTa, XLM-RoBERTa and CamemBERT (`roberta.`, exact to transformers'
//! `RobertaForSequenceClassification`): BERT's layers; positions counted over non-pad tokens
//! from `padding_idx + 1` (as MPNet's); no token types fed (their tokenizers give none: the
//! embedding adds its type row 0 to every token); no pooler; the head is dense + tanh on the
//! first token (`<s>`), then `out_proj`. Pairs (`<s> A </s></s> B </s>`) come from
//! `tokenizer.json`'s post-processor.

use ringtune_onnx_ir::{Tensor, Value};

use crate::families::rules::Rules;
use crate::families::shared::bert_layer_names;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::param_shapes::{linear, norm};
use crate::{ModelConfig, ModelError};

pub(crate) struct Roberta;

impl Rules for Roberta {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        add("roberta.embeddings.word_embeddings.weight".into(), vec![c.vocab_size, c.hidden_size]);
        add("roberta.embeddings.position_embeddings.weight".into(), vec![c.max_position_embeddings, c.hidden_size]);
        add("roberta.embeddings.token_type_embeddings.weight".into(), vec![c.type_vocab_size, c.hidden_size]);
        norm(add, "roberta.embeddings.LayerNorm", c.hidden_size);
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        linear(add, "classifier.dense", c.hidden_size, c.hidden_size);
        linear(add, "classifier.out_proj", c.hidden_size, c.num_labels);
    }

    fn layer_names(&self, _c: &ModelConfig, layer: usize) -> Option<LayerNames> {
        Some(bert_layer_names("roberta.", layer))
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        _types: Option<&Value>,
        _dims: &Value,
    ) -> Result<Value, ModelError> {
        let words = b.rows("roberta.embeddings.word_embeddings.weight", ids)?;
        // Type 0 for every token: the row broadcast over the batch, its gradient their sum.
        let zeros = b.g.constant(Tensor::from_i64(&[1, 1], &[0]))?;
        let type_row = b.rows("roberta.embeddings.token_type_embeddings.weight", &zeros)?;
        let positions = b.positions_after_padding(ids)?;
        let position_rows = b.rows("roberta.embeddings.position_embeddings.weight", &positions)?;
        b.embedding_sum(&[words, type_row, position_rows], "roberta.embeddings.LayerNorm")
    }

    fn positions_follow_padding(&self) -> bool {
        true
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        b.dense_tanh_head(first)
    }
}
