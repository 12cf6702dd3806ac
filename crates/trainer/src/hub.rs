//! Models by name (`--model sentence-transformers/all-MiniLM-L6-v2`): found in the Hugging Face
//! cache as `huggingface_hub` lays it out (`<cache>/models--org--name/snapshots/<commit>`, a
//! branch or tag's commit in `refs/<revision>`), the cache where `HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` says.
//! A path that exists is a folder, as before.

use std::path::{Path, PathBuf};

use crate::TrainError;

/// The environment the cache is found by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubEnv {
    /// `HF_HUB_CACHE`.
    pub hub_cache: Option<PathBuf>,
    /// `HF_HOME`.
    pub home: Option<PathBuf>,
    /// `XDG_CACHE_HOME`.
    pub xdg_cache: Option<PathBuf>,
    /// `HOME`.
    pub user_home: Option<PathBuf>,
}

impl HubEnv {
    /// This process's environment (empty values read as unset).
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        HubEnv {
            hub_cache: var("HF_HUB_CACHE"),
            home: var("HF_HOME"),
            xdg_cache: var("XDG_CACHE_HOME"),
            user_home: var("HOME"),
        }
    }

    /// The cache's folder, as `huggingface_hub` picks it.
    pub fn cache(&self) -> PathBuf {
        if let Some(cache) = &self.hub_cache {
            return cache.clone();
        }
        let home = match (&self.home, &self.xdg_cache, &self.user_home) {
            (Some(home), _, _) => home.clone(),
            (None, Some(xdg), _) => xdg.join("huggingface"),
            (None, None, Some(user)) => user.join(".cache/huggingface"),
            (None, None, None) => PathBuf::from(".cache/huggingface"),
        };
        home.join("hub")
    }
}

/// Whether `model` reads as a Hub name (`name` or `org/name` of letters, digits, `-`, `_`, `.`)
/// rather than a path.
pub fn is_model_name(model: &str) -> bool {
    let parts: Vec<&str> = model.split('/').collect();
    let part_ok = |p: &&str| {
        !p.is_empty() && !p.starts_with('.') && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    (1..=2).contains(&parts.len()) && parts.iter().all(part_ok)
}

/// The snapshot folder of `name` at `revision` (a branch, a tag, or a commit) in `cache`, or a
/// message saying where it looked.
pub fn snapshot(cache: &Path, name: &str, revision: &str) -> Result<PathBuf, String> {
    let repo = cache.join(format!("models--{}", name.replace('/', "--")));
    let reference = repo.join("refs").join(revision);
    let commit = match std::fs::read_to_string(&reference) {
        Ok(commit) => commit.trim().to_string(),
        Err(_) if revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit()) => revision.to_string(),
        Err(_) => {
            return Err(format!(
                "{name} (revision {revision}) is not in the Hugging Face cache: no {}",
                reference.display()
            ))
        }
    };
    let folder = repo.join("snapshots").join(&commit);
    if folder.join("config.json").is_file() {
        Ok(folder)
    } else {
        Err(format!("{name} (revision {revision}): {} has no config.json", folder.display()))
    }
}

/// The folder of `--model` as given (`model`, found at `path` when it is one): the path when
/// it exists (or `model` does not read as a name), else the cached snapshot of that name at
/// `revision` (default `main`).
pub fn locate(model: &Path, path: &Path, revision: Option<&str>, env: &HubEnv) -> Result<PathBuf, TrainError> {
    let name = model.to_str().filter(|n| is_model_name(n));
    match name {
        Some(name) if !path.exists() => {
            let revision = revision.unwrap_or("main");
            snapshot(&env.cache(), name, revision).map_err(|reason| TrainError::ModelNotFound {
                model: name.to_string(),
                reason: format!(
                    "{reason}; this build does not download: fetch it with `huggingface-cli download {name}` \
                     (on a machine online, into the same cache), or give --model a folder"
                ),
            })
        }
        _ => Ok(path.to_path_buf()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_found_as_huggingface_hub_finds_it() {
        let env = HubEnv { user_home: Some("/home/u".into()), ..HubEnv::default() };
        assert_eq!(env.cache(), PathBuf::from("/home/u/.cache/huggingface/hub"));
        let xdg = HubEnv { xdg_cache: Some("/x".into()), ..env.clone() };
        assert_eq!(xdg.cache(), PathBuf::from("/x/huggingface/hub"));
        let home = HubEnv { home: Some("/hf".into()), ..xdg.clone() };
        assert_eq!(home.cache(), PathBuf::from("/hf/hub"));
        let hub = HubEnv { hub_cache: Some("/c".into()), ..home };
        assert_eq!(hub.cache(), PathBuf::from("/c"));
    }

    #[test]
    fn names_are_told_from_paths() {
        for name in ["sentence-transformers/all-MiniLM-L6-v2", "bert-base-uncased", "org/model.v2"] {
            assert!(is_model_name(name), "{name}");
        }
        for path in ["models/a/b", "./model", "/abs/path", "../up", "a//b", ""] {
            assert!(!is_model_name(path), "{path}");
        }
    }

    #[test]
    fn a_snapshot_is_found_by_branch_or_commit_and_a_missing_one_says_where_it_looked() {
        let cache = tempfile::tempdir().expect("dir");
        let repo = cache.path().join("models--org--tiny");
        let commit = "0123456789abcdef0123456789abcdef01234567";
        std::fs::create_dir_all(repo.join("refs")).expect("refs");
        std::fs::create_dir_all(repo.join("snapshots").join(commit)).expect("snapshot");
        std::fs::write(repo.join("refs/main"), format!("{commit}\n")).expect("ref");
        std::fs::write(repo.join("snapshots").join(commit).join("config.json"), "{}").expect("config");
        let found = repo.join("snapshots").join(commit);
        assert_eq!(snapshot(cache.path(), "org/tiny", "main"), Ok(found.clone()));
        assert_eq!(snapshot(cache.path(), "org/tiny", commit), Ok(found));
        let missing = snapshot(cache.path(), "org/tiny", "v2").expect_err("no such branch");
        assert!(missing.contains("refs/v2") && missing.contains("org/tiny"), "{missing}");
        let absent = snapshot(cache.path(), "org/other", "main").expect_err("not cached");
        assert!(absent.contains("models--org--other"), "{absent}");
    }
}
