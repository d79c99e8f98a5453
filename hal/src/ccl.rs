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
use crate::error::Result;
use crate::stream::Stream;
use serde::Serialize;
use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Environment variable: collective timeout in seconds (default 300).
pub const TIMEOUT_ENV: &str = "UNIHAL_CCL_TIMEOUT";

/// The timeout from `UNIHAL_CCL_TIMEOUT`, or 300 s.
pub fn timeout_from_env() -> Duration {
    std::env::var(TIMEOUT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(300))
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
    /// Grouped calls (`group_start`/`group_end`).
    pub groups: bool,
    /// `split`.
    pub split: bool,
}

impl CclCaps {
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

/// Options of a new communicator.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CommConfig {
    /// How long an operation waits for the other ranks before failing with `Timeout`
    /// (default: `UNIHAL_CCL_TIMEOUT`, else 300 s).
    pub timeout: Option<Duration>,
}

/// The bytes that identify one communicator across ranks (128 for NCCL/RCCL, 4108 for HCCL).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UniqueId(pub Vec<u8>);

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
    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// `recv = reduce over ranks of send[rank*count..]` (`count` elements per rank).
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
    fn send(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// Receives `count` elements from `peer`.
    fn recv(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;
    /// `recv[j*count..] = send of rank j at [rank*count..]` (`count` elements per peer).
    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()>;

    /// Fails pending and later operations of this communicator (every rank) with `Aborted`.
    fn abort(&self);
    /// The sticky asynchronous error of the communicator, if any.
    fn async_error(&self) -> Option<crate::HalError>;
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}
