//! The tokenized cache: every split's examples in one binary file, with a versioned header,
//! the hash of the tokenizer, settings and source files it was built from, and a checksum.
//!
//! Layout (little endian): magic `RTDATA01`, version `u32`, fingerprint `[u8; 32]`; the task's
//! labels, text columns, how each split's file was read and the rows skipped as bad, as JSON
//! (length `u32`, then the text); split count `u32`; per split:
//! name length `u16` and name, example count `u32`, then per example the label (tag `u8`: 0
//! none, 1 a class then `u32`, 2 a score then `f32`), truncated `u8`, length `u16`, ids
//! `u32 x len`, types `u8 x len`; last, the sha256 of everything before it.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{BadRow, DataError};
use crate::{Example, Label, LabelSet, Problem};

const MAGIC: &[u8; 8] = b"RTDATA01";
/// The cache format version; a different one is stale.
pub const CACHE_VERSION: u32 = 3;

/// Tokenized splits by name (`train`, `dev`, `test`, ...).
pub type Splits = BTreeMap<String, Vec<Example>>;

/// A task's tokenized splits, its labels, the text columns they were read from, how each
/// split's file was read and the rows left out as bad.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskData {
    /// The labels (classes in id order, or a score).
    pub labels: LabelSet,
    /// The text columns of the training file.
    pub text_columns: Vec<String>,
    /// The splits.
    pub splits: Splits,
    /// How each split's file was read (the columns and why, a TSV's quoting), by split.
    pub readings: BTreeMap<String, String>,
    /// The rows skipped as bad (`--skip-bad`), by file and line: a run from the cache reports
    /// them as the run that read the files did.
    pub skipped: Vec<BadRow>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    regression: bool,
    names: Vec<String>,
    text_columns: Vec<String>,
    readings: BTreeMap<String, String>,
    skipped: Vec<BadRow>,
}

/// Writes the cache atomically.
pub fn save_cache(path: &Path, fingerprint: &[u8; 32], data: &TaskData) -> Result<(), DataError> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&CACHE_VERSION.to_le_bytes());
    out.extend_from_slice(fingerprint);
    let header = Header {
        regression: data.labels.problem() == Problem::Regression,
        names: data.labels.names().to_vec(),
        text_columns: data.text_columns.clone(),
        readings: data.readings.clone(),
        skipped: data.skipped.clone(),
    };
    let header = serde_json::to_vec(&header)
        .map_err(|e| DataError::CorruptCache { path: path.into(), reason: e.to_string() })?;
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    let splits = &data.splits;
    out.extend_from_slice(&(splits.len() as u32).to_le_bytes());
    for (name, examples) in splits {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(examples.len() as u32).to_le_bytes());
        for e in examples {
            match e.label {
                None => out.push(0),
                Some(Label::Class(c)) => {
                    out.push(1);
                    out.extend_from_slice(&c.to_le_bytes());
                }
                Some(Label::Score(s)) => {
                    out.push(2);
                    out.extend_from_slice(&s.to_le_bytes());
                }
            }
            out.push(e.truncated as u8);
            out.extend_from_slice(&(e.ids.len() as u16).to_le_bytes());
            for id in &e.ids {
                out.extend_from_slice(&id.to_le_bytes());
            }
            out.extend_from_slice(&e.type_ids);
        }
    }
    let checksum: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&checksum);
    // Several processes (the ranks of one machine) may write the same cache at once: each
    // writes its own temporary file and the last rename wins, with identical contents.
    ringtune_files::write_atomically(path, &out).map_err(|e| DataError::Io { path: e.path, source: e.source })
}

/// Reads the cache; a different fingerprint or version is stale, damage is corrupt.
pub fn load_cache(path: &Path, fingerprint: &[u8; 32]) -> Result<TaskData, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
    let corrupt = |reason: &str| DataError::CorruptCache { path: path.into(), reason: reason.into() };
    if bytes.len() < MAGIC.len() + 4 + 32 + 4 + 32 || &bytes[..8] != MAGIC {
        return Err(corrupt("not a ringtune data cache"));
    }
    let (body, checksum) = bytes.split_at(bytes.len() - 32);
    if Sha256::digest(body).as_slice() != checksum {
        return Err(corrupt("checksum mismatch"));
    }
    let mut r = Cursor { bytes: body, at: 8 };
    let version = r.u32().ok_or_else(|| corrupt("truncated header"))?;
    if version != CACHE_VERSION {
        return Err(DataError::StaleCache {
            path: path.into(),
            reason: format!("format version {version}, this build reads {CACHE_VERSION}"),
        });
    }
    if r.take(32).ok_or_else(|| corrupt("truncated header"))? != fingerprint {
        return Err(DataError::StaleCache {
            path: path.into(),
            reason: "built from another tokenizer, other settings or other data files".into(),
        });
    }
    let header_len = r.u32().ok_or_else(|| corrupt("truncated header"))? as usize;
    let header: Header = r
        .take(header_len)
        .and_then(|bytes| serde_json::from_slice(bytes).ok())
        .ok_or_else(|| corrupt("unreadable labels"))?;
    let labels = if header.regression { LabelSet::regression() } else { LabelSet::classes(&header.names) };
    let mut splits = Splits::new();
    let count = r.u32().ok_or_else(|| corrupt("truncated header"))?;
    for _ in 0..count {
        let name_len = r.u16().ok_or_else(|| corrupt("truncated split"))? as usize;
        let name = String::from_utf8(r.take(name_len).ok_or_else(|| corrupt("truncated split"))?.to_vec())
            .map_err(|_| corrupt("split name is not UTF-8"))?;
        let n = r.u32().ok_or_else(|| corrupt("truncated split"))? as usize;
        let mut examples = Vec::with_capacity(n);
        for _ in 0..n {
            let e = r.example().ok_or_else(|| corrupt("truncated example"))?;
            examples.push(e);
        }
        splits.insert(name, examples);
    }
    if r.at != body.len() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(TaskData {
        labels,
        text_columns: header.text_columns,
        splits,
        readings: header.readings,
        skipped: header.skipped,
    })
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.bytes.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn example(&mut self) -> Option<Example> {
        let label = match self.take(1)?[0] {
            0 => None,
            1 => Some(Label::Class(self.u32()?)),
            2 => Some(Label::Score(f32::from_bits(self.u32()?))),
            _ => return None,
        };
        let truncated = self.take(1)?[0] != 0;
        let len = self.u16()? as usize;
        let ids = self.take(len * 4)?.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let type_ids = self.take(len)?.to_vec();
        Some(Example { ids, type_ids, label, truncated })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> TaskData {
        let e =
            |n: u32, label| Example { ids: (0..n).collect(), type_ids: vec![0; n as usize], label, truncated: n > 3 };
        let splits = [
            ("train".to_string(), vec![e(3, Some(Label::Class(1))), e(5, Some(Label::Score(-2.5)))]),
            ("test".to_string(), vec![e(2, None)]),
        ];
        TaskData {
            labels: LabelSet::classes(&["no", "yes"]),
            text_columns: vec!["text".into()],
            splits: splits.into(),
            readings: [("train".to_string(), "text from `text`".to_string())].into(),
            skipped: vec![BadRow { file: "train.csv".into(), line: 4, reason: "empty label".into() }],
        }
    }

    #[test]
    fn round_trip_stale_and_corrupt() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("mrpc.cache");
        let fp = [7u8; 32];
        save_cache(&path, &fp, &data()).expect("save");
        assert_eq!(load_cache(&path, &fp).expect("load"), data());
        let regression = TaskData { labels: LabelSet::regression(), ..data() };
        save_cache(&path, &fp, &regression).expect("save");
        assert_eq!(load_cache(&path, &fp).expect("load"), regression);
        save_cache(&path, &fp, &data()).expect("save");
        let stale = load_cache(&path, &[8u8; 32]).expect_err("stale");
        assert!(matches!(stale, DataError::StaleCache { .. }) && stale.to_string().contains("data-prep"), "{stale}");
        let mut bytes = std::fs::read(&path).expect("read");
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        assert!(matches!(load_cache(&path, &fp), Err(DataError::CorruptCache { .. })));
        std::fs::write(&path, &bytes[..20]).expect("truncate");
        assert!(matches!(load_cache(&path, &fp), Err(DataError::CorruptCache { .. })));
    }
}
