//! A CPU share per emulated host: one cgroup each, capped at the same fraction of a core
//! (cgroup v2 `cpu.max`, or v1's `cpu.cfs_quota_us` where the machine mounts only v1), so that
//! hosts on one machine compute as if on cores of their own, slower by a known factor. The
//! groups are removed when dropped, when a run fails, or on Ctrl-C.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// The quota's period: 10 ms. A host that used its quota waits out the rest of the period,
/// which adds up to `period x (1 - share)` to whatever it was about to send: 5 ms at half a
/// core. The kernel's default of 100 ms would add 50 ms, more than a whole ring step of the
/// emulated node; at 10 ms the gap, scaled back by the emulation's factor (128x for a
/// c6i.16xlarge on half a core), is 39 us, below a real link's latency. Shorter periods cost
/// the scheduler more for no gain at that scale.
const PERIOD_US: u64 = 10_000;

/// Which cgroup interface caps the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    /// `cpu.max` in the unified hierarchy.
    V2,
    /// `cpu.cfs_quota_us` in the v1 `cpu` hierarchy.
    V1,
}

/// The hierarchy this machine caps CPU time in, if any.
fn hierarchy() -> Option<(Version, PathBuf)> {
    let unified = Path::new("/sys/fs/cgroup");
    let controllers = fs::read_to_string(unified.join("cgroup.controllers")).unwrap_or_default();
    if controllers.split_whitespace().any(|c| c == "cpu") {
        return Some((Version::V2, unified.to_path_buf()));
    }
    let v1 = unified.join("cpu");
    v1.join("cpu.cfs_quota_us").exists().then_some((Version::V1, v1))
}

/// The group names this process makes start with this (known before it makes any, for the
/// Ctrl-C handler).
pub(crate) fn prefix() -> String {
    format!("ringtune-bench-{}-", std::process::id())
}

/// Removes every group named with `prefix`, moving out any process still in one first (a
/// group with members cannot be removed) and retrying briefly while killed ones exit.
pub(crate) fn remove_all(prefix: &str) {
    let Some((_, root)) = hierarchy() else { return };
    let Ok(entries) = fs::read_dir(&root) else { return };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(prefix) {
            remove(&root, &entry.path());
        }
    }
}

fn remove(root: &Path, group: &Path) {
    for _ in 0..50 {
        if fs::remove_dir(group).is_ok() || !group.exists() {
            return;
        }
        // Members left (a process not yet reaped): back to the root group, then again.
        for pid in fs::read_to_string(group.join("cgroup.procs")).unwrap_or_default().lines() {
            let _ = fs::write(root.join("cgroup.procs"), pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("ring-bench: could not remove cgroup {}", group.display());
}

/// One group per host, each capped at `share` cores.
pub(crate) struct CpuShares {
    version: Version,
    root: PathBuf,
    prefix: String,
    hosts: usize,
    share: f64,
}

impl CpuShares {
    /// Makes `hosts` groups capped at `share` cores each. Without root or a cgroup CPU
    /// controller it says so in one sentence.
    pub(crate) fn create(hosts: usize, share: f64) -> Result<Self> {
        if !(share.is_finite() && share > 0.0) {
            bail!("--cpu-share takes a positive number of cores, e.g. 0.5");
        }
        let Some((version, root)) = hierarchy() else {
            bail!(
                "--cpu-share needs a cgroup CPU controller (v2 cpu.max, or v1 cpu.cfs_quota_us), and this machine mounts neither under /sys/fs/cgroup"
            );
        };
        if version == Version::V2 {
            let control = fs::read_to_string(root.join("cgroup.subtree_control")).unwrap_or_default();
            if !control.split_whitespace().any(|c| c == "cpu") {
                // Groups below the root get the controller only when the root hands it down.
                fs::write(root.join("cgroup.subtree_control"), "+cpu").map_err(|e| no_cgroups(&root, e))?;
            }
        }
        let shares = CpuShares { version, root, prefix: prefix(), hosts, share };
        for h in 0..hosts {
            let group = shares.group(h);
            fs::create_dir(&group).map_err(|e| no_cgroups(&shares.root, e))?;
            // The kernel refuses a quota under 1 ms.
            let quota = ((share * PERIOD_US as f64).round() as u64).max(1000);
            match version {
                Version::V2 => write(&group.join("cpu.max"), &format!("{quota} {PERIOD_US}"))?,
                Version::V1 => {
                    write(&group.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                    write(&group.join("cpu.cfs_quota_us"), &quota.to_string())?;
                }
            }
        }
        Ok(shares)
    }

    fn group(&self, h: usize) -> PathBuf {
        self.root.join(format!("{}h{h}", self.prefix))
    }

    /// Puts process `pid` (all its threads, and the children it starts later) in host `h`'s
    /// group.
    pub(crate) fn admit(&self, h: usize, pid: u32) -> Result<()> {
        write(&self.group(h).join("cgroup.procs"), &pid.to_string())
    }

    /// Seconds host `h`'s group waited for its quota so far (the cap at work).
    pub(crate) fn throttled_s(&self, h: usize) -> f64 {
        let stat = fs::read_to_string(self.group(h).join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            stat.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).unwrap_or(0.0)
        };
        match self.version {
            Version::V2 => field("throttled_usec ") / 1e6,
            Version::V1 => field("throttled_time ") / 1e9,
        }
    }

    /// What caps the hosts, for the run's header.
    pub(crate) fn describe(&self) -> String {
        let how = match self.version {
            Version::V2 => "cgroup v2 cpu.max",
            Version::V1 => "cgroup v1 cpu.cfs_quota_us",
        };
        let plural = if self.hosts == 1 { "" } else { "s" };
        format!(
            "{} host{plural} capped at {} cores each ({how}, period {} ms)",
            self.hosts,
            self.share,
            PERIOD_US / 1000
        )
    }
}

impl Drop for CpuShares {
    fn drop(&mut self) {
        remove_all(&self.prefix);
    }
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).with_context(|| format!("writing {value} to {}", path.display()))
}

fn no_cgroups(root: &Path, e: std::io::Error) -> anyhow::Error {
    anyhow::anyhow!("--cpu-share needs root to make cgroups under {} ({e})", root.display())
}
