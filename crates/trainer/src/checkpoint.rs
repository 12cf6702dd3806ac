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

use crate::selection::Selection;
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// Examples per node and step in that run (checkpoints from before this field: `None`,
    /// taken as the resuming run's).
    #[serde(default)]
    pub node_batch: Option<usize>,
    /// The global batch whose length groups ordered the data (`--group-by-length`); `None`
    /// when the order was not grouped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_groups: Option<usize>,
    /// The best evaluation so far and the early stopping's count (checkpoints from before this
    /// field: none yet).
    #[serde(default)]
    pub selection: Selection,
}

impl Meta {
    /// The batch of `epoch` at which a run of `world` nodes taking `node_batch` examples each
    /// per step goes on: the first whose examples this checkpoint's run had not all taken. (A
    /// node's share of an epoch is every `world`-th example of its order, so the first `k`
    /// global batches are the order's first `k x world x node_batch` examples, whatever the
    /// split.)
    pub fn resume_batch(&self, world: usize, node_batch: usize) -> u64 {
        let taken = self.progress.batch_in_epoch * (self.world * self.node_batch.unwrap_or(node_batch)) as u64;
        taken / (world * node_batch).max(1) as u64
    }
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

pub(crate) fn err(path: &Path, reason: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint { path: path.into(), reason: reason.to_string() }
}

/// The file name of the checkpoint after `step`.
pub fn file_name(step: u64) -> String {
    format!("step-{step:08}.ckpt")
}

/// Writes a checkpoint atomically: a crash leaves the previous files intact.
pub fn save(path: &Path, meta: &Meta, params: &[f32], m: &[f32], v: &[f32]) -> Result<(), TrainError> {
    ringtune_files::write_atomically_with(path, |file| {
        write(BufWriter::with_capacity(1 << 22, file), meta, params, m, v)
    })
    .map_err(|e| err(path, e.source))
}

/// A checkpoint's bytes, as [`save`] writes them (to hand a run's state to a node over the
/// network).
pub fn encode(meta: &Meta, params: &[f32], m: &[f32], v: &[f32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(12 * params.len() + 4096);
    // Writing to memory cannot fail.
    let _ = write(&mut bytes, meta, params, m, v);
    bytes
}

fn write(inner: impl Write, meta: &Meta, params: &[f32], m: &[f32], v: &[f32]) -> std::io::Result<()> {
    let mut out = HashingWriter { inner, hasher: Sha256::new() };
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
    decode(bytes, path, layout_hash)
}

/// A checkpoint from its bytes (read from `path`, or named so), checked as [`load`] checks it.
pub fn decode(bytes: Vec<u8>, path: &Path, layout_hash: &str) -> Result<Checkpoint, TrainError> {
    let bytes = checked(bytes, path, MAGIC, 4, "a ringtune checkpoint")?;
    let body = bytes.as_slice();
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
    let read = |k: usize| f32s_le(&floats[k * 4 * n..(k + 1) * 4 * n]);
    Ok(Checkpoint { params: read(0), m: read(1), v: read(2), meta })
}

/// A file written as `magic`, a body and the sha256 of both: its bytes without the digest, or an
/// error naming the file when it is not `what` (at least `header` bytes after the magic), is
/// truncated or corrupt.
pub(crate) fn read_checked(path: &Path, magic: &[u8; 8], header: usize, what: &str) -> Result<Vec<u8>, TrainError> {
    let mut bytes = Vec::new();
    File::open(path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(|e| err(path, e))?;
    checked(bytes, path, magic, header, what)
}

/// [`read_checked`] on bytes already read.
fn checked(mut bytes: Vec<u8>, path: &Path, magic: &[u8; 8], header: usize, what: &str) -> Result<Vec<u8>, TrainError> {
    if bytes.len() < magic.len() + header + 32 || &bytes[..magic.len()] != magic {
        return Err(err(path, format!("not {what}, or truncated")));
    }
    let digest = bytes.split_off(bytes.len() - 32);
    if Sha256::digest(&bytes).as_slice() != digest.as_slice() {
        return Err(err(path, "checksum mismatch: the file is truncated or corrupt"));
    }
    Ok(bytes)
}

/// Little-endian `f32`s.
pub(crate) fn f32s_le(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
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

/// A checkpoint file that did not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The file.
    pub path: PathBuf,
    /// Why, naming the file.
    pub reason: String,
}

/// The newest checkpoint that loads, and the newer ones that did not.
pub fn latest_valid(dir: &Path, layout_hash: &str) -> (Option<(PathBuf, Checkpoint)>, Vec<Refused>) {
    let mut refused = Vec::new();
    for path in list(dir).into_iter().rev() {
        match load(&path, layout_hash) {
            Ok(c) => return (Some((path, c)), refused),
            Err(e) => refused.push(Refused { reason: e.to_string(), path }),
        }
    }
    (None, refused)
}

/// Renames a checkpoint that did not load to `<name>.refused`, where it is kept for a look but
/// no longer counts among the checkpoints (pruning would otherwise keep it in place of a good
/// one); returns the new name.
pub fn set_aside(path: &Path) -> Result<PathBuf, TrainError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".refused");
    let aside = path.with_file_name(name);
    std::fs::rename(path, &aside).map_err(|e| err(path, e))?;
    Ok(aside)
}

/// Deletes all but the newest `keep` checkpoints and the one after step `also_keep` (the best
/// evaluation's, whose weights the run ends with).
pub fn prune(dir: &Path, keep: usize, also_keep: Option<u64>) -> Result<(), TrainError> {
    let files = list(dir);
    let kept = also_keep.map(|step| dir.join(file_name(step)));
    for old in files.iter().take(files.len().saturating_sub(keep)) {
        if kept.as_ref() != Some(old) {
            std::fs::remove_file(old).map_err(|e| err(old, e))?;
        }
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
            node_batch: Some(8),
            length_groups: None,
            selection: Selection::default(),
        }
    }

    #[test]
    fn resuming_with_another_split_goes_on_where_the_taken_examples_end() {
        let at = |batch, world, node_batch| Meta {
            progress: Progress { step: batch, epoch: 0, batch_in_epoch: batch },
            world,
            node_batch,
            ..meta(0)
        };
        // `--global-batch-size 32`: 2 nodes x 16 and 4 x 8 cut the epoch into the same batches.
        assert_eq!(at(50, 2, Some(16)).resume_batch(4, 8), 50);
        assert_eq!(at(50, 4, Some(8)).resume_batch(2, 16), 50);
        // The same batch per node on more or fewer nodes.
        assert_eq!(at(10, 2, Some(16)).resume_batch(4, 16), 5);
        assert_eq!(at(6, 4, Some(8)).resume_batch(3, 8), 8);
        // A batch partly taken is taken again.
        assert_eq!(at(5, 3, Some(8)).resume_batch(4, 8), 3);
        // A checkpoint from before the field: its batch per node taken as the resuming run's.
        assert_eq!(at(9, 4, None).resume_batch(3, 8), 12);
        assert_eq!(at(7, 2, Some(16)).resume_batch(2, 16), 7);
    }

    #[test]
    fn round_trip_prune_and_fall_back_past_a_corrupt_one() {
        let dir = tempfile::tempdir().expect("dir");
        for step in 1..=3 {
            let p = vec![step as f32; 3];
            save(&dir.path().join(file_name(step)), &meta(step), &p, &[0.5; 3], &[0.25; 3]).expect("save");
        }
        prune(dir.path(), 2, None).expect("prune");
        assert_eq!(list(dir.path()).len(), 2);
        prune(dir.path(), 1, Some(2)).expect("prune keeping step 2");
        assert_eq!(list(dir.path()), [dir.path().join(file_name(2)), dir.path().join(file_name(3))]);
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
        assert_eq!(refused[0].path, newest);
        let reason = &refused[0].reason;
        assert!(reason.contains("step-00000003.ckpt") && reason.contains("corrupt"), "{reason}");
        let files = std::fs::read_dir(dir.path()).expect("dir").count();
        assert_eq!(files, list(dir.path()).len(), "no temporary file is left behind");
    }

    #[test]
    fn a_refused_checkpoint_set_aside_no_longer_takes_the_place_of_a_good_one() {
        let dir = tempfile::tempdir().expect("dir");
        let save_step = |step: u64| {
            save(&dir.path().join(file_name(step)), &meta(step), &[step as f32; 3], &[0.5; 3], &[0.25; 3])
                .expect("save")
        };
        save_step(1);
        std::fs::write(dir.path().join(file_name(5)), b"not a checkpoint").expect("garbage");
        let (found, refused) = latest_valid(dir.path(), "abc");
        assert_eq!(found.expect("step 1").1.meta.progress.step, 1);
        let aside = set_aside(&refused[0].path).expect("set aside");
        assert!(aside.ends_with("step-00000005.ckpt.refused") && aside.exists(), "{}", aside.display());
        // The run goes on from step 1 and keeps one checkpoint: the one it just wrote.
        save_step(2);
        prune(dir.path(), 1, None).expect("prune");
        assert_eq!(list(dir.path()), vec![dir.path().join(file_name(2))]);
        assert_eq!(load(&dir.path().join(file_name(2)), "abc").expect("load").meta.progress.step, 2);
    }
}
