//! TensorBoard's event files (`--report-to tensorboard`): every record of `metrics.jsonl` also as
//! scalars, under the names the Hugging Face Trainer gives them (`train/loss`,
//! `train/learning_rate`, `eval/accuracy`, `eval/f1`, `eval/matthews_correlation`, ...).
//!
//! The format is a few lines: TFRecord frames (a little-endian length, its masked CRC-32C, the
//! bytes, their masked CRC-32C) each holding an `Event` protocol buffer, written here by hand
//! (the fields used: `wall_time` 1, `step` 2, `file_version` 3, `summary` 5 with its
//! `Summary.Value`s `tag` 1 and `simple_value` 2, `session_log` 7 with `status` 1).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::Record;
use crate::TrainError;

/// One run's event file in `dir`.
pub struct EventsFile {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventsFile {
    /// Creates a new event file in `dir` (a resumed run writes a file of its own, which begins by
    /// telling TensorBoard to drop what earlier files hold past `resumed_at`: those steps run
    /// again).
    pub fn create(dir: &Path, resumed_at: Option<u64>) -> Result<Self, TrainError> {
        std::fs::create_dir_all(dir).map_err(|source| TrainError::Io { path: dir.into(), source })?;
        let now = wall_time();
        let host = hostname();
        let path = dir.join(format!("events.out.tfevents.{}.{host}.{}.ringtune", now as u64, std::process::id()));
        let file = File::create(&path).map_err(|source| TrainError::Io { path: path.clone(), source })?;
        let mut events = EventsFile { out: BufWriter::new(file), path };
        events.append(&event(now, 0, &field_bytes(3, b"brain.Event:2")))?;
        if let Some(step) = resumed_at {
            // SessionLog { status: START }: TensorBoard purges the steps from here on.
            events.append(&event(now, step, &field_bytes(7, &varint_field(1, 1))))?;
        }
        events.flush()?;
        Ok(events)
    }

    /// Writes a record's scalars as one event and flushes it.
    pub fn write(&mut self, record: &Record) -> Result<(), TrainError> {
        let (step, values) = scalars(record);
        if values.is_empty() {
            return Ok(());
        }
        let summary: Vec<u8> = values
            .iter()
            .flat_map(|(tag, value)| {
                let mut v = field_bytes(1, tag.as_bytes());
                v.push(0x15); // field 2, 32-bit
                v.extend_from_slice(&(*value as f32).to_le_bytes());
                field_bytes(1, &v)
            })
            .collect();
        self.append(&event(wall_time(), step, &field_bytes(5, &summary)))?;
        self.flush()
    }

    fn append(&mut self, data: &[u8]) -> Result<(), TrainError> {
        self.out.write_all(&frame(data)).map_err(|source| TrainError::Io { path: self.path.clone(), source })
    }

    fn flush(&mut self) -> Result<(), TrainError> {
        self.out.flush().map_err(|source| TrainError::Io { path: self.path.clone(), source })
    }
}

/// A record's step and its scalars by tag: the Trainer's names for the training values, `eval/`
/// for the dev split's scores, `eval_<split>/` for another split's (MNLI's mismatched).
fn scalars(record: &Record) -> (u64, Vec<(String, f64)>) {
    match record {
        Record::Step(s) => (
            s.step,
            vec![
                ("train/loss".into(), s.loss),
                ("train/learning_rate".into(), s.lr),
                ("train/grad_norm".into(), s.grad_norm),
                ("train/samples_per_second".into(), s.samples_per_s),
                ("train/epoch".into(), f64::from(s.epoch)),
            ],
        ),
        Record::Eval(e) => {
            let prefix = if e.split == "dev" { "eval".to_string() } else { format!("eval_{}", e.split) };
            // `evaluate`'s names for GLUE's metrics, as the Trainer logs them.
            let s = &e.scores;
            let named = [
                ("loss", Some(s.loss)),
                ("accuracy", s.accuracy),
                ("f1", s.f1),
                ("macro_f1", s.macro_f1),
                ("matthews_correlation", s.matthews),
                ("pearson", s.pearson),
                ("spearmanr", s.spearman),
            ];
            let values = named.into_iter().filter_map(|(name, v)| Some((format!("{prefix}/{name}"), v?))).collect();
            (e.step, values)
        }
        Record::Membership(m) => (m.step, vec![("train/nodes".into(), m.nodes.len() as f64)]),
    }
}

fn wall_time() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = name.trim().chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// An `Event` with its wall time, step and one more field's bytes (`rest`).
fn event(wall_time: f64, step: u64, rest: &[u8]) -> Vec<u8> {
    let mut e = vec![0x09]; // field 1, 64-bit
    e.extend_from_slice(&wall_time.to_le_bytes());
    e.extend(varint_field(2, step));
    e.extend_from_slice(rest);
    e
}

/// A length-delimited field (`field` of wire type 2).
fn field_bytes(field: u64, bytes: &[u8]) -> Vec<u8> {
    let mut v = varint(field << 3 | 2);
    v.extend(varint(bytes.len() as u64));
    v.extend_from_slice(bytes);
    v
}

/// A varint field (`field` of wire type 0).
fn varint_field(field: u64, value: u64) -> Vec<u8> {
    let mut v = varint(field << 3);
    v.extend(varint(value));
    v
}

fn varint(mut value: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(10);
    while value >= 0x80 {
        v.push((value as u8) | 0x80);
        value >>= 7;
    }
    v.push(value as u8);
    v
}

/// A TFRecord frame of `data`.
fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut f = Vec::with_capacity(data.len() + 16);
    f.extend_from_slice(&length);
    f.extend_from_slice(&masked_crc(&length).to_le_bytes());
    f.extend_from_slice(data);
    f.extend_from_slice(&masked_crc(data).to_le_bytes());
    f
}

/// TFRecord's masked CRC-32C.
fn masked_crc(bytes: &[u8]) -> u32 {
    crc32c(bytes).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// CRC-32C (Castagnoli), bit by bit: metrics are a few hundred bytes a step.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0x82f6_3b78 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_and_its_mask_are_tfrecords() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283, "the CRC-32C check value");
        assert_eq!(crc32c(b""), 0);
        // The mask as TensorFlow's `crc32c::Mask` writes it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
        let crc = crc32c(b"abc");
        #[allow(clippy::manual_rotate)]
        let mask = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc(b"abc"), mask);
    }

    #[test]
    fn varints_are_little_endian_groups_of_seven_bits() {
        assert_eq!(varint(1), [1]);
        assert_eq!(varint(300), [0xac, 0x02]);
        assert_eq!(varint(u64::MAX).len(), 10);
    }
}
