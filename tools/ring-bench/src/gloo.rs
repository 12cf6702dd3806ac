//! gloo, the yardstick: measured in this run with a given PyTorch (ranks on loopback through
//! the reference's own script, or one rank per emulated host through `gloo_rank.py`), else
//! REFERENCE.md's figures, labelled as quoted.

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
    /// REFERENCE.md's figures for `ranks` ranks on loopback.
    pub(crate) fn quoted(ranks: usize) -> Result<Self> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("gloo-reference.toml");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let reference: Reference =
            toml::from_str(&text).with_context(|| format!("{} is not a reference", path.display()))?;
        let busbw = reference.rows.into_iter().filter(|r| r.ranks == ranks).map(|r| (r.floats, r.busbw)).collect();
        Ok(Gloo { source: format!("quoted from {}", reference.source), busbw })
    }

    /// gloo measured now by the reference script on loopback: `ranks` processes, one thread each.
    pub(crate) fn measured_on_loopback(
        python: &Path,
        script: &Path,
        ranks: usize,
        floats: &[usize],
        repeats: usize,
    ) -> Result<Self> {
        if !script.is_file() {
            bail!("no gloo script at {}: give --gloo-script", script.display());
        }
        let sizes: Vec<String> = floats.iter().map(usize::to_string).collect();
        let out = Command::new(python)
            .arg(script)
            .args(["--world", &ranks.to_string(), "--sizes", &sizes.join(","), "--iters", &repeats.to_string()])
            .output()
            .with_context(|| format!("running {} {}", python.display(), script.display()))?;
        let last_complaint = String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("").to_string();
        if !out.status.success() {
            bail!("{} ended with {}: {last_complaint}", script.display(), out.status);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(result) = stdout.lines().find_map(|l| l.strip_prefix("RESULT ")) else {
            bail!("gloo printed no RESULT line: {last_complaint}");
        };
        let value: serde_json::Value = serde_json::from_str(result)?;
        let rows = value["rows"].as_array().context("RESULT without rows")?;
        let busbw = rows
            .iter()
            .filter_map(|r| Some((r["elems"].as_u64()? as usize, format!("{:.2}", r["busbw_GBps"].as_f64()?))))
            .collect();
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
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("gloo_rank.py");
        let master = format!("{}:4100", net.addr(0));
        let sizes: Vec<String> = floats.iter().map(usize::to_string).collect();
        let mut ranks = crate::processes::Processes::default();
        for h in 0..net.hosts() {
            ranks.spawn(
                net.command(h, python)
                    .arg(&script)
                    .args(["--rank", &h.to_string(), "--world", &net.hosts().to_string(), "--master", &master])
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
        Ok(Gloo { source: "measured in this run, same hosts".into(), busbw })
    }

    pub(crate) fn get(&self, floats: usize) -> &str {
        self.busbw.get(&floats).map_or("-", String::as_str)
    }
}
