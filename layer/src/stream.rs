//! Wrapped streams and events: every enqueue is tracked, every wait and synchronisation moves
//! the clocks.

use crate::layer::{Layer, Traced};
use crate::trace::timeline::{FlowEnd, Timeline};
use crate::trace::Detail;
use crate::validate::finding::{Finding, FindingKind, Site};
use crate::validate::tracker::{Clock, Space, Touch};
use parking_lot::Mutex;
use std::any::Any;
use std::panic::Location;
use std::sync::Arc;
use unihal_hal::{
    Buffer, CaptureMode, CaptureStatus, Device, DeviceId, Event, FillValue, Function, Graph,
    HostBuffer, KernelArgs, LaunchConfig, NativeHandle, OpCall, OpId, Result, Stream, StreamId,
};

/// True when `r` is a synchronisation the capture rules refused: it waited for nothing, so the
/// host learns nothing from it.
pub(crate) fn refused_by_capture<T>(r: &Result<T>) -> bool {
    matches!(
        r,
        Err(unihal_hal::HalError::InvalidArgument {
            reason: unihal_hal::Invalid::Capture { .. },
            ..
        })
    )
}

/// A copy's trace detail.
fn copy(direction: &'static str, len: u64) -> Detail {
    Detail::new(format!("copy {direction}"), "copy")
        .arg("direction", direction)
        .bytes(len)
}

/// A kernel launch's trace detail.
fn launch_detail(function: &Arc<dyn Function>, config: &LaunchConfig) -> Detail {
    let (g, b) = (config.grid, config.block);
    Detail::new(function.name().to_owned(), "kernel")
        .arg("grid", format!("{}x{}x{}", g.x, g.y, g.z))
        .arg("block", format!("{}x{}x{}", b.x, b.y, b.z))
        .arg("shared memory", config.shared_mem_bytes)
}

/// A library op's trace detail: its operands' shapes and dtypes, the bytes they span, and the
/// FLOPs of a matmul (2·M·N·K per batch: the count every GEMM benchmark uses).
fn op_detail(call: &OpCall) -> Detail {
    let shapes: Vec<String> = call
        .tensors
        .iter()
        .map(|t| format!("{}{:?}", t.dtype, t.shape))
        .collect();
    let bytes: u64 = call
        .tensors
        .iter()
        .map(|t| t.numel().saturating_mul(t.dtype.size() as u64))
        .fold(0, u64::saturating_add);
    let mut d = Detail::new(call.op.name(), "op")
        .arg("operands", shapes.join(", "))
        .arg("bytes", bytes);
    if call.op == OpId::Matmul {
        if let (Some(a), Some(out)) = (call.tensors.first(), call.tensors.last()) {
            let k = a.shape.last().copied().unwrap_or(0);
            let flops = out.numel().saturating_mul(k).saturating_mul(2);
            d = d.arg("FLOPs", flops);
        }
    }
    d
}

/// A touch of `len` bytes at `offset` of a device buffer view.
pub(crate) fn device_touch(
    arg: &'static str,
    buf: &Buffer,
    offset: u64,
    len: u64,
    write: bool,
) -> Touch {
    let base = buf.device_addr().wrapping_sub(buf.offset());
    let start = buf.device_addr().saturating_add(offset);
    Touch {
        space: Space::Device(buf.device()),
        base,
        start,
        end: start.saturating_add(len),
        write,
        arg,
        refused_by_hal: buf.is_free_enqueued() || !fits(offset, len, buf.len()),
    }
}

/// True when `[offset, offset + len)` lies inside a view of `size` bytes. A range that does not
/// is the HAL's to refuse (`OutOfRange`): it makes no finding, so that the program sees the
/// HAL's own error, also in error mode.
fn fits(offset: u64, len: u64, size: u64) -> bool {
    offset.checked_add(len).is_some_and(|end| end <= size)
}

/// The touches of a device-to-device copy: `src` read, `dst` written.
fn device_copy(
    src: &Buffer,
    src_offset: u64,
    dst: &Buffer,
    dst_offset: u64,
    len: u64,
) -> [Touch; 2] {
    [
        device_touch("src", src, src_offset, len, false),
        device_touch("dst", dst, dst_offset, len, true),
    ]
}

fn host_touch(arg: &'static str, buf: &HostBuffer, offset: u64, len: u64, write: bool) -> Touch {
    let base = buf.host_addr() as u64;
    let start = base.saturating_add(offset);
    Touch {
        space: Space::Host,
        base,
        start,
        end: start.saturating_add(len),
        write,
        arg,
        refused_by_hal: !fits(offset, len, buf.len() as u64),
    }
}

/// The finding of a handle the layer did not make: `what` ("an event") of `device`, at `site`.
pub(crate) fn foreign(what: &str, device: DeviceId, site: Site) -> Finding {
    Finding {
        kind: FindingKind::ForeignHandle,
        message: format!(
            "{what} of {device} did not come through this validation layer (another backend \
             instance, or the unwrapped backend): the ordering it carries is invisible to the \
             layer and backends need not define it"
        ),
        site,
        earlier: None,
    }
}

/// A stream of a [`crate::LayerDevice`].
///
/// Ownership: owns the backend's stream; keeps its (wrapped) device alive. Thread safety: any
/// thread; enqueues on one stream are serialised by the wrapper.
pub struct LayerStream {
    inner: Arc<dyn Stream>,
    device: Arc<dyn Device>,
    layer: Arc<Layer>,
    key: u64,
    enqueue: Mutex<()>,
    /// The stream's device spans and its device's process, when tracing.
    timeline: Option<(u32, Arc<Mutex<Timeline>>)>,
}

impl LayerStream {
    pub(crate) fn new(
        inner: Arc<dyn Stream>,
        device: Arc<dyn Device>,
        layer: Arc<Layer>,
        pid: Option<u32>,
    ) -> Self {
        let key = inner.stream_id().get();
        layer.tracker.lock().stream_created(key, device.id());
        let timeline = match (&layer.trace, pid) {
            (Some(t), Some(pid)) => {
                let backend_device = crate::backend::inner_device(&device);
                let line = Timeline::new(t, backend_device, inner.as_ref(), pid, key);
                Some((pid, t.timeline(line, pid, key)))
            }
            _ => None,
        };
        LayerStream {
            inner,
            device,
            layer,
            key,
            enqueue: Mutex::new(()),
            timeline,
        }
    }

    /// The device's process in the trace, when tracing.
    fn pid(&self) -> Option<u32> {
        self.timeline.as_ref().map(|t| t.0)
    }

    fn traced(&self) -> Option<Traced<'_>> {
        self.timeline.as_ref().map(|(pid, t)| Traced {
            pid: *pid,
            timeline: t,
            inner: self.inner.as_ref(),
        })
    }

    /// Host time now, when this stream is traced.
    /// `None` too while the stream is capturing: the timeline's device spans are events recorded
    /// on the stream and queried later, which a capture would record into its graph (and the
    /// query would invalidate it); captured work gets its spans at the replays, which the
    /// timeline does not follow yet.
    fn start(&self) -> Option<u64> {
        if self.inner.capture_status() != CaptureStatus::None {
            return None;
        }
        self.timeline
            .as_ref()
            .and(self.layer.trace.as_ref())
            .map(|t| t.now())
    }

    /// After a call the backend accepted at `start` that the validation model follows itself
    /// (records, waits, host callbacks): its host span and device span.
    fn after(
        &self,
        start: Option<u64>,
        what: &'static str,
        detail: impl FnOnce() -> Detail,
        flow: Option<FlowEnd>,
    ) {
        if let (Some(t), Some(start), Some((pid, line))) =
            (&self.layer.trace, start, &self.timeline)
        {
            t.host_span(*pid, start, what);
            // A wait on an event of a capture has just made the stream join it (see `start`).
            if self.inner.capture_status() == CaptureStatus::None {
                line.lock()
                    .after(t, self.inner.as_ref(), start, detail(), flow);
            }
        }
    }

    /// Resolves the device spans that completed (after a synchronisation or a query).
    fn resolve(&self) {
        if let (Some(t), Some((_, line))) = (&self.layer.trace, &self.timeline) {
            line.lock().resolve(t);
        }
    }

    /// The backend's stream.
    pub fn inner(&self) -> &Arc<dyn Stream> {
        &self.inner
    }

    /// One tracked enqueue (see `Layer::enqueue`), serialised with this stream's others.
    pub(crate) fn tracked(
        &self,
        what: &'static str,
        site: Site,
        touches: &[Touch],
        detail: impl FnOnce() -> Detail,
        call: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let _order = self.enqueue.lock();
        if self.inner.capture_status() != CaptureStatus::None {
            // Recorded into a graph, not run: its touches happen at the replays, which the
            // tracker does not follow yet (docs/ARCHITECTURE.md, graphs); tracking them now would
            // report races with work that never ran.
            return call();
        }
        let traced = self.traced();
        self.layer
            .enqueue(self.key, what, site, touches, traced, detail, None, call)
    }

    /// `stream` as the backend must see it: `Ours` for a stream of this layer, otherwise the
    /// stream itself (the backend's for another layer's) with the finding it makes.
    pub(crate) fn unwrap_arg<'a>(
        layer: &Arc<Layer>,
        stream: &'a Arc<dyn Stream>,
        site: Site,
    ) -> Arg<'a, dyn Stream, LayerStream> {
        let dev = stream.device_id();
        match stream.as_any().downcast_ref::<LayerStream>() {
            Some(v) if Arc::ptr_eq(&v.layer, layer) => Arg::Ours(&v.inner, v),
            Some(v) => Arg::Foreign(
                &v.inner,
                foreign("a stream of another validated backend", dev, site),
            ),
            None => Arg::Foreign(stream, foreign("a stream", dev, site)),
        }
    }

    fn event_arg<'a>(
        &self,
        event: &'a Arc<dyn Event>,
        site: Site,
    ) -> Arg<'a, dyn Event, LayerEvent> {
        let dev = event.device_id();
        match event.as_any().downcast_ref::<LayerEvent>() {
            Some(v) if Arc::ptr_eq(&v.layer, &self.layer) => Arg::Ours(&v.inner, v),
            Some(v) => Arg::Foreign(
                &v.inner,
                foreign("an event of another validated backend", dev, site),
            ),
            None => Arg::Foreign(event, foreign("an event", dev, site)),
        }
    }
}

/// A handle argument as the backend must see it.
pub(crate) enum Arg<'a, T: ?Sized, W> {
    /// One of this layer's: the backend's handle and the wrapper.
    Ours(&'a Arc<T>, &'a W),
    /// Not this layer's: the handle to pass on and the finding it makes if the backend accepts it.
    Foreign(&'a Arc<T>, Finding),
}

impl<'a, T: ?Sized, W> Arg<'a, T, W> {
    /// Calls the backend with the handle: a foreign one is reported once the backend accepted
    /// it, in either mode (a backend that refuses it already said so).
    pub(crate) fn call<R>(
        self,
        layer: &Layer,
        f: impl FnOnce(&'a Arc<T>, Option<&'a W>) -> Result<R>,
    ) -> Result<R> {
        match self {
            Arg::Ours(inner, w) => f(inner, Some(w)),
            Arg::Foreign(inner, finding) => {
                // In both modes the backend judges the handle first: one it did not make it
                // refuses with its own typed error (no finding, as for every refused call);
                // one it accepts (its own, unwrapped) is reported, in error mode too, because an
                // accepted call cannot be taken back and the layer cannot tell the two apart
                // before the backend has.
                let r = f(inner, None)?;
                layer.report(vec![finding]);
                Ok(r)
            }
        }
    }
}

impl Drop for LayerStream {
    fn drop(&mut self) {
        self.layer.tracker.lock().stream_dropped(self.key);
        // What completed is written now; the rest stays with the trace until its end.
        self.resolve();
    }
}

impl Stream for LayerStream {
    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn stream_id(&self) -> StreamId {
        self.inner.stream_id()
    }

    #[track_caller]
    fn copy_h2d(
        &self,
        src: &HostBuffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let touches = [
            host_touch("src", src, src_offset, len, false),
            device_touch("dst", dst, dst_offset, len, true),
        ];
        self.tracked(
            "copy_h2d",
            Location::caller(),
            &touches,
            || copy("H2D", len),
            || self.inner.copy_h2d(src, src_offset, dst, dst_offset, len),
        )
    }

    #[track_caller]
    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        let touches = [device_touch("dst", dst, dst_offset, src.len() as u64, true)];
        self.tracked(
            "copy_h2d_staged",
            Location::caller(),
            &touches,
            || copy("H2D (staged)", src.len() as u64),
            || self.inner.copy_h2d_staged(src, dst, dst_offset),
        )
    }

    #[track_caller]
    fn copy_d2h(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &HostBuffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let touches = [
            device_touch("src", src, src_offset, len, false),
            host_touch("dst", dst, dst_offset, len, true),
        ];
        self.tracked(
            "copy_d2h",
            Location::caller(),
            &touches,
            || copy("D2H", len),
            || self.inner.copy_d2h(src, src_offset, dst, dst_offset, len),
        )
    }

    #[track_caller]
    fn copy_d2d(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let touches = device_copy(src, src_offset, dst, dst_offset, len);
        self.tracked(
            "copy_d2d",
            Location::caller(),
            &touches,
            || copy("D2D", len),
            || self.inner.copy_d2d(src, src_offset, dst, dst_offset, len),
        )
    }

    #[track_caller]
    fn copy_peer(
        &self,
        src: &Buffer,
        src_offset: u64,
        dst: &Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<()> {
        let touches = device_copy(src, src_offset, dst, dst_offset, len);
        self.tracked(
            "copy_peer",
            Location::caller(),
            &touches,
            || {
                copy("peer", len)
                    .arg("from", src.device().to_string())
                    .arg("to", dst.device().to_string())
            },
            || self.inner.copy_peer(src, src_offset, dst, dst_offset, len),
        )
    }

    #[track_caller]
    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        let touches = [device_touch("dst", dst, offset, len, true)];
        self.tracked(
            "fill",
            Location::caller(),
            &touches,
            || Detail::new("fill", "fill").bytes(len),
            || self.inner.fill(dst, offset, len, value),
        )
    }

    #[track_caller]
    unsafe fn launch(
        &self,
        function: &Arc<dyn Function>,
        config: &LaunchConfig,
        args: &KernelArgs,
    ) -> Result<()> {
        // What a kernel does with a buffer is invisible: every buffer it names counts as written.
        let touches: Vec<Touch> = args
            .buffers()
            .iter()
            .map(|b| device_touch("args", b, 0, b.len(), true))
            .collect();
        self.tracked(
            "launch",
            Location::caller(),
            &touches,
            || launch_detail(function, config),
            || {
                // SAFETY: the caller's promise for `launch` is passed on unchanged: the same function,
                // configuration and arguments reach the backend's stream.
                unsafe { self.inner.launch(function, config, args) }
            },
        )
    }

    #[track_caller]
    fn run_op(&self, call: &OpCall) -> Result<()> {
        let outs = call.outputs();
        let mut touches = Vec::with_capacity(call.tensors.len());
        for (k, t) in call.tensors.iter().enumerate() {
            // A view outside its buffer is refused by the backend: nothing to track. The span is
            // in device addresses.
            if let Ok(Some((lo, hi))) = t.byte_span("tensors") {
                let arg = if outs.contains(&k) { "output" } else { "input" };
                let from = lo.saturating_sub(t.buffer.device_addr());
                touches.push(device_touch(
                    arg,
                    &t.buffer,
                    from,
                    hi - lo,
                    outs.contains(&k),
                ));
            }
        }
        self.tracked(
            call.op.name(),
            Location::caller(),
            &touches,
            || op_detail(call),
            || self.inner.run_op(call),
        )
    }

    #[track_caller]
    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        // The callback runs once the work before it completed: what it (and whoever hears from
        // it) does next is ordered after that work.
        let _order = self.enqueue.lock();
        let captured = {
            let mut t = self.layer.tracker.lock();
            t.tick(self.key);
            t.snapshot(self.key)
        };
        let layer = self.layer.clone();
        // A host span only: a timing event after the callback would be work the program did
        // not enqueue, visible to a stream query made on the callback's own signal.
        let pid = self.pid();
        self.layer.host(pid, "host_callback", || {
            self.inner.host_callback(Box::new(move || {
                layer.tracker.lock().host_learns(&captured);
                f()
            }))
        })
    }

    #[track_caller]
    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let site = Location::caller();
        self.event_arg(event, site)
            .call(&self.layer, |inner, ours| {
                let _order = self.enqueue.lock();
                let start = self.start();
                self.layer.tracker.lock().tick(self.key);
                self.inner.record_event(inner)?;
                let mut flow = None;
                if let Some(v) = ours {
                    *v.clock.lock() = Some(self.layer.tracker.lock().snapshot(self.key));
                    if let (Some(t), Some(_)) = (&self.layer.trace, start) {
                        let id = t.next_flow();
                        *v.flow.lock() = Some(id);
                        flow = Some(FlowEnd { start: true, id });
                    }
                }
                if let (Some(t), Some(start), Some((pid, line))) =
                    (&self.layer.trace, start, &self.timeline)
                {
                    t.host_span(*pid, start, "record_event");
                    if let Some(f) = flow {
                        let d = Detail::new("record event", "event");
                        line.lock().after_record(t, start, d, f);
                    }
                }
                Ok(())
            })
    }

    #[track_caller]
    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        let site = Location::caller();
        self.event_arg(event, site)
            .call(&self.layer, |inner, ours| {
                let _order = self.enqueue.lock();
                let start = self.start();
                let captured = ours.and_then(|v| v.clock.lock().clone());
                self.inner.wait_event(inner)?;
                {
                    let mut t = self.layer.tracker.lock();
                    t.tick(self.key);
                    if let Some(c) = captured {
                        t.wait(self.key, &c);
                    }
                }
                let flow = ours
                    .and_then(|v| *v.flow.lock())
                    .map(|id| FlowEnd { start: false, id });
                self.after(
                    start,
                    "wait_event",
                    || Detail::new("wait event", "event"),
                    flow,
                );
                Ok(())
            })
    }

    #[track_caller]
    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        let b = self
            .layer
            .host(self.pid(), "alloc_async", || self.inner.alloc_async(len))?;
        crate::backend::allocated(&self.layer, &b);
        Ok(b)
    }

    #[track_caller]
    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        let site = Location::caller();
        let t = device_touch("buffer", buffer, 0, buffer.len(), true);
        let _order = self.enqueue.lock();
        self.layer
            .host(self.pid(), "free_async", || self.inner.free_async(buffer))?;
        self.layer
            .tracker
            .lock()
            .freed(buffer.device(), t.start, t.end, self.key, site);
        Ok(())
    }

    #[track_caller]
    fn synchronize(&self) -> Result<()> {
        // It returns once the work completed, also when it reports the stream's sticky error
        // (the failed work ran as far as it will).
        let captured = self.layer.tracker.lock().snapshot(self.key);
        let r = self
            .layer
            .host(self.pid(), "synchronize", || self.inner.synchronize());
        if !refused_by_capture(&r) {
            self.layer.tracker.lock().host_learns(&captured);
            self.resolve();
        }
        r
    }

    #[track_caller]
    fn query(&self) -> Result<bool> {
        let captured = self.layer.tracker.lock().snapshot(self.key);
        let done = self.inner.query()?;
        if done {
            self.layer.tracker.lock().host_learns(&captured);
            self.resolve();
        }
        Ok(done)
    }

    fn async_error(&self) -> Option<unihal_hal::HalError> {
        self.inner.async_error()
    }

    #[track_caller]
    fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        let _order = self.enqueue.lock();
        self.layer.host(self.pid(), "begin_capture", || {
            self.inner.begin_capture(mode)
        })
    }

    #[track_caller]
    fn end_capture(&self) -> Result<Arc<dyn Graph>> {
        let _order = self.enqueue.lock();
        self.layer
            .host(self.pid(), "end_capture", || self.inner.end_capture())
    }

    fn capture_status(&self) -> CaptureStatus {
        self.inner.capture_status()
    }

    #[track_caller]
    fn launch_graph(&self, graph: &Arc<dyn Graph>) -> Result<()> {
        // The replay's touches are not tracked (see `tracked`); it is ordered on the stream.
        let _order = self.enqueue.lock();
        self.layer.tracker.lock().tick(self.key);
        self.layer.host(self.pid(), "launch_graph", || {
            self.inner.launch_graph(graph)
        })
    }

    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An event of a [`crate::LayerDevice`]: the backend's event and the clock its last record
/// captured.
///
/// Ownership: owns the backend's event. Thread safety: any thread.
pub struct LayerEvent {
    inner: Arc<dyn Event>,
    layer: Arc<Layer>,
    clock: Mutex<Option<Clock>>,
    /// The trace's arrow of its last record, when tracing.
    flow: Mutex<Option<u64>>,
}

impl LayerEvent {
    pub(crate) fn new(inner: Arc<dyn Event>, layer: Arc<Layer>) -> Self {
        LayerEvent {
            inner,
            layer,
            clock: Mutex::new(None),
            flow: Mutex::new(None),
        }
    }

    /// The backend's event.
    pub fn inner(&self) -> &Arc<dyn Event> {
        &self.inner
    }

    /// The clock of the record a wait made now refers to.
    fn captured(&self) -> Option<Clock> {
        self.clock.lock().clone()
    }

    fn host_learns(&self, captured: Option<Clock>) {
        if let Some(c) = captured {
            self.layer.tracker.lock().host_learns(&c);
        }
    }
}

impl Event for LayerEvent {
    fn device_id(&self) -> DeviceId {
        self.inner.device_id()
    }

    fn query(&self) -> Result<bool> {
        let captured = self.captured();
        let done = self.inner.query()?;
        if done {
            self.host_learns(captured);
        }
        Ok(done)
    }

    fn synchronize(&self) -> Result<()> {
        // As a stream's: it returns once the work completed, also with the sticky error.
        let captured = self.captured();
        let r = self.inner.synchronize();
        if !refused_by_capture(&r) {
            self.host_learns(captured);
        }
        r
    }

    fn elapsed_ms(&self, end: &dyn Event) -> Result<f32> {
        match end.as_any().downcast_ref::<LayerEvent>() {
            Some(v) => self.inner.elapsed_ms(v.inner.as_ref()),
            None => self.inner.elapsed_ms(end),
        }
    }

    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
