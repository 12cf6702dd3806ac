//! Model configuration read from a Hugging Face `config.json`.

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::ModelError;

/// The model family, read from `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT (`BertForSequenceClassification`).
    Bert,
    /// MPNet (`MPNetForSequenceClassification`): relative attention bias, no token types.
    MPNet,
}

impl Family {
    /// The prefix of the encoder's parameter names (`bert.`, `mpnet.`).
    pub fn prefix(self) -> &'static str {
        match self {
            Family::Bert => "bert.",
            Family::MPNet => "mpnet.",
        }
    }

    /// The `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Bert => "bert",
            Family::MPNet => "mpnet",
        }
    }

    /// Whether the family reads token types (segment ids).
    pub fn has_token_types(self) -> bool {
        self == Family::Bert
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
    /// Output classes.
    pub num_labels: usize,
    /// Padding token id.
    pub pad_token_id: i64,
    /// Rows of MPNet's relative attention bias table (0 for BERT).
    pub relative_attention_buckets: usize,
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

    /// Parses config JSON (`path` is named in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<Self, ModelError> {
        let json: Json =
            serde_json::from_str(text).map_err(|e| ModelError::Config { path: path.into(), reason: e.to_string() })?;
        let r = Reader { json: &json, path: path.to_path_buf() };
        let family = match r.str_or("model_type", "bert")?.as_str() {
            "bert" => Family::Bert,
            "mpnet" => Family::MPNet,
            other => return Err(r.unsupported("model_type", other, "bert or mpnet")),
        };
        let act = r.str_or("hidden_act", "gelu")?;
        if act != "gelu" {
            return Err(r.unsupported("hidden_act", &act, "only `gelu`, the exact erf form"));
        }
        let position = r.str_or("position_embedding_type", "absolute")?;
        if position != "absolute" {
            return Err(r.unsupported("position_embedding_type", &position, "only `absolute`"));
        }
        for flag in ["is_decoder", "add_cross_attention"] {
            if json.get(flag).and_then(Json::as_bool) == Some(true) {
                return Err(r.unsupported(flag, "true", "encoders only"));
            }
        }
        if let Some(problem) = json.get("problem_type").and_then(Json::as_str) {
            if problem != "single_label_classification" {
                return Err(r.unsupported("problem_type", problem, "only single_label_classification"));
            }
        }
        let num_labels = match json.get("num_labels").and_then(Json::as_u64) {
            Some(n) => n as usize,
            None => json.get("id2label").and_then(Json::as_object).map_or(2, |m| m.len()),
        };
        if num_labels < 2 {
            return Err(r.unsupported("num_labels", &num_labels.to_string(), "classification with 2 or more labels"));
        }
        let hidden_dropout = r.float_or("hidden_dropout_prob", 0.1)?;
        let config = ModelConfig {
            family,
            vocab_size: r.usize("vocab_size")?,
            hidden_size: r.usize("hidden_size")?,
            num_layers: r.usize("num_hidden_layers")?,
            num_heads: r.usize("num_attention_heads")?,
            intermediate_size: r.usize("intermediate_size")?,
            max_position_embeddings: r.usize("max_position_embeddings")?,
            type_vocab_size: match family {
                Family::Bert => r.usize_or("type_vocab_size", 2)?,
                Family::MPNet => 0,
            },
            layer_norm_eps: r.float_or("layer_norm_eps", 1e-12)?,
            initializer_range: r.float_or("initializer_range", 0.02)?,
            hidden_dropout,
            attention_dropout: r.float_or("attention_probs_dropout_prob", 0.1)?,
            classifier_dropout: match json.get("classifier_dropout") {
                None | Some(Json::Null) => hidden_dropout,
                Some(_) => r.float_or("classifier_dropout", hidden_dropout)?,
            },
            num_labels,
            pad_token_id: json.get("pad_token_id").and_then(Json::as_i64).unwrap_or(match family {
                Family::Bert => 0,
                Family::MPNet => 1,
            }),
            relative_attention_buckets: match family {
                Family::Bert => 0,
                Family::MPNet => r.usize_or("relative_attention_num_buckets", 32)?,
            },
        };
        if !config.hidden_size.is_multiple_of(config.num_heads) {
            return Err(r.unsupported(
                "num_attention_heads",
                &config.num_heads.to_string(),
                &format!("must divide hidden_size {}", config.hidden_size),
            ));
        }
        for (field, p) in [
            ("hidden_dropout_prob", config.hidden_dropout),
            ("attention_probs_dropout_prob", config.attention_dropout),
            ("classifier_dropout", config.classifier_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(r.unsupported(field, &p.to_string(), "a probability in [0, 1)"));
            }
        }
        Ok(config)
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
        self
    }

    /// Whether any dropout is active.
    pub fn has_dropout(&self) -> bool {
        self.hidden_dropout > 0.0 || self.attention_dropout > 0.0 || self.classifier_dropout > 0.0
    }

    /// The config as Hugging Face `config.json` for `BertForSequenceClassification` or
    /// `MPNetForSequenceClassification`.
    pub fn to_hf_json(&self) -> Json {
        let labels: serde_json::Map<String, Json> =
            (0..self.num_labels).map(|i| (i.to_string(), Json::from(format!("LABEL_{i}")))).collect();
        let architecture = match self.family {
            Family::Bert => "BertForSequenceClassification",
            Family::MPNet => "MPNetForSequenceClassification",
        };
        let mut json = serde_json::json!({
            "architectures": [architecture],
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
            "problem_type": "single_label_classification",
        });
        if self.family == Family::MPNet {
            json["relative_attention_num_buckets"] = Json::from(self.relative_attention_buckets);
            if let Some(map) = json.as_object_mut() {
                map.remove("type_vocab_size");
                map.remove("position_embedding_type");
            }
        }
        json
    }
}

struct Reader<'a> {
    json: &'a Json,
    path: PathBuf,
}

impl Reader<'_> {
    fn missing(&self, field: &str, what: &str) -> ModelError {
        ModelError::Config { path: self.path.clone(), reason: format!("`{field}` must be {what}") }
    }

    fn unsupported(&self, field: &str, value: &str, hint: &str) -> ModelError {
        ModelError::Unsupported { path: self.path.clone(), field: field.into(), value: value.into(), hint: hint.into() }
    }

    fn usize(&self, field: &str) -> Result<usize, ModelError> {
        match self.json.get(field).and_then(Json::as_u64) {
            Some(n) if n > 0 => Ok(n as usize),
            _ => Err(self.missing(field, "a positive integer")),
        }
    }

    fn usize_or(&self, field: &str, default: usize) -> Result<usize, ModelError> {
        match self.json.get(field) {
            None | Some(Json::Null) => Ok(default),
            Some(_) => self.usize(field),
        }
    }

    fn float_or(&self, field: &str, default: f64) -> Result<f64, ModelError> {
        match self.json.get(field) {
            None | Some(Json::Null) => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.missing(field, "a number")),
        }
    }

    fn str_or(&self, field: &str, default: &str) -> Result<String, ModelError> {
        match self.json.get(field) {
            None | Some(Json::Null) => Ok(default.to_string()),
            Some(v) => v.as_str().map(str::to_string).ok_or_else(|| self.missing(field, "a string")),
        }
    }
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
    fn refuses_unsupported_values_by_name() {
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
        let rel = MINI.replace("}", r#", "position_embedding_type": "relative_key"}"#);
        assert!(parse(&rel).expect_err("relative").to_string().contains("position_embedding_type"));
    }
}
