//! Faults on the emulated cluster (`ring-bench --cluster netns`): loss and reordering on every
//! link leave the all-reduce bit-identical to a clean run; a cut shorter than the deadline is
//! ridden out with the same result; a longer one makes every rank exit non-zero within the
//! deadline + 10 s, naming the unreachable peer; a cut reaches the ranks of a command run on the
//! hosts (`ring-bench ... -- ringtune train`). `ip netns list` is the same before and after
//! every run, failed and interrupted ones included. Skipped, saying why, where namespaces cannot be made.

use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One cluster at a time: runs share two cores and the list of namespaces.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().expect("ip");
    String::from_utf8_lossy(&out.stdout).lines().map(String::from).collect()
}

/// Why this machine cannot run the cluster, if it cannot.
fn cannot_make_namespaces() -> Option<String> {
    let probe = format!("rtprobe{}", std::process::id());
    match Command::new("ip").args(["netns", "add", &probe]).output() {
        Err(e) => Some(format!("no `ip` command ({e})")),
        Ok(out) if !out.status.success() => {
            Some(format!("cannot make network namespaces: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
        Ok(_) => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).output();
            None
        }
    }
}

/// Runs ring-bench on a 4-host cluster with `extra`, checking that it leaves no namespace.
fn ring_bench(extra: &[&str]) -> Option<(Output, Duration)> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_make_namespaces() {
        eprintln!("skipped: {why}");
        return None;
    }
    let before = namespaces();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns", "--ranks", "4", "--floats", "2000000", "--repeats", "30"])
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run ring-bench");
    let took = started.elapsed();
    assert_eq!(namespaces(), before, "ring-bench left namespaces behind");
    Some((out, took))
}

fn result_hash(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("result of 2000000 floats: sha256 "))
        .map(|rest| rest.split_whitespace().next().unwrap_or_default().to_string())
        .expect("a result line")
}

#[test]
fn loss_reordering_and_a_short_cut_leave_the_result_bit_identical() {
    let Some((clean, _)) = ring_bench(&["--deadline", "8"]) else { return };
    let clean = result_hash(&clean);
    let Some((lossy, _)) = ring_bench(&["--deadline", "8", "--impair", "0.01,0.01"]) else { return };
    assert_eq!(result_hash(&lossy), clean, "1% loss and 1% reordering on every link");
    let Some((cut, _)) = ring_bench(&["--deadline", "8", "--cut", "2,1.0,2"]) else { return };
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert!(stderr.contains("host 2's link down for 2 s"), "the cut happened during the run: {stderr}");
    assert_eq!(result_hash(&cut), clean, "a 2 s cut under an 8 s deadline");
}

#[test]
fn a_cut_longer_than_the_deadline_fails_every_rank_naming_the_peer() {
    let deadline = 4.0;
    let Some((out, took)) =
        ring_bench(&["--floats", "4000000", "--repeats", "200", "--deadline", "4", "--cut", "2,1.0,60"])
    else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "rank 0 (exit status: 1), rank 1 (exit status: 1), rank 2 (exit status: 1), rank 3 (exit status: 1) failed"
        ),
        "{stderr}"
    );
    // Host 2 is the unreachable one: its neighbours name it, and the others hear it from them.
    // The ranks write to one pipe, so two messages can share a line: count the naming, not
    // the lines (the summary line names every rank by its exit status).
    let naming_rank_2: usize =
        stderr.lines().filter(|l| !l.contains("exit status")).map(|l| l.matches("rank 2 (").count()).sum();
    assert!(naming_rank_2 >= 3, "{stderr}");
    // The cut came 1 s in; every rank was gone within the deadline + 10 s of it (the link
    // comes back only when the run ends).
    assert!(took.as_secs_f64() < 1.0 + deadline + 10.0 + 3.0, "took {took:?}: {stderr}");
}

/// Runs `command` on a 2-host cluster with `extra` ring-bench flags, checking that it leaves no
/// namespace.
fn on_two_hosts(extra: &[&str], command: &[&str]) -> Option<Output> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_make_namespaces() {
        eprintln!("skipped: {why}");
        return None;
    }
    let before = namespaces();
    let out = Command::new(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns", "--ranks", "2"])
        .args(extra)
        .arg("--")
        .args(command)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run ring-bench");
    assert_eq!(namespaces(), before, "ring-bench left namespaces behind");
    Some(out)
}

#[test]
fn a_cut_reaches_the_ranks_of_a_command() {
    // Host 1 dials host 0 while its link is down: the attempt times out (124) where, up, it
    // would be refused at once (nothing listens there).
    let script = r#"sleep 1.5; if [ "$RANK" = 1 ]; then timeout 1 bash -c "</dev/tcp/$MASTER_ADDR/9" 2>/dev/null; [ $? = 124 ]; fi"#;
    let Some(cut) = on_two_hosts(&["--cut", "1,0.5,3"], &["/bin/bash", "-c", script]) else { return };
    let (stdout, stderr) = (String::from_utf8_lossy(&cut.stdout), String::from_utf8_lossy(&cut.stderr));
    assert!(cut.status.success(), "host 1 reached host 0 through a cut link:\n{stdout}\n{stderr}");
    assert!(stderr.contains("host 1's link down for 3 s"), "{stderr}");
    let Some(up) = on_two_hosts(&[], &["/bin/bash", "-c", script]) else { return };
    assert!(!up.status.success(), "without the cut, host 1's dial must be refused, not time out");
}

#[test]
fn without_privileges_it_says_so_and_fails() {
    let Ok(setpriv) = which("setpriv") else {
        eprintln!("skipped: no setpriv to drop privileges with");
        return;
    };
    let out = Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"])
        .arg(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns"])
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run ring-bench unprivileged");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--cluster netns needs root or CAP_NET_ADMIN"), "{stderr}");
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(program)).find(|p| p.is_file()))
        .ok_or(())
}

#[test]
fn an_interrupted_run_leaves_nothing_behind() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(why) = cannot_make_namespaces() {
        eprintln!("skipped: {why}");
        return;
    }
    let before = namespaces();
    let mut run = Command::new(env!("CARGO_BIN_EXE_ringtune-ring-bench"))
        .args(["--cluster", "netns", "--floats", "4000000", "--repeats", "1000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start ring-bench");
    let made = Instant::now();
    while namespaces().len() < before.len() + 5 && made.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    let pid = run.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().expect("kill").success());
    let status = run.wait().expect("wait");
    assert_eq!(status.code(), Some(130), "exits as interrupted");
    assert_eq!(namespaces(), before, "the namespaces are gone");
    let ranks = Command::new("pgrep").args(["-f", "ringtune-ring-bench --child"]).output().expect("pgrep");
    assert!(ranks.stdout.is_empty(), "ranks left running: {}", String::from_utf8_lossy(&ranks.stdout));
}
