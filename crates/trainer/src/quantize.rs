//! `ringtune quantize`: a trained model's int8 inference model, `model.int8.onnx` beside its
//! `model.onnx`, built from the run's own weights (see [`ringtune_encoders::export_inference_int8`]).

use std::path::{Path, PathBuf};

use ringtune_data::{Batch, Example, Padding, PairTokenizer};
pub use ringtune_encoders::WeightRange;
use ringtune_encoders::{
    calibration_graph, export_inference_int8, load_params, CalibrationGraph, InputMaxima, Int8Report, ModelConfig,
    ParamLayout,
};
use ringtune_runtime::{CpuFeatures, FlatBuffer, Runtime, SessionOptions};
use serde::{Deserialize, Serialize};

use crate::engine::Evaluator;
use crate::evaluation::{label_set, TaskFile};
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

/// How the feed-forward block's first layer has its input quantized (see
/// [`ringtune_encoders::FeedForwardInput`]); the second layer has its input per token always.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FeedForwardInput {
    /// Smoothed per channel by the largest inputs of calibration rows, then per batch.
    Smoothed,
    /// Per token: no calibration, 1-4% slower at batch 32 (MPNet, MiniLM; AVX2).
    PerToken,
    /// Per batch, unsmoothed: the fastest, the most lost.
    PerBatch,
}

/// Calibration rows read unless the caller says otherwise: on MPNet (MRPC, 8-bit weights) 256
/// rows spread over the training file changed 5 dev predictions of 408 against per token's 1,
/// 1024 rows 1 and all 3668 rows 6 (docs/benchmarks.md): more rows bought nothing.
pub const CALIBRATION_ROWS: usize = 256;

/// Rows a calibration batch holds.
const CALIBRATION_BATCH: usize = 32;

/// How to quantize.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeOptions {
    /// Weights (linear layers, embedding tables) whose name contains any of these stay in float.
    pub keep_float: Vec<String>,
    /// The weights' range; `None`: by this CPU (full with VNNI, reduced without).
    pub range: Option<WeightRange>,
    /// How the feed-forward block's first layer has its input quantized.
    pub feed_forward: FeedForwardInput,
    /// How many of the calibration rows given to [`TrainedModel::quantize`] to read (spread
    /// evenly over them) when smoothing.
    pub calibration_rows: usize,
}

impl Default for QuantizeOptions {
    fn default() -> Self {
        QuantizeOptions {
            keep_float: KEEP_FLOAT.iter().map(|s| s.to_string()).collect(),
            range: None,
            feed_forward: FeedForwardInput::Smoothed,
            calibration_rows: CALIBRATION_ROWS,
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

/// What [`TrainedModel::quantize`] wrote.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quantized {
    /// The int8 model.
    pub path: PathBuf,
    /// Its size in bytes.
    pub bytes: u64,
    /// How the weights were rounded and stored.
    pub weights: WeightRange,
    /// The linear layers quantized (their weights' names).
    pub linear: Vec<String>,
    /// Those of them whose input is quantized per token.
    pub per_row: Vec<String>,
    /// Those of them whose input is smoothed per channel (see [`FeedForwardInput::Smoothed`]).
    pub smoothed: Vec<String>,
    /// The rows their smoothing was calibrated on.
    pub calibration_rows: usize,
    /// The embedding tables quantized.
    pub tables: Vec<String>,
    /// The weights kept in float.
    pub kept_float: Vec<String>,
}

/// A run's fine-tuned model, its weights loaded, to quantize.
pub struct TrainedModel {
    dir: PathBuf,
    model: ModelDir,
    params: FlatBuffer,
}

impl TrainedModel {
    /// The trained weights in `dir` (a run's output folder), or why they cannot be quantized.
    pub fn open(dir: &Path) -> Result<Self, TrainError> {
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
                reason: format!(
                    "no trained weights ({} is missing): quantize a run's output folder",
                    missing.display()
                ),
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
        Ok(TrainedModel { dir: dir.to_path_buf(), model, params })
    }

    /// `rows` rows spread over `file` (read as the run was trained to read its task's files,
    /// labels unread), tokenized to `max_len` tokens, to calibrate [`TrainedModel::quantize`]'s
    /// smoothing with. Only those rows are tokenized: a training file can hold 400,000.
    pub fn read_calibration(&self, file: &Path, max_len: usize, rows: usize) -> Result<Vec<Example>, TrainError> {
        self.model.check_max_len(max_len)?;
        let tokenizer = PairTokenizer::from_model_dir(&self.dir, max_len)?;
        let mut text = TaskFile::read(&self.dir)?.read_unlabelled(file, "calibrated on")?;
        let total = text.rows.len();
        let picked = spread(total, rows);
        text.rows = picked.iter().map(|&i| text.rows[i].clone()).collect();
        tracing::info!("calibrating the smoothing on {} of the {total} rows of {}", picked.len(), file.display());
        let (examples, _) = ringtune_data::examples(&text, &label_set(&self.model.config), &tokenizer)?;
        Ok(examples)
    }

    /// Writes `model.int8.onnx` into the run's folder; smoothing (the default) calibrates on
    /// `calibration` (tokenized rows of the task, see [`read_calibration`]).
    pub fn quantize(&self, options: &QuantizeOptions, calibration: &[Example]) -> Result<Quantized, TrainError> {
        let range = options.weight_range();
        let maxima;
        let (feed_forward, calibration_rows) = match options.feed_forward {
            FeedForwardInput::Smoothed => {
                let rows = spread(calibration.len(), options.calibration_rows);
                if rows.is_empty() {
                    return Err(TrainError::Unusable {
                        path: self.dir.clone(),
                        reason: "no rows to calibrate the smoothing with: give some of the task's rows, or quantize the feed-forward input per token".into(),
                    });
                }
                let _span = tracing::debug_span!("calibrate", rows = rows.len()).entered();
                let pad = self.model.config.pad_token_id;
                let batches =
                    rows.chunks(CALIBRATION_BATCH).map(|chunk| Batch::new(calibration, chunk, Padding::Dynamic, pad));
                maxima = input_maxima(&self.model.config, &self.model.layout, &self.params, batches)?;
                (ringtune_encoders::FeedForwardInput::Smoothed(&maxima), rows.len())
            }
            FeedForwardInput::PerToken => (ringtune_encoders::FeedForwardInput::PerToken, 0),
            FeedForwardInput::PerBatch => (ringtune_encoders::FeedForwardInput::PerBatch, 0),
        };
        let (config, layout) = (&self.model.config, &self.model.layout);
        let (bytes, Int8Report { linear, per_row, smoothed, tables, kept_float }) = export_inference_int8(
            config,
            layout,
            &self.params,
            range,
            feed_forward,
            &|w| options.keeps_float(w),
            ringtune_encoders::Padding::Skipped,
        )?;
        let path = self.dir.join(INT8_MODEL);
        ringtune_files::write_atomically(&path, &bytes)?;
        Ok(Quantized {
            path,
            bytes: bytes.len() as u64,
            weights: range,
            linear,
            per_row,
            smoothed,
            calibration_rows,
            tables,
            kept_float,
        })
    }
}

/// `wanted` indices of `0..len` spread evenly (all of them when there are fewer).
fn spread(len: usize, wanted: usize) -> Vec<usize> {
    let n = wanted.min(len);
    (0..n).map(|i| i * len / n).collect()
}

/// The largest magnitude each input channel of the layers smoothing needs (see
/// [`ringtune_encoders::FeedForwardInput::Smoothed`]) takes over the real (unpadded) tokens of
/// `batches`, run through the float model of `params`.
pub fn input_maxima(
    config: &ModelConfig,
    layout: &ParamLayout,
    params: &[f32],
    batches: impl IntoIterator<Item = Batch>,
) -> Result<InputMaxima, TrainError> {
    let CalibrationGraph { model, layers } = calibration_graph(config, layout, params)?;
    let mut evaluator = Evaluator::embedded(Runtime::get()?, &model, &SessionOptions::default())?;
    let names: Vec<&str> = layers.iter().map(|(_, output)| output.as_str()).collect();
    let mut maxima: Vec<Vec<f32>> = vec![Vec::new(); layers.len()];
    // Each layer's input width: its weight is `[out, in]`.
    let widths = layers
        .iter()
        .map(|(weight, _)| layout.get(weight).and_then(|e| e.shape.last().copied()).filter(|&w| w > 0))
        .collect::<Vec<_>>();
    for batch in batches {
        let outputs = evaluator.embedded_outputs(&batch, &names)?;
        for ((largest, values), width) in maxima.iter_mut().zip(outputs).zip(&widths) {
            let tokens = batch.attention_mask.len();
            let width = width.ok_or_else(|| TrainError::Other("calibration: a layer of no known width".into()))?;
            // `[tokens, width]`, one row a position of the batch (a feed-forward block's), or
            // `[rows, width]`, one a sequence (a head's, on the first tokens: all real).
            let real: Vec<bool> = if values.len() == tokens * width {
                batch.attention_mask.iter().map(|&m| m != 0).collect()
            } else if values.len() == batch.rows * width {
                vec![true; batch.rows]
            } else {
                let found = values.len();
                return Err(TrainError::Other(format!(
                    "calibration: {found} values of width {width} for {tokens} tokens"
                )));
            };
            largest.resize(width, 0.0);
            for (row, _) in values.chunks_exact(width).zip(&real).filter(|(_, &real)| real) {
                largest.iter_mut().zip(row).for_each(|(m, v)| *m = m.max(v.abs()));
            }
        }
    }
    Ok(layers.into_iter().map(|(weight, _)| weight).zip(maxima).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calibration_rows_spread_over_the_file() {
        assert_eq!(spread(10, 4), [0, 2, 5, 7]);
        assert_eq!(spread(3, 256), [0, 1, 2]);
        assert!(spread(0, 256).is_empty() && spread(5, 0).is_empty());
    }
}
