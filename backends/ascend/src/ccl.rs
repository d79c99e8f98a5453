//! Collectives through HCCL: HCCL described as a [`CollectiveLib`] for the shared engine
//! (`unihal_ccl`), which does every check, the tracking, the watchdog and what HCCL lacks.
//!
//! * **Loading** ([`crate::ffi::hccl`]): `libhccl.so` next to the ACL runtime first
//!   (`UNIHAL_HCCL_LIB` alone when set; see [`crate::loader`]), opened on first use and never
//!   unloaded.
//! * **Values** ([`crate::conv::hccl`]): `HcclDataType` (every HAL dtype but `bool` moves; int8,
//!   int16, int32, fp16, fp32 and bf16 reduce, the facts sheet's list for every chip),
//!   `HcclReduceOp` (sum, prod, max, min) and `HcclResult` as `HalError::Vendor { library:
//!   "HCCL", .. }`.
//! * **What HCCL lacks**, as the description says and the engine does:
//!   - *no average*: the engine runs `SUM`, then divides by the number of ranks on the same
//!     stream (`div_scalar` through the device's aclnn path): reported as an emulated reduction
//!     in `CclCaps::accumulation`, for the float dtypes whose division the SoC's op table lists;
//!   - *broadcast in place only*: the root first copies its send buffer into its receive buffer
//!     on the stream;
//!   - *no split*: the engine's emulated split (`unihal_ccl::split`: two all-gathers on the
//!     parent, then `HcclCommInitRootInfo` per child);
//!   - *no abort*: a timeout, an asynchronous error or `abort` stops issuing and fails the
//!     streams with pending work; in-process ranks post stand-ins for what their peers wait for
//!     (`unihal_ccl::group`), and a reaper destroys the communicator once its operations drained;
//!     a peer in another process ends its wait at HCCL's own execution timeout
//!     (`HCCL_EXEC_TIMEOUT`). The capabilities' engine string says so.
//! * **Communicators**: the unique id is HCCL's 4108-byte root info; `HcclCommInitRootInfo`
//!   runs with the device current on the engine's helper thread, bounded by the timeout;
//!   `init_all` is one such call per device from threads with one root info. Grouped sends and
//!   receives are one `HcclBatchSendRecv` (groups are claimed only when the library has it); a
//!   send or receive alone is `HcclSend`/`HcclRecv`.
//! * **Open points**: HCCL's accumulation type is not documented (reported as the element
//!   type); the root info is made without a current device (torch_npu sets one first; a split's
//!   leaders have theirs current); `HcclAlltoAllV` is resolved but all-to-all-v is one
//!   `HcclBatchSendRecv`; a split costs two collectives on the parent and a full
//!   `HcclCommInitRootInfo` per child.

use crate::conv::hccl as conv;
use crate::ffi::hccl::{self as ffi, Comm, Hccl, RootInfo, SendRecvItem};
use crate::loader::Cann;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;
use unihal_ccl::library::{c_arg, Call, P2p, RawComm, Round};
use unihal_ccl::{CollectiveLib, Engine, LibComm};
use unihal_gpu::platform::GpuPlatform;
use unihal_hal::ccl::Accumulation;
use unihal_hal::{CclCaps, CollectiveOp, DType, HalError, OpId, ReduceOp, Result};

/// The HCCL engine: the shared engine over [`Hccl`] on Ascend devices and streams.
pub type HcclEngine = Engine<Hccl>;

/// One rank of an HCCL communicator.
pub type HcclComm = LibComm<Hccl>;

/// The HCCL engine on the shared GPU layer's platform (nothing is opened yet).
pub fn engine() -> HcclEngine {
    Engine::with_library(
        conv::LIBRARY,
        Hccl::load,
        Arc::new(GpuPlatform::<Cann>::default()),
    )
}

/// What the engine string says of the missing abort.
const NO_ABORT: &str = "no abort: a timeout, an asynchronous error or abort stops issuing and \
     fails the streams with pending work; in-process ranks' posted operations end through \
     stand-ins, other processes' at HCCL's execution timeout";

/// The float dtypes whose average the engine emulates: those the SoC's op table divides.
fn averaged() -> Vec<DType> {
    let Ok(cann) = crate::loader::cann() else {
        return Vec::new();
    };
    let table = crate::ops::soc::table(crate::ops::soc::classify(&cann.soc));
    let div = table.get(&OpId::DivScalar).cloned().unwrap_or_default();
    conv::REDUCED
        .into_iter()
        .filter(|d| d.is_float() && div.contains(d))
        .collect()
}

/// An `HcclResult` of `call` as ours.
fn check(lib: &Hccl, call: &str, code: i32) -> Result<()> {
    if code == conv::SUCCESS {
        Ok(())
    } else {
        Err(conv::vendor(lib, call, code))
    }
}

/// The error of a failed `HcclCommInitRootInfo`: HCCL's own timeout (whose message names the
/// ranks that never came) as `Timeout`.
fn init_error(lib: &Hccl, code: i32) -> HalError {
    let e = conv::vendor(lib, "HcclCommInitRootInfo", code);
    match (code, e) {
        (conv::E_TIMEOUT, HalError::Vendor { message, .. }) => HalError::Timeout {
            what: format!("HcclCommInitRootInfo: not every rank joined: {message}"),
            millis: 0,
        },
        (_, e) => e,
    }
}

impl Hccl {
    /// The `HcclDataType` of `d`.
    fn dt(&self, d: DType) -> Result<i32> {
        conv::dtype(d).ok_or_else(|| HalError::unsupported(format!("{d}: HCCL has no such type")))
    }
}

impl CollectiveLib for Hccl {
    fn label(&self) -> &'static str {
        conv::LIBRARY
    }

    fn path(&self) -> &str {
        &self.path
    }

    fn version(&self) -> Option<String> {
        None
    }

    fn caps(&self) -> CclCaps {
        let averaged = averaged();
        let mut ops = BTreeMap::new();
        for op in CollectiveOp::ALL {
            let dtypes = match op {
                CollectiveOp::AllToAll if self.all_to_all.is_none() => continue,
                _ if op.reduces() => conv::REDUCED.to_vec(),
                _ => conv::MOVED.to_vec(),
            };
            ops.insert(op, dtypes);
        }
        let reductions = conv::REDUCED
            .iter()
            .map(|&d| {
                let reds = ReduceOp::ALL
                    .into_iter()
                    .filter(|&r| r != ReduceOp::Avg || averaged.contains(&d))
                    .collect();
                (d, reds)
            })
            .collect();
        let accumulation = conv::REDUCED
            .iter()
            .map(|&d| {
                let emulated = if averaged.contains(&d) {
                    vec![ReduceOp::Avg]
                } else {
                    Vec::new()
                };
                let acc = Accumulation {
                    accumulate_in: d,
                    emulated,
                };
                (d, acc)
            })
            .collect();
        CclCaps {
            engine: format!("HCCL ({}) ({NO_ABORT})", self.path),
            ops,
            reductions,
            accumulation,
            groups: self.batch_send_recv.is_some(),
            split: true,
            survives_dead_rank: false,
            names_missing_ranks: false,
            timeout_aborts_peers: true,
            crosses_processes: true,
        }
    }

    fn id_kind(&self) -> (&'static str, usize) {
        ("HcclRootInfo", ffi::ROOT_INFO_BYTES)
    }

    fn blocking_calls(&self) -> (&'static str, &'static str) {
        ("HcclCommInitRootInfo", "split")
    }

    fn unique_id(&self) -> Result<Vec<u8>> {
        let mut root = RootInfo::zeroed();
        // SAFETY: an out-pointer to a 4108-byte root info.
        let code = unsafe { (self.get_root_info)(&mut *root) };
        check(self, "HcclGetRootInfo", code)?;
        Ok(root.bytes())
    }

    fn init_rank(&self, id: &[u8], nranks: usize, rank: usize) -> Result<RawComm> {
        let (n, r): (u32, u32) = (c_arg("nranks", nranks as u64)?, c_arg("rank", rank as u64)?);
        let root = RootInfo::from_bytes(id)
            .ok_or_else(|| HalError::Internal(format!("a root info of {} bytes", id.len())))?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: a 4108-byte root info and an out-pointer to a local; the device is current
        // (the trait's contract: HCCL uses the current device).
        let code = unsafe { (self.comm_init_root_info)(n, &*root, r, &mut comm) };
        if code != conv::SUCCESS {
            return Err(init_error(self, code));
        }
        // SAFETY: a live communicator just made, used by this thread alone.
        let place = unsafe { self.rank_size(comm as RawComm) };
        let checked = match place {
            Ok(p) if p == (rank, nranks) => Ok(comm as RawComm),
            Ok((id, size)) => Err(HalError::Internal(format!(
                "HcclCommInitRootInfo made rank {id} of {size}, asked for rank {rank} of {nranks}"
            ))),
            Err(e) => Err(e),
        };
        if checked.is_err() {
            // SAFETY: a communicator just made that nobody else holds.
            unsafe { self.release(comm as RawComm, false) };
        }
        checked
    }

    fn init_all(&self, _: &[i32]) -> Option<Result<Vec<RawComm>>> {
        // HCCL's `HcclCommInitAll` takes device lists in its own order and no timeout: the
        // engine makes one communicator per thread instead, each bounded.
        None
    }

    fn can_abort(&self) -> bool {
        false
    }

    fn has_split(&self) -> bool {
        false
    }

    fn broadcast_in_place_only(&self) -> bool {
        true
    }

    fn native_avg(&self) -> bool {
        false
    }

    unsafe fn release(&self, comm: RawComm, _abort: bool) {
        // HCCL has no abort: the engine releases a communicator only once its operations
        // drained (or leaks it).
        // SAFETY: the caller's contract: a live communicator nothing else uses now or after.
        let code = unsafe { (self.comm_destroy)(comm as Comm) };
        if code != conv::SUCCESS {
            tracing::warn!(target: "unihal::coll", "{}", conv::vendor(self, "HcclCommDestroy", code));
        }
    }

    unsafe fn async_error(&self, comm: RawComm) -> Result<Option<HalError>> {
        let mut err = 0;
        // SAFETY: the caller's contract (a live communicator used by this thread alone), and an
        // out-pointer to a local.
        let code = unsafe { (self.get_comm_async_error)(comm as Comm, &mut err) };
        check(self, "HcclGetCommAsyncError", code)?;
        Ok((err != conv::SUCCESS).then(|| conv::async_error(self, err)))
    }

    unsafe fn collective(
        &self,
        comm: RawComm,
        round: &Round,
        send: u64,
        recv: u64,
        stream: *mut c_void,
    ) -> Result<()> {
        let (c, st, n) = (comm as Comm, stream, round.count);
        let (s, r) = (send as *mut c_void, recv as *mut c_void);
        let dt = self.dt(round.dtype)?;
        let red = |op| conv::reduce_op(op).0;
        // SAFETY: in every arm, the caller's contract: a live communicator used by this thread
        // alone, and `send`/`recv` ranges of the call's extents in live buffers kept until the
        // work ran, on the current device's native stream `st`. Broadcast reads and writes the
        // receive buffer alone (the engine copied the root's data there first).
        let (call, code) = unsafe {
            match round.call {
                Call::AllReduce(op) => (
                    "HcclAllReduce",
                    (self.all_reduce)(s, r, n, dt, red(op), c, st),
                ),
                Call::Broadcast { root } => (
                    "HcclBroadcast",
                    (self.broadcast)(r, n, dt, root as u32, c, st),
                ),
                Call::Reduce { red: op, root } => (
                    "HcclReduce",
                    (self.reduce)(s, r, n, dt, red(op), root as u32, c, st),
                ),
                Call::AllGather => ("HcclAllGather", (self.all_gather)(s, r, n, dt, c, st)),
                Call::ReduceScatter(op) => (
                    "HcclReduceScatter",
                    (self.reduce_scatter)(s, r, n, dt, red(op), c, st),
                ),
                Call::AllToAll => {
                    let f = self.all_to_all.ok_or_else(|| {
                        HalError::unsupported(format!(
                            "all-to-all: {} lacks HcclAlltoAll",
                            self.path
                        ))
                    })?;
                    // `count` elements per peer in each buffer.
                    ("HcclAlltoAll", f(s, n, dt, r, n, dt, c, st))
                }
            }
        };
        check(self, call, code)
    }

    unsafe fn p2p(&self, comm: RawComm, calls: &[(P2p, u64)], stream: *mut c_void) -> Result<()> {
        let c = comm as Comm;
        if let [(p, a)] = calls {
            let (f, call) = if p.recv {
                (self.recv, "HcclRecv")
            } else {
                (self.send, "HcclSend")
            };
            let dt = self.dt(p.dtype)?;
            // SAFETY: the caller's contract (a live communicator used by this thread alone; the
            // range in a live buffer kept until the work ran).
            let code = unsafe { f(*a as *mut c_void, p.count, dt, p.peer as u32, c, stream) };
            return check(self, call, code);
        }
        let batch = self.batch_send_recv.ok_or_else(|| {
            HalError::unsupported(format!(
                "grouped send/recv: {} lacks HcclBatchSendRecv",
                self.path
            ))
        })?;
        let mut items = calls
            .iter()
            .map(|&(p, a)| {
                Ok(SendRecvItem {
                    send_recv_type: if p.recv { ffi::RECV } else { ffi::SEND },
                    buf: a as *mut c_void,
                    count: p.count,
                    data_type: self.dt(p.dtype)?,
                    remote_rank: p.peer as u32,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let n: u32 = c_arg("calls", items.len() as u64)?;
        // SAFETY: `n` items, each range in a live buffer kept until the work ran (the caller's
        // contract); HCCL reads the list during the call.
        let code = unsafe { batch(items.as_mut_ptr(), n, c, stream) };
        check(self, "HcclBatchSendRecv", code)
    }

    unsafe fn split(&self, _: RawComm, _: Option<u32>, _: i32) -> Result<RawComm> {
        Err(HalError::unsupported(
            "split: HCCL has none (the engine emulates it)".to_string(),
        ))
    }

    unsafe fn rank_size(&self, comm: RawComm) -> Result<(usize, usize)> {
        let (mut size, mut id) = (0u32, 0u32);
        // SAFETY: the caller's contract (a live communicator used by this thread alone) and
        // out-pointers to locals.
        let codes = unsafe {
            [
                (
                    "HcclGetRankSize",
                    (self.get_rank_size)(comm as Comm, &mut size),
                ),
                ("HcclGetRankId", (self.get_rank_id)(comm as Comm, &mut id)),
            ]
        };
        for (call, code) in codes {
            check(self, call, code)?;
        }
        Ok((id as usize, size as usize))
    }
}
