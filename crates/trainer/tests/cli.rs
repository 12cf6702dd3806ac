//! Bad command-line values are refused with a message naming the setting.

use std::process::Command;

fn ringtune(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune")).args(args).output().expect("run ringtune");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_training_values_are_refused_by_name() {
    for (args, expected) in [
        (&["train", "--learning-rate", "-1"][..], "--learning-rate -1"),
        (&["train", "--batch-size", "0"][..], "--batch-size 0"),
        (&["train", "--warmup-ratio", "2"][..], "--warmup-ratio 2"),
        (&["train", "--provider", "cuda"][..], "invalid value 'cuda' for '--provider"),
        (&["train", "--kernels", "cublas"][..], "[possible values: mlas, onednn]"),
        (&["train", "--precision", "fp8"][..], "[possible values: fp32, bf16, auto]"),
        (&["train", "--epochs", "many"][..], "invalid value 'many'"),
        (&["train", "--epoch", "1"][..], "unexpected argument '--epoch'"),
    ] {
        let (ok, stderr) = ringtune(args);
        assert!(!ok, "{args:?} must fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn a_missing_model_folder_is_named() {
    let (ok, stderr) = ringtune(&["train", "--model", "/nonexistent/model", "--max-steps", "1"]);
    assert!(!ok);
    assert!(stderr.contains("/nonexistent/model/config.json"), "{stderr}");
}
