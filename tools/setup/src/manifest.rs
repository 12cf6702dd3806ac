//! Provisioning manifests: which pinned wheels to fetch and which files to take out of them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::ProvisionError;

/// One provisioned item (a runtime library or a model), read from a TOML manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Short name, used by `--with NAME` and in messages.
    pub name: String,
    /// One line for humans.
    pub description: String,
    /// Folder (relative to the workspace root) that receives the extracted files.
    pub dest: PathBuf,
    /// Optional items are provisioned only when asked for by name (large downloads).
    #[serde(default)]
    pub optional: bool,
    /// The wheels to download, in order.
    pub wheels: Vec<Wheel>,
    /// What to take out of the wheels.
    pub extract: Extract,
}

/// A pinned PyPI wheel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wheel {
    /// PyPI project name.
    pub package: String,
    /// Exact version.
    pub version: String,
    /// The wheel's file name as pip saves it.
    pub file: String,
    /// sha256 of the wheel file.
    pub sha256: String,
    /// `--platform` for pip (binary wheels only).
    pub platform: Option<String>,
    /// `--python-version` for pip (binary wheels only).
    pub python_version: Option<String>,
    /// For split archives: the member of this wheel that holds this wheel's part.
    pub part: Option<String>,
}

/// Which files to extract and their pinned checksums.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Extract {
    /// Folder prefix inside the archive (`onnxruntime/capi/`).
    pub from: String,
    /// The files under `from`, each checked after extraction and on every later run.
    pub files: Vec<PinnedFile>,
}

/// A file with its pinned sha256.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedFile {
    /// Path relative to `from` inside the archive and to `dest` on disk.
    pub name: String,
    /// Lower-case hex sha256.
    pub sha256: String,
}

impl Manifest {
    /// Reads and checks one manifest file.
    pub fn load(path: &Path) -> Result<Self, ProvisionError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ProvisionError::Io { what: format!("reading manifest {}", path.display()), source })?;
        let manifest: Manifest = toml::from_str(&text)
            .map_err(|e| ProvisionError::Manifest { path: path.to_path_buf(), reason: e.to_string() })?;
        manifest.check().map_err(|reason| ProvisionError::Manifest { path: path.to_path_buf(), reason })?;
        Ok(manifest)
    }

    fn check(&self) -> Result<(), String> {
        if self.wheels.is_empty() {
            return Err("no [[wheels]] listed".into());
        }
        let split = self.wheels.iter().filter(|w| w.part.is_some()).count();
        if split != 0 && split != self.wheels.len() {
            return Err("either every wheel names a `part` or none does".into());
        }
        if split == 0 && self.wheels.len() > 1 {
            return Err("several wheels need a `part` each (they are joined into one archive)".into());
        }
        let hashes = self
            .wheels
            .iter()
            .map(|w| (&w.file, &w.sha256))
            .chain(self.extract.files.iter().map(|f| (&f.name, &f.sha256)));
        for (name, hash) in hashes {
            if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("`{name}`: sha256 must be 64 hex digits"));
            }
        }
        for f in &self.extract.files {
            let p = Path::new(&f.name);
            if p.is_absolute() || p.components().any(|c| c.as_os_str() == "..") {
                return Err(format!("`{}`: file names must stay inside `dest`", f.name));
            }
        }
        if self.dest.is_absolute() {
            return Err("`dest` must be relative to the workspace root".into());
        }
        Ok(())
    }

    /// Reads every `*.toml` manifest in `dir`, sorted by file name.
    pub fn load_dir(dir: &Path) -> Result<Vec<Self>, ProvisionError> {
        let entries = std::fs::read_dir(dir)
            .map_err(|source| ProvisionError::Io { what: format!("listing manifests in {}", dir.display()), source })?;
        let mut paths = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| ProvisionError::Io {
                what: format!("listing manifests in {}", dir.display()),
                source,
            })?;
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "toml") {
                paths.push(path);
            }
        }
        paths.sort();
        paths.iter().map(|p| Self::load(p)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "demo"
description = "a demo"
dest = "models/demo"
[[wheels]]
package = "demo"
version = "1.0"
file = "demo-1.0-py3-none-any.whl"
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
[extract]
from = "demo/"
files = [{ name = "a.txt", sha256 = "1111111111111111111111111111111111111111111111111111111111111111" }]
"#;

    fn parse(text: &str) -> Result<Manifest, ProvisionError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("m.toml");
        std::fs::write(&path, text).expect("write");
        Manifest::load(&path)
    }

    #[test]
    fn reads_a_manifest() {
        let m = parse(GOOD).expect("valid manifest");
        assert_eq!(m.name, "demo");
        assert_eq!(m.extract.files.len(), 1);
        assert!(!m.optional);
    }

    #[test]
    fn refuses_bad_hashes_and_escaping_paths() {
        let short = GOOD.replace("1111111111111111111111111111111111111111111111111111111111111111", "abc");
        let err = parse(&short).expect_err("short hash").to_string();
        assert!(err.contains("a.txt") && err.contains("64 hex"), "{err}");
        let escape = GOOD.replace("name = \"a.txt\"", "name = \"../a.txt\"");
        let err = parse(&escape).expect_err("escaping path").to_string();
        assert!(err.contains("inside `dest`"), "{err}");
        let unknown = GOOD.replace("optional", "x").replace("description", "descr");
        assert!(parse(&unknown).is_err());
    }
}
