//! An emulated cluster on this machine: every host a network namespace joined to a bridge (in
//! a switch namespace of its own) by a veth pair, each link's rate shaped with `tc`, delay and
//! loss added with `netem` where the kernel has it. Traffic stays between the addresses of the
//! namespaces it made, and everything it made is removed when it is dropped, when a run fails,
//! or on Ctrl-C.

use std::net::Ipv4Addr;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// The shape of every link.
#[derive(Debug, Clone)]
pub(crate) struct LinkSpec {
    /// `tc` rate (`10gbit`, `1gbit`).
    pub(crate) rate: String,
    /// One-way delay added to each direction (`50us`), when the kernel has netem.
    pub(crate) delay: Option<String>,
    /// Loss per direction in percent, with netem.
    pub(crate) loss: f64,
    /// Interface MTU.
    pub(crate) mtu: u32,
}

/// Namespaces, veth pairs and qdiscs of one emulated cluster.
pub(crate) struct Cluster {
    prefix: String,
    hosts: usize,
    subnet: u8,
}

/// Runs `ip` (or `tc`) with `args`; a failure is an error showing the command and its complaint.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program).args(args).output().with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!("`{program} {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The names of this machine's network namespaces.
pub(crate) fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(String::from))
            .collect()
    })
    .unwrap_or_default()
}

/// Removes every namespace whose name starts with `prefix` (their veth ends and qdiscs go
/// with them).
pub(crate) fn remove_all(prefix: &str) {
    for ns in namespaces().into_iter().filter(|n| n.starts_with(prefix)) {
        let _ = run("ip", &["netns", "del", &ns]);
    }
}

/// The prefix of every namespace this process makes (known before it makes any, for the
/// Ctrl-C handler).
pub(crate) fn prefix() -> String {
    format!("rt{}-", std::process::id())
}

/// Whether this kernel's `tc` knows `netem` (delay, loss), tried on the loopback interface of
/// namespace `ns` (so nothing outside the cluster is touched).
fn has_netem(ns: &str) -> bool {
    let ok = run("tc", &["-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1us"]).is_ok();
    if ok {
        let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", "lo", "root"]);
    }
    ok
}

impl Cluster {
    /// Builds `hosts` hosts on one bridge with every link shaped as `link`. Without root or
    /// CAP_NET_ADMIN it says so in one sentence.
    pub(crate) fn create(hosts: usize, link: &LinkSpec) -> Result<Self> {
        let id = std::process::id();
        let cluster = Cluster { prefix: prefix(), hosts, subnet: (id % 200 + 20) as u8 };
        if let Err(e) = run("ip", &["netns", "add", &cluster.switch()]) {
            bail!(
                "--cluster netns needs root or CAP_NET_ADMIN to make network namespaces, veth pairs and tc qdiscs ({e})"
            );
        }
        let netem = has_netem(&cluster.switch());
        if !netem && link.loss > 0.0 {
            bail!("--loss needs the kernel's netem qdisc (sch_netem), which this kernel lacks");
        }
        if !netem && link.delay.is_some() {
            println!("links without added delay: this kernel lacks netem (sch_netem)");
        }
        let sw = cluster.switch();
        let mtu = link.mtu.to_string();
        run("ip", &["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        run("ip", &["-n", &sw, "link", "set", "br0", "mtu", &mtu, "up"])?;
        for h in 0..hosts {
            let (ns, port) = (cluster.host(h), format!("h{h}"));
            run("ip", &["netns", "add", &ns])?;
            run("ip", &["-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            run("ip", &["-n", &sw, "link", "set", &port, "master", "br0", "mtu", &mtu, "up"])?;
            run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
            run("ip", &["-n", &ns, "link", "set", "eth0", "mtu", &mtu, "up"])?;
            let addr = format!("{}/24", cluster.addr(h));
            run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
            // Both directions of the link: the host's sending side and the switch's.
            for (space, dev) in [(&ns, "eth0"), (&sw, port.as_str())] {
                cluster.shape(space, dev, link, netem)?;
            }
        }
        Ok(cluster)
    }

    fn shape(&self, ns: &str, dev: &str, link: &LinkSpec, netem: bool) -> Result<()> {
        let mut args: Vec<String> = ["-n", ns, "qdisc", "add", "dev", dev, "root"].map(String::from).to_vec();
        if netem {
            args.extend(["netem".into(), "rate".into(), link.rate.clone(), "limit".into(), "100000".into()]);
            if let Some(delay) = &link.delay {
                args.extend(["delay".into(), delay.clone()]);
            }
            if link.loss > 0.0 {
                args.extend(["loss".into(), format!("{}%", link.loss)]);
            }
        } else {
            // A token bucket: the rate, with a burst of 4 ms at that rate (at least 64 KiB).
            let bits = parse_rate(&link.rate)?;
            let burst = (bits / 8 / 250).max(64 << 10);
            args.extend(["tbf", "rate", &link.rate, "burst", &burst.to_string(), "latency", "20ms"].map(String::from));
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        run("tc", &refs)
    }

    /// The namespace of the switch.
    pub(crate) fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    /// The namespace of host `h`.
    pub(crate) fn host(&self, h: usize) -> String {
        format!("{}h{h}", self.prefix)
    }

    /// Host `h`'s address.
    pub(crate) fn addr(&self, h: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 77, self.subnet, h as u8 + 1)
    }

    /// Hosts in the cluster.
    pub(crate) fn hosts(&self) -> usize {
        self.hosts
    }

    /// A command that runs `program` inside host `h`.
    pub(crate) fn command(&self, h: usize, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(h)]).arg(program);
        cmd
    }

    /// Gives the switch an address on the hosts' subnet (for relays living there).
    pub(crate) fn give_switch_address(&self) -> Result<Ipv4Addr> {
        let addr = Ipv4Addr::new(10, 77, self.subnet, 254);
        run("ip", &["-n", &self.switch(), "addr", "add", &format!("{addr}/24"), "dev", "br0"])?;
        Ok(addr)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        remove_all(&self.prefix);
    }
}

/// Bits per second of a `tc` rate (`10gbit`, `500mbit`, `100kbit`, `1000bit`).
pub(crate) fn parse_rate(rate: &str) -> Result<u64> {
    let lower = rate.to_ascii_lowercase();
    let (number, unit) = lower.split_at(lower.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(lower.len()));
    let scale = match unit {
        "gbit" => 1_000_000_000,
        "mbit" => 1_000_000,
        "kbit" => 1_000,
        "bit" => 1,
        _ => bail!("link rate `{rate}`: give a number with gbit, mbit, kbit or bit (as tc takes it)"),
    };
    let value: f64 = number.parse().with_context(|| format!("link rate `{rate}`"))?;
    Ok((value * scale as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_read_as_tc_writes_them() {
        assert_eq!(parse_rate("10gbit").expect("rate"), 10_000_000_000);
        assert_eq!(parse_rate("1.5Mbit").expect("rate"), 1_500_000);
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("10gbps").expect_err("unit").to_string().contains("gbit, mbit"));
    }
}
