//! `ringtune eval` and `ringtune predict`: a trained model on dev or test.

use std::fmt::Write as _;
use std::path::Path;

use ringtune_bert::load_params;
use ringtune_mrpc::{load_split, PairTokenizer, ReadOptions};
use ringtune_ops::Kernels;
use ringtune_runtime::{FlatBuffer, Runtime, SessionOptions};

use crate::engine::Evaluator;
use crate::metrics::{predictions, Scores};
use crate::model::ModelDir;
use crate::train::{evaluate, predict_logits};
use crate::TrainError;

/// A trained model ready to score pairs.
pub struct Predictor {
    model: ModelDir,
    params: FlatBuffer,
    tokenizer: PairTokenizer,
    evaluator: Evaluator,
}

impl Predictor {
    /// Loads a model folder (a training run's output, or any Hugging Face BERT folder).
    pub fn open(dir: &Path, max_len: usize, options: &SessionOptions) -> Result<Self, TrainError> {
        let model = ModelDir::open(dir)?;
        model.check_max_len(max_len)?;
        let mut params = FlatBuffer::zeros(model.layout.total_len());
        let report = load_params(&model.weight_files(&[]), &model.config, &model.layout, 0, &mut params)?;
        if !report.initialized.is_empty() {
            tracing::warn!(
                "{} has no trained head ({}): predictions are from a random one",
                dir.display(),
                report.initialized.join(", ")
            );
        }
        let tokenizer = PairTokenizer::from_model_dir(dir, max_len)?;
        let evaluator = Evaluator::new(Runtime::get()?, &model.config, &model.layout, Kernels::Mlas, options)?;
        Ok(Predictor { model, params, tokenizer, evaluator })
    }

    /// Loss, accuracy and F1 on a labelled TSV file.
    pub fn evaluate(&mut self, tsv: &Path, batch: usize) -> Result<Scores, TrainError> {
        let (examples, _) = load_split(tsv, &self.tokenizer, ReadOptions::default())?;
        if examples.is_empty() {
            return Err(TrainError::Other(format!("{} has no rows to evaluate", tsv.display())));
        }
        if examples.iter().any(|e| e.label.is_none()) {
            return Err(TrainError::Other(format!("{} has no labels to evaluate against", tsv.display())));
        }
        let c = &self.model.config;
        evaluate(&mut self.evaluator, &self.params, &examples, batch, c.pad_token_id, c.num_labels)
    }

    /// GLUE-format predictions (`index<TAB>prediction`) for a TSV file, written to `out`.
    pub fn predict(&mut self, tsv: &Path, batch: usize, out: &Path) -> Result<usize, TrainError> {
        let (examples, data) = load_split(tsv, &self.tokenizer, ReadOptions::default())?;
        let c = &self.model.config;
        let (logits, _) = predict_logits(&mut self.evaluator, &self.params, &examples, batch, c.pad_token_id)?;
        let mut text = String::from("index\tprediction\n");
        for (pair, label) in data.pairs.iter().zip(predictions(&logits, c.num_labels)) {
            let index = pair.index.unwrap_or(pair.line - 2);
            let _ = writeln!(text, "{index}\t{label}");
        }
        ringtune_files::write_atomically(out, text.as_bytes())?;
        Ok(examples.len())
    }
}
