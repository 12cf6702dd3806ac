//! `ringtune eval` and `ringtune predict`: a trained model on a labelled file or a file to
//! label, read as the run's task reads its files (`task.json`).

use std::fmt::Write as _;
use std::path::Path;

use ringtune_data::{load_file, LabelSet, PairTokenizer, ReadOptions};
use ringtune_encoders::{load_params, ProblemType};
use ringtune_ops::Kernels;
use ringtune_runtime::{FlatBuffer, Runtime, SessionOptions};

use crate::engine::Evaluator;
use crate::evaluation::{evaluate, label_set, predict_logits, Scoring, TaskFile};
use crate::metrics::{predictions, Scores};
use crate::model::ModelDir;
use crate::quantize::open_int8;
use crate::TrainError;

/// A trained model ready to score or label a task's rows.
pub struct Predictor {
    model: ModelDir,
    task: TaskFile,
    labels: LabelSet,
    /// The parameters fed to the evaluation graph (none for the int8 model, which embeds them).
    params: FlatBuffer,
    tokenizer: PairTokenizer,
    evaluator: Evaluator,
}

/// Which of a run's models scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Precision {
    /// The trained float weights (`model.safetensors`).
    #[default]
    Float,
    /// The int8 model `ringtune quantize` wrote (`model.int8.onnx`).
    Int8,
}

impl Predictor {
    /// Loads a model folder (a training run's output, or any Hugging Face BERT folder, which is
    /// taken to be for MRPC) to score with its float weights or its int8 model.
    pub fn open(
        dir: &Path,
        max_len: usize,
        options: &SessionOptions,
        precision: Precision,
    ) -> Result<Self, TrainError> {
        let model = ModelDir::open(dir)?;
        model.check_max_len(max_len)?;
        let task = TaskFile::read(dir)?;
        let tokenizer = PairTokenizer::from_model_dir(dir, max_len)?;
        let labels = label_set(&model.config);
        let (params, evaluator) = match precision {
            Precision::Float => {
                let mut params = FlatBuffer::zeros(model.layout.total_len());
                let report = load_params(&model.weight_files(&[]), &model.config, &model.layout, 0, &mut params)?;
                if !report.initialized.is_empty() {
                    tracing::warn!(
                        "{} has no trained head ({}): predictions are from a random one",
                        dir.display(),
                        report.initialized.join(", ")
                    );
                }
                (params, Evaluator::new(Runtime::get()?, &model.config, &model.layout, Kernels::Mlas, options)?)
            }
            Precision::Int8 => (FlatBuffer::zeros(0), open_int8(dir, options)?),
        };
        Ok(Predictor { model, task, labels, params, tokenizer, evaluator })
    }

    /// The task's scores on a labelled file (every row must be readable and labelled with one
    /// of the model's labels).
    pub fn evaluate(&mut self, file: &Path, batch: usize) -> Result<Scores, TrainError> {
        let layout = self.task.layout(file)?;
        let (examples, rows) = load_file(file, &layout, &self.labels, &self.tokenizer, ReadOptions::default())?;
        if examples.is_empty() {
            return Err(TrainError::Unusable { path: file.into(), reason: "no rows to evaluate".into() });
        }
        if !rows.labelled {
            return Err(TrainError::Unusable { path: file.into(), reason: "no labels to evaluate against".into() });
        }
        let c = &self.model.config;
        evaluate(&mut self.evaluator, &self.params, &examples, batch, c.pad_token_id, Scoring::new(c, &self.task.task))
    }

    /// GLUE-format predictions (`index<TAB>prediction`: the row's id, and the label's name or
    /// the score) for a file, written to `out`; labels the file has are not read.
    pub fn predict(&mut self, file: &Path, batch: usize, out: &Path) -> Result<usize, TrainError> {
        let rows = self.task.read_unlabelled(file, "predicted")?;
        let (examples, _) = ringtune_data::examples(&rows, &self.labels, &self.tokenizer)?;
        let c = &self.model.config;
        let predicted = predict_logits(&mut self.evaluator, &self.params, &examples, batch, c.pad_token_id)?;
        let mut text = String::from("index\tprediction\n");
        match c.problem {
            ProblemType::Regression => {
                for (row, score) in rows.rows.iter().zip(&predicted.logits) {
                    let _ = writeln!(text, "{}\t{score}", row.id);
                }
            }
            ProblemType::SingleLabel => {
                for (row, class) in rows.rows.iter().zip(predictions(&predicted.logits, c.num_labels)) {
                    let _ = writeln!(text, "{}\t{}", row.id, written_label(self.labels.name_of(class), class));
                }
            }
        }
        ringtune_files::write_atomically(out, text.as_bytes())?;
        Ok(examples.len())
    }
}

/// A class as a prediction file writes it: its name, or its id where the head never named it
/// (`LABEL_<id>`, Hugging Face's default).
fn written_label(name: &str, class: usize) -> String {
    if name == format!("LABEL_{class}") {
        class.to_string()
    } else {
        name.to_string()
    }
}
