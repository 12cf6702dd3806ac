//! Tables from files: comma- or tab-separated text (quoted as Python's `csv` writes it, or not
//! quoted at all as GLUE's files are) and JSON lines, as rows of optional text cells with the
//! line each row starts on. Rows that cannot be read are kept as reasons, so the caller can
//! report them all by file and line.
//!
//! A `.tsv` file is read as written: with no quoting (a `"` is a character, as in GLUE's files
//! and the IANA definition of TSV) unless the whole file reads cleanly as Python's `csv` quotes
//! it and some field is quoted ([`Format::Tsv`] detects which; [`Table::quoting`] says).

use std::path::Path;

/// How a file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Comma-separated, `"` quotes fields (which may hold commas, quotes as `""`, newlines).
    Csv,
    /// Tab-separated, quoted as CSV is when the whole file reads so and some field is quoted,
    /// else unquoted.
    Tsv,
    /// Tab-separated, quoted as CSV is.
    TsvQuoted,
    /// Tab-separated with no quoting: `"` is text (GLUE's files hold unbalanced quotes).
    TsvUnquoted,
    /// One JSON object per line (or one JSON array of objects).
    JsonLines,
}

impl Format {
    /// The format a file name says: `.csv`, `.tsv`/`.txt`, `.json`/`.jsonl`.
    pub fn from_path(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "csv" => Some(Format::Csv),
            "tsv" | "txt" => Some(Format::Tsv),
            "json" | "jsonl" | "ndjson" => Some(Format::JsonLines),
            _ => None,
        }
    }

    /// This format read with `quoting` (a delimited format; JSON lines stay as they are).
    pub fn with_quoting(self, quoting: Quoting) -> Self {
        match (self, quoting) {
            (Format::Tsv | Format::TsvQuoted | Format::TsvUnquoted, Quoting::Csv) => Format::TsvQuoted,
            (Format::Tsv | Format::TsvQuoted | Format::TsvUnquoted, Quoting::None) => Format::TsvUnquoted,
            (format, _) => format,
        }
    }
}

/// How the fields of a delimited file were read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Quoting {
    /// As Python's `csv` quotes them: a field that starts with `"` is quoted.
    Csv,
    /// Not at all: `"` is a character.
    None,
}

impl std::str::FromStr for Quoting {
    type Err = String;

    /// The quoting named as `--quoting` takes it: `csv` or `none`.
    fn from_str(name: &str) -> Result<Self, String> {
        match name {
            "csv" => Ok(Quoting::Csv),
            "none" => Ok(Quoting::None),
            _ => Err(format!("`{name}`: csv (as Python's csv quotes) or none (a quote is a character)")),
        }
    }
}

/// One row: the line it starts on and its cells (`None`: JSON null or a missing key), or why it
/// could not be read.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    /// 1-based line the row starts on.
    pub line: usize,
    /// The cells in column order, or the reason the row is malformed.
    pub cells: Result<Vec<Option<String>>, String>,
}

/// A file's columns and rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Table {
    /// Column names: the header, the first JSON object's keys (in the file's order), or `0`,
    /// `1`, ... for a file read without a header.
    pub columns: Vec<String>,
    /// The rows after the header, blank lines left out.
    pub rows: Vec<TableRow>,
    /// How a delimited file's fields were read (`None` for JSON).
    pub quoting: Option<Quoting>,
}

impl Table {
    /// The position of column `name`.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }
}

/// Reads `bytes` (a byte-order mark is dropped) as `format`; with `header` false the columns
/// are numbered and the first line is a row. Only a JSON file that is not JSON at all is an
/// error here (the reason); every other problem is a row's.
pub fn parse_table(bytes: &[u8], format: Format, header: bool) -> Result<Table, String> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match format {
        Format::JsonLines => parse_json(bytes),
        Format::Csv => Ok(delimited(quoted_records(bytes, b',').records, header, Quoting::Csv)),
        Format::TsvQuoted => Ok(delimited(quoted_records(bytes, b'\t').records, header, Quoting::Csv)),
        Format::TsvUnquoted => Ok(delimited(unquoted_records(bytes, b'\t'), header, Quoting::None)),
        Format::Tsv => {
            // Quoted only when that reading is clean throughout: a raw sentence that opens a
            // quote it never closes, or text after a closing quote, means the file is not
            // quoted, and a row of the wrong width means its quotes are text.
            let quoted = quoted_records(bytes, b'\t');
            if quoted.strict && quoted.some_quoted {
                let table = delimited(quoted.records, header, Quoting::Csv);
                if table.rows.iter().all(|r| r.cells.is_ok()) {
                    return Ok(table);
                }
            }
            Ok(delimited(unquoted_records(bytes, b'\t'), header, Quoting::None))
        }
    }
}

/// Records as `(line, fields)` before the header is taken off.
type Records = Vec<(usize, Result<Vec<String>, String>)>;

fn delimited(records: Records, header: bool, quoting: Quoting) -> Table {
    let mut records = records.into_iter();
    let columns = if header {
        match records.next() {
            Some((_, Ok(names))) => names,
            Some((_, Err(_))) | None => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let rows: Vec<TableRow> = records
        .map(|(line, fields)| TableRow {
            line,
            cells: fields.and_then(|f| {
                if header && f.len() != columns.len() {
                    Err(format!("expected {} fields ({}), found {}", columns.len(), columns.join(", "), f.len()))
                } else {
                    Ok(f.into_iter().map(Some).collect())
                }
            }),
        })
        .collect();
    let columns = if header {
        columns
    } else {
        let widest = rows.iter().filter_map(|r| r.cells.as_ref().ok()).map(Vec::len).max().unwrap_or(0);
        (0..widest).map(|i| i.to_string()).collect()
    };
    Table { columns, rows, quoting: Some(quoting) }
}

/// Lines split on `delimiter`, nothing quoted; `\r\n` accepted, blank lines skipped.
fn unquoted_records(bytes: &[u8], delimiter: u8) -> Records {
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if body.is_empty() {
        return Vec::new();
    }
    body.split(|&b| b == b'\n')
        .enumerate()
        .map(|(i, raw)| (i + 1, raw.strip_suffix(b"\r").unwrap_or(raw)))
        .filter(|(_, raw)| !raw.is_empty())
        .map(|(line, raw)| {
            let fields = raw
                .split(|&b| b == delimiter)
                .map(|f| String::from_utf8(f.to_vec()).map_err(|e| invalid_utf8(&e)))
                .collect();
            (line, fields)
        })
        .collect()
}

fn invalid_utf8(e: &std::string::FromUtf8Error) -> String {
    format!("invalid UTF-8 at byte {}", e.utf8_error().valid_up_to())
}

/// Records read with quotes, and how well the file fits quoting.
struct QuotedRecords {
    records: Records,
    /// Some field was quoted.
    some_quoted: bool,
    /// Every quote closed, and each closing quote ended its field, as a file written with
    /// quoting has them (Python's `csv` keeps text after a closing quote; a writer never puts
    /// any there).
    strict: bool,
}

/// Records as Python's `csv` reads them: a field that starts with `"` is quoted (`""` is a
/// quote, and it may span lines); a quote elsewhere is text. A quote never closed makes its
/// record bad, named by the line it opened on, and reading goes on at the next line.
fn quoted_records(bytes: &[u8], delimiter: u8) -> QuotedRecords {
    let mut out = QuotedRecords { records: Vec::new(), some_quoted: false, strict: true };
    let mut at = 0;
    let mut line = 1;
    while at < bytes.len() {
        let start_line = line;
        let mut fields: Vec<Vec<u8>> = Vec::new();
        let mut field = Vec::new();
        let mut error = None;
        // One record: fields until an unquoted newline or the end.
        loop {
            if bytes.get(at) == Some(&b'"') && field.is_empty() {
                out.some_quoted = true;
                let open_line = line;
                match quoted_field(bytes, at, &mut line, delimiter, &mut field) {
                    Ok((next, ends_field)) => {
                        at = next;
                        out.strict &= ends_field;
                    }
                    Err(reason) => {
                        // Go on after the line the quote opened on: the rows after it are read.
                        error = Some(reason);
                        out.strict = false;
                        at = bytes[at..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |p| at + p + 1);
                        line = open_line + 1;
                        break;
                    }
                }
            }
            match bytes.get(at) {
                None => {
                    fields.push(std::mem::take(&mut field));
                    break;
                }
                Some(b'\n') => {
                    at += 1;
                    line += 1;
                    if field.last() == Some(&b'\r') {
                        field.pop();
                    }
                    fields.push(std::mem::take(&mut field));
                    break;
                }
                Some(&b) if b == delimiter => {
                    at += 1;
                    fields.push(std::mem::take(&mut field));
                }
                Some(&b) => {
                    field.push(b);
                    at += 1;
                }
            }
        }
        if fields.len() == 1 && fields[0].is_empty() && error.is_none() {
            continue;
        }
        let fields = match error {
            Some(reason) => Err(reason),
            None => fields.into_iter().map(|f| String::from_utf8(f).map_err(|e| invalid_utf8(&e))).collect(),
        };
        out.records.push((start_line, fields));
    }
    out
}

/// Reads the quoted field whose `"` is at `bytes[at]` into `field`, counting the lines it
/// spans into `line`: where reading goes on, and whether the closing quote ended the field.
/// The error names the line the quote opened on.
fn quoted_field(
    bytes: &[u8],
    mut at: usize,
    line: &mut usize,
    delimiter: u8,
    field: &mut Vec<u8>,
) -> Result<(usize, bool), String> {
    let open_line = *line;
    at += 1;
    loop {
        match bytes.get(at) {
            None => return Err(format!("a quote opened on line {open_line} is not closed before the end of the file")),
            Some(b'"') if bytes.get(at + 1) == Some(&b'"') => {
                field.push(b'"');
                at += 2;
            }
            Some(b'"') => {
                let ends_field =
                    matches!(bytes.get(at + 1), None | Some(b'\n' | b'\r')) || bytes.get(at + 1) == Some(&delimiter);
                return Ok((at + 1, ends_field));
            }
            Some(&b) => {
                *line += (b == b'\n') as usize;
                field.push(b);
                at += 1;
            }
        }
    }
}

fn parse_json(bytes: &[u8]) -> Result<Table, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("not a JSON array of objects ({e})"))?;
        let order = serde_json::from_str::<FirstKeys>(text).ok().map(|k| k.0);
        // A row of an array is named by the line its object starts on, which serde does not
        // keep: the array's rows are numbered by position instead (1-based, as lines are).
        return Ok(json_rows(values.into_iter().enumerate().map(|(i, v)| (i + 1, Ok(v))), order));
    }
    let lines: Vec<(usize, &str)> =
        text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()).map(|(i, l)| (i + 1, l)).collect();
    let order = lines.iter().find_map(|(_, l)| serde_json::from_str::<Keys>(l).ok()).map(|k| k.0);
    let values = lines
        .into_iter()
        .map(|(line, l)| (line, serde_json::from_str::<serde_json::Value>(l).map_err(|e| format!("not JSON ({e})"))));
    Ok(json_rows(values, order))
}

/// The rows of JSON `values`, their columns the first object's keys, in `order` when known
/// (the file's order, as Hugging Face's datasets keep it; serde_json's map sorts them).
fn json_rows(
    values: impl Iterator<Item = (usize, Result<serde_json::Value, String>)>,
    order: Option<Vec<String>>,
) -> Table {
    let mut table = Table::default();
    let mut objects = Vec::new();
    for (line, value) in values {
        match value {
            Ok(serde_json::Value::Object(map)) => {
                if table.columns.is_empty() {
                    table.columns = match &order {
                        Some(keys) if keys.len() == map.len() && keys.iter().all(|k| map.contains_key(k)) => {
                            keys.clone()
                        }
                        _ => map.keys().cloned().collect(),
                    };
                }
                objects.push((line, Ok(map)));
            }
            Ok(_) => objects.push((line, Err("not a JSON object".to_string()))),
            Err(e) => objects.push((line, Err(e))),
        }
    }
    for (line, object) in objects {
        let cells = object
            .and_then(|map| table.columns.iter().map(|c| json_cell(c, map.get(c))).collect::<Result<Vec<_>, String>>());
        table.rows.push(TableRow { line, cells });
    }
    table
}

/// A JSON object's keys in the order written.
struct Keys(Vec<String>);

impl<'de> serde::Deserialize<'de> for Keys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeysVisitor;
        impl<'de> serde::de::Visitor<'de> for KeysVisitor {
            type Value = Keys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Keys, A::Error> {
                let mut keys = Vec::new();
                while let Some((key, serde::de::IgnoredAny)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
                    keys.push(key);
                }
                Ok(Keys(keys))
            }
        }
        deserializer.deserialize_map(KeysVisitor)
    }
}

/// The keys of the first object of a JSON array, in the order written.
struct FirstKeys(Vec<String>);

impl<'de> serde::Deserialize<'de> for FirstKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FirstVisitor;
        impl<'de> serde::de::Visitor<'de> for FirstVisitor {
            type Value = FirstKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON array of objects")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<FirstKeys, A::Error> {
                let first = seq.next_element::<Keys>()?.map_or_else(Vec::new, |k| k.0);
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(FirstKeys(first))
            }
        }
        deserializer.deserialize_seq(FirstVisitor)
    }
}

fn json_cell(column: &str, value: Option<&serde_json::Value>) -> Result<Option<String>, String> {
    use serde_json::Value;
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(_) => Err(format!("`{column}` is a JSON array or object, not text or a number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(table: &Table) -> Vec<Result<Vec<Option<String>>, String>> {
        table.rows.iter().map(|r| r.cells.clone()).collect()
    }

    fn some(values: &[&str]) -> Result<Vec<Option<String>>, String> {
        Ok(values.iter().map(|v| Some(v.to_string())).collect())
    }

    #[test]
    fn csv_quotes_span_lines_and_rows_keep_their_first_line() {
        let text = "\u{feff}text,label\r\n\"a, \"\"quoted\"\"\nline\",pos\n\nplain \"inner\" quote,neg\nshort\n";
        let t = parse_table(text.as_bytes(), Format::Csv, true).expect("csv");
        assert_eq!(t.columns, ["text", "label"]);
        assert_eq!(t.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 5, 6]);
        let c = cells(&t);
        assert_eq!(c[0], some(&["a, \"quoted\"\nline", "pos"]));
        assert_eq!(c[1], some(&["plain \"inner\" quote", "neg"]));
        assert!(c[2].as_ref().expect_err("short").contains("expected 2 fields (text, label), found 1"));
        // An unclosed quote names the line it opened on, and the rows after that line are read.
        let open = parse_table(b"text,label\nok,1\nx,\"never closed\nnext,0\n", Format::Csv, true).expect("csv");
        assert_eq!(open.rows.iter().map(|r| r.line).collect::<Vec<_>>(), [2, 3, 4]);
        let reason = cells(&open)[1].clone().expect_err("open");
        assert_eq!(reason, "a quote opened on line 3 is not closed before the end of the file");
        assert_eq!(cells(&open)[2], some(&["next", "0"]));
    }

    #[test]
    fn tsv_is_unquoted_unless_quoted_throughout() {
        // MRPC's raw sentences: quotes opened and never closed in the field, or closed mid-field.
        let raw = "sentence1\tsentence2\tscore\n\"The lawyer said he\tdid not\t1.5\n\"Yes,\" he said\tno\t0.5\n";
        let t = parse_table(raw.as_bytes(), Format::Tsv, true).expect("raw");
        assert_eq!(t.quoting, Some(Quoting::None));
        assert_eq!(
            cells(&t),
            [some(&["\"The lawyer said he", "did not", "1.5"]), some(&["\"Yes,\" he said", "no", "0.5"])]
        );
        // As pandas writes it: fields with a tab, a newline or a quote in them quoted.
        let quoted = "text\tlabel\n\"a\tb\"\t1\n\"two\nlines, \"\"q\"\"\"\t0\nplain\t1\n";
        let t = parse_table(quoted.as_bytes(), Format::Tsv, true).expect("quoted");
        assert_eq!(t.quoting, Some(Quoting::Csv));
        assert_eq!(cells(&t), [some(&["a\tb", "1"]), some(&["two\nlines, \"q\"", "0"]), some(&["plain", "1"])]);
        // No quote at all: unquoted, the same either way.
        assert_eq!(parse_table(b"a\tb\n1\t2\n", Format::Tsv, true).expect("plain").quoting, Some(Quoting::None));
        // Asked for: the raw file read quoted, as Python's csv would, runs its first quote on
        // to the next one, two lines down.
        let asked = parse_table(raw.as_bytes(), Format::Tsv.with_quoting(Quoting::Csv), true).expect("asked");
        assert_eq!((asked.quoting, asked.rows.len()), (Some(Quoting::Csv), 1));
        assert_eq!(cells(&asked)[0], some(&["The lawyer said he\tdid not\t1.5\nYes,\" he said", "no", "0.5"]));
        assert_eq!(Format::Csv.with_quoting(Quoting::None), Format::Csv);
        assert_eq!("none".parse(), Ok(Quoting::None));
        assert!("tsv".parse::<Quoting>().is_err());
    }

    #[test]
    fn unquoted_tsv_keeps_quotes_and_numbers_headerless_columns() {
        let t = parse_table(b"gj04\t1\t\t\"Hi\" she said.\nx\t0\t*\tno\n", Format::TsvUnquoted, false).expect("tsv");
        assert_eq!(t.columns, ["0", "1", "2", "3"]);
        assert_eq!(cells(&t)[0], some(&["gj04", "1", "", "\"Hi\" she said."]));
        let bad = parse_table(b"a\tb\n\xff\tb\n", Format::TsvUnquoted, true).expect("tsv");
        assert!(cells(&bad)[0].as_ref().expect_err("utf8").contains("invalid UTF-8"));
    }

    #[test]
    fn json_lines_keep_types_as_text_and_name_bad_lines() {
        let text = "{\"sentence\": \"ok\", \"label\": 1}\n{\"sentence\": \"f\", \"label\": 2.5}\n\n{\"label\": null}\n[1]\n{oops\n{\"sentence\": [1]}\n";
        let t = parse_table(text.as_bytes(), Format::JsonLines, true).expect("jsonl");
        assert_eq!(t.columns, ["sentence", "label"], "the first object's keys in the file's order");
        let c = cells(&t);
        assert_eq!(c[0], some(&["ok", "1"]));
        assert_eq!(c[1], some(&["f", "2.5"]));
        assert_eq!(c[2], Ok(vec![None, None]));
        assert_eq!(t.rows[2].line, 4);
        assert!(c[3].as_ref().expect_err("array").contains("not a JSON object"));
        assert!(c[4].as_ref().expect_err("bad").contains("not JSON"));
        assert!(c[5].as_ref().expect_err("nested").contains("`sentence` is a JSON array"));
        let array = parse_table(b"[{\"text\": \"a\", \"label\": \"x\"}]", Format::JsonLines, true).expect("array");
        assert_eq!(array.columns, ["text", "label"]);
        assert_eq!(cells(&array)[0], some(&["a", "x"]));
        assert_eq!(Format::from_path(Path::new("d/train.JSONL")), Some(Format::JsonLines));
        assert_eq!(Format::from_path(Path::new("train.parquet")), None);
    }
}
