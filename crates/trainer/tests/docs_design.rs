//! `docs/design.md` describes the crates as they describe themselves: its section on the crates
//! is each crate's `lib.rs` documentation (the prose before its example), in the order of the
//! layout block above it, which must name every folder under `crates/`. `just docs` rewrites the
//! section from the crates (`RINGTUNE_BLESS_DOCS=1`); without it, a difference fails the test.

mod common;

use std::path::Path;

use common::root;

const BEGIN: &str = "<!-- The crates: each one's lib.rs documentation, written here by `just docs`. -->";
const END: &str = "<!-- End of the crates. -->";

/// The folders under `crates/`, in the order the layout block (the first fenced block) names them.
fn crates_in_layout_order(design: &str, root: &Path) -> Vec<String> {
    let layout = design.split("```").nth(1).expect("design.md has a layout block");
    let mut folders: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| entry.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let position = |folder: &str| {
        layout
            .lines()
            .position(|line| line.trim_start().starts_with(&format!("{folder}/")))
            .unwrap_or_else(|| panic!("docs/design.md's layout block does not name crates/{folder}/: add it"))
    };
    folders.sort_by_key(|folder| position(folder));
    folders
}

/// The prose of a crate's `lib.rs` documentation: its `//!` lines up to the first example, with
/// rustdoc's links (`` [`Item`] ``, `` [`Item`](path) ``) as plain code.
fn crate_doc(root: &Path, folder: &str) -> String {
    let lib = root.join("crates").join(folder).join("src/lib.rs");
    let text = std::fs::read_to_string(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    let mut prose = Vec::new();
    for line in text.lines().take_while(|line| line.starts_with("//!")) {
        let line = line.trim_start_matches("//!");
        let line = line.strip_prefix(' ').unwrap_or(line);
        if line.starts_with("```") {
            break;
        }
        prose.push(plain_links(line));
    }
    while prose.last().is_some_and(|line| line.is_empty()) {
        prose.pop();
    }
    assert!(!prose.is_empty(), "{} has no crate documentation", lib.display());
    prose.join("\n")
}

/// `` [`Item`](path) `` and `` [`Item`] `` as `` `Item` ``.
fn plain_links(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find("[`") {
        let Some(end) = rest[start..].find("`]").map(|e| start + e) else { break };
        out.push_str(&rest[..start]);
        out.push_str(&rest[start + 1..end + 1]);
        rest = &rest[end + 2..];
        if rest.starts_with('(') {
            rest = rest.find(')').map_or(rest, |close| &rest[close + 1..]);
        }
    }
    out.push_str(rest);
    out
}

fn package_name(root: &Path, folder: &str) -> String {
    let manifest = std::fs::read_to_string(root.join("crates").join(folder).join("Cargo.toml")).expect("Cargo.toml");
    manifest
        .lines()
        .find_map(|line| line.strip_prefix("name = \""))
        .and_then(|rest| rest.strip_suffix('"'))
        .unwrap_or_else(|| panic!("crates/{folder}/Cargo.toml has no package name"))
        .to_string()
}

/// The section as the crates' documentation writes it.
fn crates_section(design: &str, root: &Path) -> String {
    let mut section = format!("{BEGIN}\n");
    for folder in crates_in_layout_order(design, root) {
        section.push_str(&format!(
            "\n### {} (`crates/{folder}`)\n\n{}\n",
            package_name(root, &folder),
            crate_doc(root, &folder)
        ));
    }
    section.push_str(&format!("\n{END}"));
    section
}

#[test]
fn design_describes_every_crate_as_its_lib_rs_does() {
    let root = root();
    let path = root.join("docs/design.md");
    let design = std::fs::read_to_string(&path).expect("docs/design.md");
    let (Some(begin), Some(end)) = (design.find(BEGIN), design.find(END)) else {
        panic!("docs/design.md lacks the crates section's markers:\n{BEGIN}\n{END}");
    };
    let written = &design[begin..end + END.len()];
    let expected = crates_section(&design, &root);
    if std::env::var_os("RINGTUNE_BLESS_DOCS").is_some() {
        let updated = format!("{}{expected}{}", &design[..begin], &design[end + END.len()..]);
        std::fs::write(&path, updated).expect("write docs/design.md");
        return;
    }
    assert!(
        written == expected,
        "docs/design.md's crates section differs from the crates' lib.rs docs: run `just docs`, and \
         check the change reads well"
    );
}

#[test]
fn rustdoc_links_read_as_plain_code() {
    assert_eq!(plain_links("a [`Task`] and [`Kernel`](ringtune_runtime::Kernel)."), "a `Task` and `Kernel`.");
    assert_eq!(plain_links("no links [here]"), "no links [here]");
}
