//! Tokenized splits from a data folder, through the cache when it is fresh.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{load_cache, load_split, save_cache, DataError, PairTokenizer, ReadOptions, Splits};

/// The GLUE splits and their files.
pub const SPLITS: [(&str, &str); 3] = [("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv")];

/// The splits that must have labels: a test-layout file in their place would train and score
/// against label 0.
const LABELLED: [&str; 2] = ["train", "dev"];

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

/// Where the tokenized splits of the model in `model_dir` at `max_len` are cached: under
/// `mrpc/` in the shared cache folder ([`ringtune_files::cache_dir`]).
pub fn cache_file(model_dir: &Path, max_len: usize) -> PathBuf {
    let model = model_dir.file_name().map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    ringtune_files::cache_dir().path.join("mrpc").join(format!("{model}-{max_len}.bin"))
}

/// The fingerprint of a cache: tokenizer and settings, and the contents of the data files.
pub fn fingerprint(data: &Path, tokenizer: &PairTokenizer, options: ReadOptions) -> Result<[u8; 32], DataError> {
    let mut h = Sha256::new();
    h.update(tokenizer.fingerprint());
    h.update([options.skip_bad as u8]);
    for (_, file) in SPLITS {
        let path = data.join(file);
        if path.exists() {
            let bytes = std::fs::read(&path).map_err(|source| DataError::Io { path: path.clone(), source })?;
            h.update(file.as_bytes());
            h.update(Sha256::digest(&bytes));
        }
    }
    Ok(h.finalize().into())
}

/// Tokenizes every split present in `data` (train, dev, test), reading `cache` when it was
/// built from the same files and settings, and writing it otherwise.
pub fn prepare(
    data: &Path,
    tokenizer: &PairTokenizer,
    options: ReadOptions,
    cache: Option<&Path>,
) -> Result<(Splits, CacheUse, Vec<crate::BadRow>), DataError> {
    let fp = fingerprint(data, tokenizer, options)?;
    let mut how = CacheUse::Built;
    if let Some(path) = cache.filter(|p| p.exists()) {
        match load_cache(path, &fp) {
            Ok(splits) => return labelled(data, splits).map(|splits| (splits, CacheUse::Loaded, Vec::new())),
            Err(e @ (DataError::StaleCache { .. } | DataError::CorruptCache { .. })) => {
                how = CacheUse::Rebuilt(e.to_string())
            }
            Err(e) => return Err(e),
        }
    }
    let mut splits = Splits::new();
    let mut skipped = Vec::new();
    for (name, file) in SPLITS {
        let path = data.join(file);
        if !path.exists() {
            continue;
        }
        let (examples, dataset) = load_split(&path, tokenizer, options)?;
        skipped.extend(dataset.skipped);
        splits.insert(name.to_string(), examples);
    }
    if !splits.contains_key("train") {
        return Err(DataError::NoData(format!("{} has no train.tsv", data.display())));
    }
    let splits = labelled(data, splits)?;
    if let Some(path) = cache {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| DataError::Io { path: dir.into(), source })?;
        }
        save_cache(path, &fp, &splits)?;
    }
    Ok((splits, how, skipped))
}

fn labelled(data: &Path, splits: Splits) -> Result<Splits, DataError> {
    for (name, file) in SPLITS.into_iter().filter(|(name, _)| LABELLED.contains(name)) {
        if splits.get(name).is_some_and(|examples| examples.iter().any(|e| e.label.is_none())) {
            return Err(DataError::Unlabelled(data.join(file)));
        }
    }
    Ok(splits)
}
