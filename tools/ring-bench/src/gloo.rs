//! gloo, the yardstick: measured in this run with a given PyTorch (`gloo_rank.py`, one process
//! per rank, on loopback or one per emulated host), else the figures of `gloo-reference.toml`,
//! labelled as quoted.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// gloo's bus bandwidth per size, and where the figures come from.
pub(crate) struct Gloo {
    /// Label of the column.
    pub(crate) source: String,
    /// Bus bandwidth in GB/s (a number or a quoted range), by floats.
    pub(crate) busbw: BTreeMap<usize, String>,
}

#[derive(Deserialize)]
struct Reference {
    source: String,
    rows: Vec<ReferenceRow>,
}

#[derive(Deserialize)]
struct ReferenceRow {
    ranks: usize,
    floats: usize,
    busbw: String,
}

impl Gloo {
    /// `gloo-reference.toml`'s figures for `ranks` ranks on loopback.
    pub(crate) fn quoted(ranks: usize) -> Result<Self> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("gloo-reference.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let reference: Reference =
            toml::from_str(&text).with_context(|| format!("{} is not a reference", path.display()))?;
        let busbw = reference.rows.into_iter().filter(|r| r.ranks == ranks).map(|r| (r.floats, r.busbw)).collect();
        Ok(Gloo { source: format!("quoted from {}", reference.source), busbw })
    }

    /// gloo measured now on loopback: `ranks` processes (`gloo_rank.py`), one thread each.
    pub(crate) fn measured_on_loopback(python: &Path, ranks: usize, floats: &[usize], repeats: usize) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free port for gloo's rendezvous")?
            .port();
        let rank_command = |_| {
            let mut command = Command::new(python);
            command.env("GLOO_SOCKET_IFNAME", "lo");
            command
        };
        let busbw = run_ranks(rank_command, ranks, &format!("127.0.0.1:{port}"), floats, repeats)?;
        Ok(Gloo { source: "measured in this run".into(), busbw })
    }

    /// No figures, and why.
    pub(crate) fn not_measured(why: &str) -> Self {
        Gloo { source: format!("not measured: {why}"), busbw: BTreeMap::new() }
    }

    /// gloo measured now on the emulated hosts: one rank per host (`gloo_rank.py`), each with
    /// one thread, over the hosts' interfaces.
    pub(crate) fn measured_on_cluster(
        net: &crate::cluster::Cluster,
        python: &Path,
        floats: &[usize],
        repeats: usize,
    ) -> Result<Self> {
        let master = format!("{}:4100", net.addr(0));
        let busbw = run_ranks(|h| net.command(h, python), net.hosts(), &master, floats, repeats)?;
        Ok(Gloo { source: "measured in this run, same hosts".into(), busbw })
    }

    pub(crate) fn get(&self, floats: usize) -> &str {
        self.busbw.get(&floats).map_or("-", String::as_str)
    }
}

/// Runs `world` ranks of `gloo_rank.py`, rank `h` by `rank_command(h)` (a Python), and collects
/// rank 0's bus bandwidth per size.
fn run_ranks(
    rank_command: impl Fn(usize) -> Command,
    world: usize,
    master: &str,
    floats: &[usize],
    repeats: usize,
) -> Result<BTreeMap<usize, String>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gloo_rank.py");
    let sizes: Vec<String> = floats.iter().map(usize::to_string).collect();
    let mut ranks = crate::processes::Processes::default();
    for h in 0..world {
        ranks.spawn(
            rank_command(h)
                .arg(&script)
                .args(["--rank", &h.to_string(), "--world", &world.to_string(), "--master", master])
                .args(["--sizes", &sizes.join(","), "--iters", &repeats.to_string()])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped()),
        )?;
    }
    let mut busbw = BTreeMap::new();
    for (h, out) in ranks.wait_all()?.into_iter().enumerate() {
        if !out.status.success() {
            bail!("gloo rank {h}: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or(""));
        }
        for line in String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.strip_prefix("RESULT ")) {
            let row: serde_json::Value = serde_json::from_str(line)?;
            let (Some(n), Some(bw)) = (row["elems"].as_u64(), row["busbw_GBps"].as_f64()) else { continue };
            busbw.insert(n as usize, format!("{bw:.2}"));
        }
    }
    Ok(busbw)
}
