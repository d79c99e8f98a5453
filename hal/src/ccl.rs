//! Collectives: NCCL-style communicators, one per rank, operating on device buffers in stream
//! order.
//!
//! A backend that has a collective engine returns it from `Backend::collectives`. Communicators
//! are made from a [`UniqueId`] (NCCL/RCCL pass 128 bytes by value, HCCL a 4108-byte root info by
//! pointer; unihal carries the bytes, whatever their length) with `init_rank`, or all at once for
//! devices of one process with `init_all`. Operations enqueue on a stream of the communicator's
//! device like everything else; their failures are sticky on the stream and on the communicator.
//!
//! ## Semantics defined once
//! * **avg** is the sum divided by the number of ranks: for floats computed in the accumulation
//!   type, for integers truncated toward zero after a wrapping sum.
//! * **Accumulation** is reported per dtype in [`CclCaps::accumulation`] (the CPU engine
//!   accumulates f16/bf16 in f32 and rounds once; NCCL reduces in the element type).
//! * **Never hang**: an operation whose peers do not arrive within the communicator's timeout
//!   (`UNIHAL_CCL_TIMEOUT`, seconds) fails with [`crate::HalError::Timeout`]; `abort` fails pending
//!   and later operations with [`crate::HalError::Aborted`]. The layer never kills the process.

use crate::buffer::Buffer;
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{HalError, Result};
use crate::stream::Stream;
use serde::Serialize;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable: collective timeout in seconds (default 300).
pub const TIMEOUT_ENV: &str = "UNIHAL_CCL_TIMEOUT";

/// The collective timeout when neither [`CommConfig::timeout`] nor `UNIHAL_CCL_TIMEOUT` sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The timeout from `UNIHAL_CCL_TIMEOUT` (seconds), or [`DEFAULT_TIMEOUT`] when unset.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming the variable for a value that is not a number of
/// seconds of at least 0.001 (`abc`, `-1`, `nan`, `1e-300`): a timeout the user believes set must
/// not be ignored. A value longer than the clock holds (`1e19`) is no timeout.
pub fn timeout_from_env() -> Result<Duration> {
    Ok(crate::settings::parse(TIMEOUT_ENV, crate::settings::seconds)?.unwrap_or(DEFAULT_TIMEOUT))
}

/// The timeout a communicator made with `config` uses: the config's, else [`timeout_from_env`].
///
/// # Errors
/// As [`timeout_from_env`]; as [`timeout_or`] for the config's.
pub fn timeout_of(config: &CommConfig) -> Result<Duration> {
    match config.timeout {
        Some(t) => crate::deadline::check_timeout("CommConfig::timeout", t),
        None => timeout_from_env(),
    }
}

/// The timeout a communicator made with `config` uses where the engine already holds its own
/// (`default`, read from the environment when the engine was made): the config's, else `default`.
///
/// # Errors
/// [`crate::HalError::InvalidArgument`] naming `CommConfig::timeout` when the config's is shorter
/// than [`crate::deadline::MIN_TIMEOUT`] (a longer one than the clock holds is no deadline).
pub fn timeout_or(config: &CommConfig, default: Duration) -> Result<Duration> {
    match config.timeout {
        Some(t) => crate::deadline::check_timeout("CommConfig::timeout", t),
        None => Ok(default),
    }
}

/// Logs communicators just made, at INFO in the COLL subsystem, as NCCL's "Init COMPLETE" lines:
/// engine (with its library and version), rank, size, device and timeout (`None`: the engine's
/// own default). `how` says which call made them (`init_rank`, `init_all`, `the MPI world`).
pub fn log_created(
    comms: &[Arc<dyn Communicator>],
    engine: &str,
    how: &str,
    timeout: Option<Duration>,
) {
    if !tracing::enabled!(target: "unihal::coll", tracing::Level::INFO) {
        return;
    }
    let timeout = timeout.map_or_else(
        || "the engine's default timeout".to_string(),
        |t| format!("timeout {:.1} s", t.as_secs_f64()),
    );
    for c in comms {
        tracing::info!(
            target: "unihal::coll",
            "communicator rank {} of {} on {} made by {how}: engine {engine}, {timeout}",
            c.rank(),
            c.size(),
            c.device().id(),
        );
    }
}

/// Logs a communicator's abort, at INFO in the COLL subsystem (NCCL's "Abort COMPLETE").
pub fn log_aborted(comm: &dyn Communicator) {
    tracing::info!(
        target: "unihal::coll",
        "communicator rank {} of {} on {} aborted",
        comm.rank(),
        comm.size(),
        comm.device().id()
    );
}

/// Logs the error a communicator keeps (a timeout, a peer's abort, a vendor failure), at WARN in
/// the COLL subsystem, as NCCL warns of its async errors. `who` names the communicator (`rank 1
/// of 2 (NCCL)`). Engines call it once, when the error becomes sticky.
pub fn log_failed(who: fmt::Arguments<'_>, error: &HalError) {
    tracing::warn!(target: "unihal::coll", "communicator {who} failed: {error}");
}

/// Reductions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ReduceOp {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl ReduceOp {
    /// Every reduction.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];
    /// Lower-case name (`sum`), as nccl-tests prints it.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Collective operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveOp {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    SendRecv,
    AllToAll,
}

impl CollectiveOp {
    /// Every collective.
    pub const ALL: [CollectiveOp; 7] = [
        CollectiveOp::AllReduce,
        CollectiveOp::Broadcast,
        CollectiveOp::Reduce,
        CollectiveOp::AllGather,
        CollectiveOp::ReduceScatter,
        CollectiveOp::SendRecv,
        CollectiveOp::AllToAll,
    ];
    /// snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            CollectiveOp::AllReduce => "all_reduce",
            CollectiveOp::Broadcast => "broadcast",
            CollectiveOp::Reduce => "reduce",
            CollectiveOp::AllGather => "all_gather",
            CollectiveOp::ReduceScatter => "reduce_scatter",
            CollectiveOp::SendRecv => "sendrecv",
            CollectiveOp::AllToAll => "all_to_all",
        }
    }
    /// True for the ops that take a reduction.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            CollectiveOp::AllReduce | CollectiveOp::Reduce | CollectiveOp::ReduceScatter
        )
    }
}

/// How a reduction is computed for one dtype.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Accumulation {
    /// The type partial results are held in.
    pub accumulate_in: DType,
    /// Reductions unihal emulates (e.g. avg as sum then scale) rather than the engine.
    pub emulated: Vec<ReduceOp>,
}

/// What a collective engine supports: a reported capability, not a promise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CclCaps {
    /// Engine name and version (`unihal-cpu in-process`, `NCCL 2.30.7`).
    pub engine: String,
    /// For each operation, the dtypes it runs in.
    pub ops: BTreeMap<CollectiveOp, Vec<DType>>,
    /// For each reducing operation and dtype, the reductions it runs.
    pub reductions: BTreeMap<DType, Vec<ReduceOp>>,
    /// Accumulation per dtype.
    pub accumulation: BTreeMap<DType, Accumulation>,
    /// [`Communicator::group`] (and so [`Communicator::all_to_allv`]).
    pub groups: bool,
    /// [`Communicator::split`].
    pub split: bool,
    /// Whether a rank that dies fails the others with `Timeout` (in-process engine) or ends the
    /// whole job (MPI: Open MPI 4 has no fault tolerance; `mpirun` kills the remaining ranks).
    pub survives_dead_rank: bool,
    /// Whether a `Timeout` names the ranks that never arrived (engines that see every rank's
    /// arrival do; NCCL only sees its own kernel waiting).
    pub names_missing_ranks: bool,
    /// Whether a rank whose operation times out aborts the communicator for every rank, so the
    /// other waiting ranks may fail with `Aborted` (a peer gave up) before their own `Timeout`.
    /// NCCL: ending a timed-out kernel needs `ncclCommAbort`, which peers may see as
    /// `ncclRemoteError`. Engines without it fail each waiting rank with its own `Timeout`.
    pub timeout_aborts_peers: bool,
    /// Whether the ranks of one communicator may live in different processes (NCCL, RCCL, HCCL,
    /// MPI, gloo), or only in one (the CPU backend's in-process engine). A launch of several
    /// processes on an engine without it fails at start instead of waiting for ranks that can
    /// never join.
    pub crosses_processes: bool,
}

impl CclCaps {
    /// The capabilities of an engine whose library did not open: nothing runs (`engine` says
    /// which library, e.g. "NCCL (unavailable)").
    pub fn unavailable(engine: String) -> CclCaps {
        CclCaps {
            engine,
            ops: BTreeMap::new(),
            reductions: BTreeMap::new(),
            accumulation: BTreeMap::new(),
            groups: false,
            split: false,
            survives_dead_rank: false,
            names_missing_ranks: false,
            timeout_aborts_peers: true,
            crosses_processes: true,
        }
    }

    /// True when `op` runs in `dtype` (with `red` for reducing ops).
    pub fn supports(&self, op: CollectiveOp, dtype: DType, red: Option<ReduceOp>) -> bool {
        self.ops.get(&op).is_some_and(|d| d.contains(&dtype))
            && red.is_none_or(|r| {
                self.reductions
                    .get(&dtype)
                    .is_some_and(|rs| rs.contains(&r))
            })
    }
}

/// The place of rank `me` in the communicator a split gives it: `(new rank, new size)` among the
/// ranks whose `(color, key)` in `asks` (indexed by old rank) share its color, ordered by
/// (key, old rank) as `ncclCommSplit` and `MPI_Comm_split` order them. `None` when `me` has no
/// color (it joins no communicator) or `me` is out of range.
pub fn split_place(asks: &[(Option<u32>, i32)], me: usize) -> Option<(usize, usize)> {
    let color = asks.get(me)?.0?;
    let mut members: Vec<(i32, usize)> = asks
        .iter()
        .enumerate()
        .filter(|(_, a)| a.0 == Some(color))
        .map(|(r, a)| (a.1, r))
        .collect();
    members.sort_unstable();
    let rank = members.iter().position(|&(_, r)| r == me)?;
    Some((rank, members.len()))
}

/// Options of a new communicator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommConfig {
    /// How long an operation waits for the other ranks before failing with `Timeout`
    /// (default: `UNIHAL_CCL_TIMEOUT`, else 300 s). At least 1 ms; `Duration::MAX` (or any
    /// timeout longer than the clock holds) is no timeout.
    pub timeout: Option<Duration>,
}

/// The bytes that identify one communicator across ranks (128 for NCCL/RCCL, 4108 for HCCL).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UniqueId(pub Vec<u8>);

/// One operation of a grouped call ([`Communicator::group`]).
///
/// Counts are in elements; `buf` is a view of a buffer on the communicator's device.
#[derive(Debug, Clone)]
pub enum GroupCall {
    /// Sends `count` elements of `buf` to `peer`.
    Send {
        buf: Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
    },
    /// Receives `count` elements from `peer` into `buf`.
    Recv {
        buf: Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
    },
}

/// The parts of a [`GroupCall`], for engines.
#[derive(Debug, Clone, Copy)]
pub struct P2pParts<'a> {
    pub buf: &'a Buffer,
    pub count: u64,
    pub dtype: DType,
    pub peer: usize,
    /// True for a receive.
    pub recv: bool,
}

impl GroupCall {
    /// The call's buffer, count, dtype, peer and direction.
    pub fn parts(&self) -> P2pParts<'_> {
        match self {
            GroupCall::Send {
                buf,
                count,
                dtype,
                peer,
            } => P2pParts {
                buf,
                count: *count,
                dtype: *dtype,
                peer: *peer,
                recv: false,
            },
            GroupCall::Recv {
                buf,
                count,
                dtype,
                peer,
            } => P2pParts {
                buf,
                count: *count,
                dtype: *dtype,
                peer: *peer,
                recv: true,
            },
        }
    }
}

/// A backend's collective engine.
pub trait Collectives: Send + Sync {
    /// What it supports.
    fn capabilities(&self) -> &CclCaps;

    /// A new id, to be shared with every rank (through a bootstrap store or MPI).
    ///
    /// # Errors
    /// Vendor errors.
    fn unique_id(&self) -> Result<UniqueId>;

    /// Joins rank `rank` of `nranks` on `device`; blocks until every rank has joined or the timeout.
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] for a bad rank or size, a foreign device or a malformed
    /// id; [`crate::HalError::Timeout`] when the other ranks do not arrive.
    fn init_rank(
        &self,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Result<Arc<dyn Communicator>>;

    /// One communicator per device, rank i on `devices[i]` (like `ncclCommInitAll`).
    ///
    /// # Errors
    /// As `init_rank`.
    fn init_all(
        &self,
        devices: &[Arc<dyn Device>],
        config: &CommConfig,
    ) -> Result<Vec<Arc<dyn Communicator>>>;

    /// For engines whose processes are already connected (MPI): this process's rank of the
    /// engine's world, on `device`, without any unique-id exchange. Collective over every process
    /// of the job. `None` for engines that need a [`UniqueId`] (the default).
    fn connected_world(
        &self,
        device: &Arc<dyn Device>,
        config: &CommConfig,
    ) -> Option<Result<Arc<dyn Communicator>>> {
        let _ = (device, config);
        None
    }
}

/// One rank of a communicator.
///
/// Every operation is enqueued on `stream` (a stream of this rank's device) and completes
/// asynchronously, once every rank has enqueued and run its matching call. Counts are in elements;
/// buffers are views (use `Buffer::slice` for offsets). Thread safety: any thread.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn device(&self) -> &Arc<dyn Device>;

    /// `recv = reduce(send of every rank)`; `send` and `recv` may be the same buffer.
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] for buffers too small or of another device;
    /// [`crate::HalError::Unsupported`] outside the capabilities; sticky Timeout/Aborted later.
    #[track_caller]
    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// `recv = send of root` (root's `send` is read; every rank's `recv` is written).
    #[track_caller]
    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// Root's `recv = reduce(send of every rank)`; other ranks' `recv` is untouched.
    #[allow(clippy::too_many_arguments)] // mirrors ncclReduce's argument list
    #[track_caller]
    fn reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// `recv[r*count..] = send of rank r` (`count` elements per rank).
    #[track_caller]
    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// `recv = reduce over ranks of send[rank*count..]` (`count` elements per rank).
    #[track_caller]
    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// Sends `count` elements to `peer` (matched in order with the peer's `recv` from this rank).
    /// A group of one call unless the engine overrides it.
    ///
    /// # Errors
    /// As [`Communicator::group`].
    #[track_caller]
    fn send(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let buf = buf.clone();
        self.group(
            &[GroupCall::Send {
                buf,
                count,
                dtype,
                peer,
            }],
            stream,
        )
    }
    /// Receives `count` elements from `peer`. A group of one call unless the engine overrides it.
    ///
    /// # Errors
    /// As [`Communicator::group`].
    #[track_caller]
    fn recv(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let buf = buf.clone();
        self.group(
            &[GroupCall::Recv {
                buf,
                count,
                dtype,
                peer,
            }],
            stream,
        )
    }
    /// `recv[j*count..] = send of rank j at [rank*count..]` (`count` elements per peer).
    #[track_caller]
    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;

    /// Issues `calls` as one operation on `stream` (like `ncclGroupStart` ... `ncclGroupEnd`): every
    /// send and receive of the group is in flight at once, so exchanges that would deadlock as
    /// separate blocking calls (a ring of sends) complete. Matching is per (source, destination)
    /// pair in issue order, as for `send`/`recv`.
    ///
    /// # Errors
    /// As `send`/`recv` for each call (nothing is enqueued when one call is invalid);
    /// [`crate::HalError::Unsupported`] when the capabilities say `groups: false`.
    #[track_caller]
    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()>;

    /// Personalised exchange with per-peer counts: rank `j` receives `send_counts[j]` elements
    /// from this rank's `send` at element `send_displs[j]`, and this rank receives
    /// `recv_counts[j]` elements from rank `j` into `recv` at `recv_displs[j]`. Runs as one
    /// grouped call of sends and receives (NCCL has no all-to-all-v either).
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] for count or displacement lists whose length is not
    /// `size()`, ranges outside the buffers, or `send` and `recv` of one allocation; then as
    /// [`Communicator::group`]. A count that differs from the peer's becomes a sticky error.
    #[allow(clippy::too_many_arguments)] // mirrors MPI_Alltoallv's argument list
    #[track_caller]
    fn all_to_allv(
        &self,
        send: &Buffer,
        send_counts: &[u64],
        send_displs: &[u64],
        recv: &Buffer,
        recv_counts: &[u64],
        recv_displs: &[u64],
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let n = self.size();
        for (arg, v) in [
            ("send_counts", send_counts),
            ("send_displs", send_displs),
            ("recv_counts", recv_counts),
            ("recv_displs", recv_displs),
        ] {
            if v.len() != n {
                return Err(crate::HalError::invalid(
                    arg,
                    crate::Invalid::Value {
                        value: format!("{} entries", v.len()),
                        accepted: format!("one per rank ({n})"),
                    },
                ));
            }
        }
        if send.same_allocation(recv) {
            return Err(crate::HalError::invalid(
                "recv",
                crate::Invalid::Other("all_to_allv cannot run in place".into()),
            ));
        }
        let esz = dtype.size() as u64;
        let view = |b: &Buffer, displ: u64, count: u64| {
            let bytes = |e: u64| e.saturating_mul(esz);
            b.slice(bytes(displ), bytes(count))
        };
        let mut calls = Vec::with_capacity(2 * n);
        for peer in 0..n {
            calls.push(GroupCall::Send {
                buf: view(send, send_displs[peer], send_counts[peer])?,
                count: send_counts[peer],
                dtype,
                peer,
            });
            calls.push(GroupCall::Recv {
                buf: view(recv, recv_displs[peer], recv_counts[peer])?,
                count: recv_counts[peer],
                dtype,
                peer,
            });
        }
        self.group(&calls, stream)
    }

    /// Splits this communicator by `color` (`None`: this rank joins no new communicator) and
    /// orders each new one by (`key`, old rank), like `ncclCommSplit`/`MPI_Comm_split`. A blocking
    /// host call that every rank must make; the child keeps this rank's device and takes
    /// `config` (a `None` timeout inherits this communicator's).
    ///
    /// # Errors
    /// [`crate::HalError::Timeout`] when some rank does not call within the timeout;
    /// [`crate::HalError::Aborted`] after `abort`; [`crate::HalError::Unsupported`] when the
    /// capabilities say `split: false`.
    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>>;

    /// Fails pending and later operations of this communicator (every rank) with `Aborted`.
    fn abort(&self);
    /// The sticky asynchronous error of the communicator, if any.
    fn async_error(&self) -> Option<crate::HalError>;
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

/// Checks every engine makes before an operation: no sticky error, a stream of the
/// communicator's device, and an operation the capabilities claim.
///
/// # Errors
/// The sticky error; [`crate::Invalid::WrongDevice`] for a stream of another device;
/// [`crate::HalError::Unsupported`] for an operation, dtype or reduction the engine lacks.
pub fn check_call(
    device: &Arc<dyn Device>,
    caps: &CclCaps,
    sticky: Option<crate::HalError>,
    (op, dtype, red): (CollectiveOp, DType, Option<ReduceOp>),
    stream: &Arc<dyn Stream>,
) -> Result<()> {
    if let Some(e) = sticky {
        return Err(e);
    }
    if stream.device_id() != device.id() {
        return Err(crate::HalError::invalid(
            "stream",
            crate::Invalid::WrongDevice {
                expected: device.id(),
                found: stream.device_id(),
            },
        ));
    }
    if !caps.supports(op, dtype, red) {
        return Err(crate::HalError::unsupported(format!(
            "{} of {dtype}{} on {}",
            op.name(),
            red.map(|r| format!(" with {r}")).unwrap_or_default(),
            caps.engine
        )));
    }
    Ok(())
}

/// `Err` unless `0 <= r < n` (a root or peer argument named `arg`).
///
/// # Errors
/// [`crate::Invalid::Value`].
pub fn check_rank(arg: &'static str, r: usize, n: usize) -> Result<()> {
    if r >= n {
        return Err(crate::HalError::invalid(
            arg,
            crate::Invalid::Value {
                value: r.to_string(),
                accepted: format!("0..{n}"),
            },
        ));
    }
    Ok(())
}

/// Bytes of `factor * count` elements of `dtype` (`factor` is 1, or the number of ranks for the
/// whole-world buffers of all_gather, reduce_scatter and all_to_all).
///
/// # Errors
/// [`crate::Invalid::Value`] when the size does not fit in 64 bits (no buffer can hold it).
pub fn checked_bytes(arg: &'static str, count: u64, factor: u64, dtype: DType) -> Result<u64> {
    count
        .checked_mul(factor)
        .and_then(|n| n.checked_mul(dtype.size() as u64))
        .ok_or_else(|| {
            crate::HalError::invalid(
                arg,
                crate::Invalid::Value {
                    value: format!("{factor} x {count} elements of {dtype}"),
                    accepted: "a size in bytes below 2^64".into(),
                },
            )
        })
}

/// `Err` when the `send_len` bytes of `send` and the `recv_len` bytes of `recv` overlap other
/// than exactly in place. In place means the two views begin where the operation expects
/// (NCCL's definitions): `send + at.0 == recv + at.1`, that is `(0, 0)` for all_reduce, reduce and
/// broadcast, `(0, rank * bytes)` for all_gather (send is this rank's block of recv) and
/// `(rank * bytes, 0)` for reduce_scatter (recv is this rank's block of send). Any other overlap
/// would let one rank's writes race with its peers' reads.
///
/// # Errors
/// [`crate::Invalid::Overlap`] with the overlapping range.
pub fn check_send_recv(
    send: &Buffer,
    send_len: u64,
    recv: &Buffer,
    recv_len: u64,
    at: (u64, u64),
) -> Result<()> {
    if !send.same_allocation(recv) || send_len == 0 || recv_len == 0 {
        return Ok(());
    }
    let (s, r) = (send.device_addr() as u128, recv.device_addr() as u128);
    let (s_end, r_end) = (s + send_len as u128, r + recv_len as u128);
    let (lo, hi) = (s.max(r), s_end.min(r_end));
    if lo >= hi || s + at.0 as u128 == r + at.1 as u128 {
        return Ok(());
    }
    Err(crate::HalError::invalid(
        "recv",
        crate::Invalid::Overlap {
            src: send.device_addr(),
            dst: recv.device_addr(),
            len: (hi - lo) as u64,
        },
    ))
}

/// `Err` when a device appears twice in `devices` (`init_all`): two ranks on one device would
/// share its streams' ordering and memory, which no engine supports (NCCL rejects it too).
///
/// # Errors
/// [`crate::Invalid::Value`] naming the device.
pub fn check_distinct_devices(devices: &[Arc<dyn Device>]) -> Result<()> {
    for (i, d) in devices.iter().enumerate() {
        if let Some(j) = devices[..i].iter().position(|e| e.id() == d.id()) {
            return Err(crate::HalError::invalid(
                "devices",
                crate::Invalid::Value {
                    value: format!("{} as ranks {j} and {i}", d.id()),
                    accepted: "each device at most once".into(),
                },
            ));
        }
    }
    Ok(())
}

/// `Err` when `send` and `recv` are views of one allocation (all-to-all cannot run in place).
///
/// # Errors
/// [`crate::Invalid::Other`].
pub fn check_not_in_place(send: &Buffer, recv: &Buffer) -> Result<()> {
    if send.same_allocation(recv) {
        return Err(crate::HalError::invalid(
            "recv",
            crate::Invalid::Other("all_to_all cannot run in place".into()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod split_tests {
    use super::split_place;

    #[test]
    fn split_places_rank_by_key_then_old_rank_and_none_without_color() {
        // Old ranks 0..5: colors 1, none, 1, 2, 1; keys 5, 0, 5, 0, -1.
        let asks = [
            (Some(1), 5),
            (None, 0),
            (Some(1), 5),
            (Some(2), 0),
            (Some(1), -1),
        ];
        assert_eq!(split_place(&asks, 4), Some((0, 3)), "smallest key first");
        assert_eq!(
            split_place(&asks, 0),
            Some((1, 3)),
            "equal keys: old rank order"
        );
        assert_eq!(split_place(&asks, 2), Some((2, 3)));
        assert_eq!(split_place(&asks, 3), Some((0, 1)));
        assert_eq!(split_place(&asks, 1), None);
        assert_eq!(split_place(&asks, 9), None);
    }
}

/// This process among the processes of a job: its host name and a random value drawn once per
/// process (process ids repeat across containers and hosts, so a pid cannot tell two processes
/// apart). Engines that connect the ranks of one process only put it in their ids, and refuse at
/// once an id made by another process instead of waiting for ranks that can never join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessTag {
    /// The host name (`/proc/sys/kernel/hostname`, else `/etc/hostname`, else `HOSTNAME` or
    /// `COMPUTERNAME`, else `unknown-host`).
    pub host: String,
    /// Random, drawn once per process.
    pub nonce: u64,
}

/// This process's [`ProcessTag`] (computed once). Thread safety: any thread.
pub fn process_tag() -> &'static ProcessTag {
    static TAG: std::sync::OnceLock<ProcessTag> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        let files = ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .into_iter()
            .filter_map(|f| std::fs::read_to_string(f).ok());
        let vars = ["HOSTNAME", "COMPUTERNAME"]
            .into_iter()
            .filter_map(|v| std::env::var(v).ok());
        let host = files
            .chain(vars)
            .map(|h| h.trim().to_string())
            .find(|h| !h.is_empty())
            .unwrap_or_else(|| "unknown-host".into());
        // std's hasher keys are drawn from the OS's random source once per process.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        ProcessTag {
            host,
            nonce: h.finish(),
        }
    })
}
