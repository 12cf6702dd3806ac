//! Hugging Face `model.safetensors` files: reading into the flat buffer, writing back out.

use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::params::{init_param, is_head};
use crate::{ModelConfig, ModelError, ParamLayout};

/// What loading found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// Parameters read from the files.
    pub loaded: usize,
    /// Head parameters the files lack, initialised from the seed.
    pub initialized: Vec<String>,
    /// Tensors in the files that the model does not use (buffers such as `position_ids` excluded).
    pub ignored: Vec<String>,
    /// Head tensors of another shape (a head for another number of labels), left out so that
    /// the head is initialised anew.
    pub replaced: Vec<String>,
}

/// Reads the parameters from `files` (later files override earlier ones) into `params`.
/// Names match with or without the family prefix (`bert.`); head parameters missing from every
/// file are initialised from `seed`; any other missing parameter is an error.
pub fn load_params(
    files: &[PathBuf],
    config: &ModelConfig,
    layout: &ParamLayout,
    seed: u64,
    params: &mut [f32],
) -> Result<LoadReport, ModelError> {
    layout.check_len(params.len())?;
    let prefix = config.family.prefix();
    let mut filled = vec![false; layout.entries().len()];
    let mut report = LoadReport::default();
    for path in files {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let tensors = SafeTensors::deserialize(&bytes)
            .map_err(|e| ModelError::Checkpoint { path: path.clone(), reason: e.to_string() })?;
        // In name order, not the file index's hash order: the same file gives the same report.
        let mut named = tensors.tensors();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, view) in named {
            let position = layout
                .entries()
                .iter()
                .position(|e| e.name == name || e.name.strip_prefix(prefix) == Some(name.as_str()));
            let Some(index) = position else {
                if !name.ends_with("position_ids") {
                    report.ignored.push(name);
                }
                continue;
            };
            let entry = &layout.entries()[index];
            if view.shape() != entry.shape.as_slice() && is_head(config, &entry.name) {
                report.replaced.push(name);
                continue;
            }
            if view.shape() != entry.shape.as_slice() {
                return Err(ModelError::ShapeMismatch {
                    path: path.clone(),
                    name,
                    found: view.shape().to_vec(),
                    expected: entry.shape.clone(),
                });
            }
            convert_into(&view, &mut params[entry.range()]).map_err(|dtype| ModelError::DType {
                path: path.clone(),
                name: name.clone(),
                dtype,
            })?;
            filled[index] = true;
        }
    }
    for (entry, done) in layout.entries().iter().zip(&filled) {
        if *done {
            report.loaded += 1;
        } else if is_head(config, &entry.name) {
            init_param(config, entry, seed, &mut params[entry.range()]);
            report.initialized.push(entry.name.clone());
        } else {
            return Err(ModelError::MissingTensor {
                path: files.last().cloned().unwrap_or_default(),
                name: entry.name.clone(),
                alias: entry.name.strip_prefix(prefix).unwrap_or(&entry.name).to_string(),
            });
        }
    }
    report.ignored.sort();
    Ok(report)
}

/// Copies a tensor into `out` as f32; the error names an unsupported element type.
fn convert_into(view: &TensorView<'_>, out: &mut [f32]) -> Result<(), String> {
    let data = view.data();
    match view.dtype() {
        Dtype::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        Dtype::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Dtype::BF16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        other => return Err(format!("{other:?}")),
    }
    Ok(())
}

/// Writes every parameter under its Hugging Face name, as `transformers` loads it.
pub fn save_params(path: &Path, layout: &ParamLayout, params: &[f32]) -> Result<(), ModelError> {
    layout.check_len(params.len())?;
    let bytes: Vec<(&str, Vec<u8>, &[usize])> = layout
        .entries()
        .iter()
        .map(|e| {
            (e.name.as_str(), params[e.range()].iter().flat_map(|v| v.to_le_bytes()).collect(), e.shape.as_slice())
        })
        .collect();
    let views = bytes
        .iter()
        .map(|(name, data, shape)| {
            TensorView::new(Dtype::F32, shape.to_vec(), data)
                .map(|v| (name.to_string(), v))
                .map_err(|e| ModelError::Checkpoint { path: path.into(), reason: e.to_string() })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let encoded = safetensors::serialize(views, None)
        .map_err(|e| ModelError::Checkpoint { path: path.into(), reason: e.to_string() })?;
    write_atomically(path, &encoded)
}

/// Writes `bytes` to `path` atomically, a failure reported as this crate's error.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    ringtune_files::write_atomically(path, bytes).map_err(|e| ModelError::Io { path: e.path, source: e.source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::layout;

    fn tiny() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"vocab_size": 10, "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 2,
                "intermediate_size": 8, "max_position_embeddings": 6}"#,
            Path::new("tiny.json"),
        )
        .expect("config")
    }

    #[test]
    fn round_trips_and_reports_heads_and_extras() {
        let config = tiny();
        let layout = layout(&config);
        let params: Vec<f32> = (0..layout.total_len()).map(|i| i as f32 * 0.5).collect();
        let dir = tempfile::tempdir().expect("dir");
        let full = dir.path().join("model.safetensors");
        save_params(&full, &layout, &params).expect("save");
        let mut back = vec![0.0; layout.total_len()];
        let report = load_params(std::slice::from_ref(&full), &config, &layout, 1, &mut back).expect("load");
        assert_eq!(report.loaded, layout.entries().len());
        for e in layout.entries() {
            assert_eq!(back[e.range()], params[e.range()], "{}", e.name);
        }

        // A base checkpoint without the prefix and without the head, with an extra buffer.
        let base: Vec<_> = layout.entries().iter().filter(|e| !e.name.starts_with("classifier.")).collect();
        let data: Vec<(String, Vec<u8>, Vec<usize>)> = base
            .iter()
            .map(|e| {
                (
                    e.name.trim_start_matches("bert.").to_string(),
                    params[e.range()].iter().flat_map(|v| v.to_le_bytes()).collect(),
                    e.shape.clone(),
                )
            })
            .chain([
                ("embeddings.position_ids".to_string(), vec![0u8; 24], vec![6]),
                ("extra.weight".into(), vec![0u8; 4], vec![1]),
            ])
            .collect();
        let views: Vec<_> = data
            .iter()
            .map(|(n, d, s)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).expect("view")))
            .collect();
        let base_path = dir.path().join("base.safetensors");
        std::fs::write(&base_path, safetensors::serialize(views, None).expect("serialise")).expect("write");
        let report = load_params(std::slice::from_ref(&base_path), &config, &layout, 1, &mut back).expect("load base");
        assert_eq!(report.initialized, vec!["classifier.weight".to_string(), "classifier.bias".to_string()]);
        assert_eq!(report.ignored, vec!["extra.weight".to_string()]);
    }

    #[test]
    fn truncated_files_and_wrong_shapes_are_named() {
        let config = tiny();
        let layout = layout(&config);
        let params = vec![0.25; layout.total_len()];
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("model.safetensors");
        save_params(&path, &layout, &params).expect("save");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("truncate");
        let mut out = vec![0.0; layout.total_len()];
        let err =
            load_params(std::slice::from_ref(&path), &config, &layout, 1, &mut out).expect_err("truncated").to_string();
        assert!(err.contains("model.safetensors") && err.contains("not a readable safetensors"), "{err}");

        let mut bigger = config.clone();
        bigger.hidden_size = 8;
        let big_layout = crate::params::layout(&bigger);
        save_params(&path, &big_layout, &vec![0.0; big_layout.total_len()]).expect("save");
        let err = load_params(&[path], &config, &layout, 1, &mut out).expect_err("shape").to_string();
        assert!(
            err.contains("has shape [") && err.contains("8] but the config needs [") && err.ends_with("4]"),
            "{err}"
        );
    }
}
