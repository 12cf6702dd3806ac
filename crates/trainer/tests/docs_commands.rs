//! Every `ringtune` and `just` command in the README's and the docs' fenced `sh` blocks runs as
//! written: a `ringtune` line's subcommand takes its flags and values (run with `--help` at the
//! end, which clap reaches only when everything before it parses), and a `just` line names a
//! recipe (`just train ...` also passes its settings to `ringtune train`). Synopsis lines are
//! read as usage: `[...]` optional (its flags checked), `a|b` alternatives (the first checked),
//! upper-case placeholders (`N`, `DIR`) given a number, `...` and `# comments` left out.

mod common;

use std::path::Path;
use std::process::Command;

use common::{markdown_documents, root};

/// The commands of every fenced `sh` block of `file`, each with its line number: lines joined
/// where a `\\` continues them, and `ringtune ...` found after a launcher (`srun`, `mpirun ...`,
/// variables set before it) too.
fn commands(file: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let mut inside = false;
    let mut found = Vec::new();
    let mut continued: Option<(usize, String)> = None;
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            inside = !inside && trimmed == "```sh";
            continue;
        }
        if !inside {
            continue;
        }
        let (start, mut command) = continued.take().unwrap_or((number + 1, String::new()));
        command.push(' ');
        // A comment: a whole line (`#SBATCH` too) or what follows ` #`.
        let code = if trimmed.starts_with('#') { "" } else { trimmed.split(" #").next().unwrap_or("") };
        command.push_str(code);
        if let Some(open) = command.strip_suffix('\\') {
            continued = Some((start, open.to_string()));
            continue;
        }
        let words: Vec<&str> = command.split_whitespace().collect();
        let from = if words.first() == Some(&"just") { Some(0) } else { words.iter().position(|w| *w == "ringtune") };
        if let Some(from) = from {
            found.push((start, words[from..].join(" ")));
        }
    }
    found
}

/// A synopsis as arguments: optional groups opened, the first of alternatives, no `...`; a
/// group that is not flags (`[train settings]`) is left out.
fn arguments(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut group: Option<Vec<String>> = None;
    // A trailing `\` continues the shell line; it is no argument.
    for word in command.split_whitespace().filter(|w| *w != "\\") {
        let opens = word.starts_with('[');
        let closes = word.ends_with(']');
        let bare = word.trim_start_matches('[').trim_end_matches(']');
        let bare = bare.split('|').next().unwrap_or(bare);
        // A placeholder (`N`, `LR`, `DIR`) or a shell variable (`"$SLURM_CPUS_PER_TASK"`) stands
        // for a value: a number fits each.
        let placeholder = !bare.is_empty() && bare.chars().all(|c| c.is_ascii_uppercase());
        let bare = if placeholder || bare.trim_matches('"').starts_with('$') { "1" } else { bare };
        let bare = bare.to_string();
        if opens {
            group = Some(Vec::new());
        }
        match group.as_mut() {
            Some(g) if bare != "..." => g.push(bare),
            Some(_) => {}
            None if bare != "..." => words.push(bare),
            None => {}
        }
        if closes {
            if let Some(g) = group.take() {
                if g.first().is_some_and(|w| w.starts_with('-')) {
                    words.extend(g);
                }
            }
        }
    }
    words
}

fn ringtune_parses(args: &[String]) -> Result<(), String> {
    // `launch`'s settings after `--` belong to `ringtune train`, checked on their own lines.
    let args: Vec<&String> = args.iter().take_while(|a| *a != "--").collect();
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune")).args(&args).arg("--help").output().expect("run ringtune");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("").to_string())
    }
}

fn just_recipes() -> Vec<String> {
    let out = Command::new("just").arg("--summary").current_dir(root()).output().expect("`just` on the PATH");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

#[test]
fn every_command_in_the_readme_and_the_docs_runs_as_written() {
    let files = markdown_documents();
    let recipes = just_recipes();
    let mut checked = 0;
    let mut wrong = Vec::new();
    for file in &files {
        for (line, command) in commands(file) {
            let words = arguments(&command);
            let result = match words.split_first() {
                Some((program, rest)) if program == "ringtune" => ringtune_parses(rest),
                Some((program, rest)) if program == "just" => match rest.split_first() {
                    None => Ok(()),
                    Some((recipe, _)) if !recipes.contains(recipe) => Err(format!("no recipe `{recipe}`")),
                    Some((recipe, settings)) if recipe == "train" => {
                        ringtune_parses(&[vec!["train".to_string()], settings.to_vec()].concat())
                    }
                    Some(_) => Ok(()),
                },
                _ => Ok(()),
            };
            checked += 1;
            if let Err(e) = result {
                wrong.push(format!("{}:{line}: `{command}`: {e}", file.display()));
            }
        }
    }
    assert!(checked >= 10, "only {checked} commands found: is the README's ```sh fence still read?");
    assert!(wrong.is_empty(), "commands that do not run as written:\n{}", wrong.join("\n"));
}

#[test]
fn synopses_read_as_usage() {
    let words = arguments("ringtune train --task cola|sst2 [--data DIR] ... [--resume] [train settings]");
    assert_eq!(words, ["ringtune", "train", "--task", "cola", "--data", "1", "--resume"]);
    assert!(ringtune_parses(&["train".into(), "--no-such-flag".into()]).is_err(), "an unknown flag is refused");
    assert!(ringtune_parses(&["train".into(), "--quoting".into(), "sometimes".into()]).is_err(), "a bad value too");
    assert!(ringtune_parses(&["eval".into(), "--model".into(), "runs/x".into(), "--int8".into()]).is_ok());
    assert_eq!(
        arguments(r#"ringtune train --threads "$SLURM_CPUS_PER_TASK""#),
        ["ringtune", "train", "--threads", "1"]
    );
}

#[test]
fn launched_and_continued_commands_are_read_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cluster.md");
    let text = "```sh\nexport A=1\nsrun ringtune train --threads 4 \\\n    --output runs/x   # a comment\n\
                mpirun -np 4 -x B=1 \\\n    ringtune train --epochs 1\njust train\n```\n```\nringtune not-sh\n```\n";
    std::fs::write(&file, text).expect("write");
    let found = commands(&file);
    assert_eq!(
        found,
        [
            (3, "ringtune train --threads 4 --output runs/x".to_string()),
            (5, "ringtune train --epochs 1".to_string()),
            (7, "just train".to_string())
        ]
    );
}
