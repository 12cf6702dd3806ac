//! What a family says differently from the shared layers: the one trait every family module
//! implements.

use ringtune_onnx_ir::Value;

use crate::forward::Builder;
use crate::layer_names::LayerNames;
use crate::param_shapes::AddParam;
use crate::{ModelConfig, ModelError};

/// What a family says differently from the shared layers.
pub(crate) trait Rules: Sync {
    /// The embeddings' parameters (before the layers, in layout order).
    fn embedding_params(&self, config: &ModelConfig, add: AddParam<'_>);

    /// Parameters after the layers (shared tables, the head), in layout order.
    fn final_params(&self, config: &ModelConfig, add: AddParam<'_>);

    /// Layer `layer`'s parameter names, for a family built of the shared layers (`None`: the
    /// family builds its own, [`Rules::encoder`]).
    fn layer_names(&self, config: &ModelConfig, layer: usize) -> Option<LayerNames>;

    /// Layer `layer`'s parameters, in layout order.
    fn layer_params(&self, config: &ModelConfig, layer: usize, add: AddParam<'_>) {
        if let Some(names) = self.layer_names(config, layer) {
            names.params(config.hidden_size, config.intermediate_size, add);
        }
    }

    /// The word-embedding table's name: the one parameter whose gradient is nonzero only on
    /// the rows a batch's token ids name.
    fn word_embeddings(&self, config: &ModelConfig) -> String {
        format!("{}embeddings.word_embeddings.weight", config.family.prefix())
    }

    /// A family that builds its own layers (ModernBERT) returns each sequence's pooled
    /// `[batch, hidden]` from the embeddings `x`, the batch's 0/1 `mask` and shape `dims`
    /// (every padded position computed); `None`: the shared layers run.
    fn encoder(
        &self,
        _b: &mut Builder<'_>,
        _x: &Value,
        _mask: &Value,
        _dims: &Value,
    ) -> Result<Option<Value>, ModelError> {
        Ok(None)
    }

    /// `[batch, seq, hidden]` (or its rows, `[batch * seq, hidden]`) from the ids
    /// (`[batch, seq]`), the token types where the family has them, and the batch's shape `dims`.
    fn embeddings(
        &self,
        b: &mut Builder<'_>,
        ids: &Value,
        types: Option<&Value>,
        dims: &Value,
    ) -> Result<Value, ModelError>;

    /// `[1, heads, seq, seq]` added to every layer's attention scores, where the family has it.
    fn position_bias(&self, _b: &mut Builder<'_>, _dims: &Value) -> Result<Option<Value>, ModelError> {
        Ok(None)
    }

    /// Whether positions are counted from the padding id (`padding_idx + 1` for the first
    /// token), which leaves `padding_idx + 1` rows of the position table unused.
    fn positions_follow_padding(&self) -> bool {
        false
    }

    /// Whether the attention's output projection is followed by dropout (DistilBERT's is not).
    fn attention_output_dropout(&self) -> bool {
        true
    }

    /// The logits from each sequence's first token (`[batch, hidden]`).
    fn head(&self, b: &mut Builder<'_>, first: &Value) -> Result<Value, ModelError>;

    /// Whether parameter `name` is the head's (a pre-trained checkpoint may lack it).
    fn is_head(&self, name: &str) -> bool {
        name.starts_with("classifier.")
    }
}
