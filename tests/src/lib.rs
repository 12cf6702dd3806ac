//! Helpers shared by the end-to-end tests: where the fixtures, data and models are, and
//! comparisons with the tolerances `tests/fixtures/README.md` states.
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

/// `RINGTUNE_FIXTURES`, else the repository's `tests/fixtures` (`just fixtures` remakes them).
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("RINGTUNE_FIXTURES").map(PathBuf::from).unwrap_or_else(|| root().join("tests/fixtures"));
    existing(dir, "the PyTorch reference fixtures", "set RINGTUNE_FIXTURES to the fixtures folder")
}

/// The MRPC folder, found as `ringtune train` finds it (`MRPC_DIR`, else `data/mrpc`, ...).
pub fn mrpc_dir() -> PathBuf {
    match ringtune_data::data_dir(&root()) {
        Ok(found) => found.path,
        Err(e) => panic!("{e}"),
    }
}

/// The provisioned all-MiniLM-L6-v2.
pub fn minilm_dir() -> PathBuf {
    existing(root().join("models/all-MiniLM-L6-v2"), "all-MiniLM-L6-v2", "run `just setup`")
}

/// The provisioned all-mpnet-base-v2 (`just setup-mpnet`).
pub fn mpnet_dir() -> PathBuf {
    existing(root().join("models/all-mpnet-base-v2"), "all-mpnet-base-v2", "run `just setup-mpnet`")
}

/// The loaded ONNX Runtime.
pub fn runtime() -> &'static ringtune_runtime::Runtime {
    match ringtune_runtime::Runtime::get() {
        Ok(rt) => rt,
        Err(e) => panic!("{e}"),
    }
}

/// Whether this CPU has oneDNN bf16 products. Where it has none, asking for them must fail
/// with a message that says what to do (checked here), and the bf16 checks of the caller are
/// skipped with a line saying so.
pub fn bf16_products(test: &str) -> bool {
    use ringtune_ops::{custom_ops, Kernels, Precision};
    match custom_ops(Kernels::OneDnn(Precision::Bf16), 1) {
        Ok(_) => true,
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("--precision fp32"), "an unhelpful refusal: {message}");
            eprintln!("{test}: bf16 not checked on this CPU ({message})");
            false
        }
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

/// A fixture batch file as a padded batch (token types zero where the file has none; float
/// labels are regression scores).
pub fn read_batch(path: &Path) -> ringtune_data::Batch {
    read_batch_prefixed(path, "")
}

/// A batch whose tensors are named `{prefix}input_ids`, ... (the optimizer trace's layout).
pub fn read_batch_prefixed(path: &Path, prefix: &str) -> ringtune_data::Batch {
    let tensors = ringtune_encoders::read_tensor_file(path).expect("batch file");
    let ints = |name: &str| tensors[&format!("{prefix}{name}")].i64s().expect("int64").to_vec();
    let shape = tensors[&format!("{prefix}input_ids")].shape().to_vec();
    let ids = ints("input_ids");
    let types = if tensors.contains_key(&format!("{prefix}token_type_ids")) {
        ints("token_type_ids")
    } else {
        vec![0; ids.len()]
    };
    // Class ids are int64; a regression fixture's scores are float32.
    let labels = &tensors[&format!("{prefix}labels")];
    let (labels, scores) = match labels.f32s() {
        Some(scores) => (vec![0; scores.len()], scores.to_vec()),
        None => (ints("labels"), vec![0.0; shape[0]]),
    };
    ringtune_data::Batch {
        rows: shape[0],
        seq: shape[1],
        input_ids: ids,
        token_type_ids: types,
        attention_mask: ints("attention_mask"),
        labels,
        scores,
        indices: (0..shape[0]).collect(),
    }
}

/// The rows `row_ids` of a row-major matrix `values` of `columns` columns, in that order (the
/// fixtures store large gradients as some of their rows).
pub fn rows_of(values: &[f32], columns: usize, row_ids: &[i64]) -> Vec<f32> {
    row_ids
        .iter()
        .flat_map(|&id| {
            let start = usize::try_from(id).expect("a row id is not negative") * columns;
            values[start..start + columns].iter().copied()
        })
        .collect()
}

/// Checks a gradient against its reference: within `tol` relative L2, except where the
/// reference is analytically zero (norm below 1e-6, e.g. attention key biases, to which
/// softmax is invariant): there the gradient must be as small.
pub fn assert_grad_close(name: &str, got: &[f32], want: &[f32], tol: f64) {
    let norm = want.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
    if norm < 1e-6 {
        let ours = got.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt();
        assert!(ours < 1e-6, "{name}: the reference is zero (norm {norm:e}) but ours has norm {ours:e}");
    } else {
        let r = rel_l2(got, want);
        if std::env::var_os("RINGTUNE_SHOW_ERRORS").is_some() {
            eprintln!("{name}: {r:.2e}");
        }
        assert!(r <= tol, "{name}: relative L2 error {r:e} > {tol:e}");
    }
}
