//! One rank of an HCCL communicator ([`HcclComm`]), its watchdog, and its end.
//!
//! * **Issuing**: every argument is checked with the HAL's shared helpers exactly as the
//!   NCCL-API engine checks them (the same code: `unihal_nccl_api::track::operand_addr`,
//!   `unihal_hal::ccl::check_*`), so misuse gets the same error on every engine; then the HCCL
//!   call is enqueued on the caller's stream through the platform (which keeps the buffers until
//!   the work ran), under the lock that serialises every use of the communicator, and a
//!   completion event is recorded behind it.
//! * **Watchdog** (`unihal_nccl_api::track`): polls `HcclGetCommAsyncError` and the completion
//!   events; an asynchronous error or an operation past its deadline (`CommConfig::timeout`,
//!   else `UNIHAL_CCL_TIMEOUT`) fails the communicator (`Group::fail` in [`super::group`]).
//! * **No abort in HCCL**: failing (a timeout, an asynchronous error, [`Communicator::abort`])
//!   stops issuing (later calls return the sticky error, `Aborted` after an abort), fails the
//!   streams with pending work, posts stand-ins for in-process peers ([`super::group`]) and
//!   hands the communicator to a reaper, which destroys it once the completion events say its
//!   operations drained, or leaks it (logged) when they have not by then.
//! * **Dropping** the last handle destroys the communicator once its operations completed (at
//!   once when none is pending); a reaper fails the streams of those that pass their deadline
//!   meanwhile with `Timeout`.

use super::conv::{self, LIBRARY};
use super::ffi::{self, Comm as RawComm, Hccl, SendRecvItem};
use super::group::{Group, Kind, Op, Round};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_not_in_place, check_rank};
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Keep, OpCall, OpId, ReduceOp, Result, Scalar, Stream, TensorView,
};
use unihal_nccl_api::track::{describe, retire, start_watchdog, InFlight, Operands};
use unihal_nccl_api::Platform;

/// How long a reaper waits for a communicator's operations past the later of its timeout and
/// their deadlines before leaking it.
const DRAIN_GRACE: Duration = Duration::from_secs(30);

/// Destroys communicator `raw` (nothing for 0); a failure is logged (nobody can act on it).
pub(crate) fn destroy(lib: &Hccl, raw: usize) {
    if raw == 0 {
        return;
    }
    // SAFETY: a communicator of HcclCommInitRootInfo that nothing uses any more (its last owner
    // gave it up and its operations completed), destroyed once.
    let code = unsafe { (lib.comm_destroy)(raw as RawComm) };
    if code != 0 {
        tracing::warn!(target: "unihal::ccl", "{}", conv::vendor(lib, "HcclCommDestroy", code));
    }
}

/// A communicator given up (failed or dropped) and its operations still in flight: destroyed
/// once they completed, leaked (and logged) when they did not by `give_up`.
struct Reaper {
    lib: Arc<Hccl>,
    platform: Arc<dyn Platform>,
    raw: usize,
    ops: Vec<InFlight>,
    give_up: Instant,
    /// Fail the streams of operations past their deadline with `Timeout` (a dropped
    /// communicator has no watchdog any more).
    timeouts: bool,
    what: String,
}

impl Reaper {
    /// Runs the reaper (through the platform: never inside a host callback), on a thread of
    /// its own when operations are pending.
    fn start(self) {
        if self.raw == 0 {
            return;
        }
        let platform = self.platform.clone();
        platform.release(Box::new(move || {
            let mut me = self;
            if me.poll() {
                return;
            }
            let spawned = std::thread::Builder::new()
                .name("unihal-hccl-reaper".into())
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_millis(2));
                    if me.poll() {
                        return;
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(target: "unihal::ccl", "HCCL: no reaper thread ({e}): a communicator is leaked");
            }
        }));
    }

    /// One pass; true when done (destroyed or leaked).
    fn poll(&mut self) -> bool {
        let now = Instant::now();
        if self.timeouts {
            for op in &mut self.ops {
                if now >= op.deadline && !op.finished() {
                    self.platform.fail_stream(
                        &op.stream,
                        HalError::Timeout {
                            what: format!("{}: peers did not arrive", op.what),
                            millis: 0,
                        },
                    );
                    op.deadline = self.give_up;
                }
            }
        }
        self.ops.retain(|op| !op.finished());
        if self.ops.is_empty() {
            destroy(&self.lib, std::mem::take(&mut self.raw));
            return true;
        }
        if now >= self.give_up {
            tracing::warn!(
                target: "unihal::ccl",
                "HCCL: {} still has {} operation(s) in flight; the communicator is leaked \
                 (HCCL cannot abort it, and destroying it would wait for them)",
                self.what,
                self.ops.len()
            );
            self.raw = 0;
            return true;
        }
        false
    }
}

/// The state a rank, its watchdog and its group share.
pub(crate) struct Shared {
    pub(super) lib: Arc<Hccl>,
    pub(super) platform: Arc<dyn Platform>,
    pub(super) device: Arc<dyn Device>,
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) timeout: Duration,
    /// The `HcclComm`; 0 once handed to a reaper. Every HCCL call on it holds this lock.
    raw: Mutex<usize>,
    /// No more operations: the communicator failed or was aborted.
    stopped: AtomicBool,
    pub(super) sticky: Mutex<Option<HalError>>,
    /// Operations in flight. Held across an issue (from before the HCCL call until its
    /// completion event is recorded), so that stopping waits for an issue in progress and the
    /// reaper sees every posted operation.
    inflight: Mutex<Vec<InFlight>>,
    watching: AtomicBool,
    group: Arc<Group>,
}

impl Shared {
    fn label(&self) -> String {
        format!(
            "rank {} of {} on {}",
            self.rank,
            self.size,
            self.device.id()
        )
    }

    pub(super) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The error of an operation after the communicator stopped.
    pub(super) fn stopped_error(&self) -> HalError {
        self.sticky.lock().clone().unwrap_or(HalError::Aborted {
            what: "the HCCL communicator".into(),
        })
    }

    /// Stops issuing, makes `e` the sticky error (unless one is there) and fails the streams
    /// with pending work with it. Waits for an issue in progress. True when this call stopped
    /// the communicator.
    pub(crate) fn stop(&self, e: HalError) -> bool {
        let mut inflight = self.inflight.lock();
        let first = !self.stopped.swap(true, Ordering::SeqCst);
        let e = self.sticky.lock().get_or_insert(e).clone();
        for op in inflight.iter_mut() {
            if !op.finished() {
                self.platform.fail_stream(&op.stream, e.clone());
            }
        }
        first
    }

    /// Gives the communicator and its operations to a reaper (after [`Shared::stop`]).
    pub(crate) fn hand_to_reaper(&self) {
        let ops = std::mem::take(&mut *self.inflight.lock());
        let raw = std::mem::take(&mut *self.raw.lock());
        let last = ops
            .iter()
            .map(|o| o.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        Reaper {
            lib: self.lib.clone(),
            platform: self.platform.clone(),
            raw,
            ops,
            give_up: last.max(Instant::now() + self.timeout) + DRAIN_GRACE,
            timeouts: false,
            what: self.label(),
        }
        .start();
    }

    /// Fails the communicator: this rank with `e`, its in-process peers with `Aborted`.
    pub(super) fn fail(&self, e: HalError) {
        let peers = HalError::Aborted {
            what: format!(
                "rank {} of the HCCL communicator failed ({e}); HCCL cannot abort, so its \
                 in-process peers stopped too",
                self.rank
            ),
        };
        self.group.clone().fail(self, e, peers);
    }

    /// Enqueues `f(communicator, native stream)` on `stream` keeping `keep`, with the
    /// communicator's lock held; logs `ops` in the group once HCCL took the call. `stand_in`:
    /// issued by a failing group (no check of `stopped`, nothing logged).
    fn issue(
        &self,
        call: &str,
        stream: &Arc<dyn Stream>,
        keep: Vec<Keep>,
        stand_in: bool,
        ops: &[Op],
        f: impl FnOnce(RawComm, ffi::Stream) -> i32,
    ) -> Result<()> {
        let mut f = Some(f);
        self.platform.submit(stream, call, keep, &mut |native| {
            let f = f
                .take()
                .ok_or_else(|| HalError::Internal(format!("{call} submitted twice")))?;
            let raw = self.raw.lock();
            if *raw == 0 || (!stand_in && self.stopped()) {
                return Err(self.stopped_error());
            }
            let code = f(*raw as RawComm, native);
            if code != conv::SUCCESS {
                return Err(conv::vendor(&self.lib, call, code));
            }
            if !stand_in {
                self.group.record(self.rank, ops);
            }
            Ok(())
        })
    }

    /// Posts `ops` as stand-ins (see [`super::group`]): collectives in order on one new stream,
    /// sends and receives on a new stream per peer, each on scratch memory kept until it ran;
    /// their completion events join the operations in flight.
    pub(crate) fn stand_in(&self, ops: &[Op]) {
        if ops.is_empty() {
            return;
        }
        let mut inflight = self.inflight.lock();
        let mut streams: HashMap<Option<usize>, Arc<dyn Stream>> = HashMap::new();
        for op in ops {
            let key = match op {
                Op::Collective(_) => None,
                Op::P2p { peer, .. } => Some(*peer),
            };
            let stream = match streams.get(&key) {
                Some(s) => s.clone(),
                None => match self.device.create_stream() {
                    Ok(s) => {
                        streams.insert(key, s.clone());
                        s
                    }
                    Err(e) => {
                        tracing::warn!(target: "unihal::ccl", "HCCL: {}: no stream for stand-ins: {e}", self.label());
                        break;
                    }
                },
            };
            if let Err(e) = self.post_stand_in(op, &stream) {
                tracing::warn!(target: "unihal::ccl", "HCCL: {}: stand-in {op:?} not posted: {e}", self.label());
                break;
            }
        }
        let deadline = Instant::now() + self.timeout;
        for s in streams.values() {
            match InFlight::record(&self.device, s, "HCCL stand-in".into(), deadline) {
                Ok(op) => inflight.push(op),
                Err(e) => tracing::warn!(target: "unihal::ccl", "HCCL: stand-in not watched: {e}"),
            }
        }
    }

    fn post_stand_in(&self, op: &Op, stream: &Arc<dyn Stream>) -> Result<()> {
        let n = self.size as u64;
        let scratch = |elems: u64, esize: u64| -> Result<Buffer> {
            let bytes = elems
                .checked_mul(esize)
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| HalError::Internal("stand-in too large".into()))?;
            self.device.alloc(bytes.max(1))
        };
        let sid = stream.stream_id();
        let lib = self.lib.clone();
        match *op {
            Op::Collective(Round {
                kind,
                dtype,
                esize,
                count,
            }) => {
                let (send_elems, recv_elems) = match kind {
                    Kind::AllGather => (count, n * count),
                    Kind::ReduceScatter { .. } => (n * count, count),
                    Kind::AllToAll => (n * count, n * count),
                    _ => (count, count),
                };
                let (s, r) = (scratch(send_elems, esize)?, scratch(recv_elems, esize)?);
                let (sa, ra) = (
                    s.device_addr() as *mut c_void,
                    r.device_addr() as *mut c_void,
                );
                let keep = vec![s.use_on(sid), r.use_on(sid)];
                self.issue("HCCL stand-in", stream, keep, true, &[], |c, st| {
                    // SAFETY: scratch buffers of the sizes HCCL reads and writes for this call,
                    // kept until it ran; a live communicator under its lock.
                    unsafe {
                        match kind {
                            Kind::AllReduce { op } => {
                                (lib.all_reduce)(sa, ra, count, dtype, op, c, st)
                            }
                            Kind::Broadcast { root } => {
                                (lib.broadcast)(ra, count, dtype, root, c, st)
                            }
                            Kind::Reduce { op, root } => {
                                (lib.reduce)(sa, ra, count, dtype, op, root, c, st)
                            }
                            Kind::AllGather => (lib.all_gather)(sa, ra, count, dtype, c, st),
                            Kind::ReduceScatter { op } => {
                                (lib.reduce_scatter)(sa, ra, count, dtype, op, c, st)
                            }
                            Kind::AllToAll => match lib.all_to_all {
                                Some(f) => f(sa, count, dtype, ra, count, dtype, c, st),
                                None => conv::E_NOT_SUPPORT,
                            },
                        }
                    }
                })
            }
            Op::P2p {
                peer,
                recv,
                count,
                dtype,
                esize,
            } => {
                let b = scratch(count, esize)?;
                let a = b.device_addr() as *mut c_void;
                let f = if recv { lib.recv } else { lib.send };
                self.issue(
                    "HCCL stand-in",
                    stream,
                    vec![b.use_on(sid)],
                    true,
                    &[],
                    |c, st| {
                        // SAFETY: a scratch buffer of `count` elements kept until the call ran; a
                        // live communicator under its lock.
                        unsafe { f(a, count, dtype, peer as u32, c, st) }
                    },
                )
            }
        }
    }

    /// `HcclGetCommAsyncError`: Ok(0) when healthy; None while another thread holds the
    /// communicator for longer than `wait`, or once it was given up.
    fn query_async(&self, wait: Duration) -> Option<Result<i32>> {
        let raw = self.raw.try_lock_for(wait)?;
        if *raw == 0 {
            return None;
        }
        let mut err = 0;
        // SAFETY: a live communicator, used by this thread alone (the lock), and an out-pointer
        // to a local.
        let code = unsafe { (self.lib.get_comm_async_error)(*raw as RawComm, &mut err) };
        drop(raw);
        Some(if code != conv::SUCCESS {
            Err(conv::vendor(&self.lib, "HcclGetCommAsyncError", code))
        } else {
            Ok(err)
        })
    }

    /// One watchdog pass: retire completed operations, fail on an asynchronous error (HCCL's
    /// word first: an operation that failed is retired before its error is read) or a timeout.
    /// False when nothing is left to watch.
    fn watch(&self) -> bool {
        if self.stopped() {
            return false;
        }
        let expired = retire(&mut self.inflight.lock(), Instant::now());
        if let Some(e) = self.async_failure(Duration::from_millis(5)) {
            self.fail(e);
            return false;
        }
        if let Some(what) = expired {
            self.fail(HalError::Timeout {
                what: format!("{what}: peers did not arrive"),
                millis: self.timeout.as_millis() as u64,
            });
            return false;
        }
        !self.inflight.lock().is_empty()
    }

    /// The communicator's asynchronous error, if HCCL reports one (or the query fails); None
    /// when healthy, or when another thread held the communicator for `wait`.
    fn async_failure(&self, wait: Duration) -> Option<HalError> {
        match self.query_async(wait)? {
            Ok(conv::SUCCESS) => None,
            Ok(code) => Some(conv::async_error(&self.lib, code)),
            Err(e) => Some(e),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Never stopped (a failure hands the communicator to a reaper, leaving 0): destroyed
        // once its operations completed; HCCL's destroy would wait for them.
        let raw = std::mem::take(self.raw.get_mut());
        let ops = std::mem::take(self.inflight.get_mut());
        let last = ops
            .iter()
            .map(|o| o.deadline)
            .max()
            .unwrap_or_else(Instant::now);
        Reaper {
            lib: self.lib.clone(),
            platform: self.platform.clone(),
            raw,
            ops,
            give_up: last + self.timeout.max(DRAIN_GRACE),
            timeouts: true,
            what: self.label(),
        }
        .start();
    }
}

/// One rank of an HCCL communicator. Thread-safe; operations must be issued in the same order on
/// every rank (HCCL's rule).
pub struct HcclComm {
    pub(super) shared: Arc<Shared>,
    pub(super) caps: CclCaps,
}

/// What a new rank is made of.
pub(crate) struct Parts {
    pub lib: Arc<Hccl>,
    pub platform: Arc<dyn Platform>,
    pub raw: RawComm,
    pub rank: usize,
    pub size: usize,
    pub device: Arc<dyn Device>,
    pub caps: CclCaps,
    pub group: Arc<Group>,
}

impl HcclComm {
    pub(crate) fn new(p: Parts, config: &CommConfig) -> Arc<HcclComm> {
        let shared = Arc::new(Shared {
            lib: p.lib,
            platform: p.platform,
            device: p.device,
            rank: p.rank,
            size: p.size,
            timeout: config
                .timeout
                .unwrap_or_else(unihal_hal::ccl::timeout_from_env),
            raw: Mutex::new(p.raw as usize),
            stopped: AtomicBool::new(false),
            sticky: Mutex::new(None),
            inflight: Mutex::new(Vec::new()),
            watching: AtomicBool::new(false),
            group: p.group,
        });
        shared.group.join(p.rank, &shared);
        Arc::new(HcclComm {
            shared,
            caps: p.caps,
        })
    }

    /// The `HcclComm` handle as an address (for diagnostics and tests): 0 once the communicator
    /// was given up after a failure (then destroyed, or leaked, by its reaper). The failing
    /// rank's thread gives every rank up after it stopped them all and issued their stand-ins,
    /// so a rank's sticky error can be seen a moment before its handle reads 0.
    pub fn native(&self) -> usize {
        *self.shared.raw.lock()
    }

    /// The shared checks of this communicator's operations.
    fn operands(&self) -> Operands<'_> {
        let s = &self.shared;
        Operands {
            platform: &*s.platform,
            device: &s.device,
            caps: &self.caps,
        }
    }

    /// The checks of every operation: refused once stopped, then the shared checks.
    fn check(
        &self,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.check_open()?;
        let sticky = self.shared.sticky.lock().clone();
        self.operands().check(sticky, call, stream)
    }

    /// The stop's error once the communicator stopped without a sticky error to report.
    fn check_open(&self) -> Result<()> {
        let s = &self.shared;
        if s.stopped() && s.sticky.lock().is_none() {
            return Err(s.stopped_error());
        }
        Ok(())
    }

    /// The device address of `elems` elements at the start of `buf`.
    fn addr(&self, buf: &Buffer, arg: &'static str, elems: u64, dtype: DType) -> Result<u64> {
        self.operands().addr(buf, arg, elems, dtype)
    }

    /// Issues one operation on `stream` (after `before`, e.g. a broadcast's copy), then the
    /// average's division of `scale` (`count` elements), then records and watches its completion.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        what: String,
        call: &str,
        stream: &Arc<dyn Stream>,
        keep: Vec<Keep>,
        ops: &[Op],
        scale: Option<(&Buffer, DType, u64)>,
        before: impl FnOnce() -> Result<()>,
        f: impl FnOnce(RawComm, ffi::Stream) -> i32,
    ) -> Result<()> {
        let s = &self.shared;
        let mut inflight = s.inflight.lock();
        if s.stopped() {
            return Err(s.stopped_error());
        }
        before()?;
        s.issue(call, stream, keep, false, ops, f)?;
        if let Some((recv, dtype, count)) = scale {
            if let Err(e) = self.divide(recv, dtype, count, stream) {
                // The sum is there, not the average: nothing on this stream may use it.
                s.platform.fail_stream(stream, e.clone());
                return Err(e);
            }
        }
        let deadline = Instant::now() + s.timeout;
        inflight.push(InFlight::record(&s.device, stream, what, deadline)?);
        drop(inflight);
        start_watchdog(
            &self.shared,
            |s| &s.watching,
            format!("unihal-hccl-watch-r{}", s.rank),
            Shared::watch,
            |s| !s.inflight.lock().is_empty() && !s.stopped(),
        );
        Ok(())
    }

    /// `recv[..count] /= size` on `stream`: the second half of an emulated average.
    fn divide(
        &self,
        recv: &Buffer,
        dtype: DType,
        count: u64,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let view = TensorView::contiguous(
            &recv.slice(0, count * dtype.size() as u64)?,
            dtype,
            &[count],
        );
        let n = Scalar::F64(self.shared.size as f64);
        stream.run_op(&OpCall::binary_scalar(
            OpId::DivScalar,
            view.clone(),
            n,
            view,
        ))
    }

    /// The average's division by the number of ranks, when `op` is `avg` and there is more than
    /// one rank.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] when the device cannot divide in `dtype`.
    fn needs_scale(&self, op: ReduceOp, dtype: DType) -> Result<bool> {
        if !conv::reduce_op(op).1 || self.shared.size == 1 {
            return Ok(false);
        }
        if !self
            .shared
            .device
            .capabilities()
            .supports(OpId::DivScalar, dtype)
        {
            return Err(HalError::unsupported(format!(
                "avg of {dtype} on HCCL (emulated as sum then div_scalar, which {} does not run in {dtype})",
                self.shared.device.id()
            )));
        }
        Ok(true)
    }

    /// The checks of an operation on a send and a receive buffer ([`Operands::two_buffers`]),
    /// then their addresses and HCCL's data type, or None for a count of 0 (nothing to do).
    fn two_buffers(
        &self,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
        send: (&Buffer, u64),
        recv: (&Buffer, u64),
        count: u64,
        in_place: Option<(u64, u64)>,
    ) -> Result<Option<(*mut c_void, *mut c_void, i32)>> {
        let (_, dtype, _) = call;
        self.check_open()?;
        let sticky = self.shared.sticky.lock().clone();
        let Some((sa, ra)) = self
            .operands()
            .two_buffers(sticky, call, stream, send, recv, count, in_place)?
        else {
            return Ok(None);
        };
        let dt = conv::dtype(dtype)
            .ok_or_else(|| HalError::unsupported(format!("{dtype}: HCCL has no such data type")))?;
        Ok(Some((sa as *mut c_void, ra as *mut c_void, dt)))
    }

    fn describe(
        &self,
        op: CollectiveOp,
        count: u64,
        dtype: DType,
        red: Option<ReduceOp>,
    ) -> String {
        describe("HCCL", op, count, dtype, red)
    }

    /// One round of a collective whose operands `two_buffers` checked: described, `keep`'s
    /// buffers kept until it ran, issued by `f` (HCCL's `call`) after `before`, its average
    /// scaled, and watched.
    #[allow(clippy::too_many_arguments)]
    fn issue_round(
        &self,
        (op, dtype, red): (CollectiveOp, DType, Option<ReduceOp>),
        (kind, dt, count): (Kind, i32, u64),
        call: &str,
        stream: &Arc<dyn Stream>,
        keep: &[&Buffer],
        scale: Option<(&Buffer, DType, u64)>,
        before: impl FnOnce() -> Result<()>,
        f: impl FnOnce(RawComm, ffi::Stream) -> i32,
    ) -> Result<()> {
        let ops = Self::round(kind, dt, dtype, count);
        let sid = stream.stream_id();
        let keep = keep.iter().map(|b| b.use_on(sid)).collect();
        let what = self.describe(op, count, dtype, red);
        self.enqueue(what, call, stream, keep, &ops, scale, before, f)
    }

    fn round(kind: Kind, dt: i32, dtype: DType, count: u64) -> [Op; 1] {
        [Op::Collective(Round {
            kind,
            dtype: dt,
            esize: dtype.size() as u64,
            count,
        })]
    }

    /// One send or receive.
    fn p2p(
        &self,
        recv: bool,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.check((CollectiveOp::SendRecv, dtype, None), stream)?;
        check_rank("peer", peer, self.shared.size)?;
        let arg = if recv { "recv" } else { "send" };
        let a = self.addr(buf, arg, count, dtype)? as *mut c_void;
        if count == 0 {
            return Ok(());
        }
        let dt = conv::dtype(dtype).unwrap_or(-1);
        let lib = self.shared.lib.clone();
        let (f, call) = if recv {
            (lib.recv, "HcclRecv")
        } else {
            (lib.send, "HcclSend")
        };
        let ops = [Op::P2p {
            peer,
            recv,
            count,
            dtype: dt,
            esize: dtype.size() as u64,
        }];
        let what = format!("{call} of {count} {dtype} with rank {peer}");
        let keep = vec![buf.use_on(stream.stream_id())];
        self.enqueue(
            what,
            call,
            stream,
            keep,
            &ops,
            None,
            || Ok(()),
            |c, st| {
                // SAFETY: the range was checked against a live buffer kept until the work ran.
                unsafe { f(a, count, dt, peer as u32, c, st) }
            },
        )
    }
}

impl Communicator for HcclComm {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn size(&self) -> usize {
        self.shared.size
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.shared.device
    }

    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let call = (CollectiveOp::AllReduce, dtype, Some(op));
        let place = Some((0, 0));
        let Some((sa, ra, dt)) =
            self.two_buffers(call, stream, (send, count), (recv, count), count, place)?
        else {
            return Ok(());
        };
        let scale = self.needs_scale(op, dtype)?.then_some((recv, dtype, count));
        let hop = conv::reduce_op(op).0;
        let lib = self.shared.lib.clone();
        self.issue_round(
            call,
            (Kind::AllReduce { op: hop }, dt, count),
            "HcclAllReduce",
            stream,
            &[send, recv],
            scale,
            || Ok(()),
            |c, st| {
                // SAFETY: both ranges were checked against live buffers kept until the work ran.
                unsafe { (lib.all_reduce)(sa, ra, count, dt, hop, c, st) }
            },
        )
    }

    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        check_rank("root", root, self.shared.size)?;
        let call = (CollectiveOp::Broadcast, dtype, None);
        let is_root = self.shared.rank == root;
        let place = is_root.then_some((0, 0));
        let Some((sa, ra, dt)) =
            self.two_buffers(call, stream, (send, count), (recv, count), count, place)?
        else {
            return Ok(());
        };
        // HCCL broadcasts in place: the root first copies its send buffer into its receive
        // buffer (on the stream), then every rank broadcasts its receive buffer.
        let bytes = count * dtype.size() as u64;
        let copy = || {
            if is_root && sa != ra {
                stream.copy_d2d(send, 0, recv, 0, bytes)
            } else {
                Ok(())
            }
        };
        let lib = self.shared.lib.clone();
        self.issue_round(
            call,
            (Kind::Broadcast { root: root as u32 }, dt, count),
            "HcclBroadcast",
            stream,
            &[recv],
            None,
            copy,
            |c, st| {
                // SAFETY: the receive range was checked against a live buffer kept until the work
                // ran.
                unsafe { (lib.broadcast)(ra, count, dt, root as u32, c, st) }
            },
        )
    }

    fn reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        check_rank("root", root, self.shared.size)?;
        let call = (CollectiveOp::Reduce, dtype, Some(op));
        let is_root = self.shared.rank == root;
        let place = is_root.then_some((0, 0));
        let Some((sa, ra, dt)) =
            self.two_buffers(call, stream, (send, count), (recv, count), count, place)?
        else {
            return Ok(());
        };
        let scale = (self.needs_scale(op, dtype)? && is_root).then_some((recv, dtype, count));
        let hop = conv::reduce_op(op).0;
        let lib = self.shared.lib.clone();
        self.issue_round(
            call,
            (
                Kind::Reduce {
                    op: hop,
                    root: root as u32,
                },
                dt,
                count,
            ),
            "HcclReduce",
            stream,
            &[send, recv],
            scale,
            || Ok(()),
            |c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.reduce)(sa, ra, count, dt, hop, root as u32, c, st) }
            },
        )
    }

    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let call = (CollectiveOp::AllGather, dtype, None);
        let total = count.saturating_mul(self.shared.size as u64);
        let place = Some((0, self.shared.rank as u64 * count));
        let Some((sa, ra, dt)) =
            self.two_buffers(call, stream, (send, count), (recv, total), count, place)?
        else {
            return Ok(());
        };
        let lib = self.shared.lib.clone();
        self.issue_round(
            call,
            (Kind::AllGather, dt, count),
            "HcclAllGather",
            stream,
            &[send, recv],
            None,
            || Ok(()),
            |c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.all_gather)(sa, ra, count, dt, c, st) }
            },
        )
    }

    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let call = (CollectiveOp::ReduceScatter, dtype, Some(op));
        let total = count.saturating_mul(self.shared.size as u64);
        let place = Some((self.shared.rank as u64 * count, 0));
        let Some((sa, ra, dt)) =
            self.two_buffers(call, stream, (send, total), (recv, count), count, place)?
        else {
            return Ok(());
        };
        let scale = self.needs_scale(op, dtype)?.then_some((recv, dtype, count));
        let hop = conv::reduce_op(op).0;
        let lib = self.shared.lib.clone();
        self.issue_round(
            call,
            (Kind::ReduceScatter { op: hop }, dt, count),
            "HcclReduceScatter",
            stream,
            &[send, recv],
            scale,
            || Ok(()),
            |c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.reduce_scatter)(sa, ra, count, dt, hop, c, st) }
            },
        )
    }

    fn send(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.p2p(false, buf, count, dtype, peer, stream)
    }

    fn recv(
        &self,
        buf: &Buffer,
        count: u64,
        dtype: DType,
        peer: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.p2p(true, buf, count, dtype, peer, stream)
    }

    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        check_not_in_place(send, recv)?;
        let f = self.shared.lib.all_to_all.ok_or_else(|| {
            HalError::unsupported(format!(
                "all-to-all: {} lacks HcclAlltoAll",
                self.shared.lib.path
            ))
        })?;
        let call = (CollectiveOp::AllToAll, dtype, None);
        let total = count.saturating_mul(self.shared.size as u64);
        let Some((sa, ra, dt)) = self.two_buffers(
            call,
            stream,
            (send, total),
            (recv, total),
            count,
            Some((0, 0)),
        )?
        else {
            return Ok(());
        };
        self.issue_round(
            call,
            (Kind::AllToAll, dt, count),
            "HcclAlltoAll",
            stream,
            &[send, recv],
            None,
            || Ok(()),
            |c, st| {
                // SAFETY: as for all_reduce (`count` elements per peer in each buffer).
                unsafe { f(sa, count, dt, ra, count, dt, c, st) }
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let batch = self.shared.lib.batch_send_recv.ok_or_else(|| {
            HalError::unsupported(format!(
                "grouped send/recv: {} lacks HcclBatchSendRecv",
                self.shared.lib.path
            ))
        })?;
        let mut items = Vec::with_capacity(calls.len());
        let mut ops = Vec::with_capacity(calls.len());
        self.check_open()?;
        let sticky = || self.shared.sticky.lock().clone();
        for (p, a) in self
            .operands()
            .group(sticky, self.shared.size, calls, stream)?
        {
            if p.count == 0 {
                // Nothing moves; both sides leave it out.
                continue;
            }
            let dt = conv::dtype(p.dtype).unwrap_or(-1);
            items.push(SendRecvItem {
                send_recv_type: if p.recv { ffi::RECV } else { ffi::SEND },
                buf: a as *mut c_void,
                count: p.count,
                data_type: dt,
                remote_rank: p.peer as u32,
            });
            ops.push(Op::P2p {
                peer: p.peer,
                recv: p.recv,
                count: p.count,
                dtype: dt,
                esize: p.dtype.size() as u64,
            });
        }
        if items.is_empty() {
            return Ok(());
        }
        let sid = stream.stream_id();
        let keep: Vec<Keep> = calls.iter().map(|c| c.parts().buf.use_on(sid)).collect();
        let what = format!("HCCL grouped send/recv of {} calls", items.len());
        let n = items.len() as u32;
        self.enqueue(
            what,
            "HcclBatchSendRecv",
            stream,
            keep,
            &ops,
            None,
            || Ok(()),
            |c, st| {
                // SAFETY: `n` items, each range checked against a live buffer kept until the work
                // ran; HCCL reads the list during the call.
                unsafe { batch(items.as_mut_ptr(), n, c, st) }
            },
        )
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        // HCCL has no split: emulated on the parent ([`super::split`]).
        self.split_emulated(color, key, config)
    }

    fn abort(&self) {
        let s = &self.shared;
        let peers = HalError::Aborted {
            what: format!("rank {} aborted the HCCL communicator", s.rank),
        };
        s.group.clone().fail(
            s,
            HalError::Aborted {
                what: "the HCCL communicator was aborted".into(),
            },
            peers,
        );
    }

    fn async_error(&self) -> Option<HalError> {
        let s = &self.shared;
        if let Some(e) = s.sticky.lock().clone() {
            return Some(e);
        }
        if s.stopped() {
            return Some(s.stopped_error());
        }
        // A failure HCCL reports fails the communicator, as the watchdog would.
        let e = s.async_failure(Duration::from_millis(100))?;
        s.fail(e);
        s.sticky.lock().clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl std::fmt::Debug for HcclComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HcclComm({}, {})", self.shared.label(), LIBRARY)
    }
}

// `Shared` is Send and Sync without an unsafe impl: the raw communicator is kept as an address
// and used only under `Shared::raw`'s lock, which serialises every HCCL call on it.
