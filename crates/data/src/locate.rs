//! Where the MRPC files are: `MRPC_DIR`, else the workspace's `data/mrpc`, else the shared
//! `../shared/data/mrpc`; and the pinned checksums of the files.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::DataError;

/// sha256 of the GLUE MRPC files and the MSR originals (as distributed by GLUE's script).
pub const PINNED_SHA256: &[(&str, &str)] = &[
    ("train.tsv", "122becc469405bc16f9defcb8715d2a4b7ce600e9d9381e6dc42bfdd1494c51d"),
    ("dev.tsv", "81c8a1a9e1dfe461dd2c1a4f98f43fe18bece44d2bf9e3d0b245b88e5aa5eaf7"),
    ("test.tsv", "4ee428d354c01fa35c2f0f6ab835398abb0bec01f17ed68fbcb6c04265505b0a"),
    ("dev_ids.tsv", "971d7767d81b997fd9060ade0ec23c4fc31cbb226a55d1bd4a1bac474eb81dc7"),
    ("msr_paraphrase_train.txt", "61a88818ec384d8465297dda1883b469f1b22d442ab90183d13e06233b180591"),
];

/// A data folder and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    /// The folder.
    pub path: PathBuf,
    /// `MRPC_DIR`, `the workspace data folder` or `the shared data folder`.
    pub origin: &'static str,
}

/// Finds the folder holding `train.tsv`: `MRPC_DIR`, else `root/data/mrpc`, else
/// `root/../shared/data/mrpc`. The error says where it looked and what to do.
pub fn data_dir(root: &Path) -> Result<DataDir, DataError> {
    if let Some(dir) = std::env::var_os("MRPC_DIR").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(dir);
        return if path.join("train.tsv").is_file() {
            Ok(DataDir { path, origin: "MRPC_DIR" })
        } else {
            Err(DataError::NoData(format!("MRPC_DIR={} has no train.tsv", path.display())))
        };
    }
    let candidates = [
        (root.join("data/mrpc"), "the workspace data folder"),
        (root.join("../shared/data/mrpc"), "the shared data folder"),
    ];
    for (path, origin) in &candidates {
        if path.join("train.tsv").is_file() {
            let path = path.canonicalize().unwrap_or_else(|_| path.clone());
            return Ok(DataDir { path, origin });
        }
    }
    Err(DataError::NoData(format!(
        "looked in MRPC_DIR (unset), {} and {}; run `just data` or set MRPC_DIR",
        candidates[0].0.display(),
        candidates[1].0.display()
    )))
}

/// Lower-case hex sha256 of a file.
pub fn sha256_hex(path: &Path) -> Result<String, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
    Ok(ringtune_files::hex(&Sha256::digest(&bytes)))
}

/// The folder of a GLUE task's files: MRPC as [`data_dir`] finds it; any other task in
/// `GLUE_DIR/<folder>` (GLUE's download script's layout, `SST-2`), else `root/data/<folder>`.
/// The error says where it looked and that `--data` names the folder.
pub fn glue_dir(root: &Path, task: crate::GlueTask) -> Result<DataDir, DataError> {
    if task == crate::GlueTask::Mrpc {
        return data_dir(root);
    }
    let train = task.splits()[0].1;
    let mut looked = Vec::new();
    let from_env = std::env::var_os("GLUE_DIR").filter(|v| !v.is_empty()).map(PathBuf::from);
    let candidates = from_env
        .map(|dir| (dir.join(task.folder()), "GLUE_DIR"))
        .into_iter()
        .chain([(root.join("data").join(task.folder()), "the workspace data folder")]);
    for (path, origin) in candidates {
        if path.join(train).is_file() {
            return Ok(DataDir { path, origin });
        }
        looked.push(path.display().to_string());
    }
    Err(DataError::NoData(format!(
        "no {train} for {} in {} (GLUE_DIR {}); give the task's folder with --data DIR",
        task.name(),
        looked.join(" or "),
        if std::env::var_os("GLUE_DIR").is_some() { "set" } else { "unset" }
    )))
}
