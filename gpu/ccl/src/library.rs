//! What the engine needs from a collective library: [`CollectiveLib`], the description of one
//! library (its names, its unique id, what it lacks) and its raw calls, and the vendor-neutral
//! shapes of those calls ([`Call`], [`Round`], [`P2p`]).
//!
//! A library implements the raw calls only; the engine ([`crate::comm`]) makes every check before
//! them and keeps every buffer they use until their work ran. Each raw call is an `unsafe fn`
//! whose `# Safety` section is the engine's promise, so the implementation's own `SAFETY`
//! comments cite it next to the vendor call.

use std::ffi::c_void;
use unihal_hal::{CclCaps, CollectiveOp, DType, HalError, Invalid, ReduceOp, Result};

/// `v` as the library's integer type `T` (a C `int` rank, a `uint32_t` count).
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `arg` when `v` does not fit.
pub fn c_arg<T: TryFrom<u64>>(arg: &'static str, v: u64) -> Result<T> {
    T::try_from(v).map_err(|_| {
        HalError::invalid(
            arg,
            Invalid::Value {
                value: v.to_string(),
                accepted: format!("a value the library's {} holds", std::any::type_name::<T>()),
            },
        )
    })
}

/// A library communicator handle as an address (`0`: none).
pub type RawComm = usize;

/// A collective as every library of this shape takes it (roots and peers are ranks of the
/// communicator, already checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    AllReduce(ReduceOp),
    Broadcast { root: usize },
    Reduce { red: ReduceOp, root: usize },
    AllGather,
    ReduceScatter(ReduceOp),
    AllToAll,
}

impl Call {
    /// The HAL's name of the operation.
    pub fn op(&self) -> CollectiveOp {
        match self {
            Call::AllReduce(_) => CollectiveOp::AllReduce,
            Call::Broadcast { .. } => CollectiveOp::Broadcast,
            Call::Reduce { .. } => CollectiveOp::Reduce,
            Call::AllGather => CollectiveOp::AllGather,
            Call::ReduceScatter(_) => CollectiveOp::ReduceScatter,
            Call::AllToAll => CollectiveOp::AllToAll,
        }
    }

    /// The reduction, for the reducing collectives.
    pub fn red(&self) -> Option<ReduceOp> {
        match *self {
            Call::AllReduce(r) | Call::Reduce { red: r, .. } | Call::ReduceScatter(r) => Some(r),
            _ => None,
        }
    }

    /// The elements of the send and of the receive buffer a call of `count` (per rank, or per
    /// block) reads and writes among `n` ranks (saturating: the checks refuse what overflows).
    pub fn extents(&self, count: u64, n: usize) -> (u64, u64) {
        let total = count.saturating_mul(n as u64);
        match self {
            Call::AllGather => (count, total),
            Call::ReduceScatter(_) => (total, count),
            Call::AllToAll => (total, total),
            _ => (count, count),
        }
    }
}

/// One collective round: the call, the element type and the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    pub call: Call,
    pub dtype: DType,
    pub count: u64,
}

/// One send (or receive, `recv`) of `count` elements of `dtype` with rank `peer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2p {
    pub peer: usize,
    pub recv: bool,
    pub count: u64,
    pub dtype: DType,
}

/// One collective library, opened: NCCL and RCCL ([`crate::nccl`]), HCCL (the Ascend backend).
///
/// The engine calls it from any thread, one call per communicator at a time (its lock), with
/// the communicator's device current for the calls that need it. A library without an abort
/// (`can_abort` false) gets stand-ins for the operations its in-process peers wait for; one
/// without a split (`has_split` false) gets the engine's emulated split; one whose broadcast is
/// in place only gets the root's copy first; one without an average gets a sum and a division.
pub trait CollectiveLib: Send + Sync + 'static {
    /// The library's name in messages and `HalError::Vendor::library` ("NCCL", "HCCL").
    fn label(&self) -> &'static str;
    /// Where the library was opened from.
    fn path(&self) -> &str;
    /// The library's version, when it says.
    fn version(&self) -> Option<String>;
    /// What the engine claims on this library.
    fn caps(&self) -> CclCaps;
    /// What its unique id is called in messages, and its size in bytes.
    fn id_kind(&self) -> (&'static str, usize);

    /// The names of its blocking init and split calls, for messages ("ncclCommInitRank",
    /// "ncclCommSplit").
    fn blocking_calls(&self) -> (&'static str, &'static str);

    /// A new unique id (`ncclGetUniqueId`, `HcclGetRootInfo`) of `id_kind().1` bytes.
    ///
    /// # Errors
    /// The library's.
    fn unique_id(&self) -> Result<Vec<u8>>;

    /// Makes rank `rank` of `nranks` of the communicator of `id` (checked: `id_kind().1` bytes,
    /// `rank < nranks`), with the device current; blocks until every rank called.
    ///
    /// # Errors
    /// The library's (its own timeout as `Timeout`); `InvalidArgument` for a size it cannot take.
    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> Result<RawComm>;

    /// One communicator per device of `ordinals` in one call (`ncclCommInitAll`), with the first
    /// device current; `None` when the library has no such call (the engine makes them from one
    /// thread each).
    ///
    /// # Errors
    /// The library's.
    fn init_all(&self, ordinals: &[i32]) -> Option<Result<Vec<RawComm>>>;

    /// True when the library can abort a communicator (ending its posted operations).
    fn can_abort(&self) -> bool;

    /// True when the library has a split of its own.
    fn has_split(&self) -> bool;

    /// True when broadcast reads and writes one buffer (the root's data in its receive buffer).
    fn broadcast_in_place_only(&self) -> bool;

    /// True when the library averages itself (else `avg` runs as a sum the engine divides).
    fn native_avg(&self) -> bool;

    /// Ends `comm`: aborts it when `abort` and the library can, else destroys it. A failure is
    /// logged (nobody can act on it).
    ///
    /// # Safety
    /// `comm` is a live communicator of this library that nothing uses now or after.
    unsafe fn release(&self, comm: RawComm, abort: bool);

    /// The communicator's asynchronous error: `None` while healthy.
    ///
    /// # Safety
    /// `comm` is live and used by this thread alone for the call.
    ///
    /// # Errors
    /// The query's own failure.
    unsafe fn async_error(&self, comm: RawComm) -> Result<Option<HalError>>;

    /// Enqueues `round` on the native stream `stream`, reading `send` and writing `recv`.
    ///
    /// # Safety
    /// `comm` is live and used by this thread alone for the call; `send` and `recv` are the
    /// device addresses of `round.call.extents(count, size)` elements of `round.dtype` each
    /// (checked against live buffers of the communicator's device, kept until the work ran);
    /// `stream` is a native stream of that device, current.
    ///
    /// # Errors
    /// The library's (naming its entry point).
    unsafe fn collective(
        &self,
        comm: RawComm,
        round: &Round,
        send: u64,
        recv: u64,
        stream: *mut c_void,
    ) -> Result<()>;

    /// Enqueues `calls` (each with its buffer's device address, counts above 0) as one group on
    /// `stream` (one call alone when there is one).
    ///
    /// # Safety
    /// As [`CollectiveLib::collective`], for `count` elements at each address.
    ///
    /// # Errors
    /// The library's; `Unsupported` for a group the library cannot issue.
    unsafe fn p2p(&self, comm: RawComm, calls: &[(P2p, u64)], stream: *mut c_void) -> Result<()>;

    /// The library's split (when [`CollectiveLib::has_split`]): the child of this rank, 0 when it
    /// has no color. Blocks until every rank called.
    ///
    /// # Safety
    /// `comm` is live and used by this thread alone for the call; the device is current.
    ///
    /// # Errors
    /// The library's; `InvalidArgument` for a color it cannot take.
    unsafe fn split(&self, comm: RawComm, color: Option<u32>, key: i32) -> Result<RawComm>;

    /// This rank's place in `comm`: (rank, size).
    ///
    /// # Safety
    /// `comm` is live and used by this thread alone for the call.
    ///
    /// # Errors
    /// The library's.
    unsafe fn rank_size(&self, comm: RawComm) -> Result<(usize, usize)>;
}
