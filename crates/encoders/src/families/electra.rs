//! ELECTRA's discriminator (`electra.`, exact to transformers'
//! `ElectraForSequenceClassification`): BERT's embeddings at `embedding_size`, projected to the
//! hidden size by `embeddings_project` where the two differ; BERT's layers; the head is dropout,
//! dense + GELU on the first token, dropout, `out_proj`.

use ringtune_onnx_ir::Value;

use crate::families::bert::Bert;
use crate::families::rules::Rules;
use crate::families::shared::bert_layer_names;
use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::linear;
use crate::param_shapes::AddParam;
use crate::{ModelConfig, ModelError};

pub(crate) struct Electra;

/// The projection from the embedding to the hidden size.
const PROJECT: &str = "electra.embeddings_project";

impl Rules for Electra {
    fn embedding_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        Bert.embedding_params(c, add);
        if c.embedding_size != c.hidden_size {
            linear(add, PROJECT, c.embedding_size, c.hidden_size);
        }
    }

    fn final_params(&self, c: &ModelConfig, add: AddParam<'_>) {
        linear(add, "classifier.dense", c.hidden_size, c.hidden_size);
        linear(add, "classifier.out_proj", c.hidden_size, c.num_labels);
    }

    fn layer_names(&self, _c: &ModelConfig, layer: usize) -> Option<LayerNames> {
        Some(bert_layer_names("electra.", layer))
    }

    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        types: Option<&Value>,
        dims: &Value,
    ) -> Result<Value, ModelError> {
        let embedded = Bert.embeddings(b, ids, types, dims)?;
        if b.config.embedding_size == b.config.hidden_size {
            return Ok(embedded);
        }
        // The projection reads the tokens as rows; the layers take them as rows too.
        let rows = b.g.reshape(&embedded, &[-1, b.config.embedding_size as i64])?;
        b.dense(&rows, PROJECT)
    }

    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError> {
        let p = b.config.classifier_dropout;
        let x = b.dropout(first, p)?;
        let x = b.dense(&x, "classifier.dense")?;
        let x = b.g.gelu(&x)?;
        let x = b.dropout(&x, p)?;
        b.dense(&x, "classifier.out_proj")
    }
}
