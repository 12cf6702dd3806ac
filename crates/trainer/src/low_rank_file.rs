//! Each node's gradient-compression state beside a checkpoint: with `--powersgd-rank` every node
//! carries its own error feedback (what its steps left unsent), which the lead's checkpoint
//! cannot hold without sending it over the ring, so each node writes its own file,
//! `step-<step>.rank-<rank>.lowrank`, beside the checkpoint of that step (on the node's own disk
//! when the output folder is not shared).
//!
//! Layout: magic `RTLOWRK1`, world, rank and bucket count (`u32` little endian), each bucket's
//! `Q` and error lengths (`u64`), the floats (`f32`, bucket by bucket, `Q` then error), then the
//! sha256 of all that precedes it. Written atomically, as checkpoints are.

use std::path::{Path, PathBuf};

use ringtune_collective::LowRankState;
use sha2::{Digest, Sha256};

use crate::checkpoint::{err, f32s_le, read_checked};
use crate::TrainError;

const MAGIC: &[u8; 8] = b"RTLOWRK1";
const EXTENSION: &str = "lowrank";

/// The file of `rank`'s state at `step`.
pub fn file_name(step: u64, rank: usize) -> String {
    format!("step-{step:08}.rank-{rank}.{EXTENSION}")
}

/// Writes `rank`'s state (of a run on `world` nodes) to `dir`'s file for `step`, and removes
/// this rank's files but the newest `keep`.
pub fn save(
    dir: &Path,
    step: u64,
    (rank, world): (usize, usize),
    state: &[LowRankState],
    keep: usize,
) -> Result<(), TrainError> {
    let path = dir.join(file_name(step, rank));
    std::fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let mut bytes = Vec::new();
    bytes.extend_from_slice(MAGIC);
    for n in [world, rank, state.len()] {
        bytes.extend_from_slice(&(n as u32).to_le_bytes());
    }
    for bucket in state {
        bytes.extend_from_slice(&(bucket.q.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&(bucket.error.len() as u64).to_le_bytes());
    }
    for bucket in state {
        for x in bucket.q.iter().chain(&bucket.error) {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    let digest = Sha256::digest(&bytes);
    bytes.extend_from_slice(&digest);
    ringtune_files::write_atomically(&path, &bytes).map_err(|e| err(&path, e.source))?;
    let mine = format!(".rank-{rank}.{EXTENSION}");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| err(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("step-") && n.ends_with(&mine))
        })
        .collect();
    files.sort();
    for old in files.iter().take(files.len().saturating_sub(keep)) {
        std::fs::remove_file(old).map_err(|e| err(old, e))?;
    }
    Ok(())
}

/// Reads `rank`'s state at `step` from `dir`, refusing a file of another world or rank, a
/// truncated or corrupt one.
pub fn load(dir: &Path, step: u64, (rank, world): (usize, usize)) -> Result<Vec<LowRankState>, TrainError> {
    let path = dir.join(file_name(step, rank));
    let bytes = read_checked(&path, MAGIC, 12, "a ringtune compression state")?;
    let body = bytes.as_slice();
    let word = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]) as usize;
    let (file_world, file_rank, buckets) = (word(8), word(12), word(16));
    if (file_world, file_rank) != (world, rank) {
        return Err(err(
            &path,
            format!("written by rank {file_rank} of {file_world} nodes, not rank {rank} of {world}"),
        ));
    }
    let mut at = 20;
    let mut lengths = Vec::with_capacity(buckets);
    for _ in 0..buckets {
        let length =
            |at: usize| body.get(at..at + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
        let (q, e) = length(at).zip(length(at + 8)).ok_or_else(|| err(&path, "truncated bucket lengths"))?;
        lengths.push((q, e));
        at += 16;
    }
    let floats: usize = lengths.iter().map(|(q, e)| q + e).sum();
    if body.len() - at != 4 * floats {
        return Err(err(&path, format!("{} bytes of floats, expected {}", body.len() - at, 4 * floats)));
    }
    let mut read = |n: usize| {
        at += 4 * n;
        f32s_le(&body[at - 4 * n..at])
    };
    Ok(lengths.into_iter().map(|(q, e)| LowRankState { q: read(q), error: read(e) }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> Vec<LowRankState> {
        vec![
            LowRankState { q: vec![1.0, -2.5], error: vec![0.25, 3.0, 4.0] },
            LowRankState::default(),
            LowRankState { q: vec![7.0], error: vec![f32::MIN_POSITIVE] },
        ]
    }

    #[test]
    fn a_state_reads_back_as_written_and_only_the_newest_are_kept() {
        let dir = tempfile::tempdir().expect("dir");
        for step in [10, 20, 30] {
            save(dir.path(), step, (1, 4), &state(), 2).expect("save");
        }
        assert_eq!(load(dir.path(), 30, (1, 4)).expect("load"), state());
        assert!(load(dir.path(), 10, (1, 4)).is_err(), "pruned");
        assert!(dir.path().join(file_name(20, 1)).exists());
        // Another rank's files are its own to prune.
        save(dir.path(), 40, (2, 4), &state(), 1).expect("save");
        assert!(dir.path().join(file_name(20, 1)).exists());
    }

    #[test]
    fn a_file_of_another_node_or_a_damaged_one_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("dir");
        save(dir.path(), 5, (0, 2), &state(), 2).expect("save");
        let other = load(dir.path(), 5, (0, 4)).expect_err("another world").to_string();
        assert!(other.contains("rank 0 of 2 nodes") && other.contains(&file_name(5, 0)), "{other}");
        let path = dir.path().join(file_name(5, 0));
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[30] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(load(dir.path(), 5, (0, 2)).expect_err("corrupt").to_string().contains("checksum"));
        assert!(load(dir.path(), 6, (0, 2)).is_err(), "missing");
    }
}
