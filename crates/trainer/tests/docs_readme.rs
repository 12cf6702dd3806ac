//! The README's figures stay one short table: at most 12 rows, every row naming the CPU it was
//! measured on and the command that gives it (every other figure belongs in
//! `docs/benchmarks.md`).

mod common;

/// The most rows the README's table may hold.
const MOST_ROWS: usize = 12;

/// The markdown tables of `text`: each a list of rows, each row its cells.
fn tables(text: &str) -> Vec<Vec<Vec<String>>> {
    let mut found: Vec<Vec<Vec<String>>> = Vec::new();
    let mut in_table = false;
    for line in text.lines().map(str::trim) {
        if !line.starts_with('|') {
            in_table = false;
            continue;
        }
        if !in_table {
            found.push(Vec::new());
            in_table = true;
        }
        let cells = line.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect();
        found.last_mut().expect("a table was just begun").push(cells);
    }
    found
}

/// The README's figures checked: one table, at most [`MOST_ROWS`] rows, each with a CPU (an
/// EPYC or Xeon named) and a command; its row count, or what is wrong.
fn check_figures(text: &str) -> Result<usize, String> {
    let all = tables(text);
    let [table] = all.as_slice() else {
        return Err(format!("{} tables: the README holds one; the rest go to docs/benchmarks.md", all.len()));
    };
    let (header, rows) = match table.as_slice() {
        [header, _separator, rows @ ..] => (header, rows),
        _ => return Err("a table without rows".into()),
    };
    if rows.is_empty() || rows.len() > MOST_ROWS {
        return Err(format!("{} rows: 1 to {MOST_ROWS}", rows.len()));
    }
    let column = |name: &str| {
        header.iter().position(|h| h.eq_ignore_ascii_case(name)).ok_or(format!("no {name} column: {header:?}"))
    };
    let (cpu, command) = (column("CPU")?, column("command")?);
    for row in rows {
        let cell = |at: usize| row.get(at).map_or("", String::as_str);
        if !["Zen", "Xeon", "EPYC"].iter().any(|kind| cell(cpu).contains(kind)) {
            return Err(format!("a row without its CPU: {row:?}"));
        }
        if cell(command).is_empty() {
            return Err(format!("a row without its command: {row:?}"));
        }
    }
    Ok(rows.len())
}

#[test]
fn the_readme_gives_its_figures_in_one_table_of_at_most_twelve_rows_each_with_cpu_and_command() {
    let text = std::fs::read_to_string(common::root().join("README.md")).expect("README.md");
    let rows = check_figures(&text).unwrap_or_else(|e| panic!("README.md: {e}"));
    assert!(rows <= MOST_ROWS);
}

#[test]
fn a_second_table_too_many_rows_or_a_row_without_cpu_or_command_is_caught() {
    let head = "| question | CPU | command |\n|---|---|---|\n";
    let row = "| speed | EPYC Zen 4 | `just bench` |\n";
    assert_eq!(check_figures(&format!("{head}{row}")), Ok(1));
    let two = format!("{head}{row}\ntext\n\n{head}{row}");
    assert!(check_figures(&two).expect_err("two tables").starts_with("2 tables"));
    let thirteen = format!("{head}{}", row.repeat(13));
    assert!(check_figures(&thirteen).expect_err("13 rows").starts_with("13 rows"));
    let no_cpu = format!("{head}| speed | 2 cores | `just bench` |\n");
    assert!(check_figures(&no_cpu).expect_err("no CPU").contains("without its CPU"));
    let no_command = format!("{head}| speed | Xeon Ice Lake | |\n");
    assert!(check_figures(&no_command).expect_err("no command").contains("without its command"));
    let no_column = "| question | command |\n|---|---|\n| speed | `just bench` |\n";
    assert!(check_figures(no_column).expect_err("no CPU column").contains("no CPU column"));
}
