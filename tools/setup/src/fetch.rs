//! Getting wheels: `pip download`, behind a trait so tests can supply wheels of their own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{ProvisionError, Wheel};

/// Puts one wheel file into a folder.
pub trait Fetch {
    /// Downloads `wheel` into the empty folder `into` and returns the file's path.
    fn fetch(&self, wheel: &Wheel, into: &Path) -> Result<PathBuf, ProvisionError>;
}

/// Downloads with `python3 -m pip download --no-deps --only-binary=:all:`.
#[derive(Debug, Clone)]
pub struct Pip {
    /// The Python interpreter (`RINGTUNE_PYTHON`, else `python3`).
    pub python: String,
    /// Where wheels are cached, named in error messages.
    pub cache: PathBuf,
}

impl Pip {
    /// pip through the interpreter named by `RINGTUNE_PYTHON`, else `python3`.
    pub fn from_env(cache: PathBuf) -> Self {
        let python =
            std::env::var("RINGTUNE_PYTHON").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "python3".to_string());
        Pip { python, cache }
    }

    fn check_pip(&self, wheel: &Wheel) -> Result<(), ProvisionError> {
        let no_pip = |reason: String| ProvisionError::NoPip {
            python: self.python.clone(),
            reason,
            wheel: wheel.file.clone(),
            cache: self.cache.clone(),
        };
        let out = Command::new(&self.python)
            .args(["-m", "pip", "--version"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| no_pip(e.to_string()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(no_pip(last_line(&out.stderr)))
        }
    }
}

impl Fetch for Pip {
    fn fetch(&self, wheel: &Wheel, into: &Path) -> Result<PathBuf, ProvisionError> {
        self.check_pip(wheel)?;
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"])
            .arg("--disable-pip-version-check")
            .arg("--dest")
            .arg(into)
            .arg(format!("{}=={}", wheel.package, wheel.version));
        if let Some(platform) = &wheel.platform {
            cmd.args(["--platform", platform]);
        }
        if let Some(version) = &wheel.python_version {
            cmd.args(["--python-version", version]);
        }
        // pip's own progress bar goes to the terminal; its error text is captured for the message.
        let out =
            cmd.stdin(Stdio::null()).stdout(Stdio::inherit()).stderr(Stdio::piped()).output().map_err(|e| {
                ProvisionError::Io { what: format!("running {} -m pip download", self.python), source: e }
            })?;
        let download_error = |reason: String| ProvisionError::Download {
            package: wheel.package.clone(),
            version: wheel.version.clone(),
            wheel: wheel.file.clone(),
            reason,
            cache: self.cache.clone(),
        };
        if !out.status.success() {
            return Err(download_error(last_line(&out.stderr)));
        }
        let path = into.join(&wheel.file);
        if !path.is_file() {
            return Err(download_error(format!("pip saved something other than the pinned file {}", wheel.file)));
        }
        Ok(path)
    }
}

/// The last non-empty line of a process's output: where pip says what went wrong.
fn last_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    text.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no output").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel() -> Wheel {
        Wheel {
            package: "demo".into(),
            version: "1.0".into(),
            file: "demo-1.0-py3-none-any.whl".into(),
            sha256: "0".repeat(64),
            platform: None,
            python_version: None,
            part: None,
        }
    }

    #[test]
    fn a_missing_python_is_a_no_pip_error_that_says_what_to_do() {
        let pip = Pip { python: "/nonexistent/python3".into(), cache: PathBuf::from(".cache/wheels") };
        let dir = tempfile::tempdir().expect("tempdir");
        let err = pip.fetch(&wheel(), dir.path()).expect_err("no python");
        assert!(matches!(err, ProvisionError::NoPip { .. }), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("install pip") && msg.contains("just setup"), "{msg}");
    }

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(last_line(b"a\nERROR: no network\n\n"), "ERROR: no network");
        assert_eq!(last_line(b""), "no output");
    }
}
