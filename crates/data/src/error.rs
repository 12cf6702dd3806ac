//! Errors of the data pipeline.

use std::fmt;
use std::path::PathBuf;

/// One malformed line of a data file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BadRow {
    /// The file.
    pub file: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.reason)
    }
}

/// How many bad rows an error lists before it only counts them.
pub const REPORTED_ROWS: usize = 20;

/// What can go wrong reading, tokenizing or caching the data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The header is not one of the known MRPC layouts.
    #[error("{file}:1: unexpected header `{found}`; expected `{expected}`")]
    Header {
        /// The file.
        file: PathBuf,
        /// The header found.
        found: String,
        /// The expected one.
        expected: String,
    },
    /// Malformed rows (all of them counted, the first ones listed); `--skip-bad` skips them.
    #[error("{} bad row(s) in {}:\n{}{}\n(use --skip-bad to skip them)", .total, .file.display(),
        .rows.iter().map(|r| format!("  {r}")).collect::<Vec<_>>().join("\n"),
        if *.total > .rows.len() { format!("\n  ... and {} more", .total - .rows.len()) } else { String::new() })]
    BadRows {
        /// The file.
        file: PathBuf,
        /// The first bad rows.
        rows: Vec<BadRow>,
        /// How many there are in all.
        total: usize,
    },
    /// A file that cannot be read as its format at all (a JSON file that is not JSON).
    #[error("{}: {reason}", .file.display())]
    BadFile {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The columns asked for (or the default ones) are not in a file.
    #[error("{}: {reason}", .file.display())]
    Columns {
        /// The file.
        file: PathBuf,
        /// Which column is missing, and the file's columns.
        reason: String,
    },
    /// The training labels make no task (one class only, too many for --num-labels, ...).
    #[error("{}: {reason}", .file.display())]
    Labels {
        /// The training file.
        file: PathBuf,
        /// Why.
        reason: String,
    },
    /// The tokenizer could not be loaded or failed.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer {
        /// The tokenizer file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A tokenized cache that does not match the data or settings.
    #[error("tokenized cache {path} is stale ({reason}); rebuild it with `data-prep`")]
    StaleCache {
        /// The cache file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A damaged tokenized cache.
    #[error("tokenized cache {path} is corrupt ({reason}); delete it and run `data-prep` again")]
    CorruptCache {
        /// The cache file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A split that must have labels is laid out as the unlabelled test split.
    #[error("{}: no labels (laid out as GLUE's test split, `index` first): training needs the labelled train.tsv and dev.tsv", .0.display())]
    Unlabelled(PathBuf),
    /// No data folder could be found.
    #[error("no data: {0}")]
    NoData(String),
    /// Invalid settings (batch size 0, rank out of range, ...).
    #[error("{0}")]
    Settings(String),
}
