//! CPU shares on the emulated cluster (`ring-bench --cluster netns --cpu-share`, `--emulate`):
//! every host's command runs capped (its group waits for its quota), the header says what is
//! scaled and what is not, and no cgroup or namespace is left after a run that succeeds,
//! fails, or is interrupted. Skipped, saying why, where namespaces or cgroups cannot be made.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One cluster at a time: runs share two cores and the lists of namespaces and groups.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The namespaces and the ring-bench cgroups on this machine.
fn made() -> (Vec<String>, Vec<String>) {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip");
    let namespaces = String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect();
    let mut groups = Vec::new();
    for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/cpu"] {
        for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with("ringtune-bench-") {
                groups.push(format!("{root}/{name}"));
            }
        }
    }
    (namespaces, groups)
}

/// Why this machine cannot run the test, if it cannot.
fn cannot_run() -> Option<String> {
    let probe = format!("rtprobe{}", std::process::id());
    match Command::new("ip").args(["netns", "add", &probe]).output() {
        Err(e) => return Some(format!("no `ip` command ({e})")),
        Ok(out) if !out.status.success() => {
            return Some(format!("cannot make network namespaces: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
        Ok(_) => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).output();
        }
    }
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").unwrap_or_default().contains("cpu");
    let v1 = Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists();
    if !v2 && !v1 {
        return Some("no cgroup CPU controller".to_string());
    }
    // A controller that is there may still be read-only (a container's): make a group to see.
    let probe = Path::new(if v2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/cpu" }).join(probe);
    match std::fs::create_dir(&probe) {
        Ok(()) => {
            let _ = std::fs::remove_dir(&probe);
            None
        }
        Err(e) => Some(format!("cannot make a cgroup under {} ({e})", probe.display())),
    }
}

fn ring_bench(args: &[&str]) -> Option<Output> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return None;
    }
    let before = made();
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns"])
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run ring-bench");
    assert_eq!(made(), before, "ring-bench left namespaces or cgroups behind");
    Some(out)
}

/// A shell loop that keeps one core busy for a few tenths of a second.
const BUSY: &str = "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done";

#[test]
fn every_host_runs_capped_and_the_groups_go_with_the_run() {
    let Some(out) = ring_bench(&["--ranks", "2", "--cpu-share", "0.2", "--", "sh", "-c", BUSY]) else { return };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("2 hosts capped at 0.2 cores each"), "{stdout}");
    let waited: Vec<f64> = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ring-bench: seconds each host waited for its CPU share: "))
        .expect("the throttled time")
        .split(", ")
        .map(|s| s.parse().expect("seconds"))
        .collect();
    // Each host's loop needs more CPU time than a fifth of a core gives it at once.
    assert_eq!(waited.len(), 2);
    assert!(waited.iter().all(|&s| s > 0.0), "every host was held to its share: {waited:?}");
}

#[test]
fn emulation_scales_the_link_with_the_share_and_says_what_it_does_not_scale() {
    let Some(out) = ring_bench(&["--ranks", "1", "--cpu-share", "0.5", "--emulate", "c6i.16xlarge", "--", "true"])
    else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("128x slower in time"), "{stdout}");
    assert!(stdout.contains("a 195.3 Mbit/s link"), "{stdout}");
    assert!(stdout.contains("Not scaled: link latency"), "{stdout}");
}

#[test]
fn a_failing_command_fails_the_run_and_leaves_nothing() {
    let Some(out) = ring_bench(&["--ranks", "2", "--cpu-share", "0.5", "--", "sh", "-c", "exit 3"]) else { return };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("host 0: `sh -c exit 3` failed (exit status: 3)"), "{stderr}");
}

#[test]
fn a_share_without_a_number_of_cores_is_refused_before_anything_is_made() {
    let Some(out) = ring_bench(&["--ranks", "2", "--cpu-share", "0", "--", "true"]) else { return };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--cpu-share takes a positive number of cores"), "{stderr}");
}

#[test]
fn an_interrupted_run_leaves_no_group_or_namespace() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_run() {
        eprintln!("skipped: {why}");
        return;
    }
    let before = made();
    let mut run = Command::new(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns", "--ranks", "2", "--cpu-share", "0.5", "--", "sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ring-bench");
    let started = Instant::now();
    while made().1.len() < before.1.len() + 2 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(made().1.len(), before.1.len() + 2, "a group per host while it runs");
    std::thread::sleep(Duration::from_millis(500));
    let pid = run.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().expect("kill").success());
    let status = run.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "exits as interrupted");
    assert_eq!(made(), before, "the groups and namespaces are gone");
}
