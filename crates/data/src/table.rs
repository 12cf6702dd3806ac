//! Tables from files: comma- or tab-separated text (quoted as Python's `csv` writes it, or not
//! quoted at all as GLUE's files are) and JSON lines, as rows of optional text cells with the
//! line each row starts on. Rows that cannot be read are kept as reasons, so the caller can
//! report them all by file and line.

use std::path::Path;

/// How a file is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// Comma-separated, `"` quotes fields (which may hold commas, quotes as `""`, newlines).
    Csv,
    /// Tab-separated, quoted as CSV is.
    Tsv,
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
    /// Column names: the header, the first JSON object's keys (sorted), or `0`, `1`, ... for a
    /// file read without a header.
    pub columns: Vec<String>,
    /// The rows after the header, blank lines left out.
    pub rows: Vec<TableRow>,
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
        Format::Csv => Ok(delimited(quoted_records(bytes, b','), header)),
        Format::Tsv => Ok(delimited(quoted_records(bytes, b'\t'), header)),
        Format::TsvUnquoted => Ok(delimited(unquoted_records(bytes, b'\t'), header)),
    }
}

/// Records as `(line, fields)` before the header is taken off.
type Records = Vec<(usize, Result<Vec<String>, String>)>;

fn delimited(records: Records, header: bool) -> Table {
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
    Table { columns, rows }
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

/// Records as Python's `csv` reads them: a field that starts with `"` is quoted (`""` is a
/// quote, and it may span lines); a quote elsewhere is text.
fn quoted_records(bytes: &[u8], delimiter: u8) -> Records {
    let mut records = Vec::new();
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
                at += 1;
                loop {
                    match bytes.get(at) {
                        None => {
                            error = Some("a quoted field is not closed before the end of the file".to_string());
                            break;
                        }
                        Some(b'"') if bytes.get(at + 1) == Some(&b'"') => {
                            field.push(b'"');
                            at += 2;
                        }
                        Some(b'"') => {
                            at += 1;
                            break;
                        }
                        Some(&b) => {
                            line += (b == b'\n') as usize;
                            field.push(b);
                            at += 1;
                        }
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
        records.push((start_line, fields));
    }
    records
}

fn parse_json(bytes: &[u8]) -> Result<Table, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("invalid UTF-8 at byte {}", e.valid_up_to()))?;
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("not a JSON array of objects ({e})"))?;
        // A row of an array is named by the line its object starts on, which serde does not
        // keep: the array's rows are numbered by position instead (1-based, as lines are).
        return Ok(json_rows(values.into_iter().enumerate().map(|(i, v)| (i + 1, Ok(v)))));
    }
    let values = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| (i + 1, serde_json::from_str::<serde_json::Value>(l).map_err(|e| format!("not JSON ({e})"))));
    Ok(json_rows(values))
}

fn json_rows(values: impl Iterator<Item = (usize, Result<serde_json::Value, String>)>) -> Table {
    let mut table = Table::default();
    let mut objects = Vec::new();
    for (line, value) in values {
        match value {
            Ok(serde_json::Value::Object(map)) => {
                if table.columns.is_empty() {
                    table.columns = map.keys().cloned().collect();
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
        let open = parse_table(b"text,label\n\"never closed,1\n", Format::Csv, true).expect("csv");
        assert!(cells(&open)[0].as_ref().expect_err("open").contains("not closed"));
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
        assert_eq!(t.columns, ["label", "sentence"]);
        let c = cells(&t);
        assert_eq!(c[0], some(&["1", "ok"]));
        assert_eq!(c[1], some(&["2.5", "f"]));
        assert_eq!(c[2], Ok(vec![None, None]));
        assert_eq!(t.rows[2].line, 4);
        assert!(c[3].as_ref().expect_err("array").contains("not a JSON object"));
        assert!(c[4].as_ref().expect_err("bad").contains("not JSON"));
        assert!(c[5].as_ref().expect_err("nested").contains("`sentence` is a JSON array"));
        let array = parse_table(b"[{\"text\": \"a\", \"label\": \"x\"}]", Format::JsonLines, true).expect("array");
        assert_eq!(cells(&array)[0], some(&["x", "a"]));
        assert_eq!(Format::from_path(Path::new("d/train.JSONL")), Some(Format::JsonLines));
        assert_eq!(Format::from_path(Path::new("train.parquet")), None);
    }
}
