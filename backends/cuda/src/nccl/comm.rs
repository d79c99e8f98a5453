//! One rank of an NCCL communicator, and its watchdog.

use super::conv::{self, IN_PROGRESS, REMOTE_ERROR};
use super::ffi::{Comm as RawComm, Nccl};
use crate::stream::{cuda_addr, CudaStream, Keep};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_call, check_not_in_place, check_rank};
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, Event, EventFlags,
    GroupCall, HalError, Invalid, ReduceOp, Result, Stream,
};

/// An operation in flight: its completion event and its stream.
struct InFlight {
    done: Arc<dyn Event>,
    stream: Arc<dyn Stream>,
    deadline: Instant,
    what: String,
}

/// The state the rank and its watchdog share.
struct Shared {
    lib: Arc<Nccl>,
    raw: usize,
    sticky: Mutex<Option<HalError>>,
    aborted: AtomicBool,
    inflight: Mutex<Vec<InFlight>>,
    watching: AtomicBool,
}

impl Shared {
    fn raw(&self) -> RawComm {
        self.raw as RawComm
    }

    /// Fails every in-flight stream, then aborts the NCCL communicator once (which ends its
    /// kernels, so waiting synchronisations return and see the failure).
    fn abort_with(&self, e: HalError) {
        self.sticky.lock().get_or_insert(e.clone());
        for op in self.inflight.lock().drain(..) {
            if let Some(s) = op.stream.as_any().downcast_ref::<CudaStream>() {
                s.fail(e.clone());
            }
        }
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: a live communicator, aborted exactly once (destroy is skipped after it).
            unsafe { (self.lib.comm_abort)(self.raw()) };
        }
    }

    /// One watchdog pass: retire completed operations, react to async errors and timeouts.
    /// Returns false when nothing is left to watch.
    fn watch(&self) -> bool {
        if self.aborted.load(Ordering::Acquire) {
            return false;
        }
        let mut err = 0;
        // SAFETY: a live communicator and an out-pointer to a local.
        unsafe { (self.lib.comm_get_async_error)(self.raw(), &mut err) };
        if err == REMOTE_ERROR {
            self.abort_with(HalError::Aborted {
                what: "a peer rank aborted the NCCL communicator".into(),
            });
            return false;
        }
        if err != 0 && err != IN_PROGRESS {
            self.abort_with(conv::vendor(&self.lib, "ncclCommGetAsyncError", err));
            return false;
        }
        let now = Instant::now();
        let mut expired = None;
        self.inflight.lock().retain(|op| match op.done.query() {
            Ok(true) => false,
            Ok(false) if now >= op.deadline => {
                expired.get_or_insert(op.what.clone());
                true
            }
            Ok(false) => true,
            Err(_) => false, // the stream holds the error
        });
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
        if !self.aborted.load(Ordering::Acquire) {
            // SAFETY: a live communicator, released exactly once (not after an abort).
            unsafe { (self.lib.comm_destroy)(self.raw()) };
        }
    }
}

/// One rank of an NCCL communicator. Thread-safe; operations of one rank must be issued in the
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
        lib: Arc<Nccl>,
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
                raw: raw as usize,
                sticky: Mutex::new(None),
                aborted: AtomicBool::new(false),
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

    /// The checks of every operation, then the CUDA stream.
    fn check<'s>(
        &self,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &'s Arc<dyn Stream>,
    ) -> Result<&'s CudaStream> {
        if self.shared.aborted.load(Ordering::Acquire) && self.shared.sticky.lock().is_none() {
            return Err(HalError::Aborted {
                what: "the NCCL communicator".into(),
            });
        }
        check_call(
            &self.device,
            &self.caps,
            self.shared.sticky.lock().clone(),
            call,
            stream,
        )?;
        stream.as_any().downcast_ref::<CudaStream>().ok_or_else(|| {
            HalError::invalid(
                "stream",
                Invalid::ForeignHandle {
                    expected: "CUDA stream".into(),
                    found: format!("stream of {}", stream.device_id()),
                },
            )
        })
    }

    /// The device address of `elems` elements at the start of `buf`.
    fn addr(&self, buf: &Buffer, arg: &'static str, elems: u64, dtype: DType) -> Result<u64> {
        let len = elems.checked_mul(dtype.size() as u64).ok_or_else(|| {
            HalError::invalid(
                arg,
                Invalid::Value {
                    value: format!("{elems} elements"),
                    accepted: "a size that fits 64 bits".into(),
                },
            )
        })?;
        cuda_addr(buf, arg, self.device.id(), 0, len)
    }

    /// Enqueues `f` on `stream` (keeping `keep`), then watches it until it completes.
    fn enqueue(
        &self,
        what: String,
        stream: &Arc<dyn Stream>,
        s: &CudaStream,
        keep: Vec<Keep>,
        f: impl FnOnce(*mut std::ffi::c_void) -> i32,
    ) -> Result<()> {
        let lib = self.shared.lib.clone();
        s.submit_with("nccl", keep, |raw| {
            let code = f(raw as *mut std::ffi::c_void);
            if code != 0 && code != IN_PROGRESS {
                return Err(conv::vendor(&lib, &what, code));
            }
            Ok(())
        })?;
        let done = self.device.create_event(EventFlags {
            disable_timing: true,
        })?;
        stream.record_event(&done)?;
        self.shared.inflight.lock().push(InFlight {
            done,
            stream: stream.clone(),
            deadline: Instant::now() + self.timeout,
            what,
        });
        self.start_watchdog();
        Ok(())
    }

    fn start_watchdog(&self) {
        if self.shared.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("unihal-nccl-watch-r{}", self.rank))
            .spawn(move || loop {
                let Some(shared) = weak.upgrade() else { return };
                if !shared.watch() {
                    shared.watching.store(false, Ordering::Release);
                    // An operation queued meanwhile restarts the watch.
                    if shared.inflight.lock().is_empty()
                        || shared.watching.swap(true, Ordering::AcqRel)
                        || shared.aborted.load(Ordering::Acquire)
                    {
                        return;
                    }
                }
                drop(shared);
                std::thread::sleep(Duration::from_millis(1));
            });
        if spawned.is_err() {
            self.shared.watching.store(false, Ordering::Release);
        }
    }

    /// A collective over a send and a receive buffer: the checks, then `f(send address, receive
    /// address, NCCL dtype, communicator, stream)` enqueued and watched (nothing for `count == 0`).
    fn two_buffers(
        &self,
        call: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &Arc<dyn Stream>,
        (send, send_elems): (&Buffer, u64),
        (recv, recv_elems): (&Buffer, u64),
        count: u64,
        f: impl FnOnce(u64, u64, i32, RawComm, *mut std::ffi::c_void) -> i32,
    ) -> Result<()> {
        let (op, dtype, red) = call;
        let s = self.check(call, stream)?;
        let sa = self.addr(send, "send", send_elems, dtype)?;
        let ra = self.addr(recv, "recv", recv_elems, dtype)?;
        if count == 0 {
            return Ok(());
        }
        let what = format!(
            "NCCL {} of {count} {dtype}{}",
            op.name(),
            red.map(|r| format!(" {r}")).unwrap_or_default()
        );
        let (dt, raw) = (conv::dtype(dtype).unwrap_or(-1), self.shared.raw());
        let keep: Vec<Keep> = vec![Box::new(send.clone()), Box::new(recv.clone())];
        self.enqueue(what, stream, s, keep, |st| f(sa, ra, dt, raw, st))
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
        let f =
            self.shared.lib.all_to_all.ok_or_else(|| {
                HalError::unsupported("all-to-all: this NCCL has no ncclAlltoAll")
            })?;
        let call = (CollectiveOp::AllToAll, dtype, None);
        let total = count.saturating_mul(self.size as u64);
        self.two_buffers(
            call,
            stream,
            (send, total),
            (recv, total),
            count,
            |s, r, dt, c, st| {
                // SAFETY: as for all_reduce.
                unsafe { f(s as _, r as _, count as usize, dt, c, st) }
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let mut parts = Vec::with_capacity(calls.len());
        let mut s = None;
        for c in calls {
            let p = c.parts();
            s = Some(self.check((CollectiveOp::SendRecv, p.dtype, None), stream)?);
            check_rank("peer", p.peer, self.size)?;
            let arg = if p.recv { "recv" } else { "send" };
            let a = self.addr(p.buf, arg, p.count, p.dtype)?;
            parts.push((
                p.recv,
                a,
                p.count,
                conv::dtype(p.dtype).unwrap_or(-1),
                p.peer,
            ));
        }
        let Some(s) = s else { return Ok(()) };
        let keep: Vec<Keep> = calls
            .iter()
            .map(|c| Box::new(c.parts().buf.clone()) as Keep)
            .collect();
        let (lib, raw) = (self.shared.lib.clone(), self.shared.raw());
        let what = format!("grouped send/recv of {} calls", calls.len());
        self.enqueue(what, stream, s, keep, |st| {
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
            None => super::ffi::SPLIT_NOCOLOR,
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
        let dev = super::NcclCollectives::cuda_device(&self.device)?;
        let timeout = config.timeout.unwrap_or(self.timeout);
        let (shared, late_lib) = (self.shared.clone(), lib.clone());
        let child = super::bounded(
            "ncclCommSplit",
            timeout,
            move || {
                dev.call("ncclCommSplit", || {
                    let mut child: RawComm = std::ptr::null_mut();
                    // SAFETY: a live communicator (`shared` keeps it), an out-pointer to a local
                    // and no configuration (the child inherits the parent's); the device's
                    // context is current.
                    let code = unsafe {
                        split(shared.raw(), color, key, &mut child, std::ptr::null_mut())
                    };
                    if code != 0 {
                        return Err(super::NcclCollectives::init_error(
                            &shared.lib,
                            "ncclCommSplit",
                            code,
                        ));
                    }
                    Ok(child as usize)
                })
            },
            move |late| {
                if late != 0 {
                    // SAFETY: a communicator nobody else holds, released once.
                    unsafe { (late_lib.comm_destroy)(late as RawComm) };
                }
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
            // SAFETY: a live communicator released once, here.
            unsafe { (lib.comm_destroy)(child) };
            return Err(conv::vendor(lib, "ncclCommUserRank", code));
        }
        let config = CommConfig {
            timeout: Some(config.timeout.unwrap_or(self.timeout)),
        };
        Ok(Some(NcclComm::new(
            lib.clone(),
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
            what: "the NCCL communicator was aborted".into(),
        });
    }

    fn async_error(&self) -> Option<HalError> {
        if let Some(e) = self.shared.sticky.lock().clone() {
            return Some(e);
        }
        if self.shared.aborted.load(Ordering::Acquire) {
            return None;
        }
        let mut err = 0;
        // SAFETY: a live communicator and an out-pointer to a local.
        unsafe { (self.shared.lib.comm_get_async_error)(self.shared.raw(), &mut err) };
        (err != 0 && err != IN_PROGRESS)
            .then(|| conv::vendor(&self.shared.lib, "ncclCommGetAsyncError", err))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

// SAFETY: the raw communicator is only used through NCCL, which is thread-safe for distinct
// communicators and for one communicator's calls serialised by the caller.
unsafe impl Send for Shared {}
// SAFETY: as above; mutable state is behind locks and atomics.
unsafe impl Sync for Shared {}
