//! The cluster an emulated one stands for, scaled in time: every host gets the same share of
//! this machine's cores, so it computes `vCPUs / share` times slower than the node it stands
//! for, and its link is slowed by the same factor, so that computing and sending keep the
//! ratio they have on the real cluster.

use std::str::FromStr;

use anyhow::{bail, Context};

/// A node of the cluster being emulated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Emulated {
    /// Its name, when it is a known instance size.
    pub(crate) name: Option<&'static str>,
    pub(crate) vcpus: f64,
    /// Its sustained network bandwidth.
    pub(crate) gbit: f64,
}

/// EC2 c6i sizes with a sustained (not burst) bandwidth: vCPUs, Gbit/s.
const SIZES: [(&str, f64, f64); 5] = [
    ("c6i.8xlarge", 32.0, 12.5),
    ("c6i.12xlarge", 48.0, 18.75),
    ("c6i.16xlarge", 64.0, 25.0),
    ("c6i.24xlarge", 96.0, 37.5),
    ("c6i.32xlarge", 128.0, 50.0),
];

impl FromStr for Emulated {
    type Err = anyhow::Error;

    /// `c6i.16xlarge`, or `VCPUS,GBIT` (`64,25`).
    fn from_str(s: &str) -> anyhow::Result<Self> {
        if let Some(&(name, vcpus, gbit)) = SIZES.iter().find(|(name, _, _)| *name == s) {
            return Ok(Emulated { name: Some(name), vcpus, gbit });
        }
        let Some((vcpus, gbit)) = s.split_once(',') else {
            let known: Vec<&str> = SIZES.iter().map(|(n, _, _)| *n).collect();
            bail!("--emulate `{s}`: give one of {} or VCPUS,GBIT (e.g. 64,25)", known.join(", "));
        };
        let number = |v: &str, what: &str| -> anyhow::Result<f64> {
            let x: f64 = v.trim().parse().with_context(|| format!("--emulate `{s}`: {what} `{v}`"))?;
            if !(x.is_finite() && x > 0.0) {
                bail!("--emulate `{s}`: {what} must be positive");
            }
            Ok(x)
        };
        Ok(Emulated { name: None, vcpus: number(vcpus, "vCPUs")?, gbit: number(gbit, "Gbit/s")? })
    }
}

impl Emulated {
    /// How many times slower a host with `share` cores computes than this node.
    pub(crate) fn slowdown(&self, share: f64) -> f64 {
        self.vcpus / share
    }

    /// The host's link rate for `share` cores, as tc takes it (kbit/s).
    pub(crate) fn link_rate(&self, share: f64) -> String {
        let kbit = self.gbit * 1e6 / self.slowdown(share);
        format!("{}kbit", kbit.round().max(1.0) as u64)
    }

    /// What the emulation scales and what it does not, for the run's header.
    pub(crate) fn describe(&self, share: f64, delay: Option<&str>) -> String {
        let name = self.name.map_or(String::new(), |n| format!("{n}, "));
        let factor = self.slowdown(share);
        format!(
            "emulating {name}{} vCPUs and {} Gbit/s per node, {factor:.0}x slower in time: each host has {share} cores \
             and a {:.1} Mbit/s link. Scaled: compute and bandwidth. Not scaled: link latency ({} where the kernel has \
             netem), which so weighs {factor:.0}x less than on the real cluster, and the thread scaling of a {}-vCPU node (a host's threads \
             run on {share} cores as if the node's vCPUs scaled perfectly)",
            self.vcpus,
            self.gbit,
            self.gbit * 1e3 / factor,
            delay.unwrap_or("none added"),
            self.vcpus
        )
    }
}

/// The share every host gets by default: this machine's cores over the hosts.
pub(crate) fn default_share(hosts: usize) -> f64 {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores as f64 / hosts as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_pairs_read_alike() {
        let named: Emulated = "c6i.16xlarge".parse().expect("known size");
        let pair: Emulated = "64,25".parse().expect("pair");
        assert_eq!((named.vcpus, named.gbit), (pair.vcpus, pair.gbit));
        assert!("c6i.huge".parse::<Emulated>().expect_err("unknown").to_string().contains("VCPUS,GBIT"));
        assert!("64,-1".parse::<Emulated>().is_err());
    }

    #[test]
    fn the_link_slows_with_the_compute() {
        let node: Emulated = "c6i.16xlarge".parse().expect("known size");
        // Half a core stands for 64 vCPUs: 128x slower, so 25 Gbit/s becomes 195.3 Mbit/s.
        assert_eq!(node.slowdown(0.5), 128.0);
        assert_eq!(node.link_rate(0.5), "195313kbit");
        assert_eq!(node.link_rate(1.0), "390625kbit");
    }
}
