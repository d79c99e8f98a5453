//! Streams of a GPU runtime: the HAL's `Stream` over a vendor stream, holding what queued work
//! uses until the runtime says it ran.
//!
//! Every enqueue that uses HAL objects (buffers, host buffers, functions, events) keeps them until
//! a timing-free event recorded after the work completes, through [`crate::retention`] (batched
//! seals, released when their event completed, at each enqueue, query and synchronize, and when a
//! host buffer's holder is asked). So dropping a buffer that queued work still reads is safe: its
//! memory is freed after the work.

use crate::device::GpuDevice;
use crate::event::GpuEvent;
use crate::graph::{refused, CaptureRec, GpuGraph};
use crate::memory::GpuAllocation;
use crate::module::GpuFunction;
use crate::retention::Retention;
use crate::runtime::{Raw, RawCaptureStatus, Runtime};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use unihal_hal::{
    check_peer_copy, Buffer, CaptureId, CaptureMode, CaptureStatus, Device, DeviceId, Event,
    FillValue, Function, Graph, HalError, HostBuffer, Invalid, Keep, KernelArgs, LaunchConfig,
    NativeHandle, OpCall, Result, Stream, StreamId, UseHolder,
};

struct Inner {
    /// What queued work keeps, behind runtime events.
    kept: Retention<Raw>,
    /// The first error that poisons the device.
    sticky: Option<HalError>,
    /// The capture this stream began or joined (current while it is active): what work
    /// enqueued meanwhile uses is kept by it, then by its graph, instead of by `kept`.
    capture: Option<Arc<CaptureRec>>,
}

impl Inner {
    /// The capture this stream is in, while it is active.
    fn capture(&self) -> Option<&Arc<CaptureRec>> {
        self.capture.as_ref().filter(|c| c.active())
    }
}

/// A stream of a GPU device. Thread-safe: enqueues are serialised by a lock. Dropping it never
/// waits: what its work uses is released by a host function queued behind that work.
pub struct GpuStream<R: Runtime> {
    /// This stream, as the holder of the host-buffer uses its work keeps.
    me: std::sync::Weak<GpuStream<R>>,
    dev: Arc<GpuDevice<R>>,
    dyn_dev: Arc<dyn Device>,
    raw: Raw,
    inner: Mutex<Inner>,
    /// The error of a host callback that panicked: set by the callback (which must not wait for
    /// `inner`, held by enqueues that may wait in the runtime), moved into the sticky error by
    /// the next call.
    callback_error: Arc<Mutex<Option<HalError>>>,
    /// This stream's BLAS handle, taken from the device's pool on its first matmul.
    blas: Mutex<Option<R::Blas>>,
    /// This stream's identity, under which its queued work keeps buffers.
    sid: StreamId,
}

/// Device address of `[offset, offset+len)` of a buffer of runtime `R` on `device`, after every
/// check (its own allocation, on `device`, in range, not freed).
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `arg`.
pub fn device_addr<R: Runtime>(
    buf: &Buffer,
    arg: &'static str,
    device: DeviceId,
    offset: u64,
    len: u64,
) -> Result<u64> {
    device_addr_in::<R>(buf, arg, device, offset, len, None)
}

/// As [`device_addr`], for work enqueued on a stream in capture `scope` (none: not capturing).
///
/// # Errors
/// As [`device_addr`]; [`Invalid::Capture`] for a graph allocation (made by `alloc_async` in
/// a capture) used outside the capture that made it.
pub fn device_addr_in<R: Runtime>(
    buf: &Buffer,
    arg: &'static str,
    device: DeviceId,
    offset: u64,
    len: u64,
    scope: Option<CaptureId>,
) -> Result<u64> {
    graph_scope::<R>(buf, arg, scope)?;
    buf.check_use(arg, device, offset, len)
}

/// Refuses a graph allocation (a memory node of a capture) used by work outside the capture
/// that made it: its address is mapped only while a replay of that capture's graph runs.
fn graph_scope<R: Runtime>(
    buf: &Buffer,
    arg: &'static str,
    scope: Option<CaptureId>,
) -> Result<()> {
    let a = buf.downcast_allocation::<GpuAllocation<R>>(arg)?;
    match a.graph {
        Some(c) if Some(c) != scope => Err(refused(
            arg,
            "buffer use",
            Some(c),
            format!(
                "the buffer was allocated by alloc_async in {c}: a graph allocation, whose \
                 memory exists only while a replay of that capture's graph runs (between its \
                 allocation and free nodes); only work captured in the same capture may use it"
            ),
        )),
        _ => Ok(()),
    }
}

impl<R: Runtime> GpuStream<R> {
    pub(crate) fn new(dev: Arc<GpuDevice<R>>) -> Result<Arc<GpuStream<R>>> {
        let raw = dev.call("stream create", || dev.rt().stream_create())?;
        let dyn_dev: Arc<dyn Device> = dev.clone();
        Ok(Arc::new_cyclic(|me| GpuStream {
            me: me.clone(),
            dev,
            dyn_dev,
            raw,
            inner: Mutex::new(Inner {
                kept: Retention::new(),
                sticky: None,
                capture: None,
            }),
            callback_error: Arc::new(Mutex::new(None)),
            blas: Mutex::new(None),
            sid: StreamId::fresh(),
        }))
    }

    /// The stream of a HAL stream of this backend.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] (argument `stream`) for another backend's stream.
    pub fn of(stream: &Arc<dyn Stream>) -> Result<&GpuStream<R>> {
        stream
            .as_any()
            .downcast_ref::<GpuStream<R>>()
            .ok_or_else(|| {
                HalError::invalid(
                    "stream",
                    Invalid::ForeignHandle {
                        expected: format!("{} stream", R::VENDOR),
                        found: format!("stream of {}", stream.device_id()),
                    },
                )
            })
    }

    /// This stream as a HAL stream handle (`None` only while it is being dropped): what an
    /// op implementation hands the caching allocator for memory in this stream's order.
    pub fn handle(&self) -> Option<Arc<dyn Stream>> {
        self.me.upgrade().map(|s| s as Arc<dyn Stream>)
    }

    /// The device this stream belongs to.
    pub fn gpu_device(&self) -> &Arc<GpuDevice<R>> {
        &self.dev
    }

    fn id(&self) -> DeviceId {
        self.dev.core.id
    }

    fn rt(&self) -> &'static R {
        self.dev.rt()
    }

    /// The stream identity under which work enqueued now keeps its buffers
    /// ([`Buffer::use_on`]): the capture's ([`CaptureId::stream_id`]) while this stream is
    /// capturing, else this stream's.
    pub fn use_key(&self) -> StreamId {
        match self.inner.lock().capture() {
            Some(c) => c.id.stream_id(),
            None => self.sid,
        }
    }

    /// `alloc_async` while capturing: an allocation node of `c` (`cuMemAllocAsync`,
    /// `hipMallocAsync` on the capturing stream), its address fixed now; the graph owns the
    /// memory (see [`crate::graph::caps`]).
    fn graph_alloc(&self, c: &Arc<CaptureRec>, len: usize) -> Result<Buffer> {
        let graphs = &self.dev.capabilities().optional.graphs;
        if !graphs.stream_alloc || !self.dev.capabilities().optional.stream_ordered_alloc {
            return Err(refused(
                "len",
                "alloc_async",
                Some(c.id),
                format!(
                    "stream-ordered allocation is not captured on this device \
                     (GraphCaps::stream_alloc is false: {}); allocate before the capture; \
                     nothing was enqueued and the capture stays valid",
                    graphs.note
                ),
            ));
        }
        if len == 0 {
            return self.dev.alloc_with("alloc async", 0, true, || Ok(0));
        }
        let rt = self.rt();
        let mut ptr = 0;
        self.submit_locked("alloc async", Vec::new(), |_, raw, _| {
            ptr = rt.malloc_async(len, raw)?;
            Ok(())
        })?;
        let buffer = Buffer::from_allocation(GpuAllocation {
            core: self.dev.core.clone(),
            ptr,
            len: len as u64,
            pooled: true,
            foreign: None,
            graph: Some(c.id),
        });
        c.graph_alloc(ptr, buffer.clone());
        Ok(buffer)
    }

    /// `free_async` of a graph allocation in its capture: a free node.
    fn graph_free(&self, buffer: &Buffer) -> Result<()> {
        let ptr = buffer
            .downcast_allocation::<GpuAllocation<R>>("buffer")?
            .ptr;
        buffer.mark_free_enqueued("buffer")?;
        let rt = self.rt();
        self.submit_locked("free async", Vec::new(), |inner, raw, _| {
            // SAFETY: a graph allocation of the capture this stream is in (checked by the
            // caller), freed once (just marked); captured work after this point cannot use it
            // (every handle is marked).
            unsafe { rt.free_async(ptr, raw) }?;
            if let Some(c) = inner.capture() {
                c.graph_free(ptr);
            }
            Ok(())
        })
    }

    /// Has `hook` called after each launch of the graph of the capture this stream is in;
    /// false when it is not capturing.
    pub fn on_replay(&self, hook: unihal_ccl::platform::ReplayHook) -> bool {
        match self.inner.lock().capture() {
            Some(c) => {
                c.on_replay(hook);
                true
            }
            None => false,
        }
    }

    /// The capture this stream is in, while it is active.
    fn scope(&self) -> Option<CaptureId> {
        self.inner.lock().capture().map(|c| c.id)
    }

    /// [`device_addr_in`] for work enqueued on this stream now.
    fn addr(&self, buf: &Buffer, arg: &'static str, offset: u64, len: u64) -> Result<u64> {
        device_addr_in::<R>(buf, arg, self.id(), offset, len, self.scope())
    }

    /// The capture the runtime says this stream is in, among those begun on this device (a
    /// stream the backend did not see join: the runtime's capture id finds it).
    fn vendor_capture(&self) -> Option<Arc<CaptureRec>> {
        if !self.dev.capabilities().optional.graphs.available() {
            return None;
        }
        let rt = self.rt();
        match self
            .dev
            .call("stream capture info", || rt.stream_capture_info(self.raw))
        {
            Ok(RawCaptureStatus::Active(v) | RawCaptureStatus::Invalidated(v)) => {
                self.dev.capture_by_vendor_id(v)
            }
            _ => None,
        }
    }

    /// `e` as the capture error it is (see [`Runtime::capture_error`]), naming `known` (the
    /// capture this stream is in as far as the backend knows) or the one the runtime reports.
    fn capture_error(&self, e: HalError, known: Option<CaptureId>) -> HalError {
        self.rt().capture_error(e, "stream", &|| {
            known.or_else(|| self.vendor_capture().map(|c| c.id))
        })
    }

    /// Refuses `call` while the stream is capturing: what the backend does not capture.
    fn refuse_in_capture(
        &self,
        inner: &Inner,
        arg: &'static str,
        call: &str,
        why: &str,
    ) -> Result<()> {
        match inner.capture() {
            Some(c) => Err(refused(
                arg,
                call,
                Some(c.id),
                format!("{why}; nothing was enqueued and the capture stays valid"),
            )),
            None => Ok(()),
        }
    }

    /// Runs `f(BLAS handle, what to keep)` as an enqueue on this stream (the handle is taken
    /// from the device's pool, or created, on first use and bound to the stream), then keeps
    /// what `f` listed until the work ran.
    ///
    /// # Errors
    /// The stream's sticky error; the handle's creation or binding; `f`'s.
    pub fn blas(&self, f: impl FnOnce(&R::Blas, &mut Vec<Keep>) -> Result<()>) -> Result<()> {
        // The operands are kept in the same locked enqueue as the BLAS call: kept by a second
        // enqueue, they were dropped under the queued GEMM when that one failed (a device that
        // could not be made current, a stream failed in between).
        self.submit_locked("BLAS", Vec::new(), |_, raw, keep| {
            let mut h = self.blas.lock();
            if h.is_none() {
                let pooled = self.dev.blas_pool.lock().pop();
                let handle = match pooled {
                    Some(handle) => handle,
                    None => crate::graph::relaxed(self.rt(), || self.rt().blas_create())?,
                };
                if let Err(e) = self.rt().blas_bind(&handle, raw) {
                    self.dev.blas_pool.lock().push(handle);
                    return Err(e);
                }
                *h = Some(handle);
            }
            f(h.as_ref().expect("created above"), keep)
        })
    }

    /// Fails the stream with `e` (a communicator's timeout or abort): later enqueues,
    /// synchronisations and queries return it. The first error stays.
    pub fn fail(&self, e: HalError) {
        self.inner.lock().sticky.get_or_insert(e);
    }

    /// The stream's sticky error (a panicking host callback's included).
    fn sticky(&self, inner: &mut Inner) -> Option<HalError> {
        if inner.sticky.is_none() {
            inner.sticky = self.callback_error.lock().clone();
        }
        inner.sticky.clone()
    }

    /// Enqueues `f(native stream)` (a runtime call on this stream, or another library's:
    /// collectives, BLAS) and keeps `keep` until it has run.
    ///
    /// # Errors
    /// The stream's sticky error; `f`'s (nothing is kept then).
    pub fn submit(
        &self,
        what: &str,
        keep: Vec<Keep>,
        f: impl FnOnce(Raw) -> Result<()>,
    ) -> Result<()> {
        self.submit_locked(what, keep, |_, raw, _| f(raw))
    }

    /// As [`GpuStream::submit`], `f` also given the stream's state (under its lock) and the list
    /// of what is kept, to which it adds what the work it enqueues uses (kept even when `f` fails
    /// after pushing: work it enqueued before failing may use it).
    fn submit_locked(
        &self,
        what: &str,
        keep: Vec<Keep>,
        f: impl FnOnce(&mut Inner, Raw, &mut Vec<Keep>) -> Result<()>,
    ) -> Result<()> {
        crate::deferred::refuse_in_callback(R::VENDOR, what)?;
        crate::deferred::flush();
        let mut inner = self.inner.lock();
        if let Some(e) = self.sticky(&mut inner) {
            return Err(e);
        }
        let rt = self.rt();
        let raw = self.raw;
        self.dev.call(what, || {
            self.retire(&mut inner, false);
            let given = keep.len();
            let mut keep = keep;
            let capture = inner.capture().cloned();
            let r = f(&mut inner, raw, &mut keep)
                .map_err(|e| self.capture_error(e, capture.as_ref().map(|c| c.id)));
            if let Err(e) = &r {
                if rt.poisons(e) {
                    inner.sticky = Some(e.clone());
                }
                // What the caller gave was for work that was not queued; what `f` added may be
                // used by work it queued before failing.
                keep.drain(..given);
                if keep.is_empty() {
                    return r;
                }
            }
            if let Some(c) = capture {
                // Captured, not run: kept by the capture, then by its graph while it lives
                // (an event recorded here would be a node of the graph, not a point of this
                // stream's work).
                c.keep(keep);
                return r;
            }
            // The work is queued: what it uses is kept whatever happens below. When no event
            // can track it, it stays kept until a synchronisation (never released earlier, and
            // without waiting here for work that may wait for the caller).
            let sealed = inner.kept.keep(
                keep,
                || rt.event_create(false).map_err(|e| e.to_string()),
                |ev| rt.event_record(ev, raw).map_err(|e| e.to_string()),
            );
            if let Err(e) = sealed {
                tracing::warn!(target: "unihal::device", "{e}; kept until a synchronisation");
            }
            r
        })
    }

    fn synchronize_inner(&self) -> Result<()> {
        // What the synchronisation covers: the work queued before it begins. Work other threads
        // enqueue meanwhile (the runtime call is not made under the lock, so a communicator's
        // watchdog may fail this stream meanwhile) keeps what it uses.
        crate::deferred::refuse_in_callback(R::VENDOR, "stream synchronize")?;
        let (cover, capture) = {
            let mut inner = self.inner.lock();
            if let Some(e) = self.sticky(&mut inner) {
                return Err(e);
            }
            (inner.kept.begin_sync(), inner.capture().map(|c| c.id))
        };
        let rt = self.rt();
        // While capturing, the runtime refuses (and invalidates the capture).
        let r = self
            .dev
            .call("stream synchronize", || rt.stream_synchronize(self.raw))
            .map_err(|e| self.capture_error(e, capture));
        let mut inner = self.inner.lock();
        // On failure, not known to have run: kept (released by a later synchronisation).
        inner
            .kept
            .end_sync(cover, r.is_ok(), |ev| event_done(rt, ev));
        if let Err(e) = &r {
            if rt.poisons(e) {
                inner.sticky.get_or_insert(e.clone());
            }
        }
        match self.sticky(&mut inner) {
            Some(e) => Err(e),
            None => r,
        }
    }

    /// Releases what completed work kept (all of it when `all`: only under the lock held
    /// across a runtime call that saw the whole stream complete).
    fn retire(&self, inner: &mut Inner, all: bool) {
        if all {
            inner.kept.retire_all();
        } else {
            let rt = self.rt();
            inner.kept.retire(|ev| event_done(rt, ev));
        }
    }

    /// Enqueues a copy between a host range (buffer, argument name, offset) and a checked device
    /// address of `keep`.
    fn host_copy(
        &self,
        to_device: bool,
        (host, host_arg, host_offset): (&HostBuffer, &'static str, u64),
        (device_addr, keep): (u64, Keep),
        len: u64,
    ) -> Result<()> {
        let holder: std::sync::Weak<dyn UseHolder> = self.me.clone();
        let range = host.begin_use_by(host_arg, host_offset, len, holder)?;
        if len == 0 {
            return Ok(());
        }
        let rt = self.rt();
        let what = if to_device { "copy h2d" } else { "copy d2h" };
        // The range and the device buffer are kept by the same locked enqueue as the copy: kept
        // by a second one, they were dropped under the queued copy when that one failed.
        let mut parts = Some((range, keep));
        self.submit_locked(what, Vec::new(), |_, s, kept| {
            let (range, keep) = parts.take().expect("submitted once");
            range.with_ptr(|p, n| {
                // SAFETY: the host range was checked by begin_use and stays in use (kept below)
                // until the copy ran; the device range was checked and `keep` holds it.
                unsafe {
                    if to_device {
                        rt.copy_h2d(device_addr, p as *const u8, n, s)
                    } else {
                        rt.copy_d2h(p, device_addr, n, s)
                    }
                }
            })?;
            kept.push(Box::new(range));
            kept.push(keep);
            Ok(())
        })
    }

    /// Keeps objects until the work queued so far has run. Kept whatever happens: the work that
    /// uses them is queued already, so when the runtime cannot be reached to seal them (the
    /// device cannot be made current, the stream failed meanwhile) they are held until a
    /// synchronisation instead of being dropped under that work; the error is returned.
    fn keep(&self, keep: Vec<Keep>) -> Result<()> {
        let mut pending = Some(keep);
        let r = self.submit_locked("keep", Vec::new(), |_, _, k| {
            k.extend(pending.take().into_iter().flatten());
            Ok(())
        });
        if let Some(k) = pending {
            self.inner.lock().kept.hold(k);
        }
        r
    }
}

impl<R: Runtime> UseHolder for GpuStream<R> {
    /// Releases what completed batches kept (their events are queried), so a host buffer is
    /// mappable once its copy ran, whichever call showed that. Nothing inside a host callback
    /// (no runtime call there; the callback released the uses queued before it).
    fn release_completed(&self) {
        if crate::deferred::in_callback() {
            return;
        }
        let mut inner = self.inner.lock();
        let _ = self.dev.call("event query", || {
            self.retire(&mut inner, false);
            Ok(())
        });
    }
}

impl<R: Runtime> Stream for GpuStream<R> {
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
        let d = self.addr(dst, "dst", dst_offset, len)?;
        self.host_copy(
            true,
            (src, "src", src_offset),
            (d, dst.use_on(self.use_key())),
            len,
        )
    }

    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        let len = src.len() as u64;
        self.addr(dst, "dst", dst_offset, len)?;
        let staging = self.dev.alloc_host_internal(src.len())?;
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
        let s = self.addr(src, "src", src_offset, len)?;
        self.host_copy(
            false,
            (dst, "dst", dst_offset),
            (s, src.use_on(self.use_key())),
            len,
        )
    }

    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let s = self.addr(src, "src", src_offset, len)?;
        let d = self.addr(dst, "dst", dst_offset, len)?;
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
        let key = self.use_key();
        let keep: Vec<Keep> = vec![src.use_on(key), dst.use_on(key)];
        let rt = self.rt();
        self.submit("copy d2d", keep, |st| {
            // SAFETY: both ranges were checked against live allocations held by `keep`, and are
            // disjoint.
            unsafe { rt.copy_d2d(d, s, len as usize, st) }
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
        let sa = src.downcast_allocation::<GpuAllocation<R>>("src")?;
        let da = dst.downcast_allocation::<GpuAllocation<R>>("dst")?;
        let scope = self.scope();
        graph_scope::<R>(src, "src", scope)?;
        graph_scope::<R>(dst, "dst", scope)?;
        let s = src.check_use("src", src.device(), src_offset, len)?;
        let d = dst.check_use("dst", dst.device(), dst_offset, len)?;
        if src.device() == dst.device() {
            // Both on this device: an ordinary copy (with its overlap check).
            return self.copy_d2d(src, src_offset, dst, dst_offset, len);
        }
        if len == 0 {
            return Ok(());
        }
        let far = if src.device() == me {
            &da.core
        } else {
            &sa.core
        };
        self.dev.enable_peer(far)?;
        let (src_core, dst_core) = (&sa.core.clone(), &da.core.clone());
        let key = self.use_key();
        let keep: Vec<Keep> = vec![src.use_on(key), dst.use_on(key)];
        let rt = self.rt();
        self.submit("copy peer", keep, |st| {
            // SAFETY: both ranges were checked against live allocations of their devices, held by
            // `keep`; the contexts are those devices'.
            unsafe { rt.copy_peer((&dst_core.ctx, d), (&src_core.ctx, s), len as usize, st) }
        })
    }

    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        let d = self.addr(dst, "dst", offset, len)?;
        value.check_aligned(d, len)?;
        let w = value.width();
        if len == 0 {
            return Ok(());
        }
        let n = (len / w) as usize;
        let rt = self.rt();
        self.submit("fill", vec![dst.use_on(self.use_key())], |s| {
            // SAFETY: the range was checked (and its alignment) and the buffer is kept.
            unsafe { rt.fill(d, value, n, s) }
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
            .downcast_ref::<GpuFunction<R>>()
            .ok_or_else(|| {
                HalError::invalid(
                    "function",
                    Invalid::ForeignHandle {
                        expected: format!("{} function", R::VENDOR),
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
        let scope = self.scope();
        for b in args.buffers() {
            graph_scope::<R>(b, "args", scope)?;
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
        let key = self.use_key();
        let mut keep: Vec<Keep> = args.buffers().iter().map(|b| b.use_on(key)).collect();
        keep.push(Box::new(function.clone()));
        let (g, b) = (config.grid, config.block);
        let rt = self.rt();
        self.submit("launch", keep, |s| {
            // SAFETY: the caller vouches for the arguments' meaning (this fn is unsafe); their
            // sizes match the kernel's parameters where known; the runtime copies the values
            // during the call; the buffers they name are kept until the kernel ran.
            unsafe {
                rt.launch(
                    f.raw,
                    [g.x, g.y, g.z],
                    [b.x, b.y, b.z],
                    config.shared_mem_bytes,
                    s,
                    &mut params,
                )
            }
        })
    }

    fn run_op(&self, call: &OpCall) -> Result<()> {
        for t in &call.tensors {
            self.addr(&t.buffer, "tensors", 0, 0)?;
        }
        let caps = self.dev.capabilities();
        if let Some(d) = call.key_dtype() {
            if !caps.supports(call.op, d) {
                return Err(HalError::unsupported(format!("op {} in {d}", call.op)));
            }
        }
        // Captured ops run the portable kernels: a BLAS call would use its handle's workspace,
        // which belongs to this stream's later work while a replay may run on another stream.
        let capturing = self.inner.lock().capture().is_some();
        if call.op == unihal_hal::OpId::Matmul && !self.rt().blas_dtypes().is_empty() && !capturing
        {
            let rt = self.rt();
            // SAFETY: run_blas hands over a call from BlasCall::of, with the operands kept until
            // the work ran, under the stream's bound handle (blas_gemm's contract).
            let gemm = |h: &R::Blas, bc: &crate::gemm::BlasCall| unsafe { rt.blas_gemm(h, bc) };
            if let Some(r) = crate::gemm::run_blas(self, call, rt.blas_dtypes(), gemm) {
                return r;
            }
        }
        if let Some(r) = self.rt().vendor_op(self, call) {
            return r;
        }
        let mut plan = unihal_kernels::plan::plan(call, &caps.mandatory)?;
        if plan.launches.is_empty() {
            return Ok(()); // no elements
        }
        // Without a kernel library (no runtime compiler) an op is supported only through the
        // vendor's library (BLAS matmul): a call it does not take is unsupported, not a failure.
        let lib = self.dev.library().map_err(|e| match e {
            HalError::Unavailable { what, reason } => HalError::unsupported(format!(
                "op {} with these operands: the vendor library does not take them and the \
                 kernel library is unavailable ({what}: {reason})",
                call.op
            )),
            e => e,
        })?;
        let functions = plan
            .launches
            .iter()
            .map(|l| lib.function(&l.kernel))
            .collect::<Result<Vec<_>>>()?;
        // Scratch memory of the plan, zeroed in stream order, kept until the launches ran.
        let scratch = if plan.scratch_bytes > 0 {
            let s = self.dev.alloc_internal(plan.scratch_bytes as usize)?;
            self.fill(&s, 0, plan.scratch_bytes, FillValue::U8(0))?;
            plan.bind_scratch(s.device_addr());
            Some(s)
        } else {
            None
        };
        let launched = functions.iter().zip(&plan.launches).try_for_each(|(f, l)| {
            let mut args = KernelArgs::new();
            args.push(l.args);
            // SAFETY: the plan validated every operand against its buffer (the HAL's rules)
            // and built the entry's one `uh_args` parameter; the buffers are kept below.
            unsafe { self.launch(f, &l.config, &args) }
        });
        // Kept also when a later launch failed: the earlier ones are queued.
        let key = self.use_key();
        let mut keep: Vec<Keep> = call.tensors.iter().map(|t| t.buffer.use_on(key)).collect();
        if let Some(s) = scratch {
            keep.push(Box::new(s));
        }
        let kept = self.keep(keep);
        launched.and(kept)
    }

    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        // When the callback runs, everything queued before it has completed: the host buffers
        // that work used are free again, so the callback may map them. Their uses are released
        // in the callback (a host-side counter); the handles themselves stay with the stream,
        // since freeing memory would call the runtime, which a host function must not do. They
        // are taken only once the stream is known healthy (the sticky check comes first) and
        // given back if the callback cannot be queued.
        let failed = self.callback_error.clone();
        let rt = self.rt();
        self.submit_locked("host callback", Vec::new(), |inner, s, _| {
            self.refuse_in_capture(
                inner,
                "f",
                "host_callback",
                "a host callback runs once (the HAL's callback is FnOnce) and a graph would run \
                 it at every replay: host callbacks are not captured (GraphCaps::host_callbacks \
                 is false)",
            )?;
            let uses = Arc::new(Mutex::new(inner.kept.take_host_uses()));
            let taken = uses.clone();
            let r = launch_host_fn(
                rt,
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
                    Err(e)
                }
            }
        })
    }

    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let e = GpuEvent::<R>::of(event.as_ref(), "event")?;
        if e.device_id() != self.id() {
            return Err(HalError::invalid(
                "event",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: e.device_id(),
                },
            ));
        }
        let rt = self.rt();
        self.submit_locked(
            "event record",
            vec![Box::new(event.clone())],
            |inner, s, _| {
                rt.event_record(e.raw, s)?;
                // Recorded in a capture: a point of the graph, which streams that wait for it join.
                *e.capture.lock() = inner.capture().cloned();
                Ok(())
            },
        )?;
        e.recorded.store(true, Ordering::Release);
        Ok(())
    }

    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let e = GpuEvent::<R>::of(event.as_ref(), "event")?;
        let rt = self.rt();
        let joins = e.recorded_in();
        self.submit_locked(
            "stream wait event",
            vec![Box::new(event.clone())],
            |inner, s, _| {
                rt.stream_wait_event(s, e.raw)?;
                // Waiting for a point of an active capture joins it (the runtime's rule): later
                // work here is captured until that capture ends.
                if let Some(c) = joins {
                    if inner.capture().is_none() {
                        inner.capture = Some(c);
                    }
                }
                Ok(())
            },
        )
    }

    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        // (The lock is released before the allocation node is enqueued.)
        let capture = self.inner.lock().capture().cloned();
        if let Some(c) = capture {
            return self.graph_alloc(&c, len);
        }
        if !self.dev.capabilities().optional.stream_ordered_alloc {
            // Memory that exists now is valid for work enqueued after this call.
            return self.dev.alloc(len);
        }
        if let Some(e) = self.sticky(&mut self.inner.lock()) {
            return Err(e);
        }
        // From the device's default pool, in this stream's order. The buffer's release is a
        // plain free once no queued work holds it, which the runtimes document as not
        // synchronising for pool memory.
        let rt = self.rt();
        if let Some(r) = rt.stream_alloc(self, len) {
            return r;
        }
        self.dev
            .alloc_with("alloc async", len, true, || rt.malloc_async(len, self.raw))
    }

    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        self.addr(buffer, "buffer", 0, 0)?;
        let graph = buffer
            .downcast_allocation::<GpuAllocation<R>>("buffer")?
            .graph;
        if graph.is_some() {
            // A graph allocation of the capture this stream is in (the scope check above):
            // a free node.
            return self.graph_free(buffer);
        }
        buffer.mark_free_enqueued("buffer")?;
        // The memory returns when the last handle (queued work holds its own) is dropped; in a
        // capture, the capture and then its graph hold one while they live.
        self.keep(vec![buffer.use_on(self.use_key())])
    }

    fn synchronize(&self) -> Result<()> {
        let r = self.synchronize_inner();
        crate::deferred::flush();
        r
    }

    fn query(&self) -> Result<bool> {
        crate::deferred::refuse_in_callback(R::VENDOR, "stream query")?;
        let mut inner = self.inner.lock();
        if let Some(e) = self.sticky(&mut inner) {
            return Err(e);
        }
        let rt = self.rt();
        let capture = inner.capture().map(|c| c.id);
        self.dev
            .call("stream query", || match rt.stream_query(self.raw) {
                Ok(done) => {
                    self.retire(&mut inner, done);
                    Ok(done)
                }
                Err(e) => {
                    if rt.poisons(&e) {
                        inner.sticky = Some(e.clone());
                    }
                    Err(e)
                }
            })
            // While capturing, the runtime refuses (and invalidates the capture).
            .map_err(|e| self.capture_error(e, capture))
    }

    fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let graphs = &self.dev.capabilities().optional.graphs;
        if !graphs.available() {
            return Err(HalError::unsupported(format!(
                "stream capture on {}: {}",
                self.id(),
                graphs.note
            )));
        }
        crate::deferred::refuse_in_callback(R::VENDOR, "begin capture")?;
        let mut inner = self.inner.lock();
        if let Some(e) = self.sticky(&mut inner) {
            return Err(e);
        }
        let already = |c: Option<CaptureId>| {
            refused(
                "stream",
                "begin_capture",
                c,
                "the stream is already capturing (it began or joined a capture); end that \
                 capture first",
            )
        };
        if let Some(c) = inner.capture() {
            return Err(already(Some(c.id)));
        }
        let rt = self.rt();
        let raw = self.raw;
        let vendor = self.dev.call("stream begin capture", || {
            match rt.stream_capture_info(raw)? {
                RawCaptureStatus::None => {}
                RawCaptureStatus::Active(v) | RawCaptureStatus::Invalidated(v) => {
                    return Err(already(self.dev.capture_by_vendor_id(v).map(|c| c.id)));
                }
            }
            rt.stream_begin_capture(raw, mode)
                .map_err(|e| self.capture_error(e, None))?;
            match rt.stream_capture_info(raw) {
                Ok(RawCaptureStatus::Active(v)) => Ok(v),
                other => {
                    // Never leave the vendor's stream capturing without a record of it (its
                    // work would never run and Device::alloc would stay refused): end it and
                    // destroy what the end returns.
                    if let Ok(g) = rt.stream_end_capture(raw) {
                        if !g.0.is_null() {
                            // SAFETY: `g` was just returned by the end of this stream's capture
                            // and is owned by nobody else.
                            let _ = unsafe { rt.graph_destroy(g) };
                        }
                    }
                    Err(match other {
                        Err(e) => e,
                        Ok(s) => HalError::Internal(format!(
                            "{} reports {s:?} right after beginning a capture",
                            R::VENDOR
                        )),
                    })
                }
            }
        })?;
        let rec = CaptureRec::begin(CaptureId::fresh(), vendor, mode, self.sid);
        self.dev.capture_begun(rec.clone());
        inner.capture = Some(rec);
        Ok(())
    }

    fn end_capture(&self) -> Result<Arc<dyn Graph>> {
        crate::deferred::refuse_in_callback(R::VENDOR, "end capture")?;
        let mut inner = self.inner.lock();
        let rec = match inner.capture() {
            Some(c) if c.origin == self.sid => c.clone(),
            Some(c) => {
                return Err(refused(
                    "stream",
                    "end_capture",
                    Some(c.id),
                    "this stream joined the capture; only the stream that began it ends it",
                ))
            }
            None => {
                return Err(refused(
                    "stream",
                    "end_capture",
                    None,
                    "the stream did not begin a capture (or its capture has ended)",
                ))
            }
        };
        let rt = self.rt();
        let raw = self.raw;
        // The graph owns its allocations: what the capture did not free gets a free node here,
        // after every captured node (the joined streams rejoined this one), so no allocation
        // escapes a replay; every handle is unusable from now on.
        let allocs = rec.take_allocs();
        let mem_nodes = !allocs.is_empty();
        let mut freed = Ok(());
        for a in &allocs {
            if !a.freed && freed.is_ok() {
                freed = self.dev.call("free async", || {
                    // SAFETY: a graph allocation of this capture (allocated on a stream in it),
                    // not freed in it, freed once; nothing is captured after this point.
                    unsafe { rt.free_async(a.ptr, raw) }
                });
            }
            let _ = a.buffer.mark_free_enqueued("buffer");
        }
        drop(allocs);
        let ended = self
            .dev
            .call("stream end capture", || rt.stream_end_capture(raw));
        let ended = match (freed, ended) {
            (Ok(()), ended) => ended,
            (Err(e), Ok(graph)) => {
                // A graph whose allocation would escape its replays is not made.
                let r = self.dev.call("graph destroy", || {
                    // SAFETY: the graph just returned by end_capture, destroyed once, never
                    // instantiated.
                    unsafe { rt.graph_destroy(graph) }
                });
                if let Err(d) = r {
                    tracing::warn!(target: "unihal::device", "{d}; the graph is leaked");
                }
                Err(e)
            }
            (Err(e), Err(_)) => Err(e),
        };
        let hooks = rec.take_hooks();
        // Ended whatever the outcome: every stream of the capture has left it.
        let kept = rec.end();
        self.dev.capture_ended(&rec);
        inner.capture = None;
        drop(inner);
        let graph = match ended {
            Ok(g) => g,
            Err(e) => {
                // Nothing captured will ever run: what it used is released now.
                drop(kept);
                return Err(rt.capture_error(e, "stream", &|| Some(rec.id)));
            }
        };
        let nodes = match self.dev.call("graph nodes", || rt.graph_node_count(graph)) {
            Ok(n) => n,
            Err(e) => {
                let r = self.dev.call("graph destroy", || {
                    // SAFETY: the graph just returned by end_capture, destroyed once, never
                    // instantiated.
                    unsafe { rt.graph_destroy(graph) }
                });
                if let Err(d) = r {
                    tracing::warn!(target: "unihal::device", "{d}; the graph is leaked");
                }
                drop(kept);
                return Err(e);
            }
        };
        Ok(GpuGraph::new(
            self.dev.clone(),
            rec.id,
            graph,
            nodes,
            kept,
            mem_nodes,
            hooks,
        )?)
    }

    fn capture_status(&self) -> CaptureStatus {
        if !self.dev.capabilities().optional.graphs.available() {
            return CaptureStatus::None;
        }
        let ours = self.inner.lock().capture().cloned();
        let rt = self.rt();
        let raw = self.raw;
        let id = |v: u64| {
            ours.as_ref()
                .filter(|c| c.vendor == v)
                .cloned()
                .or_else(|| self.dev.capture_by_vendor_id(v))
                .map(|c| c.id)
        };
        match self
            .dev
            .call("stream capture info", || rt.stream_capture_info(raw))
        {
            Ok(RawCaptureStatus::None) => CaptureStatus::None,
            Ok(RawCaptureStatus::Active(v)) => {
                id(v).map_or(CaptureStatus::None, CaptureStatus::Active)
            }
            Ok(RawCaptureStatus::Invalidated(v)) => {
                id(v).map_or(CaptureStatus::None, CaptureStatus::Invalidated)
            }
            // The runtime could not be asked (the device cannot be made current, or inside a
            // host callback): what the backend knows.
            Err(_) => ours.map_or(CaptureStatus::None, |c| CaptureStatus::Active(c.id)),
        }
    }

    fn launch_graph(&self, graph: &Arc<dyn Graph>) -> Result<()> {
        let g = GpuGraph::<R>::of(graph)?;
        if g.device_id() != self.id() {
            return Err(HalError::invalid(
                "graph",
                Invalid::WrongDevice {
                    expected: self.id(),
                    found: g.device_id(),
                },
            ));
        }
        let rt = self.rt();
        let exec = g.exec();
        // The replay keeps the graph (and so what its work uses) until it ran; the runtime
        // orders it after earlier launches of the same executable, on any stream.
        self.submit_locked(
            "graph launch",
            vec![Box::new(graph.clone())],
            |inner, s, _| {
                self.refuse_in_capture(
                    inner,
                    "graph",
                    "launch_graph",
                    "graphs are not launched inside a capture here (no nested graphs)",
                )?;
                rt.graph_launch(exec, s)
            },
        )?;
        // After the launch, outside the stream's lock (a hook records an event on it).
        if let Some(me) = self.handle() {
            g.launched(&me);
        }
        Ok(())
    }

    fn read(&self, src: &Buffer, src_offset: u64, out: &mut [u8]) -> Result<()> {
        // The staging memory is the backend's own (never refused by a capture): what a capture
        // refuses here is the synchronisation.
        let staging = self.dev.alloc_host_internal(out.len())?;
        self.copy_d2h(src, src_offset, &staging, 0, out.len() as u64)?;
        self.synchronize()?;
        out.copy_from_slice(&staging.map()?);
        Ok(())
    }

    fn async_error(&self) -> Option<HalError> {
        self.sticky(&mut self.inner.lock())
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.raw.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for GpuStream<R> {
    fn drop(&mut self) {
        let parts = std::mem::take(&mut self.inner.get_mut().kept).into_parts();
        let keep = parts.keep;
        let events = parts.events;
        let blas = self.blas.get_mut().take();
        let capture = self.inner.get_mut().capture.take();
        let (dev, raw, sid) = (self.dev.clone(), self.raw, self.sid);
        crate::deferred::release(move || {
            let rt = dev.rt();
            dev.core.clone().release("stream destroy", move || {
                if let Some(c) = capture.filter(|c| c.active()) {
                    if c.origin == sid {
                        // Dropped while capturing: the capture ends unused (nothing captured
                        // runs), so the host function below is not captured.
                        if let Ok(g) = rt.stream_end_capture(raw) {
                            // SAFETY: the graph just returned, destroyed once, never
                            // instantiated.
                            let _ = unsafe { rt.graph_destroy(g) };
                        }
                        drop(c.end());
                        dev.capture_ended(&c);
                    }
                    // Still in a capture (joined to one it cannot end, or the end was refused):
                    // a host function would be captured (and run at each replay), and a query
                    // would invalidate the capture. What the stream's real work used is leaked
                    // on purpose (never freed under that work); the runtime releases the
                    // stream itself once its work ran.
                    if !matches!(rt.stream_capture_info(raw), Ok(RawCaptureStatus::None)) {
                        tracing::warn!(target: "unihal::device",
                            "a stream in {} was dropped during the capture; what its work used \
                             is leaked", c.id);
                        std::mem::forget(keep);
                        if let Some(h) = blas {
                            std::mem::forget(h);
                        }
                        std::mem::forget(events);
                        // SAFETY: a live stream, destroyed once.
                        return unsafe { rt.stream_destroy(raw) };
                    }
                }
                // Never wait here for queued work: it may wait for something the caller does
                // only later (an event, a flag). What it uses is released by a host function
                // queued behind it; the runtime releases the stream itself once its work ran.
                let release = move || {
                    drop(keep);
                    if let Some(h) = blas {
                        dev.blas_pool.lock().push(h);
                    }
                    crate::deferred::release(move || {
                        for ev in events {
                            // SAFETY: events of this stream whose records have completed,
                            // destroyed once.
                            let _ = unsafe { rt.event_destroy(ev) };
                        }
                    });
                };
                if let Err((e, release)) = launch_host_fn(rt, raw, Box::new(release)) {
                    match rt.stream_query(raw) {
                        // Nothing of the stream runs any more: its work completed, or it failed
                        // and the runtime stopped it (a runtime refuses a host function on such
                        // a stream, ACL's among them). What it kept is released now.
                        Ok(true) | Err(_) => release(),
                        // Queued work may still use what the stream kept, and waiting for it
                        // here could hang: leaked on purpose (memory, handles, host-buffer uses).
                        Ok(false) => {
                            std::mem::forget(release);
                            tracing::warn!(target: "unihal::device",
                                "stream release: {e}; what its work used is leaked");
                        }
                    }
                }
                // SAFETY: a live stream, destroyed once; the runtime lets queued work finish.
                unsafe { rt.stream_destroy(raw) }
            });
        });
    }
}

/// A host function that was not queued, given back with the runtime's error.
type NotLaunched = (HalError, Box<dyn FnOnce() + Send>);

/// Queues `f` on `stream` as a host function: it runs once everything queued before it has
/// completed, with the runtime calls its releases would make deferred (a host function must not
/// call the runtime) and panics caught (callers that report them catch them first). When the
/// launch fails, `f` comes back unrun.
fn launch_host_fn<R: Runtime>(
    rt: &R,
    stream: Raw,
    f: Box<dyn FnOnce() + Send>,
) -> std::result::Result<(), NotLaunched> {
    unsafe extern "C" fn trampoline(data: *mut std::ffi::c_void) {
        // SAFETY: `data` came from Box::into_raw below and the runtime calls this once.
        let call = unsafe { Box::from_raw(data as *mut Box<dyn FnOnce() + Send>) };
        crate::deferred::as_callback(|| {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(call));
        });
    }
    let data = Box::into_raw(Box::new(f));
    // SAFETY: a live stream; `trampoline` takes ownership of `data` when called, once.
    let r = unsafe { rt.launch_host_fn(stream, trampoline, data as *mut _) };
    r.map_err(|e| {
        // Not queued: the runtime will never call it.
        // SAFETY: from Box::into_raw above, not handed to the runtime.
        (e, *unsafe { Box::from_raw(data) })
    })
}

/// Whether a tracking event's record has completed (an error, e.g. no current device on a
/// failed synchronisation's path, counts as not: its batch stays kept until a synchronisation).
/// The retention hands out only events of batches it still holds, destroyed only after the
/// stream's final release, so the handle is live on every path.
fn event_done<R: Runtime>(rt: &R, ev: Raw) -> bool {
    matches!(rt.event_query(ev), Ok(true))
}
