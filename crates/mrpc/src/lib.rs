//! GLUE MRPC for training: reading, tokenizing, batching, ordering and sharding.
//!
//! Owns: readers for GLUE's TSV files and MSR's originals (GLUE's train/dev split rebuilt from
//! `dev_ids.tsv`), bad-row reports naming file and line, exact Hugging Face pair tokenization
//! through the `tokenizers` crate, padded `i64` batches, the seeded per-epoch order and
//! `DistributedSampler`-style shards, the tokenized cache, and where the data lives.
//!
//! Does not own: the model (`bert`) or the training loop (`trainer`). Everything here is pure
//! but for file reads and writes.
//!
//! ```
//! use ringtune_mrpc::{epoch_order, shard, ShardMode};
//! let order = epoch_order(10, 42, 0);
//! let shards: Vec<Vec<usize>> = (0..4).map(|r| shard(&order, r, 4, ShardMode::Pad).unwrap()).collect();
//! assert!(shards.iter().all(|s| s.len() == 3));
//! ```

mod batch;
mod cache;
mod error;
mod locate;
mod order;
mod prepare;
mod reader;
mod stats;
mod tokenize;

pub use batch::{batches, Batch, Example, Padding};
pub use cache::{load_cache, save_cache, Splits, CACHE_VERSION};
pub use error::{BadRow, DataError, REPORTED_ROWS};
pub use locate::{data_dir, sha256_hex, DataDir, PINNED_SHA256};
pub use order::{epoch_order, shard, steps_per_epoch, ShardMode};
pub use prepare::{cache_file, fingerprint, prepare, CacheUse, SPLITS};
pub use reader::{
    glue_labelled_tsv, glue_split, glue_test_tsv, parse_pairs, read_dev_ids, read_pairs, Dataset, GlueFiles, Layout,
    Pair, ReadOptions,
};
pub use stats::SplitStats;
pub use tokenize::{Encoded, PairTokenizer};

/// Reads a split and tokenizes it into examples.
pub fn load_split(
    path: &std::path::Path,
    tokenizer: &PairTokenizer,
    options: ReadOptions,
) -> Result<(Vec<Example>, Dataset), DataError> {
    let data = read_pairs(path, options)?;
    let pairs: Vec<(&str, &str)> = data.pairs.iter().map(|p| (p.a.as_str(), p.b.as_str())).collect();
    let encoded = tokenizer.encode_pairs(&pairs)?;
    let examples = encoded.into_iter().zip(&data.pairs).map(|(e, p)| Example::new(e, p.label)).collect();
    Ok((examples, data))
}
