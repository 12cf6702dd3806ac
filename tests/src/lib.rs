//! Helpers shared by the end-to-end tests: where the fixtures, data and models are, and
//! comparisons with the tolerances `../shared/fixtures/README.md` states.
//!
//! Missing inputs fail loudly with what to do; no test skips silently.

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn existing(path: PathBuf, what: &str, fix: &str) -> PathBuf {
    assert!(path.exists(), "{what} not found at {}: {fix}", path.display());
    path
}

/// `RINGTUNE_FIXTURES`, else `../shared/fixtures` next to the workspace.
pub fn fixtures() -> PathBuf {
    let dir =
        std::env::var_os("RINGTUNE_FIXTURES").map(PathBuf::from).unwrap_or_else(|| root().join("../shared/fixtures"));
    existing(dir, "the PyTorch reference fixtures", "set RINGTUNE_FIXTURES to the fixtures folder")
}

/// `MRPC_DIR`, else `../shared/data/mrpc` next to the workspace.
pub fn mrpc_dir() -> PathBuf {
    let dir = std::env::var_os("MRPC_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("../shared/data/mrpc"));
    existing(dir, "the MRPC data", "set MRPC_DIR to the folder with train.tsv, dev.tsv and test.tsv (`just data`)")
}

/// The provisioned all-MiniLM-L6-v2.
pub fn minilm_dir() -> PathBuf {
    existing(root().join("models/all-MiniLM-L6-v2"), "all-MiniLM-L6-v2", "run `just setup`")
}

/// The loaded ONNX Runtime.
pub fn runtime() -> &'static runtime::Runtime {
    match runtime::Runtime::get() {
        Ok(rt) => rt,
        Err(e) => panic!("{e}"),
    }
}

/// Largest absolute difference.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// `|a - b| / |b|` in L2 norm (computed in f64).
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let diff: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}
