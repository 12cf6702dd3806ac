//! Training checkpoints: parameters, optimizer moments, the step and the data position,
//! written atomically (temporary file, fsync, rename) with a checksum, the last few kept.
//!
//! Layout: magic `RTCKPT01`, metadata length `u32` and JSON metadata, then parameters, first
//! and second moments (`f32` little endian, each `total_len` long), then the sha256 of all
//! that precedes it.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::TrainError;

const MAGIC: &[u8; 8] = b"RTCKPT01";

/// Where training stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// Optimizer steps done.
    pub step: u64,
    /// The epoch of the next step.
    pub epoch: u32,
    /// Batches of that epoch already done.
    pub batch_in_epoch: u64,
}

/// Checkpoint metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Progress.
    pub progress: Progress,
    /// The run's seed (data order).
    pub seed: u64,
    /// Hex sha256 of the parameter layout.
    pub layout_hash: String,
    /// Floats per buffer.
    pub total_len: usize,
    /// AdamW's step count.
    pub adam_step: u64,
    /// Nodes in the run that wrote it (checkpoints from before this field: one).
    #[serde(default = "one")]
    pub world: usize,
}

fn one() -> usize {
    1
}

/// A checkpoint in memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// Metadata.
    pub meta: Meta,
    /// Parameters.
    pub params: Vec<f32>,
    /// AdamW first moments.
    pub m: Vec<f32>,
    /// AdamW second moments.
    pub v: Vec<f32>,
}

fn err(path: &Path, reason: impl std::fmt::Display) -> TrainError {
    TrainError::Other(format!("checkpoint {}: {reason}", path.display()))
}

/// The file name of the checkpoint after `step`.
pub fn file_name(step: u64) -> String {
    format!("step-{step:08}.ckpt")
}

/// Writes a checkpoint atomically: a crash leaves the previous files intact.
pub fn save(path: &Path, meta: &Meta, params: &[f32], m: &[f32], v: &[f32]) -> Result<(), TrainError> {
    ringtune_files::write_atomically_with(path, |file| {
        let mut out = HashingWriter { inner: BufWriter::with_capacity(1 << 22, file), hasher: Sha256::new() };
        let json = serde_json::to_vec(meta).map_err(std::io::Error::other)?;
        out.write_all(MAGIC)?;
        out.write_all(&(json.len() as u32).to_le_bytes())?;
        out.write_all(&json)?;
        for buffer in [params, m, v] {
            for chunk in buffer.chunks(1 << 16) {
                let bytes: Vec<u8> = chunk.iter().flat_map(|x| x.to_le_bytes()).collect();
                out.write_all(&bytes)?;
            }
        }
        let digest = out.hasher.finalize();
        let mut inner = out.inner;
        inner.write_all(&digest)?;
        inner.flush()
    })
    .map_err(|e| err(path, e.source))
}

struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Reads and checks a checkpoint (magic, checksum, sizes, and the layout it was made for).
pub fn load(path: &Path, layout_hash: &str) -> Result<Checkpoint, TrainError> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| err(path, e))?;
    if bytes.len() < 8 + 4 + 32 || &bytes[..8] != MAGIC {
        return Err(err(path, "not a ringtune checkpoint, or truncated"));
    }
    let (body, digest) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != digest {
        return Err(err(path, "checksum mismatch: the file is truncated or corrupt"));
    }
    let json_len = u32::from_le_bytes([body[8], body[9], body[10], body[11]]) as usize;
    let json = body.get(12..12 + json_len).ok_or_else(|| err(path, "truncated metadata"))?;
    let meta: Meta = serde_json::from_slice(json).map_err(|e| err(path, format!("bad metadata: {e}")))?;
    if meta.layout_hash != layout_hash {
        return Err(err(path, "made for a different model (parameter layout differs)"));
    }
    let floats = &body[12 + json_len..];
    let n = meta.total_len;
    if floats.len() != 3 * 4 * n {
        return Err(err(path, format!("{} bytes of tensors, expected {}", floats.len(), 12 * n)));
    }
    let read = |k: usize| -> Vec<f32> {
        floats[k * 4 * n..(k + 1) * 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    Ok(Checkpoint { params: read(0), m: read(1), v: read(2), meta })
}

/// Checkpoint files in `dir`, oldest first.
pub fn list(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "ckpt"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// The newest checkpoint that loads, and the reasons the newer ones did not.
pub fn latest_valid(dir: &Path, layout_hash: &str) -> (Option<(PathBuf, Checkpoint)>, Vec<String>) {
    let mut refused = Vec::new();
    for path in list(dir).into_iter().rev() {
        match load(&path, layout_hash) {
            Ok(c) => return (Some((path, c)), refused),
            Err(e) => refused.push(e.to_string()),
        }
    }
    (None, refused)
}

/// Deletes all but the newest `keep` checkpoints.
pub fn prune(dir: &Path, keep: usize) -> Result<(), TrainError> {
    let files = list(dir);
    for old in files.iter().take(files.len().saturating_sub(keep)) {
        std::fs::remove_file(old).map_err(|e| err(old, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(step: u64) -> Meta {
        Meta {
            progress: Progress { step, epoch: 0, batch_in_epoch: step },
            seed: 1,
            layout_hash: "abc".into(),
            total_len: 3,
            adam_step: step,
            world: 2,
        }
    }

    #[test]
    fn round_trip_prune_and_fall_back_past_a_corrupt_one() {
        let dir = tempfile::tempdir().expect("dir");
        for step in 1..=3 {
            let p = vec![step as f32; 3];
            save(&dir.path().join(file_name(step)), &meta(step), &p, &[0.5; 3], &[0.25; 3]).expect("save");
        }
        prune(dir.path(), 2).expect("prune");
        assert_eq!(list(dir.path()).len(), 2);
        let newest = dir.path().join(file_name(3));
        let c = load(&newest, "abc").expect("load");
        assert_eq!((c.params, c.m, c.meta), (vec![3.0; 3], vec![0.5; 3], meta(3)));
        assert!(load(&newest, "other").expect_err("layout").to_string().contains("different model"));

        // Truncate the newest: it is refused by name and the previous one is used.
        let bytes = std::fs::read(&newest).expect("read");
        std::fs::write(&newest, &bytes[..bytes.len() - 7]).expect("truncate");
        let (found, refused) = latest_valid(dir.path(), "abc");
        let (path, c) = found.expect("previous checkpoint");
        assert_eq!((path, c.meta.progress.step), (dir.path().join(file_name(2)), 2));
        assert!(refused[0].contains("step-00000003.ckpt") && refused[0].contains("corrupt"), "{refused:?}");
        let files = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(files, list(dir.path()).len(), "no temporary file is left behind");
    }
}
