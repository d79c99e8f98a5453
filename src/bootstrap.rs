//! Bootstrap of multi-process runs: who this process is (from the launcher's environment,
//! [`unihal_launch::env`]), the job's store (torchrun's agent store, or rank 0's, speaking
//! PyTorch's c10d TCPStore protocol: [`unihal_launch::tcpstore`]), and the world communicator
//! made through it.
//!
//! A launch that cannot give a correct world fails at start, naming the fix: a launcher's world
//! size that differs from the engine's, an engine that cannot cross processes given ranks in
//! several processes, an `mpirun` launch on a build without the MPI engine. A failing rank
//! writes torchrun's error file ([`report_failure`]). Every wait has a deadline.

use std::sync::Arc;
use unihal_hal::{HalError, Invalid, Result};
pub use unihal_launch::{JobStore, LaunchInfo, Launcher, TcpStore, TcpStoreServer};

/// This process's rank of the world when `backend`'s collective engine connects the processes
/// already (MPI under `mpirun`), on device `local_rank % devices`; `None` for engines that need a
/// unique id exchange (then use [`init_world`]). Collective over every process of the job.
///
/// # Errors
/// Errors of the launcher variables, of opening the device, or of the engine.
pub fn connected_world(
    backend: &dyn unihal_hal::Backend,
    config: &unihal_hal::CommConfig,
) -> Result<Option<Arc<dyn unihal_hal::Communicator>>> {
    let Some(ccl) = backend.collectives() else {
        return Ok(None);
    };
    let info = LaunchInfo::from_env()?;
    log_launch(&info);
    let local = info.local_rank % backend.probe()?.max(1);
    let Some(world) = ccl.connected_world(&backend.open(local)?, config) else {
        return Ok(None);
    };
    let world = world?;
    if world.size() != info.world_size && info.launcher != Launcher::Single {
        return Err(world_mismatch(
            &info,
            &ccl.capabilities().engine,
            world.size(),
        ));
    }
    Ok(Some(world))
}

/// The key under which rank 0 publishes the world communicator's unique id (under the
/// attempt's prefix when torchrun's agent serves the store).
pub const WORLD_KEY: &str = "unihal/world/unique-id";

/// The error of a launch whose launcher and engine disagree on the world's size.
fn world_mismatch(info: &LaunchInfo, engine: &str, size: usize) -> HalError {
    let n = info.world_size;
    let fix = if info.mpi_launch {
        format!(
            "Launch with mpirun -n {n}, or choose an engine that meets through the launcher's \
             store (UNIHAL_CPU_CCL=gloo)"
        )
    } else {
        format!(
            "Under torchrun or Slurm use an engine that meets through their store \
             (UNIHAL_CPU_CCL=gloo, a build with --features gloo), or launch with mpirun -n {n} \
             for the MPI engine"
        )
    };
    HalError::invalid(
        "WORLD_SIZE",
        Invalid::Other(format!(
            "the launcher ({:?}) started {n} processes, but the world of {engine} has {size}: \
             every process would train on its own. {fix}",
            info.launcher
        )),
    )
}

/// Creates this rank's world communicator. Engines whose processes are connected already (MPI)
/// give it directly ([`unihal_hal::Collectives::connected_world`]), and its size must be the
/// launcher's. Otherwise the ranks meet in the job's store ([`JobStore::connect`]): each
/// publishes its process, the engine must cross processes if they differ, rank 0 publishes a
/// unique id, and every rank calls `init_rank`. The returned store must live until every rank
/// has joined (on rank 0 it may be the server).
///
/// # Errors
/// [`HalError::Unsupported`] when the backend has no collectives; [`HalError::InvalidArgument`]
/// naming the fix for a launch that cannot be honoured (no store address, a world size that
/// differs from the engine's, ranks in several processes on an in-process engine, `mpirun` on a
/// build without MPI); [`HalError::Timeout`] when ranks or the store do not answer within
/// `config.timeout` (or `UNIHAL_CCL_TIMEOUT`); [`HalError::AbiMismatch`] when `MASTER_PORT` is
/// not a c10d TCPStore.
pub fn init_world(
    backend: &dyn unihal_hal::Backend,
    device: &Arc<dyn unihal_hal::Device>,
    info: &LaunchInfo,
    config: &unihal_hal::CommConfig,
) -> Result<(Arc<dyn unihal_hal::Communicator>, Option<JobStore>)> {
    let ccl = backend.collectives().ok_or_else(|| {
        HalError::unsupported(format!("collectives on backend {}", backend.name()))
    })?;
    let caps = ccl.capabilities();
    let timeout = unihal_hal::ccl::timeout_of(config)?;
    log_launch(info);
    if let Some(world) = ccl.connected_world(device, config) {
        // The engine's processes are connected already (MPI): no id to exchange.
        let world = world?;
        if world.size() != info.world_size && info.launcher != Launcher::Single {
            return Err(world_mismatch(info, &caps.engine, world.size()));
        }
        return Ok((world, None));
    }
    if info.world_size == 1 {
        let id = ccl.unique_id()?;
        return Ok((ccl.init_rank(&id, 1, 0, device, config)?, None));
    }
    #[cfg(feature = "mpi")]
    if info.mpi_launch && info.master.is_none() {
        // mpirun gives no store address: the id goes over MPI's world.
        tracing::info!(target: "unihal::bootstrap", "no store address: the unique id goes over MPI's world");
        let mine = if info.rank == 0 {
            ccl.unique_id()?.0
        } else {
            Vec::new()
        };
        let id = unihal_hal::UniqueId(unihal_cpu::ccl::mpi::broadcast_from_rank0(&mine)?);
        let comm = ccl.init_rank(&id, info.world_size, info.rank, device, config)?;
        return Ok((comm, None));
    }
    if info.mpi_launch && info.master.is_none() {
        return Err(HalError::invalid(
            "launcher",
            Invalid::Other(format!(
                "started by mpirun ({} processes), but {} does not connect processes through \
                 MPI: build with --features mpi for the CPU backend's MPI engine, or set \
                 MASTER_ADDR and MASTER_PORT for a store",
                info.world_size, caps.engine
            )),
        ));
    }
    let job = JobStore::connect(info, timeout)?;
    let store = job.store();
    // Where every rank lives: an engine that connects one process's ranks only must not wait
    // for ranks in other processes.
    let tag = unihal_hal::ccl::process_tag();
    let me = format!("{}/{:016x}", tag.host, tag.nonce);
    store.set(
        &format!("unihal/world/process/{}", info.rank),
        me.as_bytes(),
    )?;
    let mut elsewhere = None;
    for r in 0..info.world_size {
        let other = store.get(&format!("unihal/world/process/{r}"))?;
        if other != me.as_bytes() && elsewhere.is_none() {
            elsewhere = Some((r, String::from_utf8_lossy(&other).into_owned()));
        }
    }
    // Once every rank has read every process, the store (rank 0's) may go away with an error.
    let read_by_all = store.add("unihal/world/processes-read", 1)? == info.world_size as i64;
    if let (false, Some((r, other))) = (caps.crosses_processes, elsewhere) {
        if read_by_all {
            // The store's rank may end as soon as it sees this key, before the ping behind the
            // set is answered: this rank fails with the engine's error either way.
            let _ = store.set("unihal/world/processes-read-by-all", b"1");
        }
        if job.serves() {
            let _ = store.wait(&["unihal/world/processes-read-by-all"], timeout);
        }
        return Err(HalError::invalid(
            "engine",
            Invalid::Other(format!(
                "rank {r} runs in another process ({other}), and {} connects the ranks of one \
                 process only: use an engine that crosses processes (the CPU backend's gloo \
                 engine, UNIHAL_CPU_CCL=gloo with --features gloo; its MPI engine under mpirun \
                 with --features mpi; NCCL, RCCL or HCCL on a GPU backend)",
                caps.engine
            )),
        ));
    }
    let id = if info.rank == 0 {
        let id = ccl.unique_id()?;
        store.set(WORLD_KEY, &id.0)?;
        id
    } else {
        unihal_hal::UniqueId(store.get(WORLD_KEY)?)
    };
    let comm = ccl.init_rank(&id, info.world_size, info.rank, device, config)?;
    store.add("unihal/world/joined", 1)?;
    Ok((comm, Some(job)))
}

/// Logs who this process is (launcher, rank, local rank, store address) at INFO in the
/// BOOTSTRAP subsystem, and gives later log lines its rank.
fn log_launch(info: &LaunchInfo) {
    if info.launcher == Launcher::Single {
        // One process, no launcher: nothing to say, and its lines carry no rank.
        return;
    }
    unihal_hal::log::set_rank(info.rank);
    let store = info.master.as_ref().map_or_else(
        || "no store address".to_string(),
        |(h, p)| format!("store {h}:{p}"),
    );
    tracing::info!(
        target: "unihal::bootstrap",
        "launcher {:?}: rank {} of {}, local rank {} of {}, {store}",
        info.launcher,
        info.rank,
        info.world_size,
        info.local_rank,
        info.local_world_size
    );
    match unihal_launch::net::selected() {
        Ok(Some(i)) => tracing::info!(
            target: "unihal::bootstrap",
            "socket interface {} address {} ({}={})",
            i.name,
            i.addr,
            unihal_launch::net::VAR,
            std::env::var(unihal_launch::net::VAR).unwrap_or_default()
        ),
        Ok(None) => {}
        // The engine that uses the interface fails with this error; say it early too.
        Err(e) => tracing::warn!(target: "unihal::bootstrap", "{e}"),
    }
}

/// Reports `error` where the launcher collects a rank's failure: torchrun's error file
/// (`TORCHELASTIC_ERROR_FILE`), which its failure summary prints. Does nothing under other
/// launchers. Never fails: a report that cannot be written is logged.
pub fn report_failure(info: &LaunchInfo, error: &dyn std::fmt::Display) {
    if let Some(path) = &info.error_file {
        if let Err(e) = unihal_launch::error_file::write(path, &error.to_string(), info.rank) {
            tracing::warn!(
                target: "unihal::bootstrap",
                "cannot write torchrun's error file {}: {e}",
                path.display()
            );
        }
    }
}
