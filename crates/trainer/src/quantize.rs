//! `ringtune quantize`: a trained model's int8 inference model, `model.int8.onnx` beside its
//! `model.onnx`, built from the run's own weights (see [`ringtune_bert::export_inference_int8`]).

use std::path::{Path, PathBuf};

use ringtune_bert::{export_inference_int8, load_params, Int8Report};
pub use ringtune_bert::{PerToken, WeightRange};
use ringtune_runtime::{CpuFeatures, FlatBuffer, Runtime, SessionOptions};
use serde::{Deserialize, Serialize};

use crate::engine::Evaluator;
use crate::model::ModelDir;
use crate::TrainError;

/// The int8 model's file name in a run's folder.
pub const INT8_MODEL: &str = "model.int8.onnx";

/// The weights that stay in float unless the caller says otherwise (their names contain one
/// of these): the pooler and the classifier, a few thousand multiply-adds a row whose
/// rounding would fall straight on the logits.
pub const KEEP_FLOAT: &[&str] = &["pooler", "classifier"];

/// What a run makes of its trained model at the end (`--quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Quantization {
    /// `model.int8.onnx`, scored on the run's evaluation sets beside the float model.
    Int8,
}

/// How to quantize.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeOptions {
    /// Weights (linear layers, embedding tables) whose name contains any of these stay in float.
    pub keep_float: Vec<String>,
    /// The weights' range; `None`: by this CPU (full with VNNI, reduced without).
    pub range: Option<WeightRange>,
    /// The layers whose input is quantized per token.
    pub per_token: PerToken,
}

impl Default for QuantizeOptions {
    fn default() -> Self {
        QuantizeOptions {
            keep_float: KEEP_FLOAT.iter().map(|s| s.to_string()).collect(),
            range: None,
            per_token: PerToken::FeedForward,
        }
    }
}

impl QuantizeOptions {
    /// The weights' range: the one asked for, else by this CPU.
    pub fn weight_range(&self) -> WeightRange {
        self.range.unwrap_or_else(|| {
            if CpuFeatures::detect().avx512_vnni {
                WeightRange::Full
            } else {
                WeightRange::Reduced
            }
        })
    }

    /// Whether the weight named `weight` stays in float.
    pub fn keeps_float(&self, weight: &str) -> bool {
        self.keep_float.iter().any(|k| weight.contains(k.as_str()))
    }
}

/// What [`quantize`] wrote.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Quantized {
    /// The int8 model.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// How the weights were rounded and stored.
    pub weights: WeightRange,
    /// The linear layers quantized (their weights' names).
    pub linear: Vec<String>,
    /// Those of them whose input is quantized per token (see [`PerToken`]).
    pub per_row: Vec<String>,
    /// The embedding tables quantized.
    pub tables: Vec<String>,
    /// The weights kept in float.
    pub kept_float: Vec<String>,
}

/// Writes `dir/model.int8.onnx` from the trained weights in `dir` (a run's output folder).
pub fn quantize(dir: &Path, options: &QuantizeOptions) -> Result<Quantized, TrainError> {
    if dir.is_file() {
        return Err(TrainError::Unusable {
            path: dir.to_path_buf(),
            reason: "no run folder: it is a file (an exported model is quantized from the run folder that holds its weights)"
                .into(),
        });
    }
    let model = ModelDir::open(dir)?;
    let weights = model.weight_files(&[]);
    if let Some(missing) = weights.iter().find(|f| !f.is_file()) {
        return Err(TrainError::Unusable {
            path: dir.to_path_buf(),
            reason: format!("no trained weights ({} is missing): quantize a run's output folder", missing.display()),
        });
    }
    let mut params = FlatBuffer::zeros(model.layout.total_len());
    let report = load_params(&weights, &model.config, &model.layout, 0, &mut params)?;
    if !report.initialized.is_empty() {
        return Err(TrainError::Unusable {
            path: weights[0].clone(),
            reason: format!("no trained head ({}): quantize a fine-tuned model", report.initialized.join(", ")),
        });
    }
    let range = options.weight_range();
    let (bytes, Int8Report { linear, per_row, tables, kept_float }) =
        export_inference_int8(&model.config, &model.layout, &params, range, options.per_token, &|w| {
            options.keeps_float(w)
        })?;
    let path = dir.join(INT8_MODEL);
    ringtune_files::write_atomically(&path, &bytes)?;
    Ok(Quantized { path, bytes: bytes.len() as u64, weights: range, linear, per_row, tables, kept_float })
}

/// An evaluator of the int8 model in `dir` (a run's folder), or why there is none to use.
pub fn open_int8(dir: &Path, options: &SessionOptions) -> Result<Evaluator, TrainError> {
    let path = dir.join(INT8_MODEL);
    let bytes = std::fs::read(&path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => TrainError::Unusable {
            path: dir.to_path_buf(),
            reason: format!("no {INT8_MODEL}: make it with `ringtune quantize --model {}`", dir.display()),
        },
        _ => TrainError::Io { path: path.clone(), source },
    })?;
    Evaluator::embedded(Runtime::get()?, &bytes, options)
        .map_err(|e| TrainError::Unusable { path, reason: format!("no model ONNX Runtime can load ({e})") })
}
