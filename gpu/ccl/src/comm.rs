//! One rank of a communicator of any [`CollectiveLib`] ([`LibComm`]), its watchdog, and its end.
//!
//! * **Issuing**: every argument is checked with the shared checks ([`Operands`]), so misuse gets
//!   the same error on every library; then the library's raw call is enqueued on the caller's
//!   stream through the platform (which keeps the buffers until the work ran), under the lock
//!   that serialises every use of the communicator (the libraries' communicators are not
//!   thread-safe), and a completion event is recorded behind it. What a library lacks is done
//!   here: an in-place-only broadcast gets the root's copy first; an average the library lacks is
//!   a sum, then a division by the number of ranks on the same stream (`div_scalar`).
//! * **Never hang**: each operation has a completion event and a deadline
//!   (`CommConfig::timeout`, else `UNIHAL_CCL_TIMEOUT`); the watchdog ([`crate::track`]) retires
//!   finished operations and polls the library's asynchronous error. An asynchronous error, an
//!   operation past its deadline or [`Communicator::abort`] **fails** the communicator: it stops
//!   issuing (later calls return the sticky error, `Aborted` after an abort) and fails the streams
//!   with pending work; then
//!   - a library that can abort (NCCL, RCCL) aborts the communicator, which ends its posted
//!     operations and, through the library, its peers' (`ncclRemoteError`);
//!   - a library that cannot (HCCL) has its in-process ranks stopped too, each posting stand-ins
//!     for what its peers wait for ([`crate::group`]), and the communicator goes to a reaper that
//!     destroys it once the completion events say its operations drained (or leaks it, logged);
//!     peers in other processes end at the library's own execution timeout.
//! * **One caller at a time, abort never waits**: every call on the communicator holds its lock;
//!   an abort asked for while another thread is inside a blocking call (a split waiting for its
//!   peers) is done by that thread as soon as its call returns.
//! * **Dropping** the last handle: a library that can abort destroys the communicator, or aborts
//!   it when operations are in flight or it failed (then their streams fail); one that cannot
//!   has it destroyed by a reaper once its operations completed (failing the streams of those
//!   that pass their deadline meanwhile with `Timeout`). Both are deferred out of host callbacks
//!   (`Platform::release`).

use crate::group::{Group, Member, Op};
use crate::library::{Call, CollectiveLib, P2p, RawComm, Round};
use crate::platform::{with_current, Platform};
use crate::track::{describe, retire, start_watchdog, use_key, InFlight, Operands};
use parking_lot::Mutex;
use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_not_in_place, check_rank};
use unihal_hal::deadline;
use unihal_hal::{
    Buffer, CclCaps, CommConfig, Communicator, DType, Device, GroupCall, HalError, Keep, OpCall,
    OpId, ReduceOp, Result, Scalar, Stream, TensorView,
};

/// How long a reaper waits for a communicator's operations past the later of its timeout and
/// their deadlines before leaking it.
const DRAIN_GRACE: Duration = Duration::from_secs(30);

/// Ends `raw` (nothing for 0).
///
/// The caller holds the only access to `raw` (its lock, or ownership), and zeroes it.
fn release<L: CollectiveLib>(lib: &L, raw: &mut RawComm, abort: bool) {
    let comm = std::mem::take(raw);
    if comm != 0 {
        // SAFETY: a live communicator (non-zero: not yet released) that no other call uses now
        // (the caller's exclusive access), zeroed above so that none will after.
        unsafe { lib.release(comm, abort) };
    }
}

/// The raw communicator behind the lock that serialises every call on it. Released once;
/// later uses get the stop's error.
struct Handle {
    /// The communicator; 0 once released (or handed to a reaper).
    raw: Mutex<RawComm>,
    /// An abort was asked for: the next holder of the lock (the current one when its call
    /// returns) aborts the communicator.
    abort_requested: AtomicBool,
    /// True while a holder of the lock is inside its library call.
    calling: AtomicBool,
}

/// A communicator given up (failed or dropped) with operations still in flight (a library that
/// cannot abort): destroyed once they completed, leaked (and logged) when they did not by
/// `give_up`.
struct Reaper<L: CollectiveLib> {
    lib: Arc<L>,
    platform: Arc<dyn Platform>,
    raw: RawComm,
    ops: Vec<InFlight>,
    give_up: Instant,
    /// Fail the streams of operations past their deadline with `Timeout` (a dropped
    /// communicator has no watchdog any more).
    timeouts: bool,
    what: String,
}

impl<L: CollectiveLib> Reaper<L> {
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
            let label = me.lib.label();
            let spawned = std::thread::Builder::new()
                .name(format!("unihal-{}-reaper", label.to_lowercase()))
                .spawn(move || loop {
                    std::thread::sleep(Duration::from_millis(2));
                    if me.poll() {
                        return;
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(target: "unihal::coll", "{label}: no reaper thread ({e}): a communicator is leaked");
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
            // The last owner gave it up and its operations completed: nothing uses it.
            release(&*self.lib, &mut self.raw, false);
            return true;
        }
        if now >= self.give_up {
            tracing::warn!(
                target: "unihal::coll",
                "{}: {} still has {} operation(s) in flight; the communicator is leaked \
                 (the library cannot abort it, and destroying it would wait for them)",
                self.lib.label(),
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
struct Shared<L: CollectiveLib> {
    lib: Arc<L>,
    platform: Arc<dyn Platform>,
    device: Arc<dyn Device>,
    rank: usize,
    size: usize,
    timeout: Duration,
    handle: Handle,
    /// No more operations: the communicator failed or was aborted.
    stopped: AtomicBool,
    sticky: Mutex<Option<HalError>>,
    /// Operations in flight. Held across an issue (from before the library call until its
    /// completion event is recorded), so that stopping waits for an issue in progress and the
    /// reaper sees every posted operation.
    inflight: Mutex<Vec<InFlight>>,
    watching: AtomicBool,
    /// The in-process ranks, for a library that cannot abort (stand-ins).
    group: Option<Arc<Group>>,
}

impl<L: CollectiveLib> Shared<L> {
    fn label(&self) -> String {
        format!(
            "rank {} of {} on {}",
            self.rank,
            self.size,
            self.device.id()
        )
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The error of an operation after the communicator stopped.
    fn stopped_error(&self) -> HalError {
        self.sticky.lock().clone().unwrap_or(HalError::Aborted {
            what: format!("the {} communicator", self.lib.label()),
        })
    }

    /// Runs `f` with the raw communicator, serialised with every other use of it.
    ///
    /// # Errors
    /// The stop's error once the communicator was released (nothing is called then).
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
        mut g: parking_lot::MutexGuard<'_, RawComm>,
        f: impl FnOnce(RawComm) -> T,
    ) -> Result<T> {
        if self.handle.abort_requested.load(Ordering::SeqCst) {
            release(&*self.lib, &mut g, true);
        }
        if *g == 0 {
            return Err(self.stopped_error());
        }
        self.handle.calling.store(true, Ordering::SeqCst);
        let r = f(*g);
        self.handle.calling.store(false, Ordering::SeqCst);
        // An abort asked for during the call (which did not wait for it) is done now.
        if self.handle.abort_requested.load(Ordering::SeqCst) {
            release(&*self.lib, &mut g, true);
        }
        Ok(r)
    }

    /// Asks for the communicator to be aborted: now when no call holds it, else by the holder
    /// as soon as its call returns (a call blocked waiting for peers is never waited for).
    fn request_abort(&self) {
        self.handle.abort_requested.store(true, Ordering::SeqCst);
        loop {
            if let Some(mut g) = self.handle.raw.try_lock() {
                release(&*self.lib, &mut g, true);
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

    /// Stops issuing, makes `e` the sticky error (unless one is there) and fails the streams
    /// with pending work with it. Waits for an issue in progress. True when this call stopped
    /// the communicator.
    fn stop(&self, e: HalError) -> bool {
        let mut inflight = self.inflight.lock();
        let first = !self.stopped.swap(true, Ordering::SeqCst);
        let e = self.sticky.lock().get_or_insert(e).clone();
        if first {
            let (r, n, label) = (self.rank, self.size, self.lib.label());
            unihal_hal::ccl::log_failed(format_args!("rank {r} of {n} ({label})"), &e);
        }
        for op in inflight.iter_mut() {
            if !op.finished() {
                self.platform.fail_stream(&op.stream, e.clone());
            }
        }
        first
    }

    /// Fails the communicator: this rank with `own`; its peers through the library's abort, or
    /// (without one) its in-process peers with `peers` and stand-ins.
    fn fail_with(&self, own: HalError, peers: HalError) {
        match &self.group {
            None => {
                self.stop(own);
                self.inflight.lock().clear();
                self.request_abort();
            }
            Some(group) => group.clone().fail(self, own, peers),
        }
    }

    /// Tracks the work enqueued on `stream` so far as an operation in flight (`what`), with
    /// the communicator's deadline, and starts the watchdog. A stopped communicator fails the
    /// stream instead (its operation cannot complete); an event that cannot be recorded leaves
    /// the stream's own error.
    fn track(shared: &Arc<Self>, stream: &Arc<dyn Stream>, what: String) {
        let s = &**shared;
        let mut inflight = s.inflight.lock();
        if s.stopped() {
            drop(inflight);
            s.platform.fail_stream(stream, s.stopped_error());
            return;
        }
        let deadline = deadline::after(s.timeout);
        match InFlight::record(&s.device, stream, what, deadline) {
            Ok(op) => inflight.push(op),
            Err(e) => {
                tracing::warn!(target: "unihal::ccl", "{e}; the operation is not watched");
                return;
            }
        }
        drop(inflight);
        start_watchdog(
            shared,
            |s| &s.watching,
            format!("unihal-{}-watch-r{}", s.lib.label().to_lowercase(), s.rank),
            Shared::watch,
            |s| !s.inflight.lock().is_empty() && !s.stopped(),
        );
    }

    /// [`Shared::fail_with`], the peers told that this rank failed with `e`.
    fn fail(&self, e: HalError) {
        let peers = HalError::Aborted {
            what: format!(
                "rank {} of the {} communicator failed ({e}); the library cannot abort, so its \
                 in-process peers stopped too",
                self.rank,
                self.lib.label()
            ),
        };
        self.fail_with(e, peers);
    }

    /// Enqueues `f(communicator, native stream)` on `stream` keeping `keep`, with the
    /// communicator's lock held; logs `ops` in the group once the library took the call.
    /// `stand_in`: issued by a failing group (no check of `stopped`, nothing logged).
    fn issue(
        &self,
        what: &str,
        stream: &Arc<dyn Stream>,
        keep: Vec<Keep>,
        stand_in: bool,
        ops: &[Op],
        f: impl FnOnce(RawComm, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        let mut f = Some(f);
        self.platform.submit(stream, what, keep, &mut |native| {
            let f = f
                .take()
                .ok_or_else(|| HalError::Internal(format!("{what} submitted twice")))?;
            self.with_raw(|raw| {
                if !stand_in && self.stopped() {
                    return Err(self.stopped_error());
                }
                f(raw, native)?;
                if let (false, Some(g)) = (stand_in, &self.group) {
                    g.record(self.rank, ops);
                }
                Ok(())
            })?
        })
    }

    /// The communicator's asynchronous error, if the library reports one (or the query fails);
    /// None when healthy, released, or when another thread held the communicator for `wait`.
    fn async_failure(&self, wait: Duration) -> Option<HalError> {
        // SAFETY: a live communicator (the lock's holder checked it is not released), used by
        // this thread alone for the call (the lock).
        match self.try_with_raw(wait, |raw| unsafe { self.lib.async_error(raw) })? {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => Some(e),
            Err(_) => None,
        }
    }

    /// One watchdog pass: retire completed operations, fail on an asynchronous error (the
    /// library's word first: an operation that failed is retired before its error is read) or a
    /// timeout. False when nothing is left to watch.
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
                millis: deadline::millis(self.timeout),
            });
            return false;
        }
        !self.inflight.lock().is_empty()
    }

    /// Posts `ops` as stand-ins: collectives in order on one new stream, sends and receives on
    /// a new stream per peer, each on scratch memory kept until it ran; their completion events
    /// join the operations in flight.
    fn post_stand_ins(&self, ops: &[Op]) {
        if ops.is_empty() {
            return;
        }
        let label = self.lib.label();
        let mut inflight = self.inflight.lock();
        let mut streams: HashMap<Option<usize>, Arc<dyn Stream>> = HashMap::new();
        for op in ops {
            let key = match op {
                Op::Collective(_) => None,
                Op::P2p(p) => Some(p.peer),
            };
            let stream = match streams.get(&key) {
                Some(s) => s.clone(),
                None => match self.device.create_stream() {
                    Ok(s) => {
                        streams.insert(key, s.clone());
                        s
                    }
                    Err(e) => {
                        tracing::warn!(target: "unihal::coll", "{label}: {}: no stream for stand-ins: {e}", self.label());
                        break;
                    }
                },
            };
            if let Err(e) = self.post_stand_in(op, &stream) {
                tracing::warn!(target: "unihal::coll", "{label}: {}: stand-in {op:?} not posted: {e}", self.label());
                break;
            }
        }
        let deadline = deadline::after(self.timeout);
        for s in streams.values() {
            match InFlight::record(&self.device, s, format!("{label} stand-in"), deadline) {
                Ok(op) => inflight.push(op),
                Err(e) => {
                    tracing::warn!(target: "unihal::coll", "{label}: stand-in not watched: {e}")
                }
            }
        }
    }

    fn post_stand_in(&self, op: &Op, stream: &Arc<dyn Stream>) -> Result<()> {
        let scratch = |elems: u64, dtype: DType| -> Result<Buffer> {
            let bytes = elems
                .checked_mul(dtype.size() as u64)
                .and_then(|b| usize::try_from(b).ok())
                .ok_or_else(|| HalError::Internal("stand-in too large".into()))?;
            self.device.alloc(bytes.max(1))
        };
        let sid = stream.stream_id();
        let what = format!("{} stand-in", self.lib.label());
        match *op {
            Op::Collective(round) => {
                let (se, re) = round.call.extents(round.count, self.size);
                let (s, r) = (scratch(se, round.dtype)?, scratch(re, round.dtype)?);
                let (sa, ra) = (s.device_addr(), r.device_addr());
                let keep = vec![s.use_on(sid), r.use_on(sid)];
                self.issue(&what, stream, keep, true, &[], |c, st| {
                    // SAFETY: scratch buffers of the sizes the round reads and writes, kept until
                    // it ran; a live communicator under its lock; the stream's native handle.
                    unsafe { self.lib.collective(c, &round, sa, ra, st) }
                })
            }
            Op::P2p(p) => {
                let b = scratch(p.count, p.dtype)?;
                let a = b.device_addr();
                self.issue(&what, stream, vec![b.use_on(sid)], true, &[], |c, st| {
                    // SAFETY: a scratch buffer of `count` elements kept until the call ran; a
                    // live communicator under its lock.
                    unsafe { self.lib.p2p(c, &[(p, a)], st) }
                })
            }
        }
    }

    /// Gives the communicator and its operations to a reaper (after [`Shared::stop`]).
    fn reap(&self) {
        let ops = std::mem::take(&mut *self.inflight.lock());
        let raw = std::mem::take(&mut *self.handle.raw.lock());
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
            give_up: last.max(deadline::after(self.timeout)) + DRAIN_GRACE,
            timeouts: false,
            what: self.label(),
        }
        .start();
    }
}

impl<L: CollectiveLib> Member for Shared<L> {
    fn stop(&self, e: HalError) -> bool {
        Shared::stop(self, e)
    }

    fn stand_in(&self, ops: &[Op]) {
        self.post_stand_ins(ops);
    }

    fn hand_to_reaper(&self) {
        self.reap();
    }
}

impl<L: CollectiveLib> Drop for Shared<L> {
    fn drop(&mut self) {
        let raw = std::mem::take(self.handle.raw.get_mut());
        let ops = std::mem::take(self.inflight.get_mut());
        if self.group.is_some() {
            // Destroyed by a reaper once its operations completed (the library's destroy would
            // wait for them, and it cannot abort).
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
                give_up: deadline::from(last, self.timeout.max(DRAIN_GRACE)),
                timeouts: true,
                what: self.label(),
            }
            .start();
            return;
        }
        // Destroying waits for the communicator's operations (forever, when a peer never comes):
        // with any in flight, or after a failure, it is aborted instead, and the streams of the
        // operations fail. Deferred out of host callbacks (which must not call the runtime or
        // the library).
        let failed = self.sticky.get_mut().is_some() || *self.handle.abort_requested.get_mut();
        let (lib, platform) = (self.lib.clone(), self.platform.clone());
        self.platform.release(Box::new(move || {
            let busy = ops.iter().any(|op| !matches!(op.done.query(), Ok(true)));
            if busy {
                let e = HalError::Aborted {
                    what: format!(
                        "the {} communicator was dropped with operations in flight",
                        lib.label()
                    ),
                };
                for op in &ops {
                    platform.fail_stream(&op.stream, e.clone());
                }
            }
            let mut raw = raw;
            // The last handle of the communicator is gone: nothing else uses it.
            release(&*lib, &mut raw, busy || failed);
        }));
    }
}

/// What a new rank is made of.
pub(crate) struct Parts<L: CollectiveLib> {
    pub lib: Arc<L>,
    pub platform: Arc<dyn Platform>,
    pub raw: RawComm,
    pub rank: usize,
    pub size: usize,
    pub device: Arc<dyn Device>,
    pub caps: CclCaps,
    /// The in-process ranks (a library that cannot abort); `None` for one that can.
    pub group: Option<Arc<Group>>,
}

/// One rank of a communicator of library `L`. Thread-safe; operations must be issued in the
/// same order on every rank (every library's rule).
pub struct LibComm<L: CollectiveLib> {
    shared: Arc<Shared<L>>,
    caps: CclCaps,
}

impl<L: CollectiveLib> LibComm<L> {
    pub(crate) fn new(p: Parts<L>, config: &CommConfig) -> Arc<LibComm<L>> {
        let shared = Arc::new(Shared {
            lib: p.lib,
            platform: p.platform,
            device: p.device,
            rank: p.rank,
            size: p.size,
            // The engine refused a bad UNIHAL_CCL_TIMEOUT before making the communicator.
            timeout: unihal_hal::ccl::timeout_of(config)
                .unwrap_or(unihal_hal::ccl::DEFAULT_TIMEOUT),
            handle: Handle {
                raw: Mutex::new(p.raw),
                abort_requested: AtomicBool::new(false),
                calling: AtomicBool::new(false),
            },
            stopped: AtomicBool::new(false),
            sticky: Mutex::new(None),
            inflight: Mutex::new(Vec::new()),
            watching: AtomicBool::new(false),
            group: p.group,
        });
        if let Some(g) = &shared.group {
            let weak: Weak<dyn Member> = Arc::downgrade(&shared) as Weak<dyn Member>;
            g.join(p.rank, weak);
        }
        Arc::new(LibComm {
            shared,
            caps: p.caps,
        })
    }

    /// The library's communicator handle as an address (for diagnostics and tests): 0 once the
    /// communicator was released (aborted, or given up after a failure: then destroyed, or
    /// leaked, by its reaper). Without an abort, the failing rank's thread gives every rank up
    /// after it stopped them all and issued their stand-ins, so a rank's sticky error can be
    /// seen a moment before its handle reads 0.
    pub fn native(&self) -> usize {
        *self.shared.handle.raw.lock()
    }

    /// The library.
    pub fn lib(&self) -> &Arc<L> {
        &self.shared.lib
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

    /// The stop's error once the communicator stopped without a sticky error to report.
    fn check_open(&self) -> Result<()> {
        let s = &self.shared;
        if s.stopped() && s.sticky.lock().is_none() {
            return Err(s.stopped_error());
        }
        Ok(())
    }

    /// Issues one operation on `stream` (after `before`, e.g. a broadcast's copy), then the
    /// average's division of `scale` (`count` elements), then records and watches its completion.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &self,
        what: String,
        stream: &Arc<dyn Stream>,
        keep: Vec<Keep>,
        ops: &[Op],
        scale: Option<(&Buffer, DType, u64)>,
        before: impl FnOnce() -> Result<()>,
        f: impl FnOnce(RawComm, *mut c_void) -> Result<()>,
    ) -> Result<()> {
        let s = &self.shared;
        let inflight = s.inflight.lock();
        if s.stopped() {
            return Err(s.stopped_error());
        }
        before()?;
        s.issue(&what, stream, keep, false, ops, f)?;
        if let Some((recv, dtype, count)) = scale {
            if let Err(e) = self.divide(recv, dtype, count, stream) {
                // The sum is there, not the average: nothing on this stream may use it.
                s.platform.fail_stream(stream, e.clone());
                return Err(e);
            }
        }
        if stream.capture_status().capture().is_some() {
            // Captured, not run: the operation runs at each replay of the graph. A completion
            // event recorded here would be a point of the graph, never completing in any
            // stream's work (and querying it is an error that invalidates the capture), so
            // each launch of the graph is tracked instead: a completion event recorded on the
            // launch's stream after it, with the communicator's deadline, watched as an eager
            // operation is (the hook holds the communicator weakly: a graph does not keep it).
            let weak = Arc::downgrade(&self.shared);
            let replay = format!("{what} (a replay of a captured graph)");
            let hook: crate::platform::ReplayHook = Arc::new(move |on: &Arc<dyn Stream>| {
                if let Some(s) = weak.upgrade() {
                    Shared::track(&s, on, replay.clone());
                }
            });
            if !s.platform.on_replay(stream, hook) {
                tracing::debug!(
                    target: "unihal::ccl",
                    "{what}: captured; its replays are not tracked on this platform"
                );
            }
            return Ok(());
        }
        drop(inflight);
        Shared::track(&self.shared, stream, what);
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

    /// The average's division by the number of ranks: when `op` is `avg`, the library has no
    /// average and there is more than one rank.
    ///
    /// # Errors
    /// [`HalError::Unsupported`] when the device cannot divide in `dtype`.
    fn needs_scale(&self, op: Option<ReduceOp>, dtype: DType) -> Result<bool> {
        let s = &self.shared;
        if op != Some(ReduceOp::Avg) || s.lib.native_avg() || s.size == 1 {
            return Ok(false);
        }
        if !s.device.capabilities().supports(OpId::DivScalar, dtype) {
            return Err(HalError::unsupported(format!(
                "avg of {dtype} on {} (emulated as sum then div_scalar, which {} does not run in \
                 {dtype})",
                s.lib.label(),
                s.device.id()
            )));
        }
        Ok(true)
    }

    /// A collective over a send and a receive buffer: the checks (the root's range, the
    /// operands, where they may coincide), then the call issued and watched (nothing for a
    /// count of 0).
    fn collective(
        &self,
        call: Call,
        (send, recv): (&Buffer, &Buffer),
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = &self.shared;
        let (me, n) = (s.rank, s.size);
        let mine = count.saturating_mul(me as u64);
        let in_place = match call {
            Call::Broadcast { root } | Call::Reduce { root, .. } => {
                check_rank("root", root, n)?;
                (me == root).then_some((0, 0))
            }
            Call::AllToAll => {
                check_not_in_place(send, recv)?;
                Some((0, 0))
            }
            Call::AllGather => Some((0, mine)),
            Call::ReduceScatter(_) => Some((mine, 0)),
            Call::AllReduce(_) => Some((0, 0)),
        };
        let (op, red) = (call.op(), call.red());
        let (se, re) = call.extents(count, n);
        self.check_open()?;
        let sticky = s.sticky.lock().clone();
        let Some((sa, ra)) = self.operands().two_buffers(
            sticky,
            (op, dtype, red),
            stream,
            (send, se),
            (recv, re),
            count,
            in_place,
        )?
        else {
            return Ok(());
        };
        let root = match call {
            Call::Broadcast { root } | Call::Reduce { root, .. } => Some(root),
            _ => None,
        };
        let at_root = root.is_none_or(|r| r == me);
        let scale = (self.needs_scale(red, dtype)? && at_root).then_some((recv, dtype, count));
        // A broadcast in place only: the root first copies its send buffer into its receive
        // buffer (on the stream), then every rank broadcasts its receive buffer.
        let copy = matches!(call, Call::Broadcast { .. })
            && s.lib.broadcast_in_place_only()
            && root == Some(me)
            && sa != ra;
        let before = || {
            if copy {
                stream.copy_d2d(send, 0, recv, 0, count * dtype.size() as u64)
            } else {
                Ok(())
            }
        };
        let round = Round { call, dtype, count };
        let sid = use_key(stream);
        let keep = vec![send.use_on(sid), recv.use_on(sid)];
        let what = describe(s.lib.label(), op, count, dtype, red);
        let lib = &s.lib;
        self.enqueue(
            what,
            stream,
            keep,
            &[Op::Collective(round)],
            scale,
            before,
            |c, st| {
                // SAFETY: both ranges were checked against live buffers of this device
                // (`Operands::two_buffers`, the call's extents) and are kept until the work ran;
                // the communicator is live and under its lock; `st` is the stream's native handle.
                unsafe { lib.collective(c, &round, sa, ra, st) }
            },
        )
    }
}

impl<L: CollectiveLib> Communicator for LibComm<L> {
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
        self.collective(Call::AllReduce(op), (send, recv), count, dtype, stream)
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
        self.collective(Call::Broadcast { root }, (send, recv), count, dtype, stream)
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
        let call = Call::Reduce { red: op, root };
        self.collective(call, (send, recv), count, dtype, stream)
    }

    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.collective(Call::AllGather, (send, recv), count, dtype, stream)
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
        self.collective(Call::ReduceScatter(op), (send, recv), count, dtype, stream)
    }

    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        self.collective(Call::AllToAll, (send, recv), count, dtype, stream)
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let s = &self.shared;
        let label = s.lib.label();
        if calls.len() > 1 && !self.caps.groups {
            return Err(HalError::unsupported(format!(
                "grouped send/recv: {} has no grouped calls",
                self.caps.engine
            )));
        }
        self.check_open()?;
        let sticky = || s.sticky.lock().clone();
        let live: Vec<(P2p, u64)> = self
            .operands()
            .group(sticky, s.size, calls, stream)?
            .into_iter()
            // A count of 0 moves nothing; both sides leave it out.
            .filter(|(p, _)| p.count != 0)
            .map(|(p, a)| {
                let call = P2p {
                    peer: p.peer,
                    recv: p.recv,
                    count: p.count,
                    dtype: p.dtype,
                };
                (call, a)
            })
            .collect();
        let what = match live.as_slice() {
            [] => return Ok(()),
            [(p, _)] if p.recv => format!(
                "{label} recv of {} {} from rank {}",
                p.count, p.dtype, p.peer
            ),
            [(p, _)] => format!("{label} send of {} {} to rank {}", p.count, p.dtype, p.peer),
            _ => format!("{label} grouped send/recv of {} calls", live.len()),
        };
        let sid = use_key(stream);
        let keep: Vec<Keep> = calls.iter().map(|c| c.parts().buf.use_on(sid)).collect();
        let ops: Vec<Op> = live.iter().map(|&(p, _)| Op::P2p(p)).collect();
        let lib = &s.lib;
        self.enqueue(
            what,
            stream,
            keep,
            &ops,
            None,
            || Ok(()),
            |c, st| {
                // SAFETY: every range was checked against a live buffer of this device
                // (`Operands::group`) and is kept until the work ran; the communicator is live and
                // under its lock.
                unsafe { lib.p2p(c, &live, st) }
            },
        )
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        let s = &self.shared;
        if let Some(e) = s.sticky.lock().clone() {
            return Err(e);
        }
        if s.stopped() {
            return Err(s.stopped_error());
        }
        let timeout = unihal_hal::ccl::timeout_or(config, s.timeout)?;
        if !s.lib.has_split() {
            return self.split_emulated(color, key, timeout);
        }
        let (platform, dev) = (s.platform.clone(), s.device.clone());
        let (shared, late_lib) = (s.clone(), s.lib.clone());
        let what = s.lib.blocking_calls().1;
        let child = crate::engine::bounded(
            what,
            timeout,
            move || {
                with_current(&*platform, &dev, what, || {
                    // The parent stays held (no other call on it) until the split returns, which
                    // may be long after this rank's caller timed out.
                    shared.with_raw(|parent| {
                        // SAFETY: a live communicator used by this thread alone (the lock); the
                        // device is current.
                        unsafe { shared.lib.split(parent, color, key) }
                    })?
                })
            },
            move |late| {
                // A communicator nobody else holds.
                release(&*late_lib, &mut { late }, false);
            },
        )
        .inspect_err(|e| {
            if matches!(e, HalError::Timeout { .. }) {
                // The parent is still inside the split on the helper thread: no more work on it.
                s.sticky.lock().get_or_insert(e.clone());
            }
        })?;
        if child == 0 {
            return Ok(None);
        }
        // SAFETY: a live communicator just made, used by this thread alone.
        let place = unsafe { s.lib.rank_size(child) };
        let (rank, size) = match place {
            Ok(p) => p,
            Err(e) => {
                // A communicator nobody else holds.
                release(&*s.lib, &mut { child }, false);
                return Err(e);
            }
        };
        Ok(Some(LibComm::new(
            Parts {
                lib: s.lib.clone(),
                platform: s.platform.clone(),
                raw: child,
                rank,
                size,
                device: s.device.clone(),
                caps: self.caps.clone(),
                group: (!s.lib.can_abort()).then(|| Group::unknown(size)),
            },
            &CommConfig {
                timeout: Some(timeout),
            },
        )))
    }

    fn abort(&self) {
        unihal_hal::ccl::log_aborted(self);
        let s = &self.shared;
        let label = s.lib.label();
        s.fail_with(
            HalError::Aborted {
                what: format!("the {label} communicator was aborted"),
            },
            HalError::Aborted {
                what: format!("rank {} aborted the {label} communicator", s.rank),
            },
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
        // A failure the library reports fails the communicator, as the watchdog would.
        let e = s.async_failure(Duration::from_millis(100))?;
        s.fail(e);
        s.sticky.lock().clone()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<L: CollectiveLib> std::fmt::Debug for LibComm<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LibComm({}, {})",
            self.shared.label(),
            self.shared.lib.label()
        )
    }
}

impl<L: CollectiveLib> LibComm<L> {
    /// What the emulated split needs of this rank.
    pub(crate) fn split_parts(&self) -> SplitParts<'_, L> {
        let s = &self.shared;
        SplitParts {
            lib: &s.lib,
            platform: &s.platform,
            device: &s.device,
            rank: s.rank,
            size: s.size,
            caps: &self.caps,
        }
    }

    /// Fails the parent of an emulated split that broke its order of operations.
    pub(crate) fn fail(&self, e: HalError) {
        self.shared.fail(e);
    }
}

/// A rank's pieces, for [`crate::split`].
pub(crate) struct SplitParts<'a, L: CollectiveLib> {
    pub lib: &'a Arc<L>,
    pub platform: &'a Arc<dyn Platform>,
    pub device: &'a Arc<dyn Device>,
    pub rank: usize,
    pub size: usize,
    pub caps: &'a CclCaps,
}

// `Shared` is Send and Sync without an unsafe impl: the raw communicator is kept as an address
// and used only under `Handle::raw`'s lock, which serialises every library call on it.
