//! Every relative link in the README, the changelog and `docs/` reaches a file that exists, and
//! a `#section` in it reaches one of that file's headings (as GitHub makes anchors of them).

mod common;

use std::path::Path;

use common::markdown_documents;

/// The targets of the `[text](target)` links of `text` that are neither web addresses nor mail.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with("mailto:") && !target.contains(' ') {
            links.push(target.to_string());
        }
    }
    links
}

/// GitHub's anchor of a heading: lower case, spaces as hyphens, punctuation but `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut fenced = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

#[test]
fn every_relative_link_reaches_a_file_and_a_heading() {
    let mut broken = Vec::new();
    for file in markdown_documents() {
        let text = std::fs::read_to_string(&file).expect("read");
        for link in relative_links(&text) {
            let (path, section) = link.split_once('#').map_or((link.as_str(), None), |(p, s)| (p, Some(s)));
            let target = if path.is_empty() { file.clone() } else { file.parent().expect("folder").join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", file.display()));
            } else if let Some(section) = section.filter(|_| target.extension().is_some_and(|e| e == "md")) {
                if !anchors(&target).iter().any(|a| a == section) {
                    broken.push(format!("{}: {link} (no such heading)", file.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(anchor(" int8 inference"), "int8-inference");
    assert_eq!(anchor("All-reduce"), "all-reduce");
    assert_eq!(anchor("Training beside PyTorch (2 cores)"), "training-beside-pytorch-2-cores");
    assert_eq!(relative_links("see [a](docs/a.md#b), [web](https://x.org) and ![p](p.png)"), ["docs/a.md#b", "p.png"]);
}
