//! The job's store, as this rank reaches it: torchrun's agent store, or one that rank 0 serves.

use crate::env::LaunchInfo;
use crate::tcpstore::{TcpStore, TcpStoreServer};
use std::time::Duration;
use unihal_hal::{HalError, Invalid, Result};

/// This rank's view of the job's store, and (on rank 0, when the launcher serves none) the
/// server itself, which lives as long as this value. Thread safety: any thread.
pub struct JobStore {
    store: TcpStore,
    server: Option<TcpStoreServer>,
}

impl JobStore {
    /// Reaches the job's store the way PyTorch's `_create_c10d_store` does: under torchrun
    /// (`TORCHELASTIC_USE_AGENT_STORE=True`) a client of the agent's store at
    /// `MASTER_ADDR:MASTER_PORT` with keys under `/worker/attempt_{TORCHELASTIC_RESTART_COUNT}`;
    /// otherwise rank 0 serves a store on `MASTER_PORT` (every interface) and every rank is a
    /// client of it.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] when the launch names no store address (the message names
    /// the variables to set); [`HalError::Unavailable`] when rank 0 cannot bind the port;
    /// [`HalError::Timeout`] or [`HalError::AbiMismatch`] from [`TcpStore::connect`].
    pub fn connect(info: &LaunchInfo, timeout: Duration) -> Result<JobStore> {
        let (addr, port) = info.master.clone().ok_or_else(|| {
            HalError::invalid(
                "MASTER_ADDR",
                Invalid::Other(format!(
                    "a {}-rank job needs the address of its store: set MASTER_ADDR and \
                     MASTER_PORT (torchrun and Slurm set them or imply them; under mpirun set \
                     them, or build with --features mpi to use MPI's own world)",
                    info.world_size
                )),
            )
        })?;
        if info.agent_store {
            let store = TcpStore::connect(&addr, port, timeout)?
                .with_prefix(&format!("/worker/attempt_{}", info.restart_count));
            tracing::info!(
                target: "unihal::bootstrap",
                "store {addr}:{port} (c10d TCPStore, served by torchrun's agent, attempt {}) connected",
                info.restart_count
            );
            return Ok(JobStore {
                store,
                server: None,
            });
        }
        let server = if info.rank == 0 {
            Some(
                TcpStoreServer::bind(&format!("0.0.0.0:{port}")).map_err(|e| {
                    HalError::Unavailable {
                        what: format!("rank 0's store on port {port}"),
                        reason: format!(
                            "{e}; if a launcher serves a store on MASTER_PORT already (torchrun \
                         does), its workers are told so by TORCHELASTIC_USE_AGENT_STORE=True"
                        ),
                    }
                })?,
            )
        } else {
            None
        };
        let host = if server.is_some() { "127.0.0.1" } else { &addr };
        let store = TcpStore::connect(host, port, timeout)?;
        let by = if server.is_some() {
            "this rank, on 0.0.0.0"
        } else {
            "rank 0"
        };
        tracing::info!(
            target: "unihal::bootstrap",
            "store {addr}:{port} (c10d TCPStore, served by {by}) connected"
        );
        Ok(JobStore { store, server })
    }

    /// The store client (keys already under the attempt's prefix).
    pub fn store(&self) -> &TcpStore {
        &self.store
    }

    /// Whether this process serves the store (rank 0 without an agent store).
    pub fn serves(&self) -> bool {
        self.server.is_some()
    }
}
