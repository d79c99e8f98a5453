//! Who this process is: the launcher's variables (torchrun, Open MPI, Slurm, PMI), where the
//! job's store lives, and what the launcher expects back (torchrun's error file).

use std::path::PathBuf;
use unihal_hal::{HalError, Invalid, Result};

/// The launcher a process was started by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    Torchrun,
    OpenMpi,
    Slurm,
    Pmi,
    Single,
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchInfo {
    pub launcher: Launcher,
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    /// Where the job's store lives: `MASTER_ADDR:MASTER_PORT`, or under Slurm without them the
    /// launch node (`SLURM_LAUNCH_NODE_IPADDR`, else the first host of `SLURM_JOB_NODELIST`) on
    /// [`slurm_port`]'s port.
    pub master: Option<(String, u16)>,
    /// torchrun's agent serves the store on `master` (`TORCHELASTIC_USE_AGENT_STORE=True`):
    /// every rank is its client, none may bind the port.
    pub agent_store: bool,
    /// torchrun's restart count (`TORCHELASTIC_RESTART_COUNT`): keys of attempt `n` live under
    /// `/worker/attempt_n`, so a restarted rank never reads the previous attempt's values.
    pub restart_count: u32,
    /// Where a failing rank writes its error for torchrun to report (`TORCHELASTIC_ERROR_FILE`).
    pub error_file: Option<PathBuf>,
    /// `mpirun` (or another PMI launcher) started this process: `OMPI_COMM_WORLD_SIZE` or
    /// `PMI_SIZE` is set, whichever launcher's variables were read.
    pub mpi_launch: bool,
}

fn num(var: &'static str, v: Option<String>) -> Result<Option<usize>> {
    match v {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            HalError::invalid(
                var,
                Invalid::Value {
                    value: format!("{var}={s:?}"),
                    accepted: "a non-negative integer".into(),
                },
            )
        }),
    }
}

/// The first host of a Slurm node list: `node[01-04,07],gpu5` is `node01`; `a,b` is `a`.
pub fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list
        .char_indices()
        .scan(0i32, |depth, (i, c)| {
            match c {
                '[' => *depth += 1,
                ']' => *depth -= 1,
                _ => {}
            }
            Some((i, c, *depth))
        })
        .find(|&(_, c, d)| c == ',' && d == 0)
        .map_or(list.len(), |(i, _, _)| i);
    let first = &list[..end];
    let host = match first.split_once('[') {
        None => first.to_string(),
        Some((stem, range)) => {
            let range = range.trim_end_matches(']');
            let lo = range.split([',', '-']).next()?;
            format!("{stem}{lo}")
        }
    };
    (!host.is_empty()).then_some(host)
}

/// The store's port of a Slurm job without `MASTER_PORT`: 29500 plus the job id modulo 1000,
/// so two jobs sharing a node rarely meet on one port (set `MASTER_PORT` to choose).
pub fn slurm_port(job_id: Option<&str>) -> u16 {
    let id: u64 = job_id.and_then(|j| j.trim().parse().ok()).unwrap_or(0);
    29500 + (id % 1000) as u16
}

impl LaunchInfo {
    /// Reads the launcher variables through `get` (the environment in [`LaunchInfo::from_env`]).
    /// Launchers are recognised in this order: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`), Open MPI (`OMPI_COMM_WORLD_*`), Slurm (`SLURM_PROCID`,
    /// `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`), PMI (`PMI_RANK`, `PMI_SIZE`);
    /// none means a single process.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming the variable when a value does not parse, a rank is
    /// not below the world size, or a local rank not below the local world size.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<LaunchInfo> {
        let sets: [(Launcher, [&'static str; 4]); 4] = [
            (
                Launcher::Torchrun,
                ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"],
            ),
            (
                Launcher::OpenMpi,
                [
                    "OMPI_COMM_WORLD_RANK",
                    "OMPI_COMM_WORLD_SIZE",
                    "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE",
                ],
            ),
            (
                Launcher::Slurm,
                [
                    "SLURM_PROCID",
                    "SLURM_NTASKS",
                    "SLURM_LOCALID",
                    "SLURM_NTASKS_PER_NODE",
                ],
            ),
            (
                Launcher::Pmi,
                ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"],
            ),
        ];
        let port_of = |var: &'static str, p: String| -> Result<u16> {
            num(var, Some(p))?
                .filter(|&p| (1..=u16::MAX as usize).contains(&p))
                .map(|p| p as u16)
                .ok_or_else(|| {
                    HalError::invalid(
                        var,
                        Invalid::Value {
                            value: var.into(),
                            accepted: "1..=65535".into(),
                        },
                    )
                })
        };
        let mut master = match (get("MASTER_ADDR"), get("MASTER_PORT")) {
            (Some(a), Some(p)) => Some((a, port_of("MASTER_PORT", p)?)),
            _ => None,
        };
        let mut found = None;
        for (launcher, [r, w, lr, lw]) in sets {
            let (Some(rank), Some(world)) = (num(r, get(r))?, num(w, get(w))?) else {
                continue;
            };
            if world == 0 || rank >= world {
                return Err(HalError::invalid(
                    r,
                    Invalid::Value {
                        value: format!("{r}={rank} with {w}={world}"),
                        accepted: format!("{r} < {w}"),
                    },
                ));
            }
            let local_rank = num(lr, get(lr))?.unwrap_or(0);
            // Slurm's tasks-per-node may list nodes, "4(x2),3": the leading number is the first
            // node's, not necessarily this one's, so with a list it is a lower bound only.
            let lw_raw = get(lw);
            let listed = lw_raw
                .as_deref()
                .is_some_and(|v| v.contains(',') || v.contains('('));
            let lw_val = lw_raw.map(|v| v.split([',', '(']).next().unwrap_or("").to_string());
            let local_world = match num(lw, lw_val)? {
                Some(0) => {
                    return Err(HalError::invalid(
                        lw,
                        Invalid::Value {
                            value: format!("{lw}=0"),
                            accepted: "at least 1".into(),
                        },
                    ))
                }
                Some(n) if listed => n.max(local_rank.saturating_add(1)),
                Some(n) => n,
                // Unset: the local ranks up to this one are on this node.
                None => local_rank.saturating_add(1),
            };
            // A node holds at most the whole job.
            if local_rank >= local_world || local_rank >= world {
                return Err(HalError::invalid(
                    lr,
                    Invalid::Value {
                        value: format!("{lr}={local_rank} with {lw}={local_world}, {w}={world}"),
                        accepted: format!("{lr} < {lw} and {lr} < {w}"),
                    },
                ));
            }
            found = Some((launcher, rank, world, local_rank, local_world));
            break;
        }
        let (launcher, rank, world_size, local_rank, local_world_size) =
            found.unwrap_or((Launcher::Single, 0, 1, 0, 1));
        if master.is_none() && launcher == Launcher::Slurm {
            let host = get("SLURM_LAUNCH_NODE_IPADDR")
                .filter(|h| !h.trim().is_empty())
                .or_else(|| get("SLURM_JOB_NODELIST").and_then(|l| first_slurm_host(&l)))
                .or_else(|| get("SLURM_NODELIST").and_then(|l| first_slurm_host(&l)));
            if let Some(host) = host {
                let port = match get("MASTER_PORT") {
                    Some(p) => port_of("MASTER_PORT", p)?,
                    None => slurm_port(get("SLURM_JOB_ID").as_deref()),
                };
                master = Some((host, port));
            }
        }
        let restart_count = match get("TORCHELASTIC_RESTART_COUNT") {
            None => 0,
            Some(v) => num("TORCHELASTIC_RESTART_COUNT", Some(v.clone()))?
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    HalError::invalid(
                        "TORCHELASTIC_RESTART_COUNT",
                        Invalid::Value {
                            value: format!("TORCHELASTIC_RESTART_COUNT={v:?}"),
                            accepted: "an integer in 0..=4294967295".into(),
                        },
                    )
                })?,
        };
        Ok(LaunchInfo {
            launcher,
            rank,
            world_size,
            local_rank,
            local_world_size,
            master,
            // torch writes Python's str(True).
            agent_store: get("TORCHELASTIC_USE_AGENT_STORE")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true")),
            restart_count,
            error_file: get("TORCHELASTIC_ERROR_FILE")
                .filter(|f| !f.is_empty())
                .map(PathBuf::from),
            mpi_launch: get("OMPI_COMM_WORLD_SIZE").is_some() || get("PMI_SIZE").is_some(),
        })
    }

    /// [`LaunchInfo::from_vars`] over the process environment.
    ///
    /// # Errors
    /// As `from_vars`.
    pub fn from_env() -> Result<LaunchInfo> {
        Self::from_vars(&|k| std::env::var(k).ok())
    }

    /// A launch of `world_size` ranks of which this is `rank`, with its store at `master`
    /// (tests, and programs that start ranks themselves).
    pub fn new(rank: usize, world_size: usize, master: Option<(String, u16)>) -> LaunchInfo {
        LaunchInfo {
            launcher: Launcher::Torchrun,
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            master,
            agent_store: false,
            restart_count: 0,
            error_file: None,
            mpi_launch: false,
        }
    }
}
