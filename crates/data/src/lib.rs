//! Datasets for fine-tuning: GLUE's tasks and the user's own files, read, labelled, tokenized,
//! batched, ordered and sharded.
//!
//! Owns: tasks ([`Task`]: GLUE's nine by name, with their files, columns and fixed labels, or any
//! CSV, TSV or JSON-lines files with the columns found from the header), readers for GLUE's MRPC
//! files and MSR's originals (GLUE's train/dev split rebuilt from `dev_ids.tsv`), labels
//! ([`LabelSet`]: classes in a fixed, recorded order, or a regression score), bad-row reports
//! naming file and line, exact Hugging Face tokenization of pairs and single sentences through
//! the `tokenizers` crate, padded `i64` batches, the seeded per-epoch order, each node's rows of
//! each step ([`node_batches`]: `DistributedSampler`-style shards on the launch's nodes, the
//! same rows taken by the rest after a loss), the tokenized cache, and where MRPC lives.
//!
//! Does not own: the model (`encoders`), the training loop or the metrics (`trainer`). Everything
//! here is pure but for file reads and writes.
//!
//! ```
//! use ringtune_data::{epoch_order, node_batches, LabelHint, LabelSet};
//! let order = epoch_order(10, 42, 0);
//! // Four nodes, a global batch of 8: each node's rows of each step, every node as many steps.
//! let nodes: Vec<_> = (0..4).map(|r| node_batches(&order, 4, 8, 0, (r, 4))).collect();
//! assert!(nodes.iter().all(|steps| steps.len() == 2 && steps[0].rows.len() == 2));
//! let labels = LabelSet::infer(&["pos", "neg", "pos"], LabelHint::Infer).unwrap();
//! assert_eq!(labels.names(), ["neg", "pos"]);
//! ```

mod batch;
mod cache;
mod choice;
mod error;
mod label;
mod locate;
mod order;
mod prepare;
mod reader;
mod stats;
mod table;
mod task;
mod tokenize;

pub use batch::{batches, Batch, Example, Padding};
pub use cache::{load_cache, save_cache, Splits, TaskData, CACHE_VERSION};
pub use choice::TaskChoice;
pub use error::{BadRow, DataError, REPORTED_ROWS};
pub use label::{Label, LabelHint, LabelSet, Problem};
pub use locate::{data_dir, glue_dir, sha256_hex, DataDir, PINNED_SHA256};
pub use order::{
    epoch_order, group_by_length, node_batches, steps_per_epoch, NodeBatch, ShardMode, LENGTH_GROUP_BATCHES,
};
pub use prepare::{cache_file, examples, fingerprint, prepare, CacheUse, Prepared};
pub use reader::{
    glue_labelled_tsv, glue_split, glue_test_tsv, parse_pairs, read_dev_ids, read_pairs, Dataset, GlueFiles, Layout,
    Pair, ReadOptions,
};
pub use stats::SplitStats;
pub use table::{parse_table, Format, Quoting, Table, TableRow};
pub use task::{default_columns, read_rows, Columns, FileLayout, GlueTask, Source, Task, TextRow, TextRows};
pub use tokenize::{Encoded, PairTokenizer};

/// Reads a file laid out as `layout` and makes its examples with `labels`: the rows it could
/// read, in order, the examples of those whose label maps, and every bad row (a labelled
/// file's row without a label among them). With `skip_bad` false, any bad row is an error
/// naming file and line.
pub fn load_file(
    path: &std::path::Path,
    layout: &FileLayout,
    labels: &LabelSet,
    tokenizer: &PairTokenizer,
    options: ReadOptions,
) -> Result<(Vec<Example>, TextRows), DataError> {
    let mut rows = read_rows(path, layout)?;
    rows.require_labels();
    let (examples, rejected) = examples(&rows, labels, tokenizer)?;
    if !rejected.is_empty() {
        // Keep `rows` in step with the examples: the rows whose label was refused go.
        let refused: std::collections::HashSet<usize> = rejected.iter().map(|r| r.line).collect();
        rows.rows.retain(|r| !refused.contains(&r.line));
        rows.bad.extend(rejected);
        rows.bad.sort_by_key(|r| r.line);
    }
    if !rows.bad.is_empty() && !options.skip_bad {
        let total = rows.bad.len();
        let mut listed = rows.bad.clone();
        listed.truncate(REPORTED_ROWS);
        return Err(DataError::BadRows { file: path.into(), rows: listed, total });
    }
    Ok((examples, rows))
}
