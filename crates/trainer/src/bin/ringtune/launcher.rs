//! Rank, world and coordinator from the environment of the launchers clusters run:
//! torchrun-style variables, Slurm, Open MPI and PMI (MPICH, Intel MPI).

use anyhow::{bail, Result};

/// The default coordinator port (torchrun's).
pub(crate) const DEFAULT_PORT: u16 = 29500;

/// Where this process stands in a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    /// This process's rank.
    pub(crate) rank: usize,
    /// Processes in the job.
    pub(crate) world: usize,
    /// `host:port` of the coordinator (rank 0), when the environment tells it.
    pub(crate) coordinator: Option<String>,
    /// Which launcher's variables were read.
    pub(crate) launcher: &'static str,
}

fn number(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    match var(name).filter(|v| !v.trim().is_empty()) {
        None => Ok(None),
        Some(v) => match v.trim().parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => bail!("launcher environment: {name}={v} is not a number"),
        },
    }
}

/// Reads the launch from environment variables (`var` looks one up); `None` when none is set.
/// The launcher nearest the process wins: torchrun, then Open MPI, then PMI, then Slurm, since
/// a job started by `mpirun` or `torchrun` inside a Slurm allocation inherits the allocation's
/// `SLURM_PROCID` as well. The coordinator is `MASTER_ADDR:MASTER_PORT`, under Slurm by default
/// the first host of the step's node list.
pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    let var: &dyn Fn(&str) -> Option<String> = &var;
    let launchers: [(&str, &str, &'static str); 4] = [
        ("RANK", "WORLD_SIZE", "torchrun"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"),
        ("PMI_RANK", "PMI_SIZE", "pmi"),
        ("SLURM_PROCID", "SLURM_NTASKS", "slurm"),
    ];
    for (rank_var, world_var, launcher) in launchers {
        let (rank, world) = match (number(var, rank_var)?, number(var, world_var)?) {
            (Some(rank), Some(world)) => (rank, world),
            // Set by hand, half a pair is a mistake; a Slurm allocation's shell has SLURM_NTASKS
            // without SLURM_PROCID, and one process started there is one node.
            (Some(_), None) | (None, Some(_)) if launcher == "torchrun" => {
                bail!("launcher environment: set both {rank_var} and {world_var}, or neither for one node")
            }
            _ => continue,
        };
        if world == 0 || rank >= world {
            bail!("launcher environment: {rank_var}={rank} is not within {world_var}={world}");
        }
        let slurm_host = || {
            ["SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"]
                .into_iter()
                .find_map(|name| var(name).filter(|list| !list.trim().is_empty()))
                .and_then(|list| first_host(&list))
        };
        let host = master_addr(var).or_else(|| (launcher == "slurm").then(slurm_host).flatten());
        let coordinator = match host {
            Some(host) => Some(format!("{host}:{}", master_port(var)?)),
            None => None,
        };
        return Ok(Some(Launch { rank, world, coordinator, launcher }));
    }
    Ok(None)
}

/// `MASTER_ADDR:MASTER_PORT` alone, for a rank and world given by flags.
pub(crate) fn coordinator_from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<String>> {
    let var: &dyn Fn(&str) -> Option<String> = &var;
    match master_addr(var) {
        Some(host) => Ok(Some(format!("{host}:{}", master_port(var)?))),
        None => Ok(None),
    }
}

fn master_addr(var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    var("MASTER_ADDR").map(|h| h.trim().to_string()).filter(|h| !h.is_empty())
}

fn master_port(var: &dyn Fn(&str) -> Option<String>) -> Result<u16> {
    match number(var, "MASTER_PORT")? {
        // Port 0 would have rank 0 listen on a port of the system's choosing that no one dials.
        Some(p) => match u16::try_from(p) {
            Ok(port) if port > 0 => Ok(port),
            _ => bail!("launcher environment: MASTER_PORT={p} is not a port (1-65535)"),
        },
        None => Ok(DEFAULT_PORT),
    }
}

/// The first host of a Slurm node list: the first name, with the first value of each bracket
/// group (`node[01-04,07],gpu5` gives `node01`, `rack[1-2]-n[08-09]-ib` gives `rack1-n08-ib`).
/// `None` for an empty or malformed list.
pub(crate) fn first_host(list: &str) -> Option<String> {
    let mut host = String::new();
    let mut rest = list.trim();
    loop {
        let literal_end = rest.find(['[', ',']).unwrap_or(rest.len());
        host.push_str(&rest[..literal_end]);
        rest = &rest[literal_end..];
        match rest.strip_prefix('[') {
            Some(group) => {
                let close = group.find(']')?;
                let first = group[..close].split(',').next()?.split('-').next()?.trim();
                if first.is_empty() {
                    return None;
                }
                host.push_str(first);
                rest = &group[close + 1..];
            }
            // The end of the list, or of its first name.
            None => break,
        }
    }
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn torchrun_slurm_mpi_and_pmi() {
        let t =
            from_env(env(&[("RANK", "2"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "10.0.0.1"), ("MASTER_PORT", "1234")]))
                .expect("ok")
                .expect("launch");
        assert_eq!(t, Launch { rank: 2, world: 4, coordinator: Some("10.0.0.1:1234".into()), launcher: "torchrun" });
        let s = from_env(env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_NODELIST", "cpu[03-06]")]))
            .expect("ok")
            .expect("launch");
        assert_eq!((s.rank, s.coordinator.as_deref(), s.launcher), (1, Some("cpu03:29500"), "slurm"));
        let m = from_env(env(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "2")]))
            .expect("ok")
            .expect("launch");
        assert_eq!((m.world, m.coordinator.clone(), m.launcher), (2, None, "openmpi"));
        let p =
            from_env(env(&[("PMI_RANK", "3"), ("PMI_SIZE", "4"), ("MASTER_ADDR", "h")])).expect("ok").expect("launch");
        assert_eq!(p.coordinator.as_deref(), Some("h:29500"));
        assert_eq!(from_env(env(&[])).expect("ok"), None);
    }

    #[test]
    fn bad_values_are_named() {
        let err = from_env(env(&[("RANK", "4"), ("WORLD_SIZE", "4")])).expect_err("rank").to_string();
        assert!(err.contains("RANK=4") && err.contains("WORLD_SIZE=4"), "{err}");
        let err = from_env(env(&[("RANK", "x"), ("WORLD_SIZE", "4")])).expect_err("x").to_string();
        assert!(err.contains("RANK=x is not a number"), "{err}");
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node[01-04,07],gpu5").as_deref(), Some("node01"));
        assert_eq!(first_host("a1,a2").as_deref(), Some("a1"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("x-[7,9]").as_deref(), Some("x-7"));
        assert_eq!(first_host(""), None);
        assert_eq!(first_host("node[1-2]-ib").as_deref(), Some("node1-ib"));
        assert_eq!(first_host("rack[1-2]-n[08-09]-ib,rack3-n01").as_deref(), Some("rack1-n08-ib"));
        assert_eq!(first_host("a[1-2]b[3-4]").as_deref(), Some("a1b3"));
        assert_eq!(first_host("node[01"), None);
        assert_eq!(first_host("node[]"), None);
    }

    #[test]
    fn the_step_node_list_names_the_coordinator() {
        let s = from_env(env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n[01-05]"),
            ("SLURM_STEP_NODELIST", "n[02-03]"),
        ]))
        .expect("ok")
        .expect("launch");
        assert_eq!(s.coordinator.as_deref(), Some("n02:29500"));
    }

    #[test]
    fn the_launcher_nearest_the_process_wins() {
        // `mpirun` inside an sbatch script: every rank inherits the batch step's SLURM_PROCID.
        let mpi_in_slurm = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_JOB_NODELIST", "n[1-4]"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("MASTER_ADDR", "n1"),
        ];
        let m = from_env(env(&mpi_in_slurm)).expect("ok").expect("launch");
        assert_eq!((m.rank, m.launcher, m.coordinator.as_deref()), (3, "openmpi", Some("n1:29500")));
        let t = from_env(env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")]))
            .expect("ok")
            .expect("launch");
        assert_eq!((t.rank, t.launcher), (1, "torchrun"));
    }

    #[test]
    fn half_a_pair_and_port_zero_are_refused() {
        let err = from_env(env(&[("WORLD_SIZE", "4"), ("MASTER_ADDR", "h0")])).expect_err("no RANK").to_string();
        assert!(err.contains("RANK") && err.contains("WORLD_SIZE"), "{err}");
        let err = from_env(env(&[("RANK", "1")])).expect_err("no WORLD_SIZE").to_string();
        assert!(err.contains("WORLD_SIZE"), "{err}");
        // A Slurm allocation's shell: one node.
        assert_eq!(from_env(env(&[("SLURM_NTASKS", "4")])).expect("ok"), None);
        let zero = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "0")];
        let err = from_env(env(&zero)).expect_err("port 0").to_string();
        assert!(err.contains("MASTER_PORT=0"), "{err}");
        assert_eq!(coordinator_from_env(env(&[("MASTER_ADDR", " h7 ")])).expect("ok").as_deref(), Some("h7:29500"));
        assert_eq!(coordinator_from_env(env(&[("MASTER_PORT", "1")])).expect("ok"), None);
    }
}
