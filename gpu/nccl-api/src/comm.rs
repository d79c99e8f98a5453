//! One rank of a communicator of the NCCL API, and its watchdog.

use crate::conv::{self, IN_PROGRESS, REMOTE_ERROR};
use crate::ffi::{Comm as RawComm, Nccl};
use crate::platform::{with_current, Platform};
use crate::track::{describe, retire, start_watchdog, InFlight, Operands};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_not_in_place, check_rank};
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Invalid, Keep, ReduceOp, Result, Stream,
};

/// The raw `ncclComm_t`, behind the lock that serialises every NCCL call on it (NCCL
/// communicators are not thread-safe: the watchdog, `async_error`, the collectives and abort all
/// use it from different threads). Released (aborted or destroyed) under that lock, once; later
/// uses get a typed error.
struct Handle {
    /// The communicator; 0 once released.
    raw: Mutex<usize>,
    /// An abort was asked for: the next holder of the lock (the current one when its call
    /// returns) aborts the communicator.
    abort_requested: AtomicBool,
    /// True while a holder of the lock is inside its NCCL call.
    calling: AtomicBool,
}

/// The state the rank and its watchdog share.
struct Shared {
    lib: Arc<Nccl>,
    platform: Arc<dyn Platform>,
    handle: Handle,
    sticky: Mutex<Option<HalError>>,
    inflight: Mutex<Vec<InFlight>>,
    watching: AtomicBool,
}

/// Aborts (or destroys) communicator `raw` and zeroes it (nothing when already zero). The caller
/// holds the only access to `raw` (its lock, or ownership).
pub(crate) fn release(lib: &Nccl, raw: &mut usize, abort: bool) {
    let comm = std::mem::replace(raw, 0);
    if comm == 0 {
        return;
    }
    let (call, f) = if abort {
        ("ncclCommAbort", lib.comm_abort)
    } else {
        ("ncclCommDestroy", lib.comm_destroy)
    };
    // SAFETY: a live communicator (non-zero: not yet released) that no other call uses now (the
    // caller's exclusive access), zeroed above so that none will after.
    let code = unsafe { f(comm as RawComm) };
    if code != 0 {
        tracing::warn!(target: "unihal::ccl", "{}", conv::vendor(lib, call, code));
    }
}

/// The error of a use after the communicator was released.
fn released(lib: &Nccl) -> HalError {
    HalError::Aborted {
        what: format!("the {} communicator (aborted)", lib.label),
    }
}

impl Shared {
    /// Runs `f` with the raw communicator, serialised with every other use of it.
    ///
    /// # Errors
    /// [`HalError::Aborted`] once the communicator was aborted (nothing is called then).
    fn with_raw<T>(&self, f: impl FnOnce(RawComm) -> T) -> Result<T> {
        self.call_locked(self.handle.raw.lock(), f)
    }

    /// As [`Shared::with_raw`], waiting at most `wait` for another thread's call (which may be a
    /// blocking one, such as a split waiting for its peers): None when it is still inside.
    fn try_with_raw<T>(&self, wait: Duration, f: impl FnOnce(RawComm) -> T) -> Option<Result<T>> {
        let g = self.handle.raw.try_lock_for(wait)?;
        Some(self.call_locked(g, f))
    }

    fn call_locked<T>(
        &self,
        mut g: parking_lot::MutexGuard<'_, usize>,
        f: impl FnOnce(RawComm) -> T,
    ) -> Result<T> {
        if self.handle.abort_requested.load(Ordering::SeqCst) {
            self.release(&mut g, true);
        }
        if *g == 0 {
            return Err(released(&self.lib));
        }
        self.handle.calling.store(true, Ordering::SeqCst);
        let r = f(*g as RawComm);
        self.handle.calling.store(false, Ordering::SeqCst);
        // An abort asked for during the call (which did not wait for it) is done now.
        if self.handle.abort_requested.load(Ordering::SeqCst) {
            self.release(&mut g, true);
        }
        Ok(r)
    }

    /// Aborts (or destroys) the communicator held by the lock guard `raw`, once.
    fn release(&self, raw: &mut usize, abort: bool) {
        release(&self.lib, raw, abort);
    }

    /// Asks for the communicator to be aborted: now when no call holds it, else by the holder
    /// as soon as its call returns (a call blocked waiting for peers is never waited for).
    fn request_abort(&self) {
        self.handle.abort_requested.store(true, Ordering::SeqCst);
        loop {
            if let Some(mut g) = self.handle.raw.try_lock() {
                self.release(&mut g, true);
                return;
            }
            // The holder reads `abort_requested` after clearing `calling` (both SeqCst): seen
            // inside its call, it will abort when the call returns.
            if self.handle.calling.load(Ordering::SeqCst) {
                return;
            }
            std::thread::yield_now();
        }
    }

    fn aborted(&self) -> bool {
        self.handle.abort_requested.load(Ordering::SeqCst)
    }

    /// Fails every in-flight stream, then aborts the NCCL communicator once (which ends its
    /// kernels, so waiting synchronisations return and see the failure).
    fn abort_with(&self, e: HalError) {
        self.sticky.lock().get_or_insert(e.clone());
        for op in self.inflight.lock().drain(..) {
            self.platform.fail_stream(&op.stream, e.clone());
        }
        self.request_abort();
    }

    /// `ncclCommGetAsyncError`: Ok(0) when healthy, Ok(code) for an asynchronous error; None
    /// when another thread's call held the communicator for `wait`.
    fn query_async(&self, wait: Duration) -> Option<Result<i32>> {
        let r = self.try_with_raw(wait, |raw| {
            let mut err = 0;
            // SAFETY: a live communicator, used by this thread alone (the lock), and an
            // out-pointer to a local.
            let code = unsafe { (self.lib.comm_get_async_error)(raw, &mut err) };
            (code, err)
        })?;
        Some(r.and_then(|(code, err)| {
            if code != 0 {
                Err(conv::vendor(&self.lib, "ncclCommGetAsyncError", code))
            } else {
                Ok(err)
            }
        }))
    }

    /// One watchdog pass: retire completed operations, react to async errors and timeouts.
    /// Returns false when nothing is left to watch.
    fn watch(&self) -> bool {
        if self.aborted() {
            return false;
        }
        // Skipped for this pass while another thread is inside a call on the communicator.
        match self.query_async(Duration::from_millis(5)) {
            None | Some(Ok(0)) | Some(Ok(IN_PROGRESS)) => {}
            Some(Ok(REMOTE_ERROR)) => {
                self.abort_with(HalError::Aborted {
                    what: format!("a peer rank aborted the {} communicator", self.lib.label),
                });
                return false;
            }
            Some(Ok(err)) => {
                self.abort_with(conv::vendor(&self.lib, "ncclCommGetAsyncError", err));
                return false;
            }
            // The state cannot be read: the operations cannot be watched.
            Some(Err(e)) => {
                self.abort_with(e);
                return false;
            }
        }
        let expired = retire(&mut self.inflight.lock(), Instant::now());
        if let Some(what) = expired {
            self.abort_with(HalError::Timeout {
                what: format!("{what}: peers did not arrive"),
                millis: 0,
            });
            return false;
        }
        !self.inflight.lock().is_empty()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Destroying waits for the communicator's operations (forever, when a peer never comes):
        // with any in flight, or after a failure, it is aborted instead, and the streams of the
        // operations fail. Deferred out of host callbacks (which must not call the runtime or
        // the library).
        let raw = std::mem::take(self.handle.raw.get_mut());
        let inflight = std::mem::take(self.inflight.get_mut());
        let failed = self.sticky.get_mut().is_some() || *self.handle.abort_requested.get_mut();
        let lib = self.lib.clone();
        let platform = self.platform.clone();
        self.platform.release(Box::new(move || {
            let busy = inflight
                .iter()
                .any(|op| !matches!(op.done.query(), Ok(true)));
            if busy {
                let e = HalError::Aborted {
                    what: format!(
                        "the {} communicator was dropped with operations in flight",
                        lib.label
                    ),
                };
                for op in &inflight {
                    platform.fail_stream(&op.stream, e.clone());
                }
            }
            let mut raw = raw;
            // The last handle of the communicator is gone: nothing else uses it.
            release(&lib, &mut raw, busy || failed);
        }));
    }
}

/// One rank of a communicator of the NCCL API (NCCL or RCCL). Thread-safe; operations of one rank must be issued in the
/// same order on every rank (NCCL's rule).
pub struct NcclComm {
    shared: Arc<Shared>,
    rank: usize,
    size: usize,
    device: Arc<dyn Device>,
    caps: CclCaps,
    timeout: Duration,
}

impl NcclComm {
    pub(crate) fn new(
        (lib, platform): (Arc<Nccl>, Arc<dyn Platform>),
        raw: RawComm,
        rank: usize,
        size: usize,
        device: Arc<dyn Device>,
        caps: CclCaps,
        config: &CommConfig,
    ) -> Arc<NcclComm> {
        Arc::new(NcclComm {
            shared: Arc::new(Shared {
                lib,
                platform,
                handle: Handle {
                    raw: Mutex::new(raw as usize),
                    abort_requested: AtomicBool::new(false),
                    calling: AtomicBool::new(false),
                },
                sticky: Mutex::new(None),
                inflight: Mutex::new(Vec::new()),
                watching: AtomicBool::new(false),
            }),
            rank,
            size,
            device,
            caps,
            timeout: config
                .timeout
                .unwrap_or_else(unihal_hal::ccl::timeout_from_env),
        })
    }

    /// The shared checks of this communicator's operations.
    fn operands(&self) -> Operands<'_> {
        Operands {
            platform: &*self.shared.platform,
            device: &self.device,
            caps: &self.caps,
        }
    }

    /// `Aborted` once the communicator was aborted without a sticky error to report.
    fn check_open(&self) -> Result<()> {
        if self.shared.aborted() && self.shared.sticky.lock().is_none() {
            return Err(HalError::Aborted {
                what: format!("the {} communicator", self.shared.lib.label),
            });
        }
        Ok(())
    }

    /// Enqueues `f(communicator, native stream)` (library calls, serialised with every other use
    /// of the communicator) on `stream`, keeping `keep` until it ran, then watches it until it
    /// completes.
    fn enqueue(
        &self,
        what: String,
        stream: &Arc<dyn Stream>,
        keep: Vec<Keep>,
        f: impl FnOnce(RawComm, *mut std::ffi::c_void) -> i32,
    ) -> Result<()> {
        let lib = self.shared.lib.clone();
        let mut f = Some(f);
        self.shared
            .platform
            .submit(stream, &what, keep, &mut |native| {
                let f = f
                    .take()
                    .ok_or_else(|| HalError::Internal("a collective submitted twice".into()))?;
                let code = self.shared.with_raw(|comm| f(comm, native))?;
                if code != 0 && code != IN_PROGRESS {
                    return Err(conv::vendor(&lib, &what, code));
                }
                Ok(())
            })?;
        let op = InFlight::record(&self.device, stream, what, Instant::now() + self.timeout)?;
        self.shared.inflight.lock().push(op);
        self.start_watchdog();
        Ok(())
    }

    fn start_watchdog(&self) {
        start_watchdog(
            &self.shared,
            |s| &s.watching,
            format!(
                "unihal-{}-watch-r{}",
                self.shared.lib.label.to_lowercase(),
                self.rank
            ),
            Shared::watch,
            |s| !s.inflight.lock().is_empty() && !s.aborted(),
        );
    }

    /// A collective over a send and a receive buffer: the checks, then `f(send address, receive
    /// address, NCCL dtype, communicator, stream)` enqueued and watched (nothing for `count == 0`).
    /// `in_place` is where send and recv may coincide, in elements ([`check_send_recv`]); `None`
    /// when this rank uses only one of them (broadcast and reduce off the root).
    #[allow(clippy::too_many_arguments)]
    fn two_buffers(
        &self,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
        send: (&Buffer, u64),
        recv: (&Buffer, u64),
        count: u64,
        in_place: Option<(u64, u64)>,
        f: impl FnOnce(u64, u64, i32, RawComm, *mut std::ffi::c_void) -> i32,
    ) -> Result<()> {
        let (op, dtype, red) = call;
        self.check_open()?;
        let sticky = self.shared.sticky.lock().clone();
        let Some((sa, ra)) = self
            .operands()
            .two_buffers(sticky, call, stream, send, recv, count, in_place)?
        else {
            return Ok(());
        };
        let what = describe(self.shared.lib.label, op, count, dtype, red);
        let dt = conv::dtype(dtype).unwrap_or(-1);
        let sid = stream.stream_id();
        let keep: Vec<Keep> = vec![send.0.use_on(sid), recv.0.use_on(sid)];
        self.enqueue(what, stream, keep, |raw, st| f(sa, ra, dt, raw, st))
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.device
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
        let lib = self.shared.lib.clone();
        let red = conv::reduce_op(op);
        self.two_buffers(
            call,
            stream,
            (send, count),
            (recv, count),
            count,
            Some((0, 0)),
            |s, r, dt, c, st| {
                // SAFETY: both ranges were checked against live buffers kept until the work ran.
                unsafe { (lib.all_reduce)(s as _, r as _, count as usize, dt, red, c, st) }
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
        check_rank("root", root, self.size)?;
        let call = (CollectiveOp::Broadcast, dtype, None);
        let lib = self.shared.lib.clone();
        self.two_buffers(
            call,
            stream,
            (send, count),
            (recv, count),
            count,
            (self.rank == root).then_some((0, 0)),
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.broadcast)(s as _, r as _, count as usize, dt, root as i32, c, st) }
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
        check_rank("root", root, self.size)?;
        let call = (CollectiveOp::Reduce, dtype, Some(op));
        let lib = self.shared.lib.clone();
        let red = conv::reduce_op(op);
        self.two_buffers(
            call,
            stream,
            (send, count),
            (recv, count),
            count,
            (self.rank == root).then_some((0, 0)),
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.reduce)(s as _, r as _, count as usize, dt, red, root as i32, c, st) }
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
        let total = count.saturating_mul(self.size as u64);
        let lib = self.shared.lib.clone();
        self.two_buffers(
            call,
            stream,
            (send, count),
            (recv, total),
            count,
            Some((0, self.rank as u64 * count)),
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.all_gather)(s as _, r as _, count as usize, dt, c, st) }
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
        let total = count.saturating_mul(self.size as u64);
        let lib = self.shared.lib.clone();
        let red = conv::reduce_op(op);
        self.two_buffers(
            call,
            stream,
            (send, total),
            (recv, count),
            count,
            Some((self.rank as u64 * count, 0)),
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { (lib.reduce_scatter)(s as _, r as _, count as usize, dt, red, c, st) }
            },
        )
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
                "all-to-all: this {} has no ncclAlltoAll/ncclAllToAll",
                self.shared.lib.label
            ))
        })?;
        let call = (CollectiveOp::AllToAll, dtype, None);
        let total = count.saturating_mul(self.size as u64);
        self.two_buffers(
            call,
            stream,
            (send, total),
            (recv, total),
            count,
            Some((0, 0)),
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { f(s as _, r as _, count as usize, dt, c, st) }
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        self.check_open()?;
        let sticky = || self.shared.sticky.lock().clone();
        let parts: Vec<_> = self
            .operands()
            .group(sticky, self.size, calls, stream)?
            .into_iter()
            .map(|(p, a)| {
                (
                    p.recv,
                    a,
                    p.count,
                    conv::dtype(p.dtype).unwrap_or(-1),
                    p.peer,
                )
            })
            .collect();
        if calls.is_empty() {
            return Ok(());
        }
        let sid = stream.stream_id();
        let keep: Vec<Keep> = calls.iter().map(|c| c.parts().buf.use_on(sid)).collect();
        let lib = self.shared.lib.clone();
        let what = format!("grouped send/recv of {} calls", calls.len());
        self.enqueue(what, stream, keep, |raw, st| {
            // SAFETY: every range was checked against a live buffer kept until the work ran;
            // the group is closed on every path.
            unsafe {
                let mut code = (lib.group_start)();
                if code != 0 {
                    return code;
                }
                for &(recv, a, count, dt, peer) in &parts {
                    let c = if recv {
                        (lib.recv)(a as _, count as usize, dt, peer as i32, raw, st)
                    } else {
                        (lib.send)(a as _, count as usize, dt, peer as i32, raw, st)
                    };
                    if code == 0 {
                        code = c;
                    }
                }
                let end = (lib.group_end)();
                if code == 0 {
                    end
                } else {
                    code
                }
            }
        })
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        let lib = &self.shared.lib;
        let split = lib.comm_split.ok_or_else(|| {
            HalError::unsupported(format!("split: {} lacks ncclCommSplit", lib.path))
        })?;
        if let Some(e) = self.shared.sticky.lock().clone() {
            return Err(e);
        }
        let color = match color {
            None => crate::ffi::SPLIT_NOCOLOR,
            Some(c) => i32::try_from(c).map_err(|_| {
                HalError::invalid(
                    "color",
                    Invalid::Value {
                        value: c.to_string(),
                        accepted: format!("0..={}", i32::MAX),
                    },
                )
            })?,
        };
        let (platform, dev) = (self.shared.platform.clone(), self.device.clone());
        let timeout = config.timeout.unwrap_or(self.timeout);
        let (shared, late_lib) = (self.shared.clone(), lib.clone());
        let child = crate::engine::bounded(
            "ncclCommSplit",
            timeout,
            move || {
                with_current(&*platform, &dev, "ncclCommSplit", || {
                    let mut child: RawComm = std::ptr::null_mut();
                    // The parent stays held (no other call on it) until the split returns, which
                    // may be long after this rank's caller timed out.
                    let code = shared.with_raw(|parent| {
                        // SAFETY: a live communicator used by this thread alone (the lock), an
                        // out-pointer to a local and no configuration (the child inherits the
                        // parent's); the device's context is current.
                        unsafe { split(parent, color, key, &mut child, std::ptr::null_mut()) }
                    })?;
                    if code != 0 {
                        return Err(crate::engine::Engine::init_error(
                            &shared.lib,
                            "ncclCommSplit",
                            code,
                        ));
                    }
                    Ok(child as usize)
                })
            },
            move |late| {
                let mut late = late;
                // A communicator nobody else holds.
                release(&late_lib, &mut late, false);
            },
        )
        .inspect_err(|e| {
            if matches!(e, HalError::Timeout { .. }) {
                // The parent is still inside the split on the helper thread: no more work on it.
                self.shared.sticky.lock().get_or_insert(e.clone());
            }
        })? as RawComm;
        if child.is_null() {
            return Ok(None);
        }
        let mut rank = 0;
        let mut size = 0;
        // SAFETY: a live communicator just made and out-pointers to locals.
        let codes = unsafe {
            [
                (lib.comm_user_rank)(child, &mut rank),
                (lib.comm_count)(child, &mut size),
            ]
        };
        if let Some(&code) = codes.iter().find(|&&c| c != 0) {
            // A communicator nobody else holds.
            release(lib, &mut (child as usize), false);
            return Err(conv::vendor(lib, "ncclCommUserRank", code));
        }
        let config = CommConfig {
            timeout: Some(config.timeout.unwrap_or(self.timeout)),
        };
        Ok(Some(NcclComm::new(
            (lib.clone(), self.shared.platform.clone()),
            child,
            rank as usize,
            size as usize,
            self.device.clone(),
            self.caps.clone(),
            &config,
        )))
    }

    fn abort(&self) {
        self.shared.abort_with(HalError::Aborted {
            what: format!("the {} communicator was aborted", self.shared.lib.label),
        });
    }

    fn async_error(&self) -> Option<HalError> {
        if let Some(e) = self.shared.sticky.lock().clone() {
            return Some(e);
        }
        if self.shared.aborted() {
            return None;
        }
        // None while another thread is inside a (blocking) call on the communicator.
        match self.shared.query_async(Duration::from_millis(100))? {
            Ok(0 | IN_PROGRESS) => None,
            Ok(err) => Some(conv::vendor(&self.shared.lib, "ncclCommGetAsyncError", err)),
            Err(e) => Some(e),
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

// `Shared` is Send and Sync without an unsafe impl: the raw communicator is kept as an address
// and used only under `Handle::raw`'s lock, which serialises every NCCL call on it.
