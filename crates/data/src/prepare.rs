//! A task's tokenized splits: its files read, its labels found and mapped, its texts tokenized,
//! through the cache when it is fresh.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::BadRow;
use crate::task::{read_rows, TextRows};
use crate::{
    load_cache, save_cache, DataError, Example, LabelSet, PairTokenizer, ReadOptions, Splits, Task, TaskData,
    REPORTED_ROWS,
};

/// How the splits were obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheUse {
    /// Read from a fresh cache.
    Loaded,
    /// Tokenized now (no cache file, or none asked for).
    Built,
    /// Tokenized now because the cache was stale or corrupt (the reason).
    Rebuilt(String),
}

/// A task's data, ready to train on.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The splits, labels, text columns, how each file was read and the rows skipped under
    /// `skip_bad` (from the cache as the first read found them).
    pub data: TaskData,
    /// How they were obtained.
    pub how: CacheUse,
}

/// Where the tokenized splits of `task` for the model in `model_dir` at `max_len` are cached:
/// under the task's name in the shared cache folder ([`ringtune_files::cache_dir`]); the user's
/// files under `files/`, one cache per training file.
pub fn cache_file(task: &Task, model_dir: &Path, max_len: usize) -> PathBuf {
    let model = model_dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let dir = ringtune_files::cache_dir().path.join(&task.name);
    match &task.source {
        crate::Source::Glue { .. } => dir.join(format!("{model}-{max_len}.bin")),
        crate::Source::Files { train, .. } => {
            let key = ringtune_files::hex(&Sha256::digest(train.to_string_lossy().as_bytes()));
            dir.join(format!("{model}-{max_len}-{}.bin", &key[..12]))
        }
    }
}

/// The fingerprint of a cache: tokenizer and settings, how each split is read, the labels
/// asked for, and the contents of the files (not where they are).
pub fn fingerprint(task: &Task, tokenizer: &PairTokenizer, options: ReadOptions) -> Result<[u8; 32], DataError> {
    let mut h = Sha256::new();
    h.update(tokenizer.fingerprint());
    h.update([options.skip_bad as u8]);
    h.update(task.name.as_bytes());
    h.update(format!("{:?}", task.labels()).as_bytes());
    for (split, path, layout) in task.split_files()? {
        let bytes = std::fs::read(&path).map_err(|source| DataError::Io { path: path.clone(), source })?;
        h.update(format!("{split}\0{layout:?}\0").as_bytes());
        h.update(Sha256::digest(&bytes));
    }
    Ok(h.finalize().into())
}

/// Tokenizes every split of `task` whose file is there, reading `cache` when it was built from
/// the same files and settings, and writing it otherwise. Every bad row of every file is an
/// error (the first file's listed) unless `options.skip_bad`, which skips and returns them.
pub fn prepare(
    task: &Task,
    tokenizer: &PairTokenizer,
    options: ReadOptions,
    cache: Option<&Path>,
) -> Result<Prepared, DataError> {
    let fp = fingerprint(task, tokenizer, options)?;
    let mut how = CacheUse::Built;
    if let Some(path) = cache.filter(|p| p.exists()) {
        match load_cache(path, &fp) {
            Ok(data) => return Ok(Prepared { data, how: CacheUse::Loaded }),
            Err(e @ (DataError::StaleCache { .. } | DataError::CorruptCache { .. })) => {
                how = CacheUse::Rebuilt(e.to_string())
            }
            Err(e) => return Err(e),
        }
    }
    let mut read = Vec::new();
    for (split, path, layout) in task.split_files()? {
        let mut rows = read_rows(&path, &layout)?;
        // Before the labels are learnt: a blank label is a bad row, never a class.
        rows.require_labels();
        read.push((split, rows));
    }
    let Some((_, train)) = read.iter().find(|(split, _)| split == "train") else {
        return Err(DataError::NoData(format!("task {} has no training file", task.name)));
    };
    for (split, rows) in &read {
        if is_labelled_split(split) && !rows.labelled {
            return Err(DataError::Unlabelled(rows.file.clone()));
        }
    }
    let labels = match task.labels() {
        Ok(fixed) => fixed,
        Err(hint) => {
            let written: Vec<&str> = train.rows.iter().filter_map(|r| r.label.as_deref()).collect();
            LabelSet::infer(&written, hint).map_err(|reason| DataError::Labels { file: train.file.clone(), reason })?
        }
    };
    let text_columns = train.text_columns.clone();
    let mut splits = Splits::new();
    let mut readings = std::collections::BTreeMap::new();
    let mut skipped = Vec::new();
    for (split, rows) in read {
        let (examples, rejected) = examples(&rows, &labels, tokenizer)?;
        skipped.extend(rows.bad.into_iter().chain(rejected));
        readings.insert(split.clone(), rows.reading);
        splits.insert(split, examples);
    }
    if !skipped.is_empty() && !options.skip_bad {
        return Err(bad_rows(&skipped));
    }
    let data = TaskData { labels, text_columns, splits, readings, skipped };
    if let Some(path) = cache {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| DataError::Io { path: dir.into(), source })?;
        }
        save_cache(path, &fp, &data)?;
    }
    Ok(Prepared { data, how })
}

/// Splits trained or scored on must have labels: a test-layout file in their place would
/// train and score against label 0.
fn is_labelled_split(split: &str) -> bool {
    split == "train" || split.starts_with("dev")
}

/// The error for the bad rows of the first file that has them, every one counted.
fn bad_rows(bad: &[BadRow]) -> DataError {
    let file = bad[0].file.clone();
    let mut rows: Vec<BadRow> = bad.iter().filter(|r| r.file == file).cloned().collect();
    rows.sort_by_key(|r| r.line);
    let total = rows.len();
    rows.truncate(REPORTED_ROWS);
    DataError::BadRows { file, rows, total }
}

/// The examples of `rows` (labels mapped by `labels`, texts tokenized), in order, and the rows
/// whose label is not one of them.
pub fn examples(
    rows: &TextRows,
    labels: &LabelSet,
    tokenizer: &PairTokenizer,
) -> Result<(Vec<Example>, Vec<BadRow>), DataError> {
    let mut kept = Vec::with_capacity(rows.rows.len());
    let mut rejected = Vec::new();
    for row in &rows.rows {
        match row.label.as_deref().map(|l| labels.encode(l)).transpose() {
            Ok(label) => kept.push((row, label)),
            Err(reason) => rejected.push(BadRow { file: rows.file.clone(), line: row.line, reason }),
        }
    }
    let texts: Vec<(&str, Option<&str>)> = kept.iter().map(|(r, _)| (r.a.as_str(), r.b.as_deref())).collect();
    let encoded = tokenizer.encode_texts(&texts)?;
    let examples = encoded.into_iter().zip(&kept).map(|(e, (_, label))| Example::new(e, *label)).collect();
    Ok((examples, rejected))
}
