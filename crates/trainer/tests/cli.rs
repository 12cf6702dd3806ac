//! Bad command-line values are refused with a message naming the setting.

mod common;

use std::process::Command;

use common::hub_mirror::HubMirror;
use common::tiny_model;

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
        // Refused, not ignored: one node has nothing to compress.
        (&["train", "--powersgd-rank", "4"][..], "--powersgd-rank sets what nodes send each other"),
        (&["train", "--powersgd-start", "10"][..], "--powersgd-start sets what nodes send each other"),
        (
            &[
                "train",
                "--world",
                "2",
                "--rank",
                "1",
                "--peers",
                "a:1,b:2",
                "--certs",
                "x",
                "--powersgd-rank",
                "0",
                "--powersgd-start",
                "5",
            ][..],
            "--powersgd-start sets how PowerSGD compresses, and this run sends every float",
        ),
        // A join needs a job of several to join, and takes its state from it, not a checkpoint.
        (&["train", "--join"][..], "--join takes a node into a running job"),
        (
            &["train", "--world", "2", "--rank", "1", "--peers", "a:1,b:2", "--certs", "x", "--join", "--resume"][..],
            "--join takes the running job's state, --resume a checkpoint's",
        ),
        (
            &["train", "--world", "2", "--rank", "1", "--peers", "a:1,b:2", "--certs", "x", "--min-nodes", "3"][..],
            "--min-nodes 3",
        ),
        // Only a run that may lose nodes takes one in: without --min-nodes the join would wait in vain.
        (
            &["train", "--world", "2", "--rank", "1", "--peers", "a:1,b:2", "--certs", "x", "--join"][..],
            "--join takes a node into a run started with --min-nodes",
        ),
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

/// `--model org/name`: a model named as on the Hub is read from the Hugging Face cache
/// (`HF_HUB_CACHE`, its `refs/main` and snapshot), at `--revision` where given; one the cache
/// lacks is one line saying where it looked when offline.
#[test]
fn a_model_named_as_on_the_hub_is_found_in_the_cache_or_said_missing() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = dir.path().join("hub");
    let commit = "89abcdef0123456789abcdef0123456789abcdef";
    let snapshot = cache.join("models--org--tiny/snapshots").join(commit);
    std::fs::create_dir_all(snapshot.parent().expect("snapshots")).expect("dirs");
    std::fs::rename(tiny_model(dir.path()), &snapshot).expect("the tiny model as a snapshot");
    std::fs::create_dir_all(cache.join("models--org--tiny/refs")).expect("refs");
    std::fs::write(cache.join("models--org--tiny/refs/main"), commit).expect("ref");
    let data = common::small_mrpc(dir.path(), 32, 8);
    let run = |model: &str, revision: &str, output: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ringtune"))
            .current_dir(dir.path())
            .env("HF_HUB_CACHE", &cache)
            .env("HF_HUB_OFFLINE", "1")
            .args(["train", "--model", model, "--revision", revision, "--data", data.to_str().expect("utf-8")])
            .args(["--output", output, "--max-steps", "1", "--kernels", "mlas", "--threads", "1"])
            .output()
            .expect("run ringtune");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stderr) = run("org/tiny", "main", "by-name");
    assert!(ok, "{stderr}");
    let (ok, stderr) = run("org/tiny", commit, "by-commit");
    assert!(ok, "{stderr}");
    let (ok, stderr) = run("org/absent", "main", "absent");
    assert!(!ok && stderr.contains("--model org/absent") && stderr.contains("models--org--absent"), "{stderr}");
    let (ok, stderr) = run("org/tiny", "v2", "no-such-branch");
    assert!(!ok && stderr.contains("refs/v2"), "{stderr}");
}

/// `--model org/name` the cache lacks is downloaded into it from `HF_ENDPOINT` by `hf-hub`
/// (the files a run reads, not the rest), and read from the cache the next time without a
/// request; with `HF_HUB_OFFLINE=1` a missing model is one line naming the cache, and a name
/// the Hub does not have says what it answered.
#[test]
fn a_model_named_as_on_the_hub_is_downloaded_into_the_cache_unless_offline() {
    let dir = tempfile::tempdir().expect("dir");
    let cache = dir.path().join("hub");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let model = tiny_model(dir.path());
    std::fs::write(model.join("pytorch_model.bin"), b"weights in a format no run reads").expect("extra file");
    let mirror = HubMirror::serve(model, "org/tiny", commit);
    let data = common::small_mrpc(dir.path(), 32, 8);
    let run = |model: &str, offline: bool, output: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_ringtune"))
            .current_dir(dir.path())
            .env("HF_HUB_CACHE", &cache)
            .env("HF_HOME", dir.path().join("hf-home"))
            .env("HF_ENDPOINT", &mirror.endpoint)
            .env("HF_HUB_OFFLINE", if offline { "1" } else { "0" })
            .env_remove("HF_TOKEN")
            .args(["train", "--model", model, "--data", data.to_str().expect("utf-8")])
            .args(["--output", output, "--max-steps", "1", "--kernels", "mlas", "--threads", "1"])
            .output()
            .expect("run ringtune");
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, stderr) = run("org/tiny", false, "downloaded");
    assert!(ok, "{stderr}");
    let repo = cache.join("models--org--tiny");
    assert_eq!(std::fs::read_to_string(repo.join("refs/main")).expect("refs/main"), commit);
    let snapshot = repo.join("snapshots").join(commit);
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(snapshot.join(file).is_file(), "{file} downloaded");
    }
    assert!(!snapshot.join("pytorch_model.bin").exists(), "a file no run reads is not downloaded");
    let asked = mirror.requests();
    let (ok, stderr) = run("org/tiny", false, "from-the-cache");
    assert!(ok, "{stderr}");
    assert_eq!(mirror.requests(), asked, "a cached model is read without asking the Hub");
    let (ok, stderr) = run("org/absent", true, "offline");
    assert!(!ok && stderr.contains("HF_HUB_OFFLINE") && stderr.contains("models--org--absent"), "{stderr}");
    assert_eq!(mirror.requests(), asked, "offline asks nothing");
    let (ok, stderr) = run("org/absent", false, "absent");
    assert!(!ok && stderr.contains(&mirror.endpoint) && stderr.contains("404"), "{stderr}");
}

/// The command lines of running `ringtune train` processes writing to `output`.
#[cfg(target_os = "linux")]
fn ranks_writing(output: &std::path::Path) -> Vec<String> {
    let named = output.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(" train ") && !c.contains(" launch ") && c.contains(&named))
        .collect()
}

/// `ringtune launch` sent SIGINT (or SIGTERM) while its ranks run: it stops them, removes the
/// certificates it made (keys included) and exits 130, rather than dying and leaving both.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupted_launch_stops_its_ranks_and_removes_its_certificates() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let output = dir.path().join("interrupted-launch-run");
    let port = std::net::UdpSocket::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_ringtune"))
        .args(["launch", "--nodes", "2", "--port", &port.to_string(), "--", "--model"])
        .arg(&model)
        .arg("--output")
        .arg(&output)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("launch");
    let certs = std::env::temp_dir().join(format!("ringtune-certs-{}", launcher.id()));
    let started = Instant::now();
    while ranks_writing(&output).len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(30), "the ranks did not start");
        assert!(launcher.try_wait().expect("wait").is_none(), "the launch ended before it was interrupted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(certs.exists(), "no certificates at {}", certs.display());
    let status = Command::new("kill").args(["-INT", &launcher.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let status = loop {
        if let Some(status) = launcher.try_wait().expect("wait") {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "the launcher did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    assert!(!certs.exists(), "certificates left behind");
    assert_eq!(ranks_writing(&output), Vec::<String>::new(), "ranks left running");
}

#[test]
fn eval_refuses_a_file_without_rows_and_a_max_len_past_the_model() {
    let dir = tempfile::tempdir().expect("dir");
    let model = tiny_model(dir.path());
    let header_only = dir.path().join("header-only.tsv");
    std::fs::write(&header_only, "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n").expect("write");
    let (model, file) = (model.to_str().expect("utf8"), header_only.to_str().expect("utf8"));
    let (ok, stderr) = ringtune(&["eval", "--model", model, "--file", file]);
    assert!(!ok && stderr.contains("header-only.tsv has no rows"), "{stderr}");
    let (ok, stderr) = ringtune(&["eval", "--model", model, "--file", file, "--max-len", "1000"]);
    assert!(
        !ok && stderr.contains("--max-len 1000 is not allowed: at most") && stderr.contains("max_position_embeddings"),
        "{stderr}"
    );
}

/// `just train` fetches MRPC only when `--print-task` says the settings train it: the user's
/// files (named by flag or in the settings file) and other GLUE tasks print their own name,
/// reading no data, so a machine without MRPC and without a network trains on its own files.
#[test]
fn print_task_names_the_task_without_reading_data() {
    let dir = tempfile::tempdir().expect("dir");
    let settings = dir.path().join("own.toml");
    std::fs::write(&settings, "train_file = \"/nowhere/train.csv\"\n").expect("toml");
    let settings = settings.to_str().expect("utf-8");
    for (args, printed) in [
        (&[][..], "mrpc"),
        (&["--task", "SST-2"][..], "sst2"),
        (&["--train-file", "/nowhere/train.csv"][..], "files"),
        (&["--config", settings][..], "files"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ringtune"))
            .args(["train", "--print-task"])
            .args(args)
            .env("MRPC_DIR", "/nowhere/mrpc")
            .current_dir(dir.path())
            .output()
            .expect("run ringtune");
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), printed, "{args:?}");
    }
    let (ok, stderr) = ringtune(&["train", "--print-task", "--task", "squad"]);
    assert!(!ok && stderr.contains("unknown task `squad`"), "{stderr}");
}
