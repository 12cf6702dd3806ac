//! The trained model a run leaves: Hugging Face files, the ONNX inference model, the task
//! file, the tokenizer and the plot.

use std::path::Path;

use ringtune_data::Source;
use ringtune_encoders::ParamLayout;

use super::inputs::Inputs;
use super::TrainingShape;
use crate::evaluation::TaskFile;
use crate::TrainError;

/// The trained model as Hugging Face files plus the ONNX inference model and the plot.
pub(super) fn write_outputs(
    output: &Path,
    inputs: &Inputs,
    layout: &ParamLayout,
    params: &[f32],
    shape: &TrainingShape,
) -> Result<(), TrainError> {
    let _span = tracing::debug_span!("outputs").entered();
    ringtune_encoders::save_params(&output.join("model.safetensors"), layout, params)?;
    let config = serde_json::to_string_pretty(&inputs.config.to_hf_json())?;
    ringtune_files::write_atomically(&output.join("config.json"), config.as_bytes())?;
    let (label_column, quoting) = match &inputs.task.source {
        Source::Files { label_column, quoting, .. } => {
            (Some(label_column.clone().unwrap_or_else(|| "label".into())), *quoting)
        }
        Source::Glue { .. } => (None, None),
    };
    TaskFile { task: inputs.task.name.clone(), text_columns: inputs.text_columns.clone(), label_column, quoting }
        .write(output)?;
    for file in &inputs.tokenizer_files {
        if let Some(name) = file.file_name() {
            std::fs::copy(file, output.join(name)).map_err(|source| TrainError::Io { path: file.clone(), source })?;
        }
    }
    let onnx = ringtune_encoders::export_inference(&inputs.config, layout, params)?;
    ringtune_files::write_atomically(&output.join("model.onnx"), &onnx)?;
    let metrics = output.join("metrics.jsonl");
    let plotted = crate::metrics::read_readable_records(&metrics).and_then(|(records, unreadable)| {
        if unreadable > 0 {
            tracing::warn!("{}: {unreadable} unreadable line(s) left out of training.png", metrics.display());
        }
        crate::plot::plot(&output.join("training.png"), &records, &shape.describe())
    });
    if let Err(e) = plotted {
        tracing::warn!("no training.png: {e}");
    }
    Ok(())
}
