//! The names of an encoder layer's parameters, by model family: the one place the families'
//! Hugging Face module names differ inside a layer.

use crate::Family;

/// The names of one encoder layer's parameters (prefixes of Hugging Face linear and
/// LayerNorm modules), which differ between families.
pub(crate) struct LayerNames {
    pub query: String,
    pub key: String,
    pub value: String,
    pub attention_out: String,
    pub attention_norm: String,
    pub intermediate: String,
    pub output: String,
    pub output_norm: String,
}

/// BERT's layer `l` (`BertModel`'s module names).
fn bert(l: usize) -> LayerNames {
    let p = format!("bert.encoder.layer.{l}.");
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

impl LayerNames {
    /// Layer `layer`'s names in a model of `family`.
    pub(crate) fn of(family: Family, layer: usize) -> Self {
        match family {
            Family::Bert => bert(layer),
            Family::MPNet => mpnet(layer),
        }
    }
}

/// MPNet's layer `l` (`MPNetModel`'s module names).
fn mpnet(l: usize) -> LayerNames {
    let p = format!("mpnet.encoder.layer.{l}.");
    LayerNames {
        query: format!("{p}attention.attn.q"),
        key: format!("{p}attention.attn.k"),
        value: format!("{p}attention.attn.v"),
        attention_out: format!("{p}attention.attn.o"),
        attention_norm: format!("{p}attention.LayerNorm"),
        intermediate: format!("{p}intermediate.dense"),
        output: format!("{p}output.dense"),
        output_norm: format!("{p}output.LayerNorm"),
    }
}
