//! Rank, world and coordinator from the environment of the launchers clusters run:
//! Kubeflow's `PET_*` variables (Trainer v2, PyTorchJob), torchrun-style variables, Slurm, Open
//! MPI, PMI (MPICH, Intel MPI), and an Indexed Job's index (a bare JobSet's).

use anyhow::{anyhow, bail, Context, Result};

/// The default coordinator port (torchrun's).
pub(crate) const DEFAULT_PORT: u16 = 29500;

/// The Kubeflow variables read here, which outrank torchrun's.
pub(crate) const KUBEFLOW_VARIABLES: [&str; 5] =
    ["PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_RDZV_ENDPOINT"];

/// Where this process stands in a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Launch {
    /// This process's rank; `None` where the environment gives the world alone (an elastic
    /// PyTorchJob without a Master replica): see [`Launch::rank_or`].
    pub(crate) rank: Option<usize>,
    /// Processes in the job.
    pub(crate) world: usize,
    /// The fewest nodes the job goes on with, when the environment tells it (an elastic
    /// PyTorchJob's `PET_NNODES=min:max`).
    pub(crate) min_nodes: Option<usize>,
    /// `host:port` of the coordinator (rank 0), when the environment tells it.
    pub(crate) coordinator: Option<String>,
    /// Which launcher's variables were read.
    pub(crate) launcher: &'static str,
}

impl Launch {
    /// This node's rank: `flag` (`--rank`) where given, else the environment's.
    pub(crate) fn rank_or(&self, flag: Option<usize>) -> Result<usize> {
        flag.or(self.rank).with_context(|| {
            format!(
                "launcher environment: PET_NNODES gives the world ({}) but not this node's rank: set PET_NODE_RANK \
                 (in a PyTorchJob, from the pod's label training.kubeflow.org/replica-index) or give --rank",
                self.world
            )
        })
    }
}

/// `name`'s value, trimmed; `None` when unset or blank.
fn value(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    var(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn number(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    match value(var, name) {
        None => Ok(None),
        Some(v) => match v.parse() {
            Ok(n) => Ok(Some(n)),
            Err(_) => bail!("launcher environment: {name}={v} is not a number"),
        },
    }
}

/// Reads the launch from environment variables (`var` looks one up); `None` when none is set.
/// The launcher nearest the process wins: Kubeflow's `PET_*` variables (a PyTorchJob sets
/// `RANK` and `WORLD_SIZE` beside them, and only `PET_NNODES` carries an elastic job's
/// minimum), then torchrun, then Open MPI, then PMI, then Slurm, since a job started by
/// `mpirun` or `torchrun` inside a Slurm allocation inherits the allocation's `SLURM_PROCID`
/// as well. The coordinator is the one [`coordinator_from_env`] names, under Slurm by default
/// the first host of the step's node list.
pub(crate) fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    let var: &dyn Fn(&str) -> Option<String> = &var;
    if let Some(launch) = kubeflow(var)? {
        return Ok(Some(launch));
    }
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
                .find_map(|name| value(var, name))
                .and_then(|list| first_host(&list))
        };
        let coordinator = match coordinator_from_env(var)? {
            Some(c) => Some(c),
            None => match (launcher == "slurm").then(slurm_host).flatten() {
                Some(host) => Some(format!("{host}:{}", port(var, "MASTER_PORT")?)),
                None => None,
            },
        };
        return Ok(Some(Launch { rank: Some(rank), world, min_nodes: None, coordinator, launcher }));
    }
    Ok(None)
}

/// Kubeflow's variables, torchrun's settings named `PET_*`: Trainer v2 sets `PET_NNODES`,
/// `PET_NODE_RANK` (the pod's index), `PET_MASTER_ADDR` and `PET_MASTER_PORT`; a PyTorchJob
/// with a Master replica sets `RANK` (and, elastic, `PET_NNODES=min:max` and
/// `PET_RDZV_ENDPOINT`); one without a Master replica no rank at all.
fn kubeflow(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<Launch>> {
    let Some(nodes) = value(var, "PET_NNODES") else {
        if let Some(rank) = value(var, "PET_NODE_RANK") {
            bail!("launcher environment: PET_NODE_RANK={rank} without PET_NNODES: set both, or neither for one node");
        }
        return Ok(None);
    };
    let (min_nodes, world) = node_range(&nodes)?;
    let mut rank = None;
    for name in ["PET_NODE_RANK", "RANK"] {
        if let Some(r) = number(var, name)? {
            if r >= world {
                bail!("launcher environment: {name}={r} is not within PET_NNODES={nodes}");
            }
            rank = Some(r);
            break;
        }
    }
    let coordinator = coordinator_from_env(var)?;
    Ok(Some(Launch { rank, world, min_nodes, coordinator, launcher: "kubeflow" }))
}

/// `PET_NNODES`'s minimum and world: a number of nodes, or `min:max` (an elastic PyTorchJob:
/// the job starts with `max` nodes and may go on with `min`).
fn node_range(nodes: &str) -> Result<(Option<usize>, usize)> {
    let count = |n: &str| {
        n.trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| anyhow!("launcher environment: PET_NNODES={nodes} is not a number of nodes or min:max"))
    };
    let Some((min, max)) = nodes.split_once(':') else { return Ok((None, count(nodes)?)) };
    let (min, max) = (count(min)?, count(max)?);
    if min > max {
        bail!("launcher environment: PET_NNODES={nodes} has its minimum above its maximum");
    }
    Ok((Some(min), max))
}

/// The coordinator the environment names: `PET_MASTER_ADDR:PET_MASTER_PORT` (Kubeflow), else
/// `PET_RDZV_ENDPOINT` (an elastic PyTorchJob), else `MASTER_ADDR:MASTER_PORT`; a port not
/// set is 29500. Also what completes a rank and world given by flags.
pub(crate) fn coordinator_from_env(var: impl Fn(&str) -> Option<String>) -> Result<Option<String>> {
    let var: &dyn Fn(&str) -> Option<String> = &var;
    if let Some(host) = value(var, "PET_MASTER_ADDR") {
        return Ok(Some(format!("{host}:{}", port(var, "PET_MASTER_PORT")?)));
    }
    if let Some(endpoint) = value(var, "PET_RDZV_ENDPOINT") {
        let port = endpoint.rsplit_once(':').filter(|(host, _)| !host.is_empty()).map(|(_, p)| p.parse::<u16>());
        return match port {
            Some(Ok(p)) if p > 0 => Ok(Some(endpoint)),
            _ => bail!("launcher environment: PET_RDZV_ENDPOINT={endpoint} is not host:port"),
        };
    }
    match value(var, "MASTER_ADDR") {
        Some(host) => Ok(Some(format!("{host}:{}", port(var, "MASTER_PORT")?))),
        None => Ok(None),
    }
}

/// The port `name` gives, 29500 where it is not set.
fn port(var: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<u16> {
    match number(var, name)? {
        // Port 0 would have rank 0 listen on a port of the system's choosing that no one dials.
        Some(p) => match u16::try_from(p) {
            Ok(port) if port > 0 => Ok(port),
            _ => bail!("launcher environment: {name}={p} is not a port (1-65535)"),
        },
        None => Ok(DEFAULT_PORT),
    }
}

/// The rank an Indexed Job (each pod of a JobSet's job) gives its pod, `JOB_COMPLETION_INDEX`:
/// read only with a world given by flags, since such a job may as well run independent tasks.
pub(crate) fn job_index(var: impl Fn(&str) -> Option<String>) -> Result<Option<usize>> {
    number(&var, "JOB_COMPLETION_INDEX")
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
        let coordinator = Some("10.0.0.1:1234".into());
        assert_eq!(t, Launch { rank: Some(2), world: 4, min_nodes: None, coordinator, launcher: "torchrun" });
        let s = from_env(env(&[("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4"), ("SLURM_JOB_NODELIST", "cpu[03-06]")]))
            .expect("ok")
            .expect("launch");
        assert_eq!((s.rank, s.coordinator.as_deref(), s.launcher), (Some(1), Some("cpu03:29500"), "slurm"));
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
        assert_eq!((m.rank, m.launcher, m.coordinator.as_deref()), (Some(3), "openmpi", Some("n1:29500")));
        let t = from_env(env(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("PMI_RANK", "0"), ("PMI_SIZE", "2")]))
            .expect("ok")
            .expect("launch");
        assert_eq!((t.rank, t.launcher), (Some(1), "torchrun"));
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

    #[test]
    fn kubeflow_trainer_variables_alone_place_the_node() {
        let trainer = [
            ("PET_NNODES", "4"),
            ("PET_NODE_RANK", "3"),
            ("PET_NPROC_PER_NODE", "auto"),
            ("PET_MASTER_ADDR", "bert-node-0-0.bert"),
            ("PET_MASTER_PORT", "29400"),
        ];
        let k = from_env(env(&trainer)).expect("ok").expect("launch");
        let coordinator = Some("bert-node-0-0.bert:29400".into());
        assert_eq!(k, Launch { rank: Some(3), world: 4, min_nodes: None, coordinator, launcher: "kubeflow" });
    }

    #[test]
    fn an_elastic_pytorchjob_gives_the_world_its_minimum_and_the_rendezvous_endpoint() {
        let elastic = [("PET_NNODES", "2:3"), ("PET_RDZV_ENDPOINT", "bert-worker-0:23456"), ("RANK", "1")];
        let k = from_env(env(&elastic)).expect("ok").expect("launch");
        assert_eq!((k.rank, k.world, k.min_nodes), (Some(1), 3, Some(2)));
        assert_eq!(k.coordinator.as_deref(), Some("bert-worker-0:23456"));
        // Without a Master replica no variable holds the rank: --rank gives it, or the error
        // says what to set.
        let k = from_env(env(&elastic[..2])).expect("ok").expect("launch");
        assert_eq!(k.rank_or(Some(2)).expect("the flag"), 2);
        let err = k.rank_or(None).expect_err("no rank").to_string();
        assert!(err.contains("PET_NODE_RANK") && err.contains("--rank"), "{err}");
        // PET_MASTER_ADDR, where both are set, names the coordinator.
        let both =
            [("PET_NNODES", "2"), ("PET_NODE_RANK", "0"), ("PET_MASTER_ADDR", "m"), ("PET_RDZV_ENDPOINT", "r:1")];
        assert_eq!(from_env(env(&both)).expect("ok").expect("launch").coordinator.as_deref(), Some("m:29500"));
    }

    #[test]
    fn kubeflow_variables_win_over_the_torchrun_ones_beside_them() {
        let pytorchjob = [("PET_NNODES", "2:4"), ("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "job-master-0")];
        let k = from_env(env(&pytorchjob)).expect("ok").expect("launch");
        assert_eq!((k.launcher, k.rank, k.world, k.min_nodes), ("kubeflow", Some(1), 4, Some(2)));
        assert_eq!(k.coordinator.as_deref(), Some("job-master-0:29500"));
    }

    #[test]
    fn malformed_kubeflow_values_are_named() {
        let refused = |pairs: &[(&str, &str)]| from_env(env(pairs)).expect_err("refused").to_string();
        let err = refused(&[("PET_NNODES", "3:2"), ("PET_NODE_RANK", "0")]);
        assert!(err.contains("PET_NNODES=3:2") && err.contains("minimum"), "{err}");
        for bad in ["x", "0", "2:", ":3", "1:x", "-1"] {
            let err = refused(&[("PET_NNODES", bad), ("PET_NODE_RANK", "0")]);
            assert!(err.contains(&format!("PET_NNODES={bad} is not a number of nodes")), "{bad}: {err}");
        }
        let err = refused(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "3")]);
        assert!(err.contains("PET_NODE_RANK=3 is not within PET_NNODES=3"), "{err}");
        let err = refused(&[("PET_NNODES", "2:3"), ("PET_NODE_RANK", "3")]);
        assert!(err.contains("PET_NODE_RANK=3 is not within PET_NNODES=2:3"), "{err}");
        let err = refused(&[("PET_NNODES", "3"), ("PET_NODE_RANK", "one")]);
        assert!(err.contains("PET_NODE_RANK=one is not a number"), "{err}");
        let err = refused(&[("PET_NODE_RANK", "1")]);
        assert!(err.contains("PET_NODE_RANK=1 without PET_NNODES"), "{err}");
        let err =
            refused(&[("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("PET_MASTER_ADDR", "m"), ("PET_MASTER_PORT", "0")]);
        assert!(err.contains("PET_MASTER_PORT=0"), "{err}");
        for bad in ["host", ":29400", "host:port", "host:0"] {
            let err = refused(&[("PET_NNODES", "2"), ("PET_NODE_RANK", "1"), ("PET_RDZV_ENDPOINT", bad)]);
            assert!(err.contains(&format!("PET_RDZV_ENDPOINT={bad} is not host:port")), "{bad}: {err}");
        }
    }

    #[test]
    fn an_indexed_jobs_index_is_read_alone() {
        assert_eq!(job_index(env(&[("JOB_COMPLETION_INDEX", "2")])).expect("ok"), Some(2));
        assert_eq!(job_index(env(&[])).expect("ok"), None);
        assert!(job_index(env(&[("JOB_COMPLETION_INDEX", "x")]))
            .expect_err("x")
            .to_string()
            .contains("JOB_COMPLETION_INDEX=x"));
        // It makes no launch: an Indexed Job may run independent tasks.
        assert_eq!(from_env(env(&[("JOB_COMPLETION_INDEX", "2")])).expect("ok"), None);
    }
}
