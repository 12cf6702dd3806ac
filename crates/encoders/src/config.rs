//! Model configuration read from a Hugging Face `config.json`.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::{Family, ModelError};

/// What the classification head predicts, as Hugging Face's `problem_type` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemType {
    /// One class of `num_labels` (cross-entropy): `single_label_classification`.
    SingleLabel,
    /// One real score, `num_labels` 1 (mean squared error): `regression`.
    Regression,
}

impl ProblemType {
    /// Hugging Face's name.
    pub fn hf_name(self) -> &'static str {
        match self {
            ProblemType::SingleLabel => "single_label_classification",
            ProblemType::Regression => "regression",
        }
    }
}

/// The hyper-parameters that shape the graph and the parameter layout.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub family: Family,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Width of the embeddings (ELECTRA's may be narrower than the hidden size; the others'
    /// is the hidden size).
    pub embedding_size: usize,
    /// Encoder layers.
    pub num_layers: usize,
    /// Attention heads per layer.
    pub num_heads: usize,
    /// Feed-forward inner size.
    pub intermediate_size: usize,
    /// Position embedding rows.
    pub max_position_embeddings: usize,
    /// Token-type embedding rows.
    pub type_vocab_size: usize,
    /// LayerNorm epsilon.
    pub layer_norm_eps: f64,
    /// Standard deviation of the initialisation.
    pub initializer_range: f64,
    /// Dropout after embeddings, attention output and feed-forward output.
    pub hidden_dropout: f64,
    /// Dropout on attention probabilities.
    pub attention_dropout: f64,
    /// Dropout before the classifier.
    pub classifier_dropout: f64,
    /// Outputs of the head: classes, or 1 for a regression score.
    pub num_labels: usize,
    /// What the head predicts (and so the loss).
    pub problem: ProblemType,
    /// The name of each class (`id2label`, in id order; `LABEL_<i>` where none is given).
    pub id2label: Vec<String>,
    /// Padding token id.
    pub pad_token_id: i64,
    /// Rows of MPNet's relative attention bias table (0 for BERT).
    pub relative_attention_buckets: usize,
    /// What only ModernBERT has (`None` for the other families).
    pub modernbert: Option<ModernBertSettings>,
    /// What only DeBERTa has (`None` for the other families).
    pub deberta: Option<DebertaSettings>,
}

/// DeBERTa's settings beyond BERT's.
#[derive(Debug, Clone, PartialEq)]
pub struct DebertaSettings {
    /// The disentangled attention (`relative_attention`); `None`: content to content alone.
    pub relative: Option<RelativeAttention>,
    /// The embeddings add absolute positions (`position_biased_input`; v3: no).
    pub position_biased_input: bool,
    /// Dropout before the pooler's dense layer.
    pub pooler_dropout: f64,
}

/// DeBERTa's relative attention.
#[derive(Debug, Clone, PartialEq)]
pub struct RelativeAttention {
    /// `position_buckets` (0: none, every distance its own up to the span).
    pub buckets: usize,
    /// `max_relative_positions` (the config's, or `max_position_embeddings` where it is below 1).
    pub max_relative: usize,
    /// Rows of the relative table each side: the buckets, else `max_relative`.
    pub span: usize,
    /// Content to position (`pos_att_type` has `c2p`).
    pub c2p: bool,
    /// Position to content (`pos_att_type` has `p2c`).
    pub p2c: bool,
    /// The positions are projected by the layer's own key and query projections.
    pub share_att_key: bool,
    /// The table is normalised (`norm_rel_ebd` has `layer_norm`).
    pub normalized: bool,
}

impl DebertaSettings {
    /// From `config.json`'s DeBERTa keys; what transformers' DeBERTa-v2 can do and ours does not
    /// (a convolution beside the first layer, another pooler width or activation) is refused.
    fn read(hf: &HfConfig, path: &Path) -> Result<Self, ModelError> {
        if hf.conv_kernel_size.unwrap_or(0) > 0 {
            let size = hf.conv_kernel_size.unwrap_or(0).to_string();
            return Err(unsupported(path, "conv_kernel_size", &size, "0: no convolution layer"));
        }
        if let Some(width) = hf.pooler_hidden_size.filter(|&w| w != hf.hidden_size) {
            return Err(unsupported(path, "pooler_hidden_size", &width.to_string(), "the hidden size"));
        }
        if let Some(act) = hf.pooler_hidden_act.as_deref().filter(|a| *a != "gelu") {
            return Err(unsupported(path, "pooler_hidden_act", act, "only `gelu`"));
        }
        let relative = if hf.relative_attention.unwrap_or(false) {
            let kinds: Vec<String> = match &hf.pos_att_type {
                Some(Json::String(text)) => text.split('|').map(|k| k.trim().to_lowercase()).collect(),
                Some(Json::Array(list)) => list.iter().filter_map(Json::as_str).map(str::to_lowercase).collect(),
                _ => Vec::new(),
            };
            if let Some(other) = kinds.iter().find(|k| !matches!(k.as_str(), "c2p" | "p2c")) {
                return Err(unsupported(path, "pos_att_type", other, "c2p and p2c"));
            }
            let max_relative = match hf.max_relative_positions {
                Some(m) if m >= 1 => m as usize,
                _ => hf.max_position_embeddings,
            };
            let buckets = hf.position_buckets.filter(|&b| b > 0).map_or(0, |b| b as usize);
            let normalized = hf
                .norm_rel_ebd
                .as_deref()
                .unwrap_or("none")
                .to_lowercase()
                .split('|')
                .any(|k| k.trim() == "layer_norm");
            Some(RelativeAttention {
                buckets,
                max_relative,
                span: if buckets > 0 { buckets } else { max_relative },
                c2p: kinds.iter().any(|k| k == "c2p"),
                p2c: kinds.iter().any(|k| k == "p2c"),
                share_att_key: hf.share_att_key.unwrap_or(false),
                normalized,
            })
        } else {
            None
        };
        Ok(DebertaSettings {
            relative,
            position_biased_input: hf.position_biased_input.unwrap_or(true),
            pooler_dropout: hf.pooler_dropout.unwrap_or(0.0),
        })
    }

    /// The keys transformers' `DebertaV2Config` reads them from.
    fn write(&self, map: &mut serde_json::Map<String, Json>) {
        map.insert("position_biased_input".into(), Json::from(self.position_biased_input));
        map.insert("pooler_dropout".into(), Json::from(self.pooler_dropout));
        map.insert("pooler_hidden_act".into(), Json::from("gelu"));
        map.insert("relative_attention".into(), Json::from(self.relative.is_some()));
        if let Some(rel) = &self.relative {
            let kinds: Vec<&str> = [("p2c", rel.p2c), ("c2p", rel.c2p)].iter().filter(|k| k.1).map(|k| k.0).collect();
            map.insert("pos_att_type".into(), Json::from(kinds.join("|")));
            map.insert("position_buckets".into(), Json::from(if rel.buckets > 0 { rel.buckets as i64 } else { -1 }));
            map.insert("max_relative_positions".into(), Json::from(rel.max_relative));
            map.insert("share_att_key".into(), Json::from(rel.share_att_key));
            map.insert("norm_rel_ebd".into(), Json::from(if rel.normalized { "layer_norm" } else { "none" }));
        }
    }
}

/// ModernBERT's settings beyond BERT's (its config names).
#[derive(Debug, Clone, PartialEq)]
pub struct ModernBertSettings {
    /// Whether each layer's attention is global (`full_attention`) rather than a sliding window.
    pub global_layers: Vec<bool>,
    /// How far a sliding-window layer's token sees either side (`local_attention / 2`).
    pub sliding_window: usize,
    /// The rotary theta of the global layers.
    pub global_theta: f64,
    /// The rotary theta of the sliding-window layers.
    pub local_theta: f64,
    /// The head pools the real tokens' mean (`classifier_pooling` `mean`), else the first token.
    pub mean_pooling: bool,
    /// Dropout after the embeddings' norm.
    pub embedding_dropout: f64,
    /// `norm_bias`, `attention_bias`, `mlp_bias`, `classifier_bias`.
    pub norm_bias: bool,
    /// Biases on `Wqkv` and the attention's `Wo`.
    pub attention_bias: bool,
    /// Biases on `Wi` and the feed-forward's `Wo`.
    pub mlp_bias: bool,
    /// A bias on the head's dense layer.
    pub classifier_bias: bool,
}

impl ModernBertSettings {
    /// From `config.json`'s ModernBERT keys: `layer_types`, or `global_attn_every_n_layers`
    /// (every n-th layer global from the first); `rope_parameters`' thetas, or
    /// `global_rope_theta` / `local_rope_theta`.
    fn read(hf: &HfConfig, path: &Path) -> Result<Self, ModelError> {
        let layers = hf.num_hidden_layers;
        let global_layers = match &hf.layer_types {
            Some(types) => types
                .iter()
                .map(|t| match t.as_str() {
                    "full_attention" => Ok(true),
                    "sliding_attention" => Ok(false),
                    other => Err(unsupported(path, "layer_types", other, "full_attention or sliding_attention")),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let every = positive(path, "global_attn_every_n_layers", hf.global_attn_every_n_layers.unwrap_or(3))?;
                (0..layers).map(|l| l % every == 0).collect()
            }
        };
        if global_layers.len() != layers {
            let found = global_layers.len().to_string();
            return Err(unsupported(path, "layer_types", &found, &format!("one per layer, {layers}")));
        }
        let theta = |kind: &str, flat: Option<f64>, default: f64| -> Result<f64, ModelError> {
            let params = hf.rope_parameters.as_ref().and_then(|r| r.get(kind));
            if let Some(rope) = params.and_then(|p| p.get("rope_type")).and_then(Json::as_str) {
                if rope != "default" {
                    return Err(unsupported(path, "rope_type", rope, "default"));
                }
            }
            Ok(params.and_then(|p| p.get("rope_theta")).and_then(Json::as_f64).or(flat).unwrap_or(default))
        };
        for (field, value) in
            [("hidden_activation", &hf.hidden_act), ("classifier_activation", &hf.classifier_activation)]
        {
            if let Some(act) = value.as_deref().filter(|a| *a != "gelu") {
                return Err(unsupported(path, field, act, "only `gelu`, the exact erf form"));
            }
        }
        let mean_pooling = match hf.classifier_pooling.as_deref().unwrap_or("cls") {
            "cls" => false,
            "mean" => true,
            other => return Err(unsupported(path, "classifier_pooling", other, "cls or mean")),
        };
        Ok(ModernBertSettings {
            global_layers,
            sliding_window: positive(path, "local_attention", hf.local_attention.unwrap_or(128))? / 2,
            global_theta: theta("full_attention", hf.global_rope_theta, 160_000.0)?,
            local_theta: theta("sliding_attention", hf.local_rope_theta, 10_000.0)?,
            mean_pooling,
            embedding_dropout: hf.embedding_dropout.unwrap_or(0.0),
            norm_bias: hf.norm_bias.unwrap_or(false),
            attention_bias: hf.attention_bias.unwrap_or(false),
            mlp_bias: hf.mlp_bias.unwrap_or(false),
            classifier_bias: hf.classifier_bias.unwrap_or(false),
        })
    }

    /// The keys transformers' `ModernBertConfig` reads them from.
    fn write(&self, map: &mut serde_json::Map<String, Json>) {
        let types: Vec<Json> = self
            .global_layers
            .iter()
            .map(|&g| Json::from(if g { "full_attention" } else { "sliding_attention" }))
            .collect();
        map.insert("layer_types".into(), Json::from(types));
        map.insert("local_attention".into(), Json::from(self.sliding_window * 2));
        map.insert(
            "rope_parameters".into(),
            serde_json::json!({
                "full_attention": {"rope_type": "default", "rope_theta": self.global_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": self.local_theta},
            }),
        );
        map.insert("classifier_pooling".into(), Json::from(if self.mean_pooling { "mean" } else { "cls" }));
        map.insert("embedding_dropout".into(), Json::from(self.embedding_dropout));
        for (key, on) in [
            ("norm_bias", self.norm_bias),
            ("attention_bias", self.attention_bias),
            ("mlp_bias", self.mlp_bias),
            ("classifier_bias", self.classifier_bias),
        ] {
            map.insert(key.into(), Json::from(on));
        }
    }
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self, ModelError> {
        Self::from_file(&dir.join("config.json"))
    }

    /// Reads a `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.into(), source })?;
        Self::from_json(&text, path)
    }

    /// Parses config JSON (`path` is named in errors, with the line of a value of the wrong type).
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ModelError> {
        let (family, hf) = HfConfig::read(text, path)?;
        hf.check_supported(path)?;
        if hf.sinusoidal_pos_embds == Some(true) {
            return Err(unsupported(path, "sinusoidal_pos_embds", "true", "learned position embeddings (false)"));
        }
        let num_labels = hf.num_labels.or(hf.id2label.as_ref().map(|m| m.len())).unwrap_or(2);
        let problem = match hf.problem_type.as_deref() {
            Some("regression") => ProblemType::Regression,
            Some(_) => ProblemType::SingleLabel,
            None if num_labels == 1 => ProblemType::Regression,
            None => ProblemType::SingleLabel,
        };
        match problem {
            ProblemType::SingleLabel if num_labels < 2 => {
                return Err(unsupported(
                    path,
                    "num_labels",
                    &num_labels.to_string(),
                    "classification with 2 or more labels, or 1 with problem_type regression",
                ));
            }
            ProblemType::Regression if num_labels != 1 => {
                return Err(unsupported(path, "num_labels", &num_labels.to_string(), "1 for a regression"));
            }
            _ => {}
        }
        let id2label = label_names(hf.id2label.as_ref(), num_labels);
        let hidden_dropout = hf.hidden_dropout_prob.unwrap_or(0.1);
        let config = ModelConfig {
            family,
            vocab_size: positive(path, "vocab_size", hf.vocab_size)?,
            hidden_size: positive(path, "hidden_size", hf.hidden_size)?,
            embedding_size: match (family, hf.embedding_size) {
                (Family::Electra | Family::DebertaV2, Some(width)) => positive(path, "embedding_size", width)?,
                _ => hf.hidden_size,
            },
            num_layers: positive(path, "num_hidden_layers", hf.num_hidden_layers)?,
            num_heads: positive(path, "num_attention_heads", hf.num_attention_heads)?,
            intermediate_size: positive(path, "intermediate_size", hf.intermediate_size)?,
            max_position_embeddings: positive(path, "max_position_embeddings", hf.max_position_embeddings)?,
            type_vocab_size: type_vocab_size(family, &hf, path)?,
            layer_norm_eps: hf.layer_norm_eps.unwrap_or(if family == Family::ModernBert { 1e-5 } else { 1e-12 }),
            initializer_range: hf.initializer_range.unwrap_or(0.02),
            hidden_dropout,
            attention_dropout: hf.attention_probs_dropout_prob.unwrap_or(0.1),
            // DeBERTa's head reads `cls_dropout` (its config may carry a `classifier_dropout` too).
            classifier_dropout: match family {
                Family::DebertaV2 => hf.cls_dropout,
                _ => hf.classifier_dropout,
            }
            .unwrap_or(hidden_dropout),
            num_labels,
            problem,
            id2label,
            pad_token_id: hf.pad_token_id.unwrap_or(family.default_pad_id()),
            relative_attention_buckets: match family {
                Family::MPNet => {
                    positive(path, "relative_attention_num_buckets", hf.relative_attention_num_buckets.unwrap_or(32))?
                }
                _ => 0,
            },
            modernbert: match family {
                Family::ModernBert => Some(ModernBertSettings::read(&hf, path)?),
                _ => None,
            },
            deberta: match family {
                Family::DebertaV2 => Some(DebertaSettings::read(&hf, path)?),
                _ => None,
            },
        };
        config.check(path)?;
        Ok(config)
    }

    /// Refuses head counts that do not divide the hidden size and dropouts outside [0, 1).
    fn check(&self, path: &Path) -> Result<(), ModelError> {
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            return Err(unsupported(
                path,
                "num_attention_heads",
                &self.num_heads.to_string(),
                &format!("must divide hidden_size {}", self.hidden_size),
            ));
        }
        for (field, p) in [
            ("hidden_dropout_prob", self.hidden_dropout),
            ("attention_probs_dropout_prob", self.attention_dropout),
            ("classifier_dropout", self.classifier_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(unsupported(path, field, &p.to_string(), "a probability in [0, 1)"));
            }
        }
        Ok(())
    }

    /// The most tokens a sequence may have: the position table's rows, less those a family
    /// that counts positions from the padding id never reaches (RoBERTa's 514 rows take 512).
    pub fn max_tokens(&self) -> usize {
        if self.family.rules().positions_follow_padding() {
            let unused = usize::try_from(self.pad_token_id).map_or(0, |pad| pad + 1);
            self.max_position_embeddings.saturating_sub(unused)
        } else {
            self.max_position_embeddings
        }
    }

    /// Whether the graph takes token types: the family's, or a DeBERTa's with a type table.
    pub fn reads_token_types(&self) -> bool {
        self.family.has_token_types() || (self.family == Family::DebertaV2 && self.type_vocab_size > 0)
    }

    /// Size of one attention head.
    pub fn head_size(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// The same config with every dropout probability set to `p`.
    pub fn with_dropout(mut self, p: f64) -> Self {
        self.hidden_dropout = p;
        self.attention_dropout = p;
        self.classifier_dropout = p;
        if let Some(modernbert) = &mut self.modernbert {
            modernbert.embedding_dropout = p;
        }
        self
    }

    /// The same config with a head for `names` classes, or (`names` empty) one regression score.
    pub fn with_labels(mut self, problem: ProblemType, names: &[String]) -> Self {
        self.problem = problem;
        match problem {
            ProblemType::SingleLabel => {
                self.num_labels = names.len();
                self.id2label = names.to_vec();
            }
            ProblemType::Regression => {
                self.num_labels = 1;
                self.id2label = vec!["LABEL_0".into()];
            }
        }
        self
    }

    /// Whether any dropout is active.
    pub fn has_dropout(&self) -> bool {
        self.hidden_dropout > 0.0 || self.attention_dropout > 0.0 || self.classifier_dropout > 0.0
    }

    /// The config as Hugging Face `config.json` for the family's `...ForSequenceClassification`.
    pub fn to_hf_json(&self) -> Json {
        let labels: serde_json::Map<String, Json> =
            self.id2label.iter().enumerate().map(|(i, name)| (i.to_string(), Json::from(name.as_str()))).collect();
        let ids: serde_json::Map<String, Json> =
            self.id2label.iter().enumerate().map(|(i, name)| (name.clone(), Json::from(i))).collect();
        let mut json = serde_json::json!({
            "architectures": [self.family.architecture()],
            "model_type": self.family.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "gelu",
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "layer_norm_eps": self.layer_norm_eps,
            "initializer_range": self.initializer_range,
            "hidden_dropout_prob": self.hidden_dropout,
            "attention_probs_dropout_prob": self.attention_dropout,
            "classifier_dropout": self.classifier_dropout,
            "position_embedding_type": "absolute",
            "pad_token_id": self.pad_token_id,
            "num_labels": self.num_labels,
            "id2label": labels,
            "label2id": ids,
            "problem_type": self.problem.hf_name(),
        });
        if let Some(map) = json.as_object_mut() {
            self.family_keys(map);
        }
        json
    }

    /// Where a family's `config.json` names or holds what BERT's does not.
    fn family_keys(&self, map: &mut serde_json::Map<String, Json>) {
        match self.family {
            Family::Bert | Family::Roberta | Family::XlmRoberta | Family::Camembert => {}
            Family::MPNet => {
                map.insert("relative_attention_num_buckets".into(), Json::from(self.relative_attention_buckets));
                map.remove("type_vocab_size");
                map.remove("position_embedding_type");
            }
            Family::Electra => {
                map.insert("embedding_size".into(), Json::from(self.embedding_size));
            }
            Family::DebertaV2 => {
                map.insert("embedding_size".into(), Json::from(self.embedding_size));
                map.insert("pooler_hidden_size".into(), Json::from(self.hidden_size));
                map.remove("position_embedding_type");
                if let Some(p) = map.remove("classifier_dropout") {
                    map.insert("cls_dropout".into(), p);
                }
                if let Some(settings) = &self.deberta {
                    settings.write(map);
                }
            }
            Family::ModernBert => {
                self.family.write_own_names(map);
                map.insert("classifier_activation".into(), Json::from("gelu"));
                for unused in ["type_vocab_size", "position_embedding_type"] {
                    map.remove(unused);
                }
                if let Some(settings) = &self.modernbert {
                    settings.write(map);
                }
            }
            Family::DistilBert => {
                // Its LayerNorm epsilon is fixed at 1e-12.
                self.family.write_own_names(map);
                map.insert("sinusoidal_pos_embds".into(), Json::from(false));
                for unused in ["type_vocab_size", "position_embedding_type", "layer_norm_eps"] {
                    map.remove(unused);
                }
            }
        }
    }
}

/// The keys of a Hugging Face `config.json` that shape the model (others are ignored);
/// `null` reads as absent, as `transformers` treats it.
/// DistilBERT's and ModernBERT's names for BERT's keys (`dim`, `n_layers`, `norm_eps`, ...) are
/// renamed to BERT's before it is read ([`Family::config_names`]).
#[derive(Deserialize)]
struct HfConfig {
    vocab_size: usize,
    hidden_size: usize,
    embedding_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    relative_attention: Option<bool>,
    max_relative_positions: Option<i64>,
    position_buckets: Option<i64>,
    pos_att_type: Option<Json>,
    share_att_key: Option<bool>,
    norm_rel_ebd: Option<String>,
    position_biased_input: Option<bool>,
    pooler_hidden_size: Option<usize>,
    pooler_dropout: Option<f64>,
    cls_dropout: Option<f64>,
    pooler_hidden_act: Option<String>,
    conv_kernel_size: Option<usize>,
    layer_types: Option<Vec<String>>,
    global_attn_every_n_layers: Option<usize>,
    local_attention: Option<usize>,
    global_rope_theta: Option<f64>,
    local_rope_theta: Option<f64>,
    rope_parameters: Option<Json>,
    classifier_pooling: Option<String>,
    classifier_activation: Option<String>,
    embedding_dropout: Option<f64>,
    norm_bias: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    classifier_bias: Option<bool>,
    intermediate_size: usize,
    max_position_embeddings: usize,
    sinusoidal_pos_embds: Option<bool>,
    type_vocab_size: Option<usize>,
    layer_norm_eps: Option<f64>,
    initializer_range: Option<f64>,
    hidden_dropout_prob: Option<f64>,
    attention_probs_dropout_prob: Option<f64>,
    classifier_dropout: Option<f64>,
    num_labels: Option<usize>,
    id2label: Option<serde_json::Map<String, Json>>,
    pad_token_id: Option<i64>,
    relative_attention_num_buckets: Option<usize>,
    hidden_act: Option<String>,
    position_embedding_type: Option<String>,
    is_decoder: Option<bool>,
    add_cross_attention: Option<bool>,
    problem_type: Option<String>,
}

impl HfConfig {
    /// The family and its keys from config JSON, the family's own names read as BERT's.
    fn read(text: &str, path: &Path) -> Result<(Family, HfConfig), ModelError> {
        let config_error = |e: serde_json::Error| ModelError::Config { path: path.into(), reason: e.to_string() };
        let mut keys: serde_json::Map<String, Json> = serde_json::from_str(text).map_err(config_error)?;
        let model_type = match keys.get("model_type") {
            None | Some(Json::Null) => "bert",
            Some(Json::String(name)) => name.as_str(),
            Some(other) => return Err(unsupported(path, "model_type", &other.to_string(), "a family's name as text")),
        };
        let Some(family) = Family::from_model_type(model_type) else {
            let families = format!("one of the families ringtune builds: {}", Family::model_types());
            return Err(unsupported(path, "model_type", model_type, &families));
        };
        // A family's own names stand for BERT's and win where a config holds both (ModernBERT
        // checkpoints carry `layer_norm_eps` beside `norm_eps`; transformers reads only its own).
        // The text is parsed as written where nothing is renamed, so errors keep their line.
        let renamed = family.config_names().iter().fold(false, |renamed, (bert, own)| match keys.remove(*own) {
            Some(value) => {
                keys.insert((*bert).to_string(), value);
                true
            }
            None => renamed,
        });
        let hf = if renamed {
            serde_json::from_value(Json::Object(keys)).map_err(config_error)?
        } else {
            serde_json::from_str(text).map_err(config_error)?
        };
        Ok((family, hf))
    }

    /// Refuses, by name, settings of a model that is not an encoder for single-label
    /// classification with exact GELU and absolute positions.
    fn check_supported(&self, path: &Path) -> Result<(), ModelError> {
        let act = self.hidden_act.as_deref().unwrap_or("gelu");
        if act != "gelu" {
            return Err(unsupported(path, "hidden_act", act, "only `gelu`, the exact erf form"));
        }
        let position = self.position_embedding_type.as_deref().unwrap_or("absolute");
        if position != "absolute" {
            return Err(unsupported(path, "position_embedding_type", position, "only `absolute`"));
        }
        for (flag, set) in [("is_decoder", self.is_decoder), ("add_cross_attention", self.add_cross_attention)] {
            if set == Some(true) {
                return Err(unsupported(path, flag, "true", "encoders only"));
            }
        }
        match self.problem_type.as_deref() {
            None | Some("single_label_classification" | "regression") => Ok(()),
            Some(other) => Err(unsupported(path, "problem_type", other, "single_label_classification or regression")),
        }
    }
}

/// Class names in id order from `id2label` (keys are ids as text), `LABEL_<i>` for ids it
/// lacks.
fn label_names(id2label: Option<&serde_json::Map<String, Json>>, num_labels: usize) -> Vec<String> {
    (0..num_labels)
        .map(|i| {
            id2label
                .and_then(|m| m.get(&i.to_string()))
                .and_then(Json::as_str)
                .map_or_else(|| format!("LABEL_{i}"), str::to_string)
        })
        .collect()
}

/// Token-type rows: BERT's and ELECTRA's 2 unless said, RoBERTa's 1, DeBERTa's 0 (v3 has none),
/// none for the families that read no types.
fn type_vocab_size(family: Family, hf: &HfConfig, path: &Path) -> Result<usize, ModelError> {
    Ok(match family {
        Family::Bert | Family::Electra => positive(path, "type_vocab_size", hf.type_vocab_size.unwrap_or(2))?,
        Family::Roberta | Family::XlmRoberta | Family::Camembert => {
            positive(path, "type_vocab_size", hf.type_vocab_size.unwrap_or(1))?
        }
        Family::MPNet | Family::DistilBert | Family::ModernBert => 0,
        Family::DebertaV2 => hf.type_vocab_size.unwrap_or(0),
    })
}

fn unsupported(path: &Path, field: &str, value: &str, hint: &str) -> ModelError {
    ModelError::Unsupported { path: path.into(), field: field.into(), value: value.into(), hint: hint.into() }
}

fn positive(path: &Path, field: &str, value: usize) -> Result<usize, ModelError> {
    if value == 0 {
        return Err(ModelError::Config { path: path.into(), reason: format!("`{field}` must be a positive integer") });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINI: &str = r#"{"model_type": "bert", "vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 64, "hidden_act": "gelu"}"#;

    fn parse(text: &str) -> Result<ModelConfig, ModelError> {
        ModelConfig::from_json(text, Path::new("config.json"))
    }

    #[test]
    fn reads_defaults() {
        let c = parse(MINI).expect("valid");
        assert_eq!((c.num_labels, c.type_vocab_size, c.head_size()), (2, 2, 8));
        assert_eq!(c.layer_norm_eps, 1e-12);
        assert_eq!(c.classifier_dropout, 0.1);
        let json = c.to_hf_json();
        assert_eq!(json["num_hidden_layers"], 2);
        let mpnet = parse(&MINI.replace("\"bert\"", "\"mpnet\"")).expect("mpnet");
        assert_eq!(
            (mpnet.family, mpnet.type_vocab_size, mpnet.pad_token_id, mpnet.relative_attention_buckets),
            (Family::MPNet, 0, 1, 32)
        );
        assert_eq!(mpnet.to_hf_json()["architectures"][0], "MPNetForSequenceClassification");
    }

    #[test]
    fn labels_and_regression_round_trip_through_hugging_face_json() {
        let named = MINI.replace("}", r#", "id2label": {"0": "neg", "2": "pos", "1": "mid"}}"#);
        let c = parse(&named).expect("named labels");
        assert_eq!(
            (c.num_labels, c.problem, c.id2label.clone()),
            (3, ProblemType::SingleLabel, vec!["neg".into(), "mid".into(), "pos".into()])
        );
        let json = c.to_hf_json();
        assert_eq!((json["id2label"]["2"].as_str(), json["label2id"]["mid"].as_u64()), (Some("pos"), Some(1)));
        let again = parse(&json.to_string()).expect("written config reads back");
        assert_eq!(again, c);
        let one = parse(&MINI.replace("}", r#", "num_labels": 1}"#)).expect("one output");
        assert_eq!((one.problem, one.num_labels), (ProblemType::Regression, 1));
        let scores = c.clone().with_labels(ProblemType::Regression, &[]);
        assert_eq!(scores.to_hf_json()["problem_type"], "regression");
        assert_eq!(parse(&scores.to_hf_json().to_string()).expect("regression reads back"), scores);
    }

    #[test]
    fn every_family_reads_back_the_config_it_writes() {
        for family in Family::ALL {
            let text = MINI.replace("\"bert\"", &format!("\"{}\"", family.model_type()));
            let c = parse(&text).unwrap_or_else(|e| panic!("{family:?}: {e}"));
            assert_eq!((c.family, c.embedding_size), (family, 32), "{family:?}");
            let json = c.to_hf_json();
            assert_eq!(json["architectures"][0], family.architecture());
            assert_eq!(json["model_type"], family.model_type());
            assert_eq!(parse(&json.to_string()).expect("written config reads back"), c, "{family:?}");
        }
        let distil = parse(&MINI.replace("\"bert\"", "\"distilbert\"")).expect("distilbert").to_hf_json();
        assert_eq!((distil["dim"].as_u64(), distil["n_layers"].as_u64()), (Some(32), Some(2)), "its own names");
        assert!(distil.get("hidden_size").is_none());
        let electra = MINI.replace("\"bert\"", "\"electra\"").replace("}", r#", "embedding_size": 16}"#);
        let electra = parse(&electra).expect("electra");
        assert_eq!((electra.embedding_size, electra.to_hf_json()["embedding_size"].as_u64()), (16, Some(16)));
        let roberta = parse(&MINI.replace("\"bert\"", "\"xlm-roberta\"")).expect("xlm-roberta");
        assert_eq!((roberta.pad_token_id, roberta.type_vocab_size), (1, 1), "RoBERTa's defaults");
        assert_eq!((roberta.max_tokens(), parse(MINI).expect("bert").max_tokens()), (62, 64), "positions from 2");
    }

    #[test]
    fn modernbert_reads_its_layers_windows_and_thetas() {
        let modern = |extra: &str| parse(&MINI.replace("\"bert\"", "\"modernbert\"").replace("}", extra));
        let four =
            MINI.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 4").replace("\"bert\"", "\"modernbert\"");
        let flat = parse(&four.replace(
            "}",
            r#", "global_attn_every_n_layers": 3, "local_attention": 6, "global_rope_theta": 8e4,
               "classifier_pooling": "mean", "mlp_bias": true}"#,
        ));
        let m = flat.expect("modernbert").modernbert.expect("its settings");
        assert_eq!(m.global_layers, [true, false, false, true]);
        assert_eq!((m.sliding_window, m.global_theta, m.local_theta), (3, 8e4, 1e4));
        assert!(m.mean_pooling && m.mlp_bias && !m.norm_bias);
        let typed = modern(
            r#", "layer_types": ["sliding_attention", "full_attention"],
               "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5.0}}}"#,
        );
        let m = typed.expect("layer types").modernbert.expect("its settings");
        assert_eq!((m.global_layers, m.global_theta), (vec![false, true], 5.0));
        let yarn = modern(r#", "rope_parameters": {"sliding_attention": {"rope_type": "yarn"}}}"#);
        assert!(yarn.expect_err("yarn").to_string().contains("rope_type"));
        let pooling = modern(r#", "classifier_pooling": "max"}"#).expect_err("max").to_string();
        assert!(pooling.contains("classifier_pooling") && pooling.contains("cls or mean"), "{pooling}");
        let short = modern(r#", "layer_types": ["full_attention"]}"#).expect_err("one of two").to_string();
        assert!(short.contains("one per layer, 2"), "{short}");
    }

    #[test]
    fn a_familys_own_name_wins_over_berts_where_a_config_holds_both() {
        let modern = MINI.replace("\"bert\"", "\"modernbert\"");
        let both = parse(&modern.replace("}", r#", "layer_norm_eps": 1e-12, "norm_eps": 1e-6}"#)).expect("both");
        assert_eq!(both.layer_norm_eps, 1e-6, "ModernBERT reads norm_eps");
        let distil = MINI.replace("\"bert\"", "\"distilbert\"").replace("}", r#", "dim": 48, "n_heads": 6}"#);
        let c = parse(&distil).expect("dim beside hidden_size");
        assert_eq!((c.hidden_size, c.num_heads), (48, 6));
        let wrong = parse(&distil.replace("\"dim\": 48", "\"dim\": \"wide\"")).expect_err("text width").to_string();
        assert!(wrong.contains("config.json") && wrong.contains("wide"), "{wrong}");
        let bert = parse(&MINI.replace("}", r#", "norm_eps": 1e-6}"#)).expect("another family's name is ignored");
        assert_eq!(bert.layer_norm_eps, 1e-12);
        let numbered = parse(&MINI.replace("\"bert\"", "7")).expect_err("model_type a number").to_string();
        assert!(numbered.contains("model_type"), "{numbered}");
    }

    #[test]
    fn deberta_reads_its_relative_attention() {
        let deberta = |extra: &str| parse(&MINI.replace("\"bert\"", "\"deberta-v2\"").replace("}", extra));
        let v3 = deberta(
            r#", "relative_attention": true, "position_buckets": 256, "max_relative_positions": -1,
               "pos_att_type": "p2c|c2p", "share_att_key": true, "norm_rel_ebd": "layer_norm",
               "position_biased_input": false, "type_vocab_size": 0}"#,
        )
        .expect("v3");
        let d = v3.deberta.clone().expect("its settings");
        let rel = d.relative.expect("relative attention");
        assert_eq!((rel.buckets, rel.max_relative, rel.span), (256, 64, 256), "max_position_embeddings when -1");
        assert!(rel.c2p && rel.p2c && rel.share_att_key && rel.normalized && !d.position_biased_input);
        assert!(!v3.reads_token_types(), "no type table");
        let listed = deberta(r#", "relative_attention": true, "pos_att_type": ["c2p"], "type_vocab_size": 2}"#)
            .expect("a list of kinds");
        let rel = listed.deberta.as_ref().and_then(|d| d.relative.clone()).expect("relative");
        assert!(rel.c2p && !rel.p2c && rel.span == 64 && listed.reads_token_types());
        let conv = deberta(r#", "conv_kernel_size": 3}"#).expect_err("conv").to_string();
        assert!(conv.contains("conv_kernel_size"), "{conv}");
        let kind = deberta(r#", "relative_attention": true, "pos_att_type": "p2p"}"#).expect_err("p2p").to_string();
        assert!(kind.contains("pos_att_type") && kind.contains("p2p"), "{kind}");
        let cls = deberta(r#", "classifier_dropout": 0.3, "cls_dropout": 0.2}"#).expect("both keys");
        assert_eq!(cls.classifier_dropout, 0.2, "its head reads cls_dropout");
    }

    #[test]
    fn refuses_unsupported_values_by_name() {
        let err = parse(&MINI.replace("\"bert\"", "\"albert\"")).expect_err("albert").to_string();
        assert!(err.contains("model_type") && err.contains("albert"), "{err}");
        assert!(
            err.contains("bert, mpnet, roberta, xlm-roberta, camembert, distilbert, electra, modernbert, deberta-v2"),
            "{err}"
        );
        let sinusoidal = MINI.replace("\"bert\"", "\"distilbert\"").replace("}", r#", "sinusoidal_pos_embds": true}"#);
        assert!(parse(&sinusoidal).expect_err("sinusoidal").to_string().contains("sinusoidal_pos_embds"));
        let err = parse(&MINI.replace("\"gelu\"", "\"relu\"")).expect_err("relu").to_string();
        assert!(err.contains("hidden_act") && err.contains("relu"), "{err}");
        let err = parse(&MINI.replace("\"bert\"", "\"gpt2\"")).expect_err("gpt2").to_string();
        assert!(err.contains("model_type"), "{err}");
        let err = parse(&MINI.replace("\"num_attention_heads\": 4", "\"num_attention_heads\": 5"))
            .expect_err("heads")
            .to_string();
        assert!(err.contains("num_attention_heads"), "{err}");
        let err = parse(&MINI.replace("\"vocab_size\": 100,", "")).expect_err("missing").to_string();
        assert!(err.contains("vocab_size"), "{err}");
        let err = parse(&MINI.replace("\"vocab_size\": 100", "\"vocab_size\": 0")).expect_err("zero").to_string();
        assert!(err.contains("`vocab_size` must be a positive integer"), "{err}");
        let err =
            parse(&MINI.replace("\"hidden_size\": 32", "\"hidden_size\": \"wide\"")).expect_err("type").to_string();
        assert!(err.contains("config.json") && err.contains("line 1"), "{err}");
        let null_dropout = MINI.replace("}", r#", "classifier_dropout": null, "hidden_dropout_prob": 0.2}"#);
        assert_eq!(parse(&null_dropout).expect("null means absent").classifier_dropout, 0.2);
        let multi = MINI.replace("}", r#", "problem_type": "multi_label_classification"}"#);
        assert!(parse(&multi).expect_err("multi-label").to_string().contains("problem_type"));
        let wide_regression = MINI.replace("}", r#", "problem_type": "regression", "num_labels": 3}"#);
        assert!(parse(&wide_regression).expect_err("3 scores").to_string().contains("1 for a regression"));
        let rel = MINI.replace("}", r#", "position_embedding_type": "relative_key"}"#);
        assert!(parse(&rel).expect_err("relative").to_string().contains("position_embedding_type"));
    }
}
