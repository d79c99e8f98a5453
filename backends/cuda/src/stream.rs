//! CUDA streams: the HAL's `Stream` over a `CUstream`, holding what queued work uses until the
//! driver says it ran.
//!
//! Every enqueue that uses HAL objects (buffers, host buffers, functions, events) keeps them until
//! a timing-free event recorded after the work completes, through the shared retention of GPU
//! streams (`unihal_gpu::retention`: batched seals, released when their event completed, at each
//! enqueue, query and synchronize, and when a host buffer's holder is asked). So dropping a
//! buffer that queued work still reads is safe: its memory is freed after the work.

use crate::conv::{not_ready, vendor};
use crate::device::CudaDevice;
use crate::drv::{self, result, DriverError};
use crate::event::CudaEvent;
use crate::memory::CudaAllocation;
use crate::module::CudaFunction;
use cudarc::driver::sys;
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use unihal_gpu::retention::Retention;
use unihal_hal::{
    check_peer_copy, Buffer, Device, DeviceId, Event, FillValue, Function, HalError, HostBuffer,
    Invalid, KernelArgs, LaunchConfig, NativeHandle, OpCall, OpId, Result, Stream, UseHolder,
};

pub(crate) use unihal_hal::Keep;

struct Inner {
    /// What queued work keeps, behind CUDA events (the shared retention of GPU streams).
    kept: Retention<sys::CUevent>,
    /// The first error that poisons the context.
    sticky: Option<HalError>,
}

/// A stream of a CUDA device. Thread-safe: enqueues are serialised by a lock.
pub struct CudaStream {
    /// This stream, as the holder of the host-buffer uses its work keeps.
    me: std::sync::Weak<CudaStream>,
    dev: Arc<CudaDevice>,
    dyn_dev: Arc<dyn Device>,
    raw: sys::CUstream,
    inner: Mutex<Inner>,
    /// The error of a host callback that panicked: set by the callback (which must not wait for
    /// `inner`, held by enqueues that may wait in the driver), moved into the sticky error by
    /// the next call.
    callback_error: Arc<Mutex<Option<HalError>>>,
    /// This stream's cuBLAS handle, created on its first matmul.
    blas: Mutex<Option<crate::cublas::Handle>>,
}

// SAFETY: CUstream handles may be used from any thread; the kept objects are Send + Sync.
unsafe impl Send for CudaStream {}
// SAFETY: as above; mutable state is behind the mutex.
unsafe impl Sync for CudaStream {}

/// CUDA errors after which the context is unusable (a kernel fault, a killed kernel).
fn poisons(e: &HalError) -> bool {
    matches!(e, HalError::Vendor { code, .. } if matches!(*code, 700 | 702 | 714..=719))
}

/// Device address of `[offset, offset+len)` of a CUDA buffer on `device`, after every check.
pub(crate) fn cuda_addr(
    buf: &Buffer,
    arg: &'static str,
    device: DeviceId,
    offset: u64,
    len: u64,
) -> Result<u64> {
    buf.downcast_allocation::<CudaAllocation>(arg)?;
    buf.check_use(arg, device, offset, len)
}

impl CudaStream {
    pub(crate) fn new(dev: Arc<CudaDevice>) -> Result<Arc<CudaStream>> {
        let raw = dev.call("cuStreamCreate", || {
            result::stream::create_non_blocking().map_err(|e| vendor("cuStreamCreate", e))
        })?;
        let dyn_dev: Arc<dyn Device> = dev.clone();
        Ok(Arc::new_cyclic(|me| CudaStream {
            me: me.clone(),
            dev,
            dyn_dev,
            raw,
            inner: Mutex::new(Inner {
                kept: Retention::new(),
                sticky: None,
            }),
            callback_error: Arc::new(Mutex::new(None)),
            blas: Mutex::new(None),
        }))
    }

    fn id(&self) -> DeviceId {
        self.dev.ctx.id
    }

    /// Enqueues `f` (a driver call on this stream) and keeps `keep` until it has run.
    fn submit(
        &self,
        call: &str,
        keep: Vec<Keep>,
        f: impl FnOnce(sys::CUstream) -> std::result::Result<(), DriverError>,
    ) -> Result<()> {
        self.submit_with(call, keep, |s| f(s).map_err(|e| vendor(call, e)))
    }

    /// Runs `f(cuBLAS handle, what to keep)` as an enqueue on this stream (the handle is created
    /// on first use and bound to the stream), then keeps what `f` listed until the work ran.
    pub(crate) fn blas(&self, f: impl FnOnce(usize, &mut Vec<Keep>) -> Result<()>) -> Result<()> {
        let mut keep = Vec::new();
        self.submit_with("cuBLAS", Vec::new(), |raw| {
            let mut h = self.blas.lock();
            if h.is_none() {
                let pooled = self.dev.blas_pool.lock().pop();
                let handle = match pooled {
                    Some(handle) => handle,
                    None => crate::cublas::Handle::new()?,
                };
                if let Err(e) = handle.bind(raw) {
                    self.dev.blas_pool.lock().push(handle);
                    return Err(e);
                }
                *h = Some(handle);
            }
            f(h.as_ref().expect("created above").0, &mut keep)
        })?;
        self.keep(keep)
    }

    /// Fails the stream with `e` (a communicator's timeout or abort): later enqueues,
    /// synchronisations and queries return it. The first error stays.
    pub(crate) fn fail(&self, e: HalError) {
        self.inner.lock().sticky.get_or_insert(e);
    }

    /// The stream's sticky error (a panicking host callback's included).
    fn sticky(&self, inner: &mut Inner) -> Option<HalError> {
        if inner.sticky.is_none() {
            inner.sticky = self.callback_error.lock().clone();
        }
        inner.sticky.clone()
    }

    /// As [`CudaStream::submit`] for a call of another library on this stream (`f` maps its
    /// own errors).
    pub(crate) fn submit_with(
        &self,
        call: &str,
        keep: Vec<Keep>,
        f: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        self.submit_locked(call, keep, |_, raw| f(raw))
    }

    /// As [`CudaStream::submit_with`], `f` also given the stream's state (under its lock).
    fn submit_locked(
        &self,
        call: &str,
        keep: Vec<Keep>,
        f: impl FnOnce(&mut Inner, sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        crate::deferred::refuse_in_callback(call)?;
        crate::deferred::flush();
        let mut inner = self.inner.lock();
        if let Some(e) = self.sticky(&mut inner) {
            return Err(e);
        }
        self.dev.call(call, || {
            self.retire(&mut inner, false);
            if let Err(e) = f(&mut inner, self.raw) {
                if poisons(&e) {
                    inner.sticky = Some(e.clone());
                }
                return Err(e);
            }
            // The work is queued: what it uses is kept whatever happens below. When no event
            // can track it, it stays kept until a synchronisation (never released earlier, and
            // without waiting here for work that may wait for the caller).
            let raw = self.raw;
            let sealed = inner.kept.keep(
                keep,
                || {
                    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                        .map_err(|e| vendor("cuEventCreate", e).to_string())
                },
                |ev| {
                    // SAFETY: a live event and stream of the current context.
                    unsafe { result::event::record(ev, raw) }
                        .map_err(|e| vendor("cuEventRecord", e).to_string())
                },
            );
            if let Err(e) = sealed {
                tracing::warn!(target: "unihal::cuda", "{e}; kept until a synchronisation");
            }
            Ok(())
        })
    }

    fn synchronize_inner(&self) -> Result<()> {
        // What the synchronisation covers: the work queued before it begins. Work other threads
        // enqueue meanwhile (the driver call is not made under the lock, so a communicator's
        // watchdog may fail this stream meanwhile) keeps what it uses.
        crate::deferred::refuse_in_callback("cuStreamSynchronize")?;
        let cover = {
            let mut inner = self.inner.lock();
            if let Some(e) = self.sticky(&mut inner) {
                return Err(e);
            }
            inner.kept.begin_sync()
        };
        let r = self.dev.call("cuStreamSynchronize", || {
            // SAFETY: a live stream.
            unsafe { result::stream::synchronize(self.raw) }
                .map_err(|e| vendor("cuStreamSynchronize", e))
        });
        let mut inner = self.inner.lock();
        // On failure, not known to have run: kept (released by a later synchronisation).
        inner.kept.end_sync(cover, r.is_ok(), event_done);
        if let Err(e) = &r {
            if poisons(e) {
                inner.sticky.get_or_insert(e.clone());
            }
        }
        match self.sticky(&mut inner) {
            Some(e) => Err(e),
            None => r,
        }
    }

    /// Releases what completed work kept (all of it when `all`: only under the lock held
    /// across a driver call that saw the whole stream complete).
    fn retire(&self, inner: &mut Inner, all: bool) {
        if all {
            inner.kept.retire_all();
        } else {
            inner.kept.retire(event_done);
        }
    }

    /// Enqueues a copy between a host range (buffer, argument name, offset) and a checked device
    /// address of `keep`.
    fn host_copy(
        &self,
        to_device: bool,
        (host, host_arg, host_offset): (&HostBuffer, &'static str, u64),
        (device_addr, keep): (u64, Buffer),
        len: u64,
    ) -> Result<()> {
        let call = if to_device {
            "cuMemcpyHtoDAsync"
        } else {
            "cuMemcpyDtoHAsync"
        };
        let holder: std::sync::Weak<dyn UseHolder> = self.me.clone();
        let range = host.begin_use_by(host_arg, host_offset, len, holder)?;
        if len == 0 {
            return Ok(());
        }
        let raw_ok = range.with_ptr(|p, n| {
            self.submit(call, Vec::new(), |s| {
                // SAFETY: the host range was checked by begin_use and stays in use (kept below)
                // until the copy ran; the device range was checked and `keep` holds it.
                unsafe {
                    if to_device {
                        drv::cuMemcpyHtoDAsync_v2(device_addr, p as *const _, n, s).result()
                    } else {
                        drv::cuMemcpyDtoHAsync_v2(p as *mut _, device_addr, n, s).result()
                    }
                }
            })
        });
        raw_ok?;
        self.keep(vec![Box::new(range), Box::new(keep)])
    }

    /// Keeps objects until the work queued so far has run.
    fn keep(&self, keep: Vec<Keep>) -> Result<()> {
        self.submit("cuEventRecord", keep, |_| Ok(()))
    }
}

impl UseHolder for CudaStream {
    /// Releases what completed batches kept (their events are queried), so a host buffer is
    /// mappable once its copy ran, whichever call showed that. Nothing inside a host callback
    /// (no driver call there; the callback released the uses queued before it).
    fn release_completed(&self) {
        if crate::deferred::in_callback() {
            return;
        }
        let mut inner = self.inner.lock();
        let _ = self.dev.call("cuEventQuery", || {
            self.retire(&mut inner, false);
            Ok(())
        });
    }
}

impl Stream for CudaStream {
    fn device(&self) -> &Arc<dyn Device> {
        &self.dyn_dev
    }

    fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let d = cuda_addr(dst, "dst", self.id(), dst_offset, len)?;
        self.host_copy(true, (src, "src", src_offset), (d, dst.clone()), len)
    }

    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        let len = src.len() as u64;
        cuda_addr(dst, "dst", self.id(), dst_offset, len)?;
        let staging = self.dev.alloc_host(src.len())?;
        staging.map()?.copy_from_slice(src);
        self.copy_h2d(&staging, 0, dst, dst_offset, len)
    }

    fn copy_d2h(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &HostBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let s = cuda_addr(src, "src", self.id(), src_offset, len)?;
        self.host_copy(false, (dst, "dst", dst_offset), (s, src.clone()), len)
    }

    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let s = cuda_addr(src, "src", self.id(), src_offset, len)?;
        let d = cuda_addr(dst, "dst", self.id(), dst_offset, len)?;
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
        if len == 0 {
            return Ok(());
        }
        let keep: Vec<Keep> = vec![Box::new(src.clone()), Box::new(dst.clone())];
        self.submit("cuMemcpyDtoDAsync", keep, |st| {
            // SAFETY: both ranges were checked against live allocations held by `keep`, and are
            // disjoint.
            unsafe { result::memcpy_dtod_async(d, s, len as usize, st) }
        })
    }

    fn copy_peer(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let me = self.id();
        let peers = &self.dev.capabilities().optional.peer_devices;
        check_peer_copy(me, peers, src.device(), dst.device())?;
        let sa = src.downcast_allocation::<CudaAllocation>("src")?;
        let da = dst.downcast_allocation::<CudaAllocation>("dst")?;
        let s = src.check_use("src", src.device(), src_offset, len)?;
        let d = dst.check_use("dst", dst.device(), dst_offset, len)?;
        if src.device() == dst.device() {
            // Both on this device: an ordinary copy (with its overlap check).
            return self.copy_d2d(src, src_offset, dst, dst_offset, len);
        }
        if len == 0 {
            return Ok(());
        }
        let far = if src.device() == me { &da.ctx } else { &sa.ctx };
        self.dev.enable_peer(far)?;
        let (src_ctx, dst_ctx) = (sa.ctx.raw as usize, da.ctx.raw as usize);
        let keep: Vec<Keep> = vec![Box::new(src.clone()), Box::new(dst.clone())];
        self.submit("cuMemcpyPeerAsync", keep, |st| {
            // SAFETY: both ranges were checked against live allocations of their devices, held by
            // `keep`; the contexts are those devices' retained primary contexts.
            unsafe {
                result::memcpy_peer_async(
                    dst_ctx as sys::CUcontext,
                    d,
                    src_ctx as sys::CUcontext,
                    s,
                    len as usize,
                    st,
                )
            }
        })
    }

    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        let d = cuda_addr(dst, "dst", self.id(), offset, len)?;
        let w = value.width();
        if d % w != 0 || len % w != 0 {
            return Err(HalError::invalid(
                "dst",
                Invalid::Value {
                    value: format!("address {d:#x}, length {len}"),
                    accepted: format!("multiples of the {w}-byte pattern width"),
                },
            ));
        }
        if len == 0 {
            return Ok(());
        }
        let n = (len / w) as usize;
        self.submit("cuMemsetD*Async", vec![Box::new(dst.clone())], |s| {
            // SAFETY: the range was checked (and its alignment) and the buffer is kept.
            unsafe {
                match value {
                    FillValue::U8(v) => drv::cuMemsetD8Async(d, v, n, s).result(),
                    FillValue::U16(v) => drv::cuMemsetD16Async(d, v, n, s).result(),
                    FillValue::U32(v) => drv::cuMemsetD32Async(d, v, n, s).result(),
                }
            }
        })
    }

    unsafe fn launch(
        &self,
        function: &Arc<dyn Function>,
        config: &LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        let f = function
            .as_any()
            .downcast_ref::<CudaFunction>()
            .ok_or_else(|| {
                HalError::invalid(
                    "function",
                    Invalid::ForeignHandle {
                        expected: "CUDA function".into(),
                        found: format!(
                            "function {:?} of {}",
                            function.name(),
                            function.device_id()
                        ),
                    },
                )
            })?;
        if f.device_id() != self.id() {
            return Err(HalError::invalid(
                "function",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: f.device_id(),
                },
            ));
        }
        config.validate(&self.dev.capabilities().mandatory)?;
        if let Some(sizes) = f.param_sizes() {
            args.check_against(sizes)?;
        }
        if let Some(b) = args.buffers().iter().find(|b| b.is_free_enqueued()) {
            return Err(HalError::invalid(
                "args",
                Invalid::FreeEnqueued {
                    addr: b.device_addr() - b.offset(),
                    len: b.len(),
                },
            ));
        }
        let mut params = args.param_ptrs();
        let mut keep: Vec<Keep> = args
            .buffers()
            .iter()
            .map(|b| Box::new(b.clone()) as Keep)
            .collect();
        keep.push(Box::new(function.clone()));
        let (g, b) = (config.grid, config.block);
        self.submit("cuLaunchKernel", keep, |s| {
            // SAFETY: the caller vouches for the arguments' meaning (this fn is unsafe); their
            // sizes match the kernel's parameters where known; the driver copies the values
            // during the call; the buffers they name are kept until the kernel ran.
            unsafe {
                drv::cuLaunchKernel(
                    f.raw,
                    g.x,
                    g.y,
                    g.z,
                    b.x,
                    b.y,
                    b.z,
                    config.shared_mem_bytes,
                    s,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
                .result()
            }
        })
    }

    fn run_op(&self, call: &OpCall) -> Result<()> {
        for t in &call.tensors {
            cuda_addr(&t.buffer, "tensors", self.id(), 0, 0)?;
        }
        let caps = self.dev.capabilities();
        if let Some(d) = call.key_dtype() {
            if !caps.supports(call.op, d) {
                return Err(HalError::unsupported(format!("op {} in {d}", call.op)));
            }
        }
        if call.op == OpId::Matmul {
            if let Some(r) = crate::cublas::matmul(self, self.id(), call) {
                return r;
            }
        }
        let mut plan = unihal_kernels::plan::plan(call, &caps.mandatory)?;
        if plan.launches.is_empty() {
            return Ok(()); // no elements
        }
        let lib = self.dev.library()?;
        let functions = plan
            .launches
            .iter()
            .map(|l| lib.function(&l.kernel))
            .collect::<Result<Vec<_>>>()?;
        // Scratch memory of the plan, zeroed in stream order, kept until the launches ran.
        let scratch = if plan.scratch_bytes > 0 {
            let s = self.dev.alloc(plan.scratch_bytes as usize)?;
            self.fill(&s, 0, plan.scratch_bytes, FillValue::U8(0))?;
            plan.bind_scratch(s.device_addr());
            Some(s)
        } else {
            None
        };
        for (f, l) in functions.iter().zip(&plan.launches) {
            let mut args = KernelArgs::new();
            args.push(l.args);
            // SAFETY: the plan validated every operand against its buffer (the HAL's rules) and
            // built the entry's one `uh_args` parameter; the buffers are kept below.
            unsafe { self.launch(f, &l.config, &args)? };
        }
        let mut keep: Vec<Keep> = call
            .tensors
            .iter()
            .map(|t| Box::new(t.buffer.clone()) as Keep)
            .collect();
        if let Some(s) = scratch {
            keep.push(Box::new(s));
        }
        self.keep(keep)
    }

    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        // When the callback runs, everything queued before it has completed: the host buffers
        // that work used are free again, so the callback may map them. Their uses are released
        // in the callback (a host-side counter); the handles themselves stay with the stream,
        // since freeing memory would call the driver, which a host function must not do. They
        // are taken only once the stream is known healthy (the sticky check comes first) and
        // given back if the callback cannot be queued.
        let failed = self.callback_error.clone();
        self.submit_locked("cuLaunchHostFunc", Vec::new(), |inner, s| {
            let uses = Arc::new(Mutex::new(inner.kept.take_host_uses()));
            let taken = uses.clone();
            let r = launch_host_fn(
                s,
                Box::new(move || {
                    drop(std::mem::take(&mut *taken.lock()));
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                        failed
                            .lock()
                            .get_or_insert(HalError::Internal("a host callback panicked".into()));
                    }
                }),
            );
            match r {
                Ok(()) => Ok(()),
                Err((e, f)) => {
                    // Not queued: the uses go back, released once the work that holds them ran.
                    let back = std::mem::take(&mut *uses.lock());
                    drop(f);
                    inner.kept.give_back(back);
                    Err(vendor("cuLaunchHostFunc", e))
                }
            }
        })
    }

    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let e = CudaEvent::of(event.as_ref(), "event")?;
        if e.device_id() != self.id() {
            return Err(HalError::invalid(
                "event",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: e.device_id(),
                },
            ));
        }
        self.submit("cuEventRecord", vec![Box::new(event.clone())], |s| {
            // SAFETY: a live event and stream of the same context.
            unsafe { result::event::record(e.raw, s) }
        })?;
        e.recorded.store(true, Ordering::Release);
        Ok(())
    }

    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let e = CudaEvent::of(event.as_ref(), "event")?;
        self.submit("cuStreamWaitEvent", vec![Box::new(event.clone())], |s| {
            // SAFETY: a live event (of any context of this process) and a live stream.
            unsafe {
                result::stream::wait_event(s, e.raw, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
            }
        })
    }

    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        if !self.dev.capabilities().optional.stream_ordered_alloc {
            // Memory that exists now is valid for work enqueued after this call.
            return self.dev.alloc(len);
        }
        if let Some(e) = self.sticky(&mut self.inner.lock()) {
            return Err(e);
        }
        // From the device's default pool, in this stream's order. The buffer's release is a
        // plain cuMemFree once no queued work holds it, which CUDA documents as not synchronising
        // for pool memory.
        self.dev.alloc_with("cuMemAllocAsync", len, || {
            // SAFETY: a non-zero size and a live stream of the current context.
            unsafe { result::malloc_async(self.raw, len) }
        })
    }

    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        cuda_addr(buffer, "buffer", self.id(), 0, 0)?;
        buffer.mark_free_enqueued("buffer")?;
        // The memory returns when the last handle (queued work holds its own) is dropped.
        self.keep(vec![Box::new(buffer.clone())])
    }

    fn synchronize(&self) -> Result<()> {
        let r = self.synchronize_inner();
        crate::deferred::flush();
        r
    }

    fn query(&self) -> Result<bool> {
        crate::deferred::refuse_in_callback("cuStreamQuery")?;
        let mut inner = self.inner.lock();
        if let Some(e) = self.sticky(&mut inner) {
            return Err(e);
        }
        self.dev.call("cuStreamQuery", || {
            // SAFETY: a live stream.
            match unsafe { drv::cuStreamQuery(self.raw) }.result() {
                Ok(()) => {
                    self.retire(&mut inner, true);
                    Ok(true)
                }
                Err(e) if not_ready(&e) => {
                    self.retire(&mut inner, false);
                    Ok(false)
                }
                Err(e) => {
                    let e = vendor("cuStreamQuery", e);
                    if poisons(&e) {
                        inner.sticky = Some(e.clone());
                    }
                    Err(e)
                }
            }
        })
    }

    fn async_error(&self) -> Option<HalError> {
        self.sticky(&mut self.inner.lock())
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.raw as *mut std::ffi::c_void)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        let parts = std::mem::take(&mut self.inner.get_mut().kept).into_parts();
        let keep = parts.keep;
        let events: Vec<usize> = parts.events.into_iter().map(|ev| ev as usize).collect();
        let blas = self.blas.get_mut().take();
        let (dev, raw) = (self.dev.clone(), self.raw as usize);
        crate::deferred::release(move || {
            let _ = dev.clone().call("cuStreamDestroy", || {
                let raw = raw as sys::CUstream;
                // Never wait here for queued work: it may wait for something the caller does
                // only later (an event, a flag). What it uses is released by a host function
                // queued behind it; the driver releases the stream itself once its work ran.
                let release = move || {
                    drop(keep);
                    if let Some(h) = blas {
                        dev.blas_pool.lock().push(h);
                    }
                    crate::deferred::release(move || {
                        for ev in events {
                            // SAFETY: events of this stream whose records have completed,
                            // destroyed once.
                            let _ = unsafe { result::event::destroy(ev as sys::CUevent) };
                        }
                    });
                };
                if let Err((e, release)) = launch_host_fn(raw, Box::new(release)) {
                    // Queued work may still use what the stream kept, and waiting for it here
                    // could hang: leaked on purpose (memory, handles, host-buffer uses).
                    std::mem::forget(release);
                    tracing::warn!(target: "unihal::cuda",
                        "stream release: {}; what its work used is leaked",
                        vendor("cuLaunchHostFunc", e));
                }
                // SAFETY: a live stream, destroyed once; CUDA lets queued work finish first.
                unsafe { result::stream::destroy(raw) }.map_err(|e| vendor("cuStreamDestroy", e))
            });
        });
    }
}

/// A host function that was not queued, given back with the driver's error.
type NotLaunched = (DriverError, Box<dyn FnOnce() + Send>);

/// Queues `f` on `stream` as a host function (`cuLaunchHostFunc`): it runs once everything
/// queued before it has completed, with the driver calls its releases would make deferred (a host
/// function must not call the driver) and panics caught (callers that report them catch them
/// first). When the launch fails, `f` comes back unrun.
fn launch_host_fn(
    stream: sys::CUstream,
    f: Box<dyn FnOnce() + Send>,
) -> std::result::Result<(), NotLaunched> {
    unsafe extern "C" fn trampoline(data: *mut std::ffi::c_void) {
        // SAFETY: `data` came from Box::into_raw below and the driver calls this once.
        let call = unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) };
        crate::deferred::as_callback(|| {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
        });
    }
    let data = Box::into_raw(Box::new(f));
    // SAFETY: a live stream; `trampoline` takes ownership of `data` when called.
    let r = unsafe { drv::cuLaunchHostFunc(stream, Some(trampoline), data as *mut _) }.result();
    r.map_err(|e| {
        // Not queued: the driver will never call it.
        // SAFETY: from Box::into_raw above, not handed to the driver.
        (e, *unsafe { Box::from_raw(data) })
    })
}

/// Whether a tracking event's record has completed (an error, e.g. no current context on a
/// failed synchronisation's path, counts as not: its batch stays kept until a synchronisation).
fn event_done(ev: sys::CUevent) -> bool {
    // SAFETY: a live event of this stream: the retention hands out only events of batches it
    // still holds, and they are destroyed only after the stream's final release, so the handle
    // is valid on every path; the call reads nothing else.
    unsafe { result::event::query(ev) }.is_ok()
}
