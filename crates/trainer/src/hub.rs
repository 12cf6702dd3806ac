//! Models by name (`--model sentence-transformers/all-MiniLM-L6-v2`): found in the Hugging Face
//! cache as `huggingface_hub` lays it out (`<cache>/models--org--name/snapshots/<commit>`, a
//! branch or tag's commit in `refs/<revision>`), the cache where `HF_HUB_CACHE`, else
//! `HF_HOME/hub`, else `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub` says.
//! A model the cache lacks is downloaded into it by Hugging Face's own client (`hf-hub`) from
//! `HF_ENDPOINT` (default the Hub), the files a run reads only, unless `HF_HUB_OFFLINE` says not
//! to. A path that exists is a folder, as before.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

use crate::TrainError;

/// Where models are downloaded from when `HF_ENDPOINT` does not say.
const HUB: &str = "https://huggingface.co";

/// The files of a model's repository a run reads (those it has): the config, the weights and
/// the tokenizer's files; other formats' weights and the rest are not downloaded.
const RUN_FILES: [&str; 6] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
];

/// The environment the cache and the Hub are found by.
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
    /// `HF_ENDPOINT`: the Hub, or a mirror of it.
    pub endpoint: Option<String>,
    /// `HF_HUB_OFFLINE` set true: nothing is downloaded.
    pub offline: bool,
    /// `HF_TOKEN` (else the token file `huggingface-cli login` wrote in the Hugging Face home).
    pub token: Option<String>,
}

impl HubEnv {
    /// This process's environment (empty values read as unset).
    pub fn from_env() -> Self {
        let text = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        HubEnv {
            hub_cache: var("HF_HUB_CACHE"),
            home: var("HF_HOME"),
            xdg_cache: var("XDG_CACHE_HOME"),
            user_home: var("HOME"),
            endpoint: text("HF_ENDPOINT"),
            // huggingface_hub's reading of a boolean variable.
            offline: text("HF_HUB_OFFLINE")
                .is_some_and(|v| ["1", "on", "yes", "true"].contains(&v.to_ascii_lowercase().as_str())),
            token: text("HF_TOKEN"),
        }
    }

    /// The Hugging Face home, as `huggingface_hub` picks it.
    fn hf_home(&self) -> PathBuf {
        match (&self.home, &self.xdg_cache, &self.user_home) {
            (Some(home), _, _) => home.clone(),
            (None, Some(xdg), _) => xdg.join("huggingface"),
            (None, None, Some(user)) => user.join(".cache/huggingface"),
            (None, None, None) => PathBuf::from(".cache/huggingface"),
        }
    }

    /// The cache's folder, as `huggingface_hub` picks it.
    pub fn cache(&self) -> PathBuf {
        self.hub_cache.clone().unwrap_or_else(|| self.hf_home().join("hub"))
    }

    /// The token sent to the Hub, if any.
    fn token(&self) -> Option<String> {
        self.token.clone().or_else(|| {
            let saved = std::fs::read_to_string(self.hf_home().join("token")).ok()?;
            Some(saved.trim().to_string()).filter(|t| !t.is_empty())
        })
    }

    fn endpoint(&self) -> &str {
        self.endpoint.as_deref().unwrap_or(HUB).trim_end_matches('/')
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

/// Downloads the files a run reads of `name` at `revision` into `cache` from `env`'s endpoint
/// (each file once: one already in the cache at that commit is not fetched again); the
/// snapshot folder, or what went wrong.
pub fn download(cache: &Path, name: &str, revision: &str, env: &HubEnv) -> Result<PathBuf, String> {
    let endpoint = env.endpoint();
    let mut builder = ApiBuilder::from_cache(Cache::new(cache.to_path_buf())).with_endpoint(endpoint.to_string());
    if let Some(token) = env.token() {
        builder = builder.with_token(Some(token));
    }
    let api = builder.build().map_err(|e| format!("the Hugging Face client: {e}"))?;
    let repo = api.repo(Repo::with_revision(name.to_string(), RepoType::Model, revision.to_string()));
    let info = repo.info().map_err(|e| format!("{endpoint} did not list it: {e}"))?;
    let listed: BTreeSet<&str> = info.siblings.iter().map(|s| s.rfilename.as_str()).collect();
    for needed in ["config.json", "model.safetensors"] {
        if !listed.contains(needed) {
            return Err(format!(
                "{endpoint} lists no {needed} for it (ringtune reads the config and safetensors weights)"
            ));
        }
    }
    if !listed.contains("tokenizer.json") && !listed.contains("vocab.txt") {
        return Err(format!("{endpoint} lists neither tokenizer.json nor vocab.txt for it"));
    }
    tracing::info!("downloading {name} ({revision}) from {endpoint} into {}", cache.display());
    let mut folder = None;
    for file in RUN_FILES.iter().filter(|f| listed.contains(*f)) {
        let path = repo.get(file).map_err(|e| format!("downloading {file} from {endpoint}: {e}"))?;
        folder = path.parent().map(Path::to_path_buf);
    }
    folder.ok_or_else(|| format!("{endpoint} gave no files"))
}

/// The folder of `--model` as given (`model`, found at `path` when it is one): the path when
/// it exists (or `model` does not read as a name), else the cached snapshot of that name at
/// `revision` (default `main`), downloaded first when the cache lacks it and `env` is online.
pub fn locate(model: &Path, path: &Path, revision: Option<&str>, env: &HubEnv) -> Result<PathBuf, TrainError> {
    let name = match model.to_str().filter(|n| is_model_name(n)) {
        Some(name) if !path.exists() => name,
        _ => return Ok(path.to_path_buf()),
    };
    let revision = revision.unwrap_or("main");
    let cache = env.cache();
    let not_found = |reason: String| TrainError::ModelNotFound { model: name.to_string(), reason };
    match snapshot(&cache, name, revision) {
        Ok(folder) => Ok(folder),
        Err(missing) if env.offline => Err(not_found(format!(
            "{missing}; offline (HF_HUB_OFFLINE): fetch it on a machine online with `huggingface-cli download \
             {name}` into this cache, or give --model a folder"
        ))),
        Err(missing) => download(&cache, name, revision, env).map_err(|failed| {
            not_found(format!(
                "{missing}, and the download failed: {failed}; check the name and --revision, or fetch it with \
                 `huggingface-cli download {name}`, or give --model a folder"
            ))
        }),
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
