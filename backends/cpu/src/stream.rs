//! CPU streams: the `Stream` trait over a [`WorkerShared`] queue.

use crate::device::CpuDevice;
use crate::event::{CpuEvent, Record};
use crate::fault::Fault;
use crate::graph::{Capture, CaptureSlot, CpuGraph, Hook};
use crate::memory::CpuAllocation;
use crate::module::{run_launch, CpuFunction};
use crate::worker::WorkerShared;
use std::any::Any;
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use unihal_hal::{
    check_peer_copy, Buffer, CaptureMode, CaptureStatus, Device, DeviceAllocation, DeviceId, Event,
    FillValue, Function, Graph, HalError, HostBuffer, HostUse, Invalid, Keep, KernelArgs,
    LaunchConfig, NativeHandle, OpCall, OpId, Result, Stream, StreamId,
};

/// A stream of a CPU device, run by its own worker thread.
pub struct CpuStream {
    pub(crate) dev: Arc<CpuDevice>,
    pub(crate) dyn_dev: Arc<dyn Device>,
    pub(crate) worker: Arc<WorkerShared>,
    /// This stream's identity, under which its queued work keeps buffers.
    pub(crate) sid: StreamId,
    /// The capture this stream records into, if any (`crate::graph`).
    pub(crate) cap: Arc<CaptureSlot>,
}

/// Device address of `[offset, offset+len)` of a CPU buffer on `device`, after every check.
pub(crate) fn cpu_addr(
    buf: &Buffer,
    arg: &'static str,
    device: DeviceId,
    offset: u64,
    len: u64,
) -> Result<*mut u8> {
    let a = buf.downcast_allocation::<CpuAllocation>(arg)?;
    // The outer object must describe the CPU allocation it downcasts to.
    if a.addr() != buf.allocation().addr() || a.len() != buf.allocation().len() {
        return Err(HalError::invalid(
            arg,
            Invalid::ForeignHandle {
                expected: "CPU allocation".into(),
                found: format!(
                    "buffer [{:#x}, +{}) of {} wrapping another allocation",
                    buf.allocation().addr(),
                    buf.allocation().len(),
                    buf.device()
                ),
            },
        ));
    }
    Ok(buf.check_use(arg, device, offset, len)? as *mut u8)
}

/// Which way a host copy goes.
#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    ToHost,
}

/// A raw address that may cross to the worker thread.
#[derive(Clone, Copy)]
struct Addr(*mut u8);
// SAFETY: the address points into an allocation that the queued operation keeps alive (it holds a
// Buffer clone); only the worker dereferences it.
unsafe impl Send for Addr {}

impl Addr {
    /// The pointer. A method, so closures capture the whole (Send) `Addr`, not its field.
    fn get(self) -> *mut u8 {
        self.0
    }
}

impl CpuStream {
    fn id(&self) -> DeviceId {
        self.dev.id()
    }

    /// Enqueues a copy between the host range `(arg, offset, len)` of `host` and a checked device
    /// address, holding both. The host range is in use (the map protocol) from the enqueue until
    /// the copy ran; in a capture, from each launch of the graph until its replay ran the copy.
    fn enqueue_host_copy(
        &self,
        (host, arg, offset, len): (&HostBuffer, &'static str, u64, u64),
        dev: Addr,
        keep: Keep,
        dir: Direction,
    ) -> Result<()> {
        let capture = self.capture();
        let first = host.begin_use(arg, offset, len)?;
        let copy = move |host: &HostUse| {
            host.with_ptr(|p, n| {
                // SAFETY: the host range was checked by begin_use and is held by `host`; the
                // device range was checked and is held by `keep`; they are different memory.
                unsafe {
                    match dir {
                        Direction::ToDevice => std::ptr::copy_nonoverlapping(p, dev.get(), n),
                        Direction::ToHost => std::ptr::copy_nonoverlapping(dev.get(), p, n),
                    }
                }
            })
        };
        if capture.is_none() {
            let mut first = Some(first);
            return self.submit(Box::new(move |err| {
                if let Some(u) = first.take().filter(|_| err.is_none()) {
                    copy(&u);
                }
                let _ = &keep; // held until the operation is dropped
                Ok(())
            }));
        }
        // Captured: each launch takes the use (refused then if the host holds a map), the replay
        // releases it.
        drop(first);
        let slot = Arc::new(parking_lot::Mutex::new(None));
        let (host, taken) = (host.clone(), slot.clone());
        let hook: Hook = Box::new(move || {
            let u = host.begin_use(arg, offset, len)?;
            let taken = taken.clone();
            Ok(Box::new(move || *taken.lock() = Some(u)))
        });
        self.submit_to(
            capture,
            Box::new(move |err| {
                let u = slot.lock().take();
                if let Some(u) = u.filter(|_| err.is_none()) {
                    copy(&u);
                }
                let _ = &keep; // held until the graph is dropped
                Ok(())
            }),
            Some(hook),
        )
    }

    /// Enqueues `op`, or records it when the stream is capturing.
    pub(crate) fn submit(&self, op: crate::worker::Op) -> Result<()> {
        self.submit_with_hook(op, None)
    }

    /// Enqueues `op`, or records it with its launch-time `hook` when the stream is capturing
    /// (eagerly, the caller has done what the hook does).
    pub(crate) fn submit_with_hook(&self, op: crate::worker::Op, hook: Option<Hook>) -> Result<()> {
        self.submit_to(self.capture(), op, hook)
    }

    /// As [`CpuStream::submit_with_hook`] into `capture`, the stream's capture as the caller read
    /// it when it built `op` (an operation built for a capture is never enqueued, nor the reverse,
    /// if another thread ends the capture meanwhile).
    pub(crate) fn submit_to(
        &self,
        capture: Option<Arc<Capture>>,
        op: crate::worker::Op,
        hook: Option<Hook>,
    ) -> Result<()> {
        match capture {
            Some(c) => {
                if let Some(e) = self.worker.error() {
                    return Err(e);
                }
                c.push(self.sid, op, hook)
            }
            None => self.worker.enqueue(op).map(drop),
        }
    }

    /// Refuses `what` on a capturing stream (the capture stays valid): for work that cannot
    /// be replayed, such as the MPI and gloo engines' calls (their message numbers and tags are
    /// taken at the enqueue).
    ///
    /// # Errors
    /// [`HalError::Unsupported`] naming `what` while the stream captures.
    #[allow(dead_code)] // Used by the feature-gated engines.
    pub(crate) fn refuse_in_capture(&self, what: &str) -> Result<()> {
        match self.capture() {
            Some(c) => Err(c.refuse(
                what,
                HalError::unsupported(format!(
                    "{what} in a stream capture on the CPU backend (only the in-process \
                     engine's collectives are captured)"
                )),
            )),
            None => Ok(()),
        }
    }

    /// Enqueues `op`, which runs once: for callers that checked [`CpuStream::refuse_in_capture`].
    #[allow(dead_code)] // Used by the feature-gated engines.
    pub(crate) fn submit_once(
        &self,
        op: impl FnOnce(Option<&HalError>) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        let mut op = Some(op);
        self.submit(Box::new(move |err| match op.take() {
            Some(op) => op(err),
            None => Ok(()),
        }))
    }

    /// The capture this stream records into, if any.
    pub(crate) fn capture(&self) -> Option<Arc<Capture>> {
        self.cap.get()
    }

    /// The identity under which work enqueued now keeps its buffers: the stream's own, or while
    /// capturing the capture's (`CaptureId::stream_id`: the graph's uses are a queue of their own).
    pub(crate) fn use_sid(&self) -> StreamId {
        self.capture().map_or(self.sid, |c| c.id.stream_id())
    }

    /// Enqueues a copy of `len` bytes between two checked, disjoint ranges, keeping `keep` alive.
    fn enqueue_copy(&self, src: Addr, dst: Addr, len: u64, keep: [Keep; 2]) -> Result<()> {
        let (s, d) = (src.get() as u64, dst.get() as u64);
        if len > 0 && s < d + len && d < s + len {
            return Err(HalError::invalid(
                "dst",
                Invalid::Overlap {
                    src: s,
                    dst: d,
                    len,
                },
            ));
        }
        self.submit(Box::new(move |err| {
            if err.is_none() && len > 0 {
                // SAFETY: both ranges were bounds-checked against live CPU allocations, which `keep`
                // holds until this closure is dropped, and checked disjoint above.
                unsafe { std::ptr::copy_nonoverlapping(src.get(), dst.get(), len as usize) };
            }
            let _ = &keep; // held until the operation is dropped
            Ok(())
        }))
    }
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        if let Some(c) = self.capture() {
            // As a destroyed capturing stream on CUDA: the capture is invalidated; the origin's
            // drop also ends it, so the device does not stay capturing.
            c.invalidate("the drop of a capturing stream");
            if c.end(self.sid).is_err() && !c.is_active() {
                self.dev.capture_ended(&c);
            }
        }
        self.worker.shutdown();
    }
}

impl Stream for CpuStream {
    fn device(&self) -> &Arc<dyn Device> {
        &self.dyn_dev
    }

    fn stream_id(&self) -> StreamId {
        self.sid
    }

    fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        crate::fault::point("copy")?;
        let d = Addr(cpu_addr(dst, "dst", self.id(), dst_offset, len)?);
        let host = (src, "src", src_offset, len);
        self.enqueue_host_copy(host, d, dst.use_on(self.use_sid()), Direction::ToDevice)
    }

    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        crate::fault::point("copy")?;
        let len = src.len() as u64;
        let d = Addr(cpu_addr(dst, "dst", self.id(), dst_offset, len)?);
        let staged = src.to_vec();
        let keep = dst.use_on(self.use_sid());
        self.submit(Box::new(move |err| {
            if err.is_none() && !staged.is_empty() {
                // SAFETY: the device range was checked and is held by `keep`; `staged` is ours.
                unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), d.get(), staged.len()) };
            }
            let _ = &keep; // held until the operation is dropped
            Ok(())
        }))
    }

    fn copy_d2h(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &HostBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        crate::fault::point("copy")?;
        let s = Addr(cpu_addr(src, "src", self.id(), src_offset, len)?);
        let host = (dst, "dst", dst_offset, len);
        self.enqueue_host_copy(host, s, src.use_on(self.use_sid()), Direction::ToHost)
    }

    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        crate::fault::point("copy")?;
        let s = Addr(cpu_addr(src, "src", self.id(), src_offset, len)?);
        let d = Addr(cpu_addr(dst, "dst", self.id(), dst_offset, len)?);
        self.enqueue_copy(
            s,
            d,
            len,
            [src.use_on(self.use_sid()), dst.use_on(self.use_sid())],
        )
    }

    fn copy_peer(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        crate::fault::point("copy")?;
        let (sd, dd) = (src.device(), dst.device());
        let peers = &self.dev.capabilities_ref().optional.peer_devices;
        check_peer_copy(self.id(), peers, sd, dd)?;
        let s = Addr(cpu_addr(src, "src", sd, src_offset, len)?);
        let d = Addr(cpu_addr(dst, "dst", dd, dst_offset, len)?);
        self.enqueue_copy(
            s,
            d,
            len,
            [src.use_on(self.use_sid()), dst.use_on(self.use_sid())],
        )
    }

    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        crate::fault::point("fill")?;
        let d = Addr(cpu_addr(dst, "dst", self.id(), offset, len)?);
        value.check_aligned(d.0 as u64, len)?;
        let w = value.width();
        let keep = dst.use_on(self.use_sid());
        self.submit(Box::new(move |err| {
            if err.is_none() {
                let n = (len / w) as usize;
                let p = d.get();
                // SAFETY: the range was checked (and its alignment to w) and `keep` holds it.
                unsafe {
                    match value {
                        FillValue::U8(v) => std::ptr::write_bytes(p, v, n),
                        FillValue::U16(v) => (0..n).for_each(|i| (p as *mut u16).add(i).write(v)),
                        FillValue::U32(v) => (0..n).for_each(|i| (p as *mut u32).add(i).write(v)),
                    }
                }
            }
            let _ = &keep; // held until the operation is dropped
            Ok(())
        }))
    }

    unsafe fn launch(
        &self,
        function: &Arc<dyn Function>,
        config: &LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        crate::fault::point("launch")?;
        let f = function
            .as_any()
            .downcast_ref::<CpuFunction>()
            .ok_or_else(|| {
                HalError::invalid(
                    "function",
                    Invalid::ForeignHandle {
                        expected: "CPU function".into(),
                        found: format!(
                            "function {:?} of {}",
                            function.name(),
                            function.device_id()
                        ),
                    },
                )
            })?;
        if f.device != self.id() {
            return Err(HalError::invalid(
                "function",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: f.device,
                },
            ));
        }
        config.validate(&self.dev.capabilities_ref().mandatory)?;
        args.check_against(f.kernel.param_sizes)?;
        if let Some(b) = args.buffers().iter().find(|b| b.is_free_enqueued()) {
            return Err(HalError::invalid(
                "args",
                Invalid::FreeEnqueued {
                    addr: b.device_addr() - b.offset(),
                    len: b.len(),
                },
            ));
        }
        let f = CpuFunction {
            device: f.device,
            name: f.name.clone(),
            kernel: f.kernel,
        };
        let (config, args) = (*config, args.clone());
        let pool = self.dev.pool();
        self.submit(Box::new(move |err| {
            if err.is_some() {
                return Ok(());
            }
            let _span = tracing::trace_span!("cpu launch", kernel = %f.name).entered();
            run_launch(pool.as_deref(), &f, &config, &args)
        }))
    }

    fn run_op(&self, call: &OpCall) -> Result<()> {
        crate::fault::point("op")?;
        for t in &call.tensors {
            cpu_addr(&t.buffer, "tensors", self.id(), 0, 0)?;
        }
        let caps = self.dev.capabilities_ref();
        if let Some(d) = call.key_dtype() {
            if !caps.supports(call.op, d) {
                return Err(HalError::unsupported(format!("op {} in {d}", call.op)));
            }
        }
        let pool = self.dev.pool();
        if call.op == OpId::Matmul && self.dev.matmul_engine() == crate::MatmulEngine::Gemm {
            let Some(job) = crate::matmul::MatmulJob::new(call)? else {
                return Ok(()); // empty output
            };
            let keep: Vec<_> = call
                .tensors
                .iter()
                .map(|t| t.buffer.use_on(self.use_sid()))
                .collect();
            return self.submit(Box::new(move |err| {
                if err.is_none() {
                    let _span = tracing::trace_span!("cpu matmul").entered();
                    // SAFETY: validation checked every element of the views against its buffer
                    // and that c overlaps neither input; `keep` holds the buffers; this stream
                    // orders the work after its own earlier uses of them, and ordering against
                    // other streams is the caller's contract (memory rule 6: an unordered use is
                    // a race on device bytes, never a Rust reference).
                    unsafe { job.run(pool.as_deref()) }
                }
                let _ = &keep; // held until the operation is dropped
                Ok(())
            }));
        }
        let mut plan = unihal_kernels::plan::plan(call, &caps.mandatory)?;
        if plan.launches.is_empty() {
            return Ok(()); // no elements
        }
        let mut launches = Vec::with_capacity(plan.launches.len());
        for l in &plan.launches {
            let kernel = *self.dev.kernels().get(&l.kernel).ok_or_else(|| {
                HalError::Internal(format!("kernel {} missing from the CPU library", l.kernel))
            })?;
            launches.push(CpuFunction {
                device: self.id(),
                name: l.kernel.clone(),
                kernel,
            });
        }
        let keep: Vec<_> = call
            .tensors
            .iter()
            .map(|t| t.buffer.use_on(self.use_sid()))
            .collect();
        // The launches' own buffer handles were for planning: the queued work holds the
        // buffers through `keep` (stream uses, so a caching allocator may reuse a block on this
        // stream as soon as its caller drops it).
        for l in &mut plan.launches {
            l.buffers = Vec::new();
        }
        // Scratch memory of the plan, taken now so that a size the host cannot give is an error of
        // this call, never an abort.
        let words = usize::try_from(plan.scratch_bytes.div_ceil(8)).unwrap_or(usize::MAX);
        let mut scratch: Vec<u64> = Vec::new();
        scratch
            .try_reserve_exact(words)
            .map_err(|_| HalError::OutOfMemory {
                requested: plan.scratch_bytes,
                free: 0,
            })?;
        scratch.resize(words, 0);
        self.submit(Box::new(move |err| {
            if err.is_some() {
                return Ok(());
            }
            // The plan: a host allocation that lives for these launches.
            // Written by the kernels: bound through a mutable pointer.
            plan.bind_scratch(scratch.as_mut_ptr() as u64);
            let mut r = Ok(());
            for (f, l) in launches.iter().zip(&plan.launches) {
                let _span = tracing::trace_span!("cpu op", kernel = %f.name).entered();
                let mut args = KernelArgs::new();
                args.push(l.args);
                // The plan checked every operand against its buffer, and `keep` holds the buffers.
                r = run_launch(pool.as_deref(), f, &l.config, &args);
                if r.is_err() {
                    break;
                }
            }
            let _ = &keep; // held until the operation is dropped
            r
        }))
    }

    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        if let Some(c) = self.capture() {
            // A replay would run the callback again: the HAL's callbacks run once.
            return Err(c.refuse(
                "host_callback",
                HalError::unsupported(
                    "a host callback in a stream capture on the CPU backend (`Stream::host_callback` \
                     takes a FnOnce, which a replay cannot run again)",
                ),
            ));
        }
        let mut f = Some(f);
        self.submit(Box::new(move |err| {
            if let Some(f) = f.take().filter(|_| err.is_none()) {
                f();
            }
            Ok(())
        }))
    }

    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        crate::fault::point("event_record")?;
        let ev = CpuEvent::from_dyn("event", &**event)?;
        if ev.device_id() != self.id() {
            return Err(HalError::invalid(
                "event",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: ev.device_id(),
                },
            ));
        }
        if let Some(c) = self.capture() {
            ev.set_captured(c.mark(self.sid));
            return Ok(());
        }
        let time = Arc::new(OnceLock::new());
        let slot = time.clone();
        let pos = self.worker.enqueue(Box::new(move |err| {
            // The outcome of the work the record captures: its time, or the error that ended it.
            let _ = slot.set(match err {
                None => Ok(Instant::now()),
                Some(e) => Err(e.clone()),
            });
            Ok(())
        }))?;
        let pos = if self.dev.fault().is(Fault::EarlyEventCompletion) {
            0
        } else {
            pos
        };
        ev.set_record(Record {
            worker: self.worker.clone(),
            pos,
            time,
        });
        Ok(())
    }

    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        crate::fault::point("event_wait")?;
        let ev = CpuEvent::from_dyn("event", &**event)?;
        let record = match (ev.record(), self.capture()) {
            (Ok(None), _) => {
                // Never recorded: complete by definition, nothing to wait for.
                return match self.worker.error() {
                    Some(e) => Err(e),
                    None => Ok(()),
                };
            }
            (Ok(Some(_)), Some(c)) => {
                // Illegal (CUDA's isolation error): the capture is invalidated.
                c.invalidate("wait_event on an event recorded outside the capture");
                return Err(HalError::invalid(
                    "event",
                    Invalid::Capture {
                        capture: Some(c.id),
                        call: "wait_event".into(),
                        detail: "the event was recorded outside the capture: a graph cannot \
                                     depend on work outside it (make the stream wait before \
                                     begin_capture); the capture is now invalidated"
                            .into(),
                    },
                ));
            }
            (Ok(Some(r)), None) => r,
            (Err(mark), Some(c)) => {
                if !Arc::ptr_eq(&mark.capture, &c) {
                    return Err(c.illegal(
                        "event",
                        "wait_event on an event recorded in another capture",
                    ));
                }
                c.depend(self.sid, &mark);
                return Ok(());
            }
            (Err(mark), None) => {
                if let Some(e) = self.worker.error() {
                    return Err(e);
                }
                return mark.capture.join(self.sid, &self.cap);
            }
        };
        let ignore = self.dev.fault().is(Fault::IgnoreEventWaits);
        self.worker
            .enqueue(Box::new(move |err| {
                if err.is_some() || ignore {
                    return Ok(());
                }
                record.worker.wait_for(record.pos)?;
                // Work this stream depends on failed: so does this stream.
                record.outcome().map(drop)
            }))
            .map(drop)
    }

    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        crate::fault::point("alloc")?;
        if let Some(e) = self.worker.error() {
            return Err(e);
        }
        if let Some(c) = self.capture() {
            // A graph allocation: made now, at an address fixed while the graph lives (CUDA's
            // memory nodes).
            let b = self.dev.alloc_unchecked(len)?;
            c.push_allocation(self.sid, &b)?;
            return Ok(b);
        }
        // Capture-safe (the HAL's route for allocating while another stream captures).
        self.dev.alloc_unchecked(len)
    }

    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        cpu_addr(buffer, "buffer", self.id(), 0, 0)?;
        if let Some(e) = self.worker.error() {
            return Err(e);
        }
        buffer.mark_free_enqueued("buffer")?;
        let keep = buffer.use_on(self.use_sid());
        self.submit(Box::new(move |_| {
            let _ = &keep; // held until the operation is dropped
            Ok(())
        }))
    }

    fn synchronize(&self) -> Result<()> {
        if let Some(c) = self.capture() {
            return Err(c.illegal("stream", "Stream::synchronize"));
        }
        self.worker.synchronize()
    }

    fn query(&self) -> Result<bool> {
        if let Some(e) = self.worker.error() {
            return Err(e);
        }
        if let Some(c) = self.capture() {
            return Err(c.illegal("stream", "Stream::query"));
        }
        Ok(self.worker.reached(self.worker.position()))
    }

    fn async_error(&self) -> Option<HalError> {
        self.worker.error()
    }

    fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        if let Some(c) = self.capture() {
            return Err(HalError::invalid(
                "stream",
                Invalid::Capture {
                    capture: Some(c.id),
                    call: "begin_capture".into(),
                    detail: "the stream is already capturing".into(),
                },
            ));
        }
        if let Some(e) = self.worker.error() {
            return Err(e);
        }
        let c = Capture::begin(self.sid, self.cap.clone(), self.id(), mode);
        tracing::debug!(stream = %self.sid, capture = %c.id, ?mode, "stream capture begun");
        self.dev.capture_begun(c);
        Ok(())
    }

    fn end_capture(&self) -> Result<Arc<dyn Graph>> {
        let Some(c) = self.capture() else {
            return Err(HalError::invalid(
                "stream",
                Invalid::Capture {
                    capture: None,
                    call: "end_capture".into(),
                    detail: "the stream is not capturing".into(),
                },
            ));
        };
        let r = c.end(self.sid);
        if !c.is_active() {
            self.dev.capture_ended(&c);
        }
        let g = r?;
        tracing::debug!(capture = %c.id, nodes = g.node_count(), "stream capture ended");
        Ok(Arc::new(g))
    }

    fn capture_status(&self) -> CaptureStatus {
        match self.capture() {
            None => CaptureStatus::None,
            Some(c) if c.is_invalidated() => CaptureStatus::Invalidated(c.id),
            Some(c) => CaptureStatus::Active(c.id),
        }
    }

    fn launch_graph(&self, graph: &Arc<dyn Graph>) -> Result<()> {
        let g = graph.as_any().downcast_ref::<CpuGraph>().ok_or_else(|| {
            HalError::invalid(
                "graph",
                Invalid::ForeignHandle {
                    expected: "CPU graph".into(),
                    found: format!("graph of {}", graph.device_id()),
                },
            )
        })?;
        if g.device_id() != self.id() {
            return Err(HalError::invalid(
                "graph",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: g.device_id(),
                },
            ));
        }
        if let Some(c) = self.capture() {
            return Err(c.refuse(
                "launch_graph",
                HalError::unsupported(
                    "launching a graph into a stream capture on the CPU backend (child graphs)",
                ),
            ));
        }
        g.launch_on(&self.worker)
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
