//! A missing or wrong library is an error that names the path and says `just setup`, never a
//! panic. One test function, because a process loads ONNX Runtime at most once.

use std::path::Path;

use ringtune_runtime::{default_library_path, Runtime, RuntimeError};

#[test]
fn wrong_libraries_are_refused_then_the_right_one_loads() {
    let dir = std::env::temp_dir().join(format!("ringtune-bad-lib-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");

    let missing = dir.join("libonnxruntime.so.0");
    let err = Runtime::load(&missing, "a test").err().expect("missing file");
    assert!(matches!(err, RuntimeError::LibraryNotFound { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&missing.display().to_string()) && msg.contains("just setup"), "{msg}");

    let garbage = dir.join("libgarbage.so");
    std::fs::write(&garbage, b"not a shared library").expect("write");
    let err = Runtime::load(&garbage, "a test").err().expect("garbage file");
    assert!(matches!(err, RuntimeError::LibraryLoad { .. }), "{err}");
    assert!(err.to_string().contains("libgarbage.so"), "{err}");

    // A real shared library that is not ONNX Runtime.
    let libm = Path::new("/lib/x86_64-linux-gnu/libm.so.6");
    if libm.exists() {
        let err = Runtime::load(libm, "a test").err().expect("not ONNX Runtime");
        assert!(err.to_string().contains("OrtGetApiBase"), "{err}");
    }

    let good = default_library_path();
    let rt = Runtime::load(&good.path, &good.origin).expect("the provisioned library loads after the failures");
    assert_eq!(rt.version(), ringtune_runtime::ORT_VERSION);
    let err = Runtime::load(&garbage, "a test").err().expect("a second library");
    assert!(matches!(err, RuntimeError::AlreadyLoaded { .. }), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
