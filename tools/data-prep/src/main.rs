//! `data-prep`: any task's files (a GLUE task, MRPC by default, or your own CSV, TSV or JSON
//! lines) to ringtune's tokenized cache, with statistics and every bad row by file and line;
//! `data-prep fetch` gets MRPC (`just data`), `data-prep locate` prints where it is.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use ringtune_data::{
    cache_file, data_dir, glue_labelled_tsv, glue_split, glue_test_tsv, prepare, read_dev_ids, read_pairs, sha256_hex,
    CacheUse, PairTokenizer, Problem, Quoting, ReadOptions, SplitStats, TaskChoice, PINNED_SHA256,
};

/// Tokenizes a task's splits into the cache that training loads instantly, with the same task
/// flags as `ringtune train`.
#[derive(Parser)]
#[command(version)]
struct Args {
    #[command(subcommand)]
    command: Option<MrpcCommand>,
    /// GLUE task: cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli (default: mrpc).
    #[arg(long)]
    task: Option<String>,
    /// The GLUE task's folder (mrpc: MRPC_DIR, data/mrpc, ../shared/data/mrpc; others:
    /// GLUE_DIR/<Task>, data/<Task>).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Your own training file instead of a GLUE task: .csv, .tsv or .jsonl.
    #[arg(long)]
    train_file: Option<PathBuf>,
    /// Your validation file.
    #[arg(long)]
    validation_file: Option<PathBuf>,
    /// Your test file.
    #[arg(long)]
    test_file: Option<PathBuf>,
    /// Text columns of your files, one or two, comma separated.
    #[arg(long, value_delimiter = ',')]
    text_columns: Option<Vec<String>>,
    /// Label column of your files (default: label).
    #[arg(long)]
    label_column: Option<String>,
    /// How your .tsv files quote: csv or none (default: csv only when the whole file reads so).
    #[arg(long)]
    quoting: Option<Quoting>,
    /// Outputs of the head (default: the number of training labels; 1: a regression).
    #[arg(long)]
    num_labels: Option<usize>,
    /// Model folder with tokenizer.json or vocab.txt.
    #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
    model: PathBuf,
    /// Maximum tokens per pair (truncation longest_first).
    #[arg(long, default_value_t = 128)]
    max_len: usize,
    /// Cache file (default: .cache/<task>/<model>-<max_len>.bin).
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Skip malformed rows (and report how many) instead of failing.
    #[arg(long)]
    skip_bad: bool,
    /// Write each pair's input_ids, token_type_ids, attention_mask as JSON lines.
    #[arg(long)]
    dump: Option<PathBuf>,
    /// The split to dump.
    #[arg(long, default_value = "dev")]
    dump_split: String,
}

#[derive(Subcommand)]
enum MrpcCommand {
    /// Finds or downloads MRPC and checks it against the pinned sha256s.
    Fetch {
        /// Where to put downloaded files.
        #[arg(long, default_value = "data/mrpc")]
        dest: PathBuf,
    },
    /// Prints the folder MRPC is read from, found as `ringtune train` finds it.
    Locate,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let root = workspace_root();
    match &args.command {
        Some(MrpcCommand::Fetch { dest }) => return fetch(&root, &root.join(dest)),
        Some(MrpcCommand::Locate) => {
            println!("{}", data_dir(&root)?.path.display());
            return Ok(());
        }
        None => {}
    }
    let choice = TaskChoice {
        task: args.task.clone(),
        data: args.data.clone(),
        train_file: args.train_file.clone(),
        validation_file: args.validation_file.clone(),
        test_file: args.test_file.clone(),
        text_columns: args.text_columns.clone(),
        label_column: args.label_column.clone(),
        quoting: args.quoting,
        num_labels: args.num_labels,
    };
    // Relative paths are the caller's, as `ringtune train` takes them.
    let task = choice.task(&std::env::current_dir()?)?;
    let model = if args.model.is_absolute() { args.model.clone() } else { root.join(&args.model) };
    let tokenizer = PairTokenizer::from_model_dir(&model, args.max_len)?;
    let cache = args.cache.clone().unwrap_or_else(|| cache_file(&task, &model, args.max_len));
    let started = Instant::now();
    let options = ReadOptions { skip_bad: args.skip_bad };
    let prepared = prepare(&task, &tokenizer, options, Some(&cache))?;
    let (splits, how, skipped) = (&prepared.data.splits, &prepared.how, &prepared.data.skipped);
    let data = match &task.source {
        ringtune_data::Source::Glue { dir, .. } => dir.display().to_string(),
        ringtune_data::Source::Files { train, .. } => train.display().to_string(),
    };
    let what = match how {
        CacheUse::Loaded => "loaded from the cache".to_string(),
        CacheUse::Built => "tokenized".to_string(),
        CacheUse::Rebuilt(why) => format!("tokenized again ({why})"),
    };
    let labels = &prepared.data.labels;
    let labels = match labels.problem() {
        Problem::Regression => "a score (regression)".to_string(),
        Problem::Classification => labels.names().join(", "),
    };
    println!(
        "task   {}\ndata   {data}\ntext   {}\nlabels {labels}\nmodel  {}\ncache  {} ({what}, {:.2} s)",
        task.name,
        prepared.data.text_columns.join(", "),
        model.display(),
        cache.display(),
        started.elapsed().as_secs_f64()
    );
    for (name, examples) in splits {
        println!("{name:<6} {}", SplitStats::of(examples));
    }
    if !skipped.is_empty() {
        println!("skipped {} bad row(s):", skipped.len());
        for row in skipped.iter().take(ringtune_data::REPORTED_ROWS) {
            println!("  {row}");
        }
    }
    if let Some(path) = &args.dump {
        let examples = splits.get(&args.dump_split).with_context(|| format!("no split `{}`", args.dump_split))?;
        let mut out = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
        );
        for e in examples {
            let line = serde_json::json!({
                "input_ids": e.ids, "token_type_ids": e.type_ids, "attention_mask": vec![1; e.ids.len()],
            });
            writeln!(out, "{line}")?;
        }
        out.flush()?;
        println!("dumped {} pairs of {} to {}", examples.len(), args.dump_split, path.display());
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap_or_else(|_| PathBuf::from("."))
}

/// GLUE's sources (`download_glue_data.py`).
const SOURCES: &[(&str, &str)] = &[
    ("msr_paraphrase_train.txt", "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_train.txt"),
    ("msr_paraphrase_test.txt", "https://dl.fbaipublicfiles.com/senteval/senteval_data/msr_paraphrase_test.txt"),
    (
        "dev_ids.tsv",
        "https://firebasestorage.googleapis.com/v0/b/mtl-sentence-representations.appspot.com/o/data%2Fmrpc_dev_ids.tsv?alt=media&token=ec5c0836-31d5-48f4-b431-7480817f1adc",
    ),
];

/// Uses the data that is there (checked), or downloads the MSR originals and builds GLUE's
/// three files from them, checked against the pinned hashes.
fn fetch(root: &Path, dest: &Path) -> Result<()> {
    if let Ok(found) = data_dir(root) {
        verify(&found.path)?;
        println!("MRPC found in {} ({}), checksums match", found.path.display(), found.origin);
        return Ok(());
    }
    std::fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    for (file, url) in SOURCES {
        let target = dest.join(file);
        if target.exists() {
            continue;
        }
        let partial = dest.join(format!(".{file}.partial"));
        let status = Command::new("curl").args(["-fsSL", "--retry", "2", "-o"]).arg(&partial).arg(url).status();
        let ok = matches!(status, Ok(s) if s.success());
        if !ok {
            let _ = std::fs::remove_file(&partial);
            bail!(
                "could not download {file} from {url} (no network, or curl missing). Download these files by hand into {}: {}; \
                 or set MRPC_DIR to a folder with GLUE's train.tsv, dev.tsv and test.tsv. The corpus is under the MSR-SSLA \
                 licence (non-commercial).",
                dest.display(),
                SOURCES.iter().map(|(f, u)| format!("{f} <{u}>")).collect::<Vec<_>>().join(", ")
            );
        }
        std::fs::rename(&partial, &target)?;
    }
    let train = read_pairs(&dest.join("msr_paraphrase_train.txt"), ReadOptions::default())?;
    let test = read_pairs(&dest.join("msr_paraphrase_test.txt"), ReadOptions::default())?;
    let ids = read_dev_ids(&dest.join("dev_ids.tsv"))?;
    let (train_pairs, dev_pairs) = glue_split(&train, &ids);
    ringtune_files::write_atomically(&dest.join("train.tsv"), glue_labelled_tsv(&train_pairs).as_bytes())?;
    ringtune_files::write_atomically(&dest.join("dev.tsv"), glue_labelled_tsv(&dev_pairs).as_bytes())?;
    ringtune_files::write_atomically(&dest.join("test.tsv"), glue_test_tsv(&test.pairs).as_bytes())?;
    verify(dest)?;
    println!("MRPC downloaded and built in {}, checksums match", dest.display());
    Ok(())
}

/// Checks every pinned file that is present; the three GLUE files must be.
fn verify(dir: &Path) -> Result<()> {
    for (file, expected) in PINNED_SHA256 {
        let path = dir.join(file);
        let required = file.ends_with(".tsv") && *file != "dev_ids.tsv";
        if !path.exists() {
            if required {
                bail!("{} is missing", path.display());
            }
            continue;
        }
        let actual = sha256_hex(&path)?;
        if &actual != expected {
            bail!(
                "{} has sha256 {actual}, expected {expected}: the file is not GLUE's; replace it (`just data`)",
                path.display()
            );
        }
    }
    Ok(())
}
