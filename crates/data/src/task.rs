//! Tasks: GLUE's nine by name (their files, columns and fixed labels) and the user's own files,
//! and the rows of text a split's file holds.

use std::path::{Path, PathBuf};

use crate::error::{BadRow, DataError};
use crate::label::{LabelHint, LabelSet};
use crate::reader::{read_pairs, ReadOptions};
use crate::table::{parse_table, Format, Quoting, Table};

/// GLUE's tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GlueTask {
    /// Corpus of Linguistic Acceptability (single sentences, Matthews correlation).
    Cola,
    /// Stanford Sentiment Treebank (single sentences).
    Sst2,
    /// Microsoft Research Paraphrase Corpus (pairs, accuracy and F1).
    Mrpc,
    /// Quora Question Pairs (pairs, accuracy and F1).
    Qqp,
    /// Semantic Textual Similarity Benchmark (pairs, a 0-5 score: Pearson and Spearman).
    Stsb,
    /// Multi-Genre NLI (pairs, 3 classes; matched and mismatched dev sets).
    Mnli,
    /// Question NLI (pairs).
    Qnli,
    /// Recognizing Textual Entailment (pairs).
    Rte,
    /// Winograd NLI (pairs).
    Wnli,
}

impl GlueTask {
    /// Every task, in GLUE's order.
    pub const ALL: [GlueTask; 9] = [
        GlueTask::Cola,
        GlueTask::Sst2,
        GlueTask::Mrpc,
        GlueTask::Qqp,
        GlueTask::Stsb,
        GlueTask::Mnli,
        GlueTask::Qnli,
        GlueTask::Rte,
        GlueTask::Wnli,
    ];

    /// The task's name as `run_glue.py` takes it (`sst2`).
    pub fn name(self) -> &'static str {
        match self {
            GlueTask::Cola => "cola",
            GlueTask::Sst2 => "sst2",
            GlueTask::Mrpc => "mrpc",
            GlueTask::Qqp => "qqp",
            GlueTask::Stsb => "stsb",
            GlueTask::Mnli => "mnli",
            GlueTask::Qnli => "qnli",
            GlueTask::Rte => "rte",
            GlueTask::Wnli => "wnli",
        }
    }

    /// The task named `name` (case-insensitive; `sst-2` and `sts-b` as GLUE's folders spell them).
    pub fn from_name(name: &str) -> Result<Self, DataError> {
        let wanted = name.to_ascii_lowercase().replace('-', "");
        Self::ALL.into_iter().find(|t| t.name() == wanted).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|t| t.name()).collect();
            DataError::Settings(format!(
                "unknown task `{name}`: one of {}, or your own files with --train-file",
                names.join(", ")
            ))
        })
    }

    /// The folder GLUE's download script puts the task in (`SST-2`).
    pub fn folder(self) -> &'static str {
        match self {
            GlueTask::Cola => "CoLA",
            GlueTask::Sst2 => "SST-2",
            GlueTask::Mrpc => "MRPC",
            GlueTask::Qqp => "QQP",
            GlueTask::Stsb => "STS-B",
            GlueTask::Mnli => "MNLI",
            GlueTask::Qnli => "QNLI",
            GlueTask::Rte => "RTE",
            GlueTask::Wnli => "WNLI",
        }
    }

    /// The labels, in the order of Hugging Face's `glue` dataset, written as GLUE's files write
    /// them.
    pub fn labels(self) -> LabelSet {
        match self {
            GlueTask::Stsb => LabelSet::regression(),
            GlueTask::Mnli => LabelSet::classes(&["entailment", "neutral", "contradiction"]),
            GlueTask::Qnli | GlueTask::Rte => LabelSet::classes(&["entailment", "not_entailment"]),
            _ => LabelSet::classes(&["0", "1"]),
        }
    }

    /// The splits and their files.
    pub fn splits(self) -> &'static [(&'static str, &'static str)] {
        match self {
            GlueTask::Mnli => &[
                ("train", "train.tsv"),
                ("dev", "dev_matched.tsv"),
                ("dev_mismatched", "dev_mismatched.tsv"),
                ("test", "test_matched.tsv"),
                ("test_mismatched", "test_mismatched.tsv"),
            ],
            _ => &[("train", "train.tsv"), ("dev", "dev.tsv"), ("test", "test.tsv")],
        }
    }

    /// How `path`, a file of this task's (a labelled split's, or a test split's as GLUE ships
    /// them), is laid out: only CoLA's differ, told apart by the test file's header line.
    pub fn layout_of_file(self, path: &Path) -> Result<FileLayout, DataError> {
        if self != GlueTask::Cola {
            return Ok(self.file_layout("dev"));
        }
        use std::io::BufRead;
        // The header line only: the rows are read once, by `read_rows`.
        let io = |source| DataError::Io { path: path.into(), source };
        let mut first = Vec::new();
        std::io::BufReader::new(std::fs::File::open(path).map_err(io)?).read_until(b'\n', &mut first).map_err(io)?;
        let split = if first.starts_with(b"index\tsentence") { "test" } else { "dev" };
        Ok(self.file_layout(split))
    }

    /// How a split's file is laid out (MRPC has a reader of its own, see [`FileLayout::Mrpc`]).
    pub fn file_layout(self, split: &str) -> FileLayout {
        let (text, label, id): (&[&str], &str, &str) = match self {
            GlueTask::Mrpc => return FileLayout::Mrpc,
            // CoLA's train and dev files have no header: source, label, original label, sentence.
            GlueTask::Cola if !split.starts_with("test") => {
                return FileLayout::table(Format::TsvUnquoted, false, &["3"], "1", None);
            }
            GlueTask::Cola | GlueTask::Sst2 => (&["sentence"], "label", "index"),
            GlueTask::Qqp => (&["question1", "question2"], "is_duplicate", "id"),
            GlueTask::Stsb => (&["sentence1", "sentence2"], "score", "index"),
            GlueTask::Mnli => (&["sentence1", "sentence2"], "gold_label", "index"),
            GlueTask::Qnli => (&["question", "sentence"], "label", "index"),
            GlueTask::Rte | GlueTask::Wnli => (&["sentence1", "sentence2"], "label", "index"),
        };
        FileLayout::table(Format::TsvUnquoted, true, text, label, Some(id))
    }
}

/// Which columns of a table hold the texts, the label and the row's id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Columns {
    /// One column (single sentences) or two (pairs).
    pub text: Vec<String>,
    /// The label's column; a file without it is unlabelled (a test split).
    pub label: String,
    /// The column that names a row in predictions (else its position).
    pub id: Option<String>,
}

/// How one file is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FileLayout {
    /// GLUE's MRPC files and MSR's originals ([`read_pairs`]).
    Mrpc,
    /// A table.
    Table {
        /// Its format.
        format: Format,
        /// Whether the first row names the columns.
        header: bool,
        /// The columns asked for (`None`: found from the header, see [`default_columns`]).
        columns: Option<Columns>,
    },
}

impl FileLayout {
    fn table(format: Format, header: bool, text: &[&str], label: &str, id: Option<&str>) -> Self {
        FileLayout::Table {
            format,
            header,
            columns: Some(Columns {
                text: text.iter().map(|t| t.to_string()).collect(),
                label: label.into(),
                id: id.map(str::to_string),
            }),
        }
    }

    /// A user's file: its format from its name (a `.tsv` read with `quoting`, else as
    /// [`Format::Tsv`] detects), with the columns asked for (any `None` found from the header).
    pub fn for_file(
        path: &Path,
        text: Option<&[String]>,
        label: Option<&str>,
        quoting: Option<Quoting>,
    ) -> Result<Self, DataError> {
        let format = Format::from_path(path).ok_or_else(|| {
            DataError::Settings(format!(
                "{}: unknown file type; name it .csv, .tsv or .jsonl (JSON lines)",
                path.display()
            ))
        })?;
        let format = quoting.map_or(format, |q| format.with_quoting(q));
        let columns = match (text, label) {
            (None, None) => None,
            (text, label) => Some(Columns {
                text: text.map(<[String]>::to_vec).unwrap_or_default(),
                label: label.unwrap_or("label").to_string(),
                id: None,
            }),
        };
        Ok(FileLayout::Table { format, header: true, columns })
    }
}

/// Columns that name a row rather than hold text.
const ID_COLUMNS: [&str; 3] = ["idx", "id", "index"];

/// The columns `run_glue.py` would pick from a header whose label is in `label`, and why:
/// `sentence1` and `sentence2`; else the first two columns that are neither the label nor an id
/// (`idx`, `id`, `index`); else the first such column. The id is the first of `idx`, `id`,
/// `index` there. `None`: no column but the label and ids.
pub fn default_columns(columns: &[String], label: &str) -> Option<(Columns, &'static str)> {
    let has = |name: &str| columns.iter().any(|c| c == name);
    let others: Vec<&String> = columns.iter().filter(|c| *c != label && !ID_COLUMNS.contains(&c.as_str())).collect();
    let (text, why): (Vec<String>, _) = if has("sentence1")
        && has("sentence2")
        && label != "sentence1"
        && label != "sentence2"
    {
        (vec!["sentence1".into(), "sentence2".into()], "the columns named sentence1 and sentence2")
    } else if others.len() >= 2 {
        (others[..2].iter().map(|c| c.to_string()).collect(), "the first two columns that are not the label or an id")
    } else {
        (vec![others.first()?.to_string()], "the only column that is not the label or an id")
    };
    let id = ID_COLUMNS.into_iter().find(|c| has(c)).map(str::to_string);
    Some((Columns { text, label: label.into(), id }, why))
}

/// Where a task's data comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A GLUE task's files in a folder.
    Glue {
        /// The task.
        task: GlueTask,
        /// The folder with its files.
        dir: PathBuf,
    },
    /// The user's own files.
    Files {
        /// Training data.
        train: PathBuf,
        /// Scored after each epoch.
        validation: Option<PathBuf>,
        /// Predicted by `ringtune predict`.
        test: Option<PathBuf>,
        /// The text columns (one or two; default: from the header).
        text_columns: Option<Vec<String>>,
        /// The label column (default: `label`).
        label_column: Option<String>,
        /// How a `.tsv` file quotes (default: detected).
        quoting: Option<Quoting>,
        /// What the labels are (default: found from the training labels).
        hint: LabelHint,
    },
}

/// A task: its name and where its data is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Task {
    /// `mrpc`, `sst2`, ... or `files`.
    pub name: String,
    /// The data.
    pub source: Source,
}

impl Task {
    /// GLUE's `task` with its files in `dir`.
    pub fn glue(task: GlueTask, dir: &Path) -> Self {
        Task { name: task.name().into(), source: Source::Glue { task, dir: dir.to_path_buf() } }
    }

    /// The GLUE task, if it is one.
    pub fn glue_task(&self) -> Option<GlueTask> {
        match &self.source {
            Source::Glue { task, .. } => Some(*task),
            Source::Files { .. } => None,
        }
    }

    /// The splits whose files exist (a GLUE folder may lack dev or test) or were named (a
    /// named file that is missing is an error when it is read), with how each is read.
    pub fn split_files(&self) -> Result<Vec<(String, PathBuf, FileLayout)>, DataError> {
        match &self.source {
            Source::Glue { task, dir } => Ok(task
                .splits()
                .iter()
                .map(|(split, file)| (split.to_string(), dir.join(file), task.file_layout(split)))
                .filter(|(_, path, _)| path.exists())
                .collect()),
            Source::Files { train, validation, test, text_columns, label_column, quoting, .. } => {
                let named = [("train", Some(train)), ("dev", validation.as_ref()), ("test", test.as_ref())];
                named
                    .into_iter()
                    .filter_map(|(split, path)| path.map(|p| (split, p)))
                    .map(|(split, path)| {
                        let layout =
                            FileLayout::for_file(path, text_columns.as_deref(), label_column.as_deref(), *quoting)?;
                        Ok((split.to_string(), path.clone(), layout))
                    })
                    .collect()
            }
        }
    }

    /// The labels the task fixes, or how to find them from the training labels.
    pub fn labels(&self) -> Result<LabelSet, LabelHint> {
        match &self.source {
            Source::Glue { task, .. } => Ok(task.labels()),
            Source::Files { hint, .. } => Err(*hint),
        }
    }
}

/// One row of text as read, before its label is mapped and its text tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRow {
    /// 1-based line the row starts on.
    pub line: usize,
    /// The first (or only) text.
    pub a: String,
    /// The second text of a pair.
    pub b: Option<String>,
    /// The label as written; `None` where the file has no label column or the cell is blank
    /// (or JSON `null`).
    pub label: Option<String>,
    /// The row's id (the id column; else its position among the rows, from 0).
    pub id: String,
}

/// The rows of one file.
#[derive(Debug, Clone, Default)]
pub struct TextRows {
    /// The file.
    pub file: PathBuf,
    /// The text columns read (MRPC's `#1 String`, `#2 String`).
    pub text_columns: Vec<String>,
    /// How the file was read: the columns and why they were chosen, and a TSV's quoting.
    pub reading: String,
    /// Whether the file has labels: a label column with a label in some row (a column left
    /// blank throughout, as a test split's may be, is no labels).
    pub labelled: bool,
    /// Rows that could be read, in file order.
    pub rows: Vec<TextRow>,
    /// Rows that could not, with the reason.
    pub bad: Vec<BadRow>,
}

impl TextRows {
    /// Makes every row of a labelled file that has no label a bad row (`empty label`): such a
    /// row can be neither trained on nor scored, and must not become a class of its own.
    pub fn require_labels(&mut self) {
        if !self.labelled {
            return;
        }
        let (rows, unlabelled): (Vec<TextRow>, Vec<TextRow>) =
            std::mem::take(&mut self.rows).into_iter().partition(|r| r.label.is_some());
        self.rows = rows;
        if unlabelled.is_empty() {
            return;
        }
        self.bad.extend(unlabelled.into_iter().map(|r| BadRow {
            file: self.file.clone(),
            line: r.line,
            reason: "empty label".into(),
        }));
        self.bad.sort_by_key(|r| r.line);
    }
}

/// Reads the rows of `path` laid out as `layout`. A row that cannot be read (a wrong number of
/// fields, an empty text) is a bad row; a file whose columns are not there is an error. A blank
/// label is read as none ([`TextRows::require_labels`] makes it a bad row).
pub fn read_rows(path: &Path, layout: &FileLayout) -> Result<TextRows, DataError> {
    let FileLayout::Table { format, header, columns } = layout else {
        return mrpc_rows(path);
    };
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
    let table =
        parse_table(&bytes, *format, *header).map_err(|reason| DataError::BadFile { file: path.into(), reason })?;
    let (columns, why) = resolve(&table, columns.as_ref(), path)?;
    let text: Vec<usize> = columns.text.iter().filter_map(|c| table.column(c)).collect();
    let label = table.column(&columns.label);
    let id = columns.id.as_deref().and_then(|c| table.column(c));
    let named = columns.text.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(" and ");
    let mut reading = format!("text from {named} ({why})");
    match (table.quoting, format) {
        (Some(Quoting::Csv), Format::Tsv) => reading.push_str(
            "; tab-separated, quoted as Python's csv writes it (every quote in the file closes where a field ends)",
        ),
        (Some(Quoting::None), Format::Tsv) => reading.push_str("; tab-separated, unquoted (a quote is a character)"),
        (Some(Quoting::Csv), Format::TsvQuoted) => reading.push_str("; tab-separated, quoted (--quoting csv)"),
        _ => {}
    }
    let mut out = TextRows { file: path.into(), text_columns: columns.text.clone(), reading, ..Default::default() };
    for (position, row) in table.rows.iter().enumerate() {
        let bad = |reason: String| BadRow { file: path.into(), line: row.line, reason };
        let cells = match &row.cells {
            Ok(cells) => cells,
            Err(reason) => {
                out.bad.push(bad(reason.clone()));
                continue;
            }
        };
        let cell = |i: usize| cells.get(i).cloned().flatten();
        let texts: Vec<Option<String>> = text.iter().map(|&i| cell(i)).collect();
        if let Some(k) = texts.iter().position(|t| t.as_deref().is_none_or(|t| t.trim().is_empty())) {
            out.bad.push(bad(format!("empty text in `{}`", columns.text[k])));
            continue;
        }
        let mut texts = texts.into_iter().flatten();
        out.rows.push(TextRow {
            line: row.line,
            a: texts.next().unwrap_or_default(),
            b: texts.next(),
            label: label.and_then(cell).filter(|l| !l.trim().is_empty()),
            id: id.and_then(cell).unwrap_or_else(|| position.to_string()),
        });
    }
    out.labelled = out.rows.iter().any(|r| r.label.is_some());
    Ok(out)
}

/// The columns to read from `table`, and why: those asked for, else the defaults of its header
/// ([`default_columns`]); each text column must be there (a label column may be missing: the
/// file is unlabelled).
fn resolve(table: &Table, asked: Option<&Columns>, path: &Path) -> Result<(Columns, &'static str), DataError> {
    let label = asked.map_or("label", |c| c.label.as_str());
    let found = default_columns(&table.columns, label);
    let asked_id = asked.and_then(|c| c.id.clone());
    let (columns, why) = match (asked, found) {
        (Some(c), found) if !c.text.is_empty() => {
            (Columns { id: asked_id.or_else(|| found.and_then(|(f, _)| f.id)), ..c.clone() }, "the columns asked for")
        }
        (_, Some((f, why))) => (Columns { id: asked_id.or(f.id), ..f }, why),
        (_, None) => (Columns { text: Vec::new(), label: label.into(), id: None }, ""),
    };
    let listed = || table.columns.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(", ");
    if columns.text.is_empty() {
        return Err(DataError::Columns {
            file: path.into(),
            reason: format!(
                "no text column: every column ({}) is the label `{label}` or an id; name them with --text-columns a[,b]",
                listed()
            ),
        });
    }
    if columns.text.len() > 2 {
        return Err(DataError::Settings(format!("--text-columns takes one column or two, not {}", columns.text.len())));
    }
    if let Some(missing) = columns.text.iter().find(|c| table.column(c).is_none()) {
        return Err(DataError::Columns {
            file: path.into(),
            reason: format!("no column `{missing}` (columns: {}); name the text columns with --text-columns", listed()),
        });
    }
    Ok((columns, why))
}

/// MRPC through its own reader: the header checked, ids and both sentences required.
fn mrpc_rows(path: &Path) -> Result<TextRows, DataError> {
    let data = read_pairs(path, ReadOptions { skip_bad: true })?;
    let labelled = data.pairs.first().is_none_or(|p| p.label.is_some());
    let rows = data
        .pairs
        .into_iter()
        .enumerate()
        .map(|(position, p)| TextRow {
            line: p.line,
            label: p.label.map(|l| l.to_string()),
            id: p.index.unwrap_or(position).to_string(),
            a: p.a,
            b: Some(p.b),
        })
        .collect();
    Ok(TextRows {
        file: path.into(),
        text_columns: vec!["#1 String".into(), "#2 String".into()],
        reading: "MRPC's layout".into(),
        labelled,
        rows,
        bad: data.skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path
    }

    #[test]
    fn glue_layouts_read_their_columns() {
        let dir = tempfile::tempdir().expect("dir");
        let cola =
            write(dir.path(), "train.tsv", "gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n");
        let rows = read_rows(&cola, &GlueTask::Cola.file_layout("train")).expect("cola");
        assert_eq!(
            (rows.rows[1].a.as_str(), rows.rows[1].label.as_deref(), rows.rows[1].b.as_ref()),
            ("They drank the pub.", Some("0"), None)
        );
        let mnli = write(
            dir.path(),
            "dev_matched.tsv",
            "index\tpromptID\tsentence1\tsentence2\tlabel1\tgold_label\n7\t1\tA man.\tA person.\tentailment\tentailment\n",
        );
        let rows = read_rows(&mnli, &GlueTask::Mnli.file_layout("dev")).expect("mnli");
        assert_eq!(rows.rows[0].b.as_deref(), Some("A person."));
        assert_eq!((rows.rows[0].id.as_str(), rows.rows[0].label.as_deref()), ("7", Some("entailment")));
        let test = write(dir.path(), "test.tsv", "index\tsentence\n0\tfine\n");
        let rows = read_rows(&test, &GlueTask::Sst2.file_layout("test")).expect("sst2 test");
        assert!(!rows.labelled && rows.rows[0].label.is_none());
        // CoLA's test file by its header, whatever its name; its labelled files have none.
        let renamed = write(dir.path(), "cola_to_label.tsv", "index\tsentence\n0\tThey drank the pub.\n");
        let layout = GlueTask::Cola.layout_of_file(&renamed).expect("layout");
        assert_eq!(read_rows(&renamed, &layout).expect("test layout").rows[0].a, "They drank the pub.");
        assert_eq!(GlueTask::Cola.layout_of_file(&cola).expect("layout"), GlueTask::Cola.file_layout("dev"));
        assert_eq!(GlueTask::from_name("SST-2").expect("folder spelling"), GlueTask::Sst2);
        assert!(GlueTask::from_name("squad").expect_err("unknown").to_string().contains("cola, sst2, mrpc"));
    }

    #[test]
    fn user_files_find_their_columns_or_say_which_to_name() {
        let dir = tempfile::tempdir().expect("dir");
        let csv = write(dir.path(), "train.csv", "id,sentence1,sentence2,label\na,x,y,yes\nb,x,,no\nc,p,q\n");
        let rows = read_rows(&csv, &FileLayout::for_file(&csv, None, None, None).expect("csv")).expect("rows");
        assert_eq!(rows.text_columns, ["sentence1", "sentence2"]);
        assert_eq!((rows.rows[0].id.as_str(), rows.rows[0].label.as_deref()), ("a", Some("yes")));
        let reasons: Vec<String> = rows.bad.iter().map(ToString::to_string).collect();
        assert!(reasons[0].ends_with("train.csv:3: empty text in `sentence2`"), "{reasons:?}");
        assert!(reasons[1].contains("train.csv:4: expected 4 fields"), "{reasons:?}");
        let odd = write(dir.path(), "odd.tsv", "review\tstars\ngood\t5\n");
        let named = [String::from("review")];
        let layout = FileLayout::for_file(&odd, Some(&named), Some("stars"), None).expect("named");
        let rows = read_rows(&odd, &layout).expect("named columns");
        assert_eq!(
            (rows.rows[0].a.as_str(), rows.rows[0].label.as_deref(), rows.rows[0].id.as_str()),
            ("good", Some("5"), "0")
        );
        assert!(FileLayout::for_file(Path::new("x.parquet"), None, None, None).is_err());
    }

    #[test]
    fn columns_default_as_run_glue_picks_them() {
        let dir = tempfile::tempdir().expect("dir");
        let read = |name: &str, text: &str| {
            let path = write(dir.path(), name, text);
            read_rows(&path, &FileLayout::for_file(&path, None, None, None).expect("layout"))
        };
        let qqp = read("qqp.tsv", "question1\tquestion2\tlabel\nHow?\tWhy?\t1\n").expect("qqp");
        assert_eq!(qqp.text_columns, ["question1", "question2"]);
        assert!(qqp.reading.contains("the first two columns that are not the label or an id"), "{}", qqp.reading);
        let nli = read("nli.csv", "id,premise,label,hypothesis,genre\n3,A dog.,0,An animal.,fiction\n").expect("nli");
        assert_eq!(nli.text_columns, ["premise", "hypothesis"]);
        assert_eq!(nli.rows[0].id, "3");
        let pairs = read("pairs.csv", "text,sentence2,sentence1,label\nt,b,a,1\n").expect("pairs");
        assert_eq!(pairs.text_columns, ["sentence1", "sentence2"]);
        let single = read("single.jsonl", "{\"idx\": 0, \"review\": \"good\", \"label\": 1}\n").expect("single");
        assert_eq!((single.text_columns[0].as_str(), single.rows[0].a.as_str()), ("review", "good"));
        assert!(single.reading.contains("the only column that is not the label or an id"), "{}", single.reading);
        let err = read("none.csv", "id,label\n1,0\n").expect_err("no text column");
        assert!(err.to_string().contains("`id`, `label`") && err.to_string().contains("--text-columns"), "{err}");
        // A label column named with the flag is not taken for text.
        let path = write(dir.path(), "stars.tsv", "stars\treview\tsummary\n5\tgood\tok\n");
        let rows =
            read_rows(&path, &FileLayout::for_file(&path, None, Some("stars"), None).expect("layout")).expect("rows");
        assert_eq!(rows.text_columns, ["review", "summary"]);
        assert_eq!(rows.rows[0].label.as_deref(), Some("5"));
    }

    #[test]
    fn blank_labels_are_bad_rows_of_a_labelled_file_and_no_labels_of_a_blank_column() {
        let dir = tempfile::tempdir().expect("dir");
        let path = write(dir.path(), "scores.csv", "sentence,label\na,0.5\nb,\nc,1.5\n");
        let mut rows = read_rows(&path, &FileLayout::for_file(&path, None, None, None).expect("layout")).expect("rows");
        assert!(rows.labelled && rows.rows[1].label.is_none());
        rows.require_labels();
        assert_eq!(rows.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 4]);
        assert!(rows.bad[0].to_string().ends_with("scores.csv:3: empty label"), "{:?}", rows.bad);
        let json = write(
            dir.path(),
            "nulls.jsonl",
            "{\"sentence\": \"a\", \"label\": \"x\"}\n{\"sentence\": \"b\", \"label\": null}\n",
        );
        let mut rows = read_rows(&json, &FileLayout::for_file(&json, None, None, None).expect("layout")).expect("rows");
        rows.require_labels();
        assert_eq!((rows.rows.len(), rows.bad[0].line, rows.bad[0].reason.as_str()), (1, 2, "empty label"));
        // A test split's label column left blank throughout: unlabelled rows, none bad.
        let test = write(dir.path(), "test.tsv", "sentence\tlabel\na\t\nb\t\n");
        let mut rows = read_rows(&test, &FileLayout::for_file(&test, None, None, None).expect("layout")).expect("rows");
        rows.require_labels();
        assert!(!rows.labelled && rows.bad.is_empty() && rows.rows.len() == 2);
    }
}
