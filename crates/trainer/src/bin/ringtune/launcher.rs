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

/// Reads the launch from environment variables (`var` looks one up), in the order torchrun,
/// Slurm, Open MPI, PMI; `None` when none is set. The coordinator is `MASTER_ADDR:MASTER_PORT`,
/// under Slurm by default the first host of the node list.
pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    let var: &dyn Fn(&str) -> Option<String> = &var;
    let launchers: [(&str, &str, &'static str); 4] = [
        ("RANK", "WORLD_SIZE", "torchrun"),
        ("SLURM_PROCID", "SLURM_NTASKS", "slurm"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "openmpi"),
        ("PMI_RANK", "PMI_SIZE", "pmi"),
    ];
    for (rank_var, world_var, launcher) in launchers {
        let (Some(rank), Some(world)) = (number(var, rank_var)?, number(var, world_var)?) else { continue };
        if world == 0 || rank >= world {
            bail!("launcher environment: {rank_var}={rank} is not within {world_var}={world}");
        }
        let port = match number(var, "MASTER_PORT")? {
            Some(p) => match u16::try_from(p) {
                Ok(port) => port,
                Err(_) => bail!("launcher environment: MASTER_PORT={p} is not a port"),
            },
            None => DEFAULT_PORT,
        };
        let host = var("MASTER_ADDR").filter(|h| !h.is_empty()).or_else(|| {
            (launcher == "slurm")
                .then(|| var("SLURM_JOB_NODELIST").or_else(|| var("SLURM_NODELIST")))
                .flatten()
                .and_then(|list| first_host(&list))
        });
        return Ok(Some(Launch { rank, world, coordinator: host.map(|h| format!("{h}:{port}")), launcher }));
    }
    Ok(None)
}

/// The first host of a Slurm node list (`node[01-04,07],gpu5` gives `node01`).
pub(crate) fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let first_end = {
        let mut depth = 0;
        list.char_indices().find(|&(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
    }
    .map_or(list.len(), |(i, _)| i);
    let first = &list[..first_end];
    match first.split_once('[') {
        None => (!first.is_empty()).then(|| first.to_string()),
        Some((prefix, rest)) => {
            let range = rest.trim_end_matches(']').split(',').next()?;
            let start = range.split('-').next()?;
            Some(format!("{prefix}{start}"))
        }
    }
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
    }
}
