//! unihal's launch layer: how the processes of a job find each other.
//!
//! - [`env`]: who this process is, from the launcher's variables (torchrun, Open MPI, Slurm,
//!   PMI), and where the job's store lives (`MASTER_ADDR:MASTER_PORT`, or Slurm's launch node).
//! - [`tcpstore`]: PyTorch's c10d TCPStore protocol, client and server, so that unihal's ranks
//!   use the store torchrun's agent already serves instead of binding its port, and so that a
//!   Python process can read what unihal wrote.
//! - [`store`]: the job's store as a rank reaches it (agent store with the restart attempt's
//!   prefix, or rank 0's own).
//! - [`error_file`]: torchrun's error file, so a failing rank's error reaches torchrun's summary.
//! - [`net`]: the network interface a rank's sockets use (`UNIHAL_SOCKET_IFNAME`, read as
//!   `NCCL_SOCKET_IFNAME` is).
//!
//! Every wait has a deadline: a rank or store that never answers is a `Timeout`, never a hang.
//! Collective engines that rendezvous through a store (gloo) use the same client, so every route
//! into a job meets the same store.

pub mod env;
pub mod error_file;
pub mod net;
pub mod store;
pub mod tcpstore;

pub use env::{LaunchInfo, Launcher};
pub use store::JobStore;
pub use tcpstore::{TcpStore, TcpStoreServer};
