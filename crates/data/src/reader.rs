//! Readers for GLUE's MRPC TSV files and the original MSR Paraphrase files.
//!
//! Files are UTF-8, may start with a byte-order mark, and are split on tabs with no quoting:
//! sentences hold unbalanced `"`. Every malformed line is reported with its file and line.

use std::path::{Path, PathBuf};

use crate::error::{BadRow, DataError, REPORTED_ROWS};

/// One sentence pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// 1 for a paraphrase, 0 for not; `None` in the unlabelled test split.
    pub label: Option<u8>,
    /// The test split's `index` column (its position), else `None`.
    pub index: Option<usize>,
    /// First sentence id.
    pub id1: String,
    /// Second sentence id.
    pub id2: String,
    /// First sentence.
    pub a: String,
    /// Second sentence.
    pub b: String,
    /// 1-based line in the source file.
    pub line: usize,
}

/// The file layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `Quality  #1 ID  #2 ID  #1 String  #2 String` (GLUE train/dev, MSR originals).
    Labelled,
    /// `index  #1 ID  #2 ID  #1 String  #2 String` (GLUE test).
    Test,
}

const LABELLED_HEADER: &str = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String";
const TEST_HEADER: &str = "index\t#1 ID\t#2 ID\t#1 String\t#2 String";

/// What to do with malformed rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Skip them (and count them) instead of failing.
    pub skip_bad: bool,
}

/// Pairs read from one file, and the rows skipped.
#[derive(Debug, Clone, Default)]
pub struct Dataset {
    /// The pairs, in file order.
    pub pairs: Vec<Pair>,
    /// Rows skipped under `skip_bad`.
    pub skipped: Vec<BadRow>,
}

impl Dataset {
    /// Number of pairs with label 1.
    pub fn positives(&self) -> usize {
        self.pairs.iter().filter(|p| p.label == Some(1)).count()
    }
}

/// Reads a GLUE `train.tsv`/`dev.tsv` (labelled) or `test.tsv`, or an MSR original file; the
/// layout is told by the header.
pub fn read_pairs(path: &Path, options: ReadOptions) -> Result<Dataset, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
    parse_pairs(&bytes, path, options)
}

/// Parses file contents (`path` is named in errors).
pub fn parse_pairs(bytes: &[u8], path: &Path, options: ReadOptions) -> Result<Dataset, DataError> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut lines = split_lines(bytes);
    let header = lines.next().map(|(_, l)| String::from_utf8_lossy(l).into_owned()).unwrap_or_default();
    let layout = match header.as_str() {
        LABELLED_HEADER => Layout::Labelled,
        TEST_HEADER => Layout::Test,
        _ => {
            return Err(DataError::Header { file: path.into(), found: header, expected: LABELLED_HEADER.into() });
        }
    };
    let mut data = Dataset::default();
    let mut bad = Vec::new();
    for (number, raw) in lines {
        match parse_row(raw, layout, number) {
            Ok(pair) => data.pairs.push(pair),
            Err(reason) => bad.push(BadRow { file: path.into(), line: number, reason }),
        }
    }
    if bad.is_empty() || options.skip_bad {
        data.skipped = bad;
        return Ok(data);
    }
    let total = bad.len();
    bad.truncate(REPORTED_ROWS);
    Err(DataError::BadRows { file: path.into(), rows: bad, total })
}

/// Lines with their 1-based numbers; `\r\n` endings accepted, a final newline not a row.
fn split_lines(bytes: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    body.split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !(l.is_empty() && bytes.is_empty()))
}

fn parse_row(raw: &[u8], layout: Layout, line: usize) -> Result<Pair, String> {
    let text = std::str::from_utf8(raw).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    let fields: Vec<&str> = text.split('\t').collect();
    if fields.len() != 5 {
        return Err(format!("expected 5 tab-separated fields, found {}", fields.len()));
    }
    let (label, index) = match layout {
        Layout::Labelled => match fields[0] {
            "0" => (Some(0), None),
            "1" => (Some(1), None),
            other => return Err(format!("label must be 0 or 1, found `{other}`")),
        },
        Layout::Test => (
            None,
            Some(fields[0].parse::<usize>().map_err(|_| format!("index must be a number, found `{}`", fields[0]))?),
        ),
    };
    for (name, value) in [("#1 ID", fields[1]), ("#2 ID", fields[2])] {
        if value.trim().is_empty() {
            return Err(format!("empty {name}"));
        }
    }
    for (name, value) in [("first", fields[3]), ("second", fields[4])] {
        if value.trim().is_empty() {
            return Err(format!("empty {name} sentence"));
        }
    }
    Ok(Pair {
        label,
        index,
        id1: fields[1].to_string(),
        id2: fields[2].to_string(),
        a: fields[3].to_string(),
        b: fields[4].to_string(),
        line,
    })
}

/// Reads GLUE's `dev_ids.tsv`: one `id1<TAB>id2` per line.
pub fn read_dev_ids(path: &Path) -> Result<Vec<(String, String)>, DataError> {
    let bytes = std::fs::read(path).map_err(|source| DataError::Io { path: path.into(), source })?;
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&bytes);
    let mut ids = Vec::new();
    let mut bad = Vec::new();
    for (line, raw) in split_lines(bytes) {
        let text = String::from_utf8_lossy(raw);
        match text.trim().split('\t').collect::<Vec<_>>().as_slice() {
            [a, b] if !a.is_empty() && !b.is_empty() => ids.push((a.to_string(), b.to_string())),
            _ => bad.push(BadRow { file: path.into(), line, reason: "expected two tab-separated ids".into() }),
        }
    }
    if bad.is_empty() {
        Ok(ids)
    } else {
        let total = bad.len();
        bad.truncate(REPORTED_ROWS);
        Err(DataError::BadRows { file: path.into(), rows: bad, total })
    }
}

/// Splits MSR's `msr_paraphrase_train.txt` into GLUE's train and dev exactly as GLUE's
/// `download_glue_data.py` does: pairs whose ids are in `dev_ids` go to dev, in file order.
pub fn glue_split(msr_train: &Dataset, dev_ids: &[(String, String)]) -> (Vec<Pair>, Vec<Pair>) {
    let dev: std::collections::HashSet<(&str, &str)> = dev_ids.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    msr_train.pairs.iter().cloned().partition(|p| !dev.contains(&(p.id1.as_str(), p.id2.as_str())))
}

/// GLUE's TSV text for labelled pairs (`train.tsv`, `dev.tsv`): the MSR header with its
/// byte-order mark, then `label id1 id2 a b` lines. GLUE strips each whole row, so only the
/// second sentence loses trailing whitespace.
pub fn glue_labelled_tsv(pairs: &[Pair]) -> String {
    let mut out = format!("\u{feff}{LABELLED_HEADER}\n");
    for p in pairs {
        out.push_str(&format!("{}\t{}\t{}\t{}\t{}\n", p.label.unwrap_or(0), p.id1, p.id2, p.a, p.b.trim_end()));
    }
    out
}

/// GLUE's `test.tsv` text from MSR's `msr_paraphrase_test.txt` pairs (labels dropped).
pub fn glue_test_tsv(pairs: &[Pair]) -> String {
    let mut out = format!("{TEST_HEADER}\n");
    for (i, p) in pairs.iter().enumerate() {
        out.push_str(&format!("{i}\t{}\t{}\t{}\t{}\n", p.id1, p.id2, p.a, p.b.trim_end()));
    }
    out
}

/// The three GLUE splits of a data folder.
#[derive(Debug, Clone)]
pub struct GlueFiles {
    /// `train.tsv`.
    pub train: PathBuf,
    /// `dev.tsv`.
    pub dev: PathBuf,
    /// `test.tsv`.
    pub test: PathBuf,
}

impl GlueFiles {
    /// The files of `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        GlueFiles { train: dir.join("train.tsv"), dev: dir.join("dev.tsv"), test: dir.join("test.tsv") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, skip_bad: bool) -> Result<Dataset, DataError> {
        parse_pairs(text.as_bytes(), Path::new("x.tsv"), ReadOptions { skip_bad })
    }

    #[test]
    fn reads_bom_quotes_and_crlf() {
        let text = "\u{feff}Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\r\n1\t1\t2\tHe said \"hi.\tShe \"left\r\n";
        let d = parse(text, false).expect("valid");
        assert_eq!(d.pairs.len(), 1);
        assert_eq!(d.pairs[0].a, "He said \"hi.");
        assert_eq!(d.pairs[0].label, Some(1));
        let test = parse("index\t#1 ID\t#2 ID\t#1 String\t#2 String\n7\t1\t2\ta\tb\n", false).expect("test");
        assert_eq!((test.pairs[0].index, test.pairs[0].label), (Some(7), None));
    }

    #[test]
    fn every_kind_of_bad_row_is_named() {
        let header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n";
        let rows = ["1\t1\t2\ta", "2\t1\t2\ta\tb", "0\t1\t2\t \tb", "1\t1\t2\ta\tb\textra", "0\t3\t4\tfine\tfine"];
        let mut text = header.to_string() + &rows.join("\n") + "\n";
        text.push_str("1\t5\t6\t");
        let mut bytes = text.into_bytes();
        bytes.extend_from_slice(b"\xff\xfe\tb\n");
        let err = parse_pairs(&bytes, Path::new("x.tsv"), ReadOptions::default()).expect_err("bad rows");
        let msg = err.to_string();
        for expected in [
            "x.tsv:2: expected 5",
            "x.tsv:3: label must be 0 or 1",
            "x.tsv:4: empty first sentence",
            "x.tsv:5: expected 5",
            "x.tsv:7: invalid UTF-8",
        ] {
            assert!(msg.contains(expected), "missing `{expected}` in:\n{msg}");
        }
        assert!(msg.contains("5 bad row(s)") && msg.contains("--skip-bad"), "{msg}");
        let skipped = parse_pairs(&bytes, Path::new("x.tsv"), ReadOptions { skip_bad: true }).expect("skip");
        assert_eq!((skipped.pairs.len(), skipped.skipped.len()), (1, 5));
    }

    #[test]
    fn long_error_lists_are_cut_but_counted() {
        let mut text = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n".to_string();
        for _ in 0..30 {
            text.push_str("9\t1\t2\ta\tb\n");
        }
        let msg = parse(&text, false).expect_err("bad").to_string();
        assert!(msg.contains("30 bad row(s)") && msg.contains("and 10 more"), "{msg}");
    }

    #[test]
    fn unknown_header_is_refused() {
        let msg = parse("a\tb\n", false).expect_err("header").to_string();
        assert!(msg.contains("x.tsv:1: unexpected header"), "{msg}");
    }
}
