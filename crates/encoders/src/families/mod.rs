//! The encoder families, each a small module saying only how it differs from the shared layers
//! (`forward.rs`: attention, feed-forward, post-LayerNorm residuals; `shared.rs`: the pieces
//! several families use): its parameters' names, its embeddings, its classification head.
//! Adding a family is one module here, one [`Family`] variant and its row in [`Family::ALL`].

mod bert;
pub(crate) mod deberta;
mod distilbert;
mod electra;
mod modernbert;
mod mpnet;
mod roberta;
pub(crate) mod rules;
pub(crate) mod shared;

use rules::Rules;

/// The model family, read from `config.json`'s `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT (`BertForSequenceClassification`).
    Bert,
    /// MPNet (`MPNetForSequenceClassification`): relative attention bias, no token types.
    MPNet,
    /// RoBERTa (`RobertaForSequenceClassification`): BERT's layers, positions counted from the
    /// padding id, no token types fed, no pooler.
    Roberta,
    /// XLM-RoBERTa (`XLMRobertaForSequenceClassification`): RoBERTa's model.
    XlmRoberta,
    /// CamemBERT (`CamembertForSequenceClassification`): RoBERTa's model.
    Camembert,
    /// DistilBERT (`DistilBertForSequenceClassification`): no token types, its own layer names,
    /// a ReLU head.
    DistilBert,
    /// ELECTRA's discriminator (`ElectraForSequenceClassification`): BERT's layers over an
    /// embedding that may be narrower than the hidden size, a GELU head.
    Electra,
    /// ModernBERT (`ModernBertForSequenceClassification`): pre-norm layers of its own, rotary
    /// positions, global and sliding-window attention, a GeGLU feed-forward.
    ModernBert,
    /// DeBERTa-v2 and v3 (`DebertaV2ForSequenceClassification`, `model_type` `deberta-v2`):
    /// disentangled attention over log-bucketed relative positions.
    DebertaV2,
}

impl Family {
    /// Every family, as `model_type` names it.
    pub const ALL: [Family; 9] = [
        Family::Bert,
        Family::MPNet,
        Family::Roberta,
        Family::XlmRoberta,
        Family::Camembert,
        Family::DistilBert,
        Family::Electra,
        Family::ModernBert,
        Family::DebertaV2,
    ];

    /// The family of a `model_type`, if we build it.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.model_type() == model_type)
    }

    /// The `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::MPNet => "mpnet",
            Family::Roberta => "roberta",
            Family::XlmRoberta => "xlm-roberta",
            Family::Camembert => "camembert",
            Family::DistilBert => "distilbert",
            Family::Electra => "electra",
            Family::ModernBert => "modernbert",
            Family::DebertaV2 => "deberta-v2",
        }
    }

    /// The `model_type`s we build, for errors: `bert, mpnet, ...`.
    pub fn model_types() -> String {
        Family::ALL.map(Family::model_type).join(", ")
    }

    /// The class transformers loads an export as.
    pub fn architecture(self) -> &'static str {
        match self {
            Family::Bert => "BertForSequenceClassification",
            Family::MPNet => "MPNetForSequenceClassification",
            Family::Roberta => "RobertaForSequenceClassification",
            Family::XlmRoberta => "XLMRobertaForSequenceClassification",
            Family::Camembert => "CamembertForSequenceClassification",
            Family::DistilBert => "DistilBertForSequenceClassification",
            Family::Electra => "ElectraForSequenceClassification",
            Family::ModernBert => "ModernBertForSequenceClassification",
            Family::DebertaV2 => "DebertaV2ForSequenceClassification",
        }
    }

    /// The prefix of the encoder's parameter names (`bert.`, `roberta.`, ...).
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert.",
            Family::MPNet => "mpnet.",
            Family::Roberta | Family::XlmRoberta | Family::Camembert => "roberta.",
            Family::DistilBert => "distilbert.",
            Family::Electra => "electra.",
            Family::ModernBert => "model.",
            Family::DebertaV2 => "deberta.",
        }
    }

    /// Whether the family reads token types (segment ids): the others' tokenizers give none
    /// (RoBERTa's embedding adds its one type row to every token; a DeBERTa reads them where its
    /// config has a type table, `ModelConfig::reads_token_types`).
    pub fn has_token_types(self) -> bool {
        matches!(self, Family::Bert | Family::Electra)
    }

    /// The padding id where `config.json` gives none.
    pub(crate) fn default_pad_id(self) -> i64 {
        match self {
            Family::MPNet | Family::Roberta | Family::XlmRoberta | Family::Camembert => 1,
            Family::Bert | Family::DistilBert | Family::Electra | Family::DebertaV2 => 0,
            Family::ModernBert => 50283,
        }
    }

    /// The family's own `config.json` names for BERT's keys, as (BERT's, its own).
    pub fn config_names(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Family::DistilBert => &[
                ("hidden_size", "dim"),
                ("num_hidden_layers", "n_layers"),
                ("num_attention_heads", "n_heads"),
                ("intermediate_size", "hidden_dim"),
                ("hidden_act", "activation"),
                ("hidden_dropout_prob", "dropout"),
                ("attention_probs_dropout_prob", "attention_dropout"),
                ("classifier_dropout", "seq_classif_dropout"),
            ],
            Family::ModernBert => &[
                ("layer_norm_eps", "norm_eps"),
                ("hidden_act", "hidden_activation"),
                ("hidden_dropout_prob", "mlp_dropout"),
                ("attention_probs_dropout_prob", "attention_dropout"),
            ],
            _ => &[],
        }
    }

    /// Renames BERT's keys in a `config.json` being written to the family's own names.
    pub(crate) fn write_own_names(self, map: &mut serde_json::Map<String, serde_json::Value>) {
        for (bert, own) in self.config_names() {
            if let Some(value) = map.remove(*bert) {
                map.insert((*own).to_string(), value);
            }
        }
    }

    /// How the family differs from the shared layers.
    pub(crate) fn rules(self) -> &'static dyn Rules {
        match self {
            Family::Bert => &bert::Bert,
            Family::MPNet => &mpnet::MPNet,
            Family::Roberta | Family::XlmRoberta | Family::Camembert => &roberta::Roberta,
            Family::DistilBert => &distilbert::DistilBert,
            Family::Electra => &electra::Electra,
            Family::ModernBert => &modernbert::ModernBert,
            Family::DebertaV2 => &deberta::Deberta,
        }
    }
}
