//! Stream capture and graphs over a vendor runtime's graph API (CUDA graphs, HIP graphs).
//!
//! The vendor does the capturing: whether a stream is capturing, which calls a capture refuses
//! (and the invalidation they cause) and the order of replays all come from the runtime. What
//! this layer adds:
//!
//! * **identities**: the backend keeps the [`CaptureId`] of each capture it began
//!   ([`CaptureRec`]), found again from the runtime's own capture id (a stream that joined a
//!   capture reports that one), so every capture error names it;
//! * **retention**: work enqueued while capturing never runs until a replay, so what it uses
//!   (buffers under [`CaptureId::stream_id`], host-buffer uses, functions, events) is not kept
//!   behind tracking events (an event recorded in a capture is a graph dependency, and querying
//!   one is an error that invalidates the capture) but collected by the capture and handed to
//!   the graph, which keeps it while it lives;
//! * **the graph object** ([`GpuGraph`]): an executable graph (`CUgraphExec`, `hipGraphExec_t`)
//!   over the captured graph shared by every instantiation; it keeps its device (and so its
//!   core) alive and outlives the capturing stream; its last handle is dropped only once its
//!   queued replays ran (each replay keeps it as any queued work keeps what it uses), then the
//!   executable, the graph and what the work used are released in that order;
//! * **internal allocations** (an op's scratch memory, staging host memory, a BLAS handle) made
//!   while a capture is active run with the calling thread's capture mode exchanged to relaxed
//!   ([`relaxed`], as PyTorch's allocator does), so the backend's own bookkeeping never
//!   invalidates a capture; the user's `Device::alloc` is never exchanged and goes through the
//!   vendor's check.

use crate::device::GpuDevice;
use crate::runtime::{Raw, Runtime};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use unihal_ccl::platform::ReplayHook;
use unihal_hal::{
    CaptureId, CaptureMode, DeviceId, Graph, GraphCaps, GraphSupport, HalError, Invalid, Keep,
    NativeHandle, Result, StreamId,
};

/// Captures active in the process (every runtime): internal allocations exchange their
/// thread's capture mode only while one is.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// One capture the backend began: its identity, the runtime's id, and what the captured work
/// uses until the graph takes it. Shared by the origin stream, the streams that joined and the
/// events recorded in it.
pub struct CaptureRec {
    /// The HAL's identity of the capture.
    pub id: CaptureId,
    /// The runtime's capture sequence id.
    pub vendor: u64,
    /// The mode it was begun in.
    pub mode: CaptureMode,
    /// The stream that began it (the only one that may end it).
    pub origin: StreamId,
    /// The thread that began it.
    pub thread: ThreadId,
    ended: AtomicBool,
    kept: Mutex<Vec<Keep>>,
    /// The graph allocations made in it (memory nodes), and whether the capture freed each.
    allocs: Mutex<Vec<GraphAlloc>>,
    /// Called after each launch of its graph (captured collectives' tracking).
    hooks: Mutex<Vec<ReplayHook>>,
}

/// A graph allocation of a capture: `alloc_async` on a capturing stream.
pub(crate) struct GraphAlloc {
    /// Its address, fixed at capture.
    pub(crate) ptr: u64,
    /// A handle of it (marked free-enqueued when the capture ends: only the graph uses it).
    pub(crate) buffer: unihal_hal::Buffer,
    /// A free node of the capture frees it.
    pub(crate) freed: bool,
}

impl CaptureRec {
    pub(crate) fn begin(
        id: CaptureId,
        vendor: u64,
        mode: CaptureMode,
        origin: StreamId,
    ) -> Arc<CaptureRec> {
        ACTIVE.fetch_add(1, Ordering::AcqRel);
        Arc::new(CaptureRec {
            id,
            vendor,
            mode,
            origin,
            thread: std::thread::current().id(),
            ended: AtomicBool::new(false),
            kept: Mutex::new(Vec::new()),
            allocs: Mutex::new(Vec::new()),
            hooks: Mutex::new(Vec::new()),
        })
    }

    /// Records a graph allocation (an allocation node) made in this capture.
    pub(crate) fn graph_alloc(&self, ptr: u64, buffer: unihal_hal::Buffer) {
        self.allocs.lock().push(GraphAlloc {
            ptr,
            buffer,
            freed: false,
        });
    }

    /// Records the free node of this capture's graph allocation at `ptr`.
    pub(crate) fn graph_free(&self, ptr: u64) {
        if let Some(a) = self.allocs.lock().iter_mut().find(|a| a.ptr == ptr) {
            a.freed = true;
        }
    }

    /// Has `hook` called after each launch of this capture's graph.
    pub(crate) fn on_replay(&self, hook: ReplayHook) {
        self.hooks.lock().push(hook);
    }

    /// The replay hooks, taken once (by its end).
    pub(crate) fn take_hooks(&self) -> Vec<ReplayHook> {
        std::mem::take(&mut *self.hooks.lock())
    }

    /// The graph allocations made in this capture, taken once (by its end).
    pub(crate) fn take_allocs(&self) -> Vec<GraphAlloc> {
        std::mem::take(&mut *self.allocs.lock())
    }

    /// True until `end_capture` ended it (whether or not that succeeded).
    pub fn active(&self) -> bool {
        !self.ended.load(Ordering::Acquire)
    }

    /// Keeps what captured work uses until the graph takes it (or the capture fails, when
    /// nothing captured ever runs).
    pub(crate) fn keep(&self, keep: Vec<Keep>) {
        self.kept.lock().extend(keep);
    }

    /// Ends the capture (once): what its work uses, for the graph.
    pub(crate) fn end(&self) -> Vec<Keep> {
        if !self.ended.swap(true, Ordering::AcqRel) {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        }
        std::mem::take(&mut *self.kept.lock())
    }
}

impl Drop for CaptureRec {
    fn drop(&mut self) {
        // A capture whose origin vanished without ending it (never the case through the
        // streams, which end it) no longer counts as active.
        if !*self.ended.get_mut() {
            ACTIVE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl std::fmt::Debug for CaptureRec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (runtime id {}, {:?})",
            self.id, self.vendor, self.mode
        )
    }
}

/// Runs `f` (an allocation the backend makes for itself) with the calling thread's capture mode
/// exchanged to relaxed while any capture is active, so that it neither fails nor invalidates a
/// capture; the thread's mode is restored after. Without an active capture, or on a runtime
/// without graphs, `f` just runs.
pub fn relaxed<R: Runtime, T>(rt: &R, f: impl FnOnce() -> T) -> T {
    if ACTIVE.load(Ordering::Acquire) == 0 || rt.graph_support().is_err() {
        return f();
    }
    let previous = rt.exchange_capture_mode(CaptureMode::Relaxed);
    let r = f();
    if let Ok(mode) = previous {
        let _ = rt.exchange_capture_mode(mode);
    }
    r
}

/// The graph capabilities of a device of runtime `rt`: native when the runtime has every graph
/// entry, else unsupported naming what is missing. `kernel_library`: the device runs library
/// ops through the portable kernel library (captured ops never go to the vendor BLAS).
///
/// Stream-ordered allocation is captured where the runtime records memory nodes
/// ([`Runtime::graph_mem_nodes`]), as the vendors document it: `alloc_async` on a capturing
/// stream is an allocation node whose address is fixed at capture, `free_async` of it in the
/// same capture a free node. The graph owns that memory: it exists only while a replay runs
/// between the two nodes, so only work captured in the same capture may use the buffer (other
/// uses are refused with [`Invalid::Capture`]), and an allocation the capture did not free is
/// freed by a free node the end of the capture adds on the origin stream (after every captured
/// node: every joined stream has rejoined it), its handles then unusable
/// ([`Invalid::FreeEnqueued`]). So no allocation escapes a replay, every launch of the
/// executable succeeds, and no auto-free flag is needed. A graph with memory nodes has one
/// executable at a time (NVIDIA's and AMD's rule): see [`GpuGraph`]'s `instantiate`.
pub fn caps<R: Runtime>(rt: &R, kernel_library: bool) -> GraphCaps {
    match rt.graph_support() {
        Ok(()) => GraphCaps {
            support: GraphSupport::Native,
            note: format!(
                "{} graphs; not captured: host callbacks (a callback runs once: the HAL's is \
                 FnOnce){}; memory allocated in a capture belongs to its graph (only that \
                 capture's work uses it; what the capture does not free is freed at the end of \
                 each replay; one executable at a time); library ops captured run the portable \
                 kernels, never the vendor BLAS",
                R::VENDOR,
                if rt.graph_mem_nodes() {
                    ""
                } else {
                    ", stream-ordered allocation (alloc_async/free_async: the runtime lacks \
                     the stream-ordered entries)"
                }
            ),
            copies: true,
            fills: true,
            kernels: true,
            ops: kernel_library,
            collectives: true,
            host_callbacks: false,
            stream_alloc: rt.graph_mem_nodes(),
        },
        Err(why) => GraphCaps::unsupported(why),
    }
}

/// An [`Invalid::Capture`] of `call` under `capture`, for a rule this layer applies itself.
pub(crate) fn refused(
    arg: &'static str,
    call: &str,
    capture: Option<CaptureId>,
    detail: impl Into<String>,
) -> HalError {
    HalError::invalid(
        arg,
        Invalid::Capture {
            capture,
            call: call.into(),
            detail: detail.into(),
        },
    )
}

/// The graph a capture made, shared by its executables: destroyed (and what its work uses
/// released) after the last one.
struct Captured<R: Runtime> {
    dev: Arc<GpuDevice<R>>,
    graph: Raw,
    id: CaptureId,
    nodes: usize,
    kept: Vec<Keep>,
    /// It has memory (allocation or free) nodes: one executable at a time.
    mem_nodes: bool,
    /// Its executables alive (not yet destroyed).
    execs: AtomicUsize,
    /// Called after each launch (captured collectives' tracking in flight).
    hooks: Vec<ReplayHook>,
}

impl<R: Runtime> Drop for Captured<R> {
    fn drop(&mut self) {
        let (dev, graph) = (self.dev.clone(), self.graph);
        let kept = std::mem::take(&mut self.kept);
        crate::deferred::release(move || {
            let rt = dev.rt();
            dev.core().release("graph destroy", move || {
                // SAFETY: the graph of one end_capture, destroyed once, after every executable
                // made from it (each holds this).
                let r = unsafe { rt.graph_destroy(graph) };
                // The work that used these can run no more: every executable is gone.
                drop(kept);
                r
            });
        });
    }
}

/// An executable graph of a GPU runtime: the HAL's [`Graph`]. Thread-safe (launches go through
/// streams; the runtime orders launches of one executable).
pub struct GpuGraph<R: Runtime> {
    captured: Option<Arc<Captured<R>>>,
    exec: Raw,
}

impl<R: Runtime> GpuGraph<R> {
    /// Instantiates `graph` (just captured, `nodes` nodes) on `dev`; the graph and `kept` are
    /// released once this and every later instantiation are gone. When instantiation fails, the
    /// graph is destroyed and `kept` released now (nothing captured ever runs).
    pub(crate) fn new(
        dev: Arc<GpuDevice<R>>,
        id: CaptureId,
        graph: Raw,
        nodes: usize,
        kept: Vec<Keep>,
        mem_nodes: bool,
        hooks: Vec<ReplayHook>,
    ) -> Result<Arc<GpuGraph<R>>> {
        let captured = Arc::new(Captured {
            dev,
            graph,
            id,
            nodes,
            kept,
            mem_nodes,
            execs: AtomicUsize::new(0),
            hooks,
        });
        GpuGraph::instantiate_from(captured)
    }

    fn instantiate_from(captured: Arc<Captured<R>>) -> Result<Arc<GpuGraph<R>>> {
        // Counted before the call, so two threads never both pass the check.
        let before = captured.execs.fetch_add(1, Ordering::AcqRel);
        if captured.mem_nodes && before > 0 {
            captured.execs.fetch_sub(1, Ordering::AcqRel);
            return Err(HalError::unsupported(format!(
                "a second executable of the graph of {}: it allocates memory (alloc_async in \
                 the capture: memory nodes), and {} allows one executable of such a graph at a \
                 time (each owns the graph's allocations at their fixed addresses); drop the \
                 existing one first, or launch it on several streams (its replays are ordered)",
                captured.id,
                R::VENDOR
            )));
        }
        let r = GpuGraph::instantiate_raw(&captured);
        if r.is_err() {
            captured.execs.fetch_sub(1, Ordering::AcqRel);
        }
        r
    }

    fn instantiate_raw(captured: &Arc<Captured<R>>) -> Result<Arc<GpuGraph<R>>> {
        let captured = captured.clone();
        let rt = captured.dev.rt();
        let exec = crate::graph::relaxed(rt, || {
            captured
                .dev
                .call("graph instantiate", || rt.graph_instantiate(captured.graph))
        })?;
        Ok(Arc::new(GpuGraph {
            captured: Some(captured),
            exec,
        }))
    }

    /// The graph of a HAL graph of this backend.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] (argument `graph`) for another backend's graph.
    pub fn of(graph: &Arc<dyn Graph>) -> Result<&GpuGraph<R>> {
        graph.as_any().downcast_ref::<GpuGraph<R>>().ok_or_else(|| {
            HalError::invalid(
                "graph",
                Invalid::ForeignHandle {
                    expected: format!("{} graph", R::VENDOR),
                    found: format!("graph of {}", graph.device_id()),
                },
            )
        })
    }

    fn captured(&self) -> &Arc<Captured<R>> {
        self.captured.as_ref().expect("taken only by drop")
    }

    /// The runtime's executable graph.
    pub fn exec(&self) -> Raw {
        self.exec
    }

    /// Runs what follows each launch (captured collectives register their replay in flight),
    /// `stream` the launch's.
    pub(crate) fn launched(&self, stream: &Arc<dyn unihal_hal::Stream>) {
        for hook in &self.captured().hooks {
            hook(stream);
        }
    }
}

impl<R: Runtime> Graph for GpuGraph<R> {
    fn device_id(&self) -> DeviceId {
        self.captured().dev.core().id
    }

    fn capture_id(&self) -> CaptureId {
        self.captured().id
    }

    fn node_count(&self) -> usize {
        self.captured().nodes
    }

    /// A second executable (`cuGraphInstantiate` again). A graph with memory nodes
    /// (`alloc_async` in its capture) has one executable at a time, as NVIDIA and AMD document:
    /// while this one lives, [`HalError::Unsupported`] saying so (checked here rather than left
    /// to the vendor's bare "invalid value"); the auto-free flag would not lift the rule, and is
    /// not needed since no allocation escapes a replay (see [`caps`]).
    fn instantiate(&self) -> Result<Arc<dyn Graph>> {
        Ok(GpuGraph::instantiate_from(self.captured().clone())?)
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::Ptr(self.exec.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl<R: Runtime> Drop for GpuGraph<R> {
    fn drop(&mut self) {
        // The last handle: every queued replay kept one, so none is pending.
        let captured = self.captured.take().expect("dropped once");
        let exec = self.exec;
        let dev = captured.dev.clone();
        crate::deferred::release(move || {
            let rt = dev.rt();
            dev.core().release("graph exec destroy", move || {
                // SAFETY: made by graph_instantiate, destroyed once; its launches ran (each
                // kept this graph until then).
                let r = unsafe { rt.graph_exec_destroy(exec) };
                captured.execs.fetch_sub(1, Ordering::AcqRel);
                // The captured graph goes after its executable.
                drop(captured);
                r
            });
        });
    }
}

/// What each of the vendors' capture error codes (CUDA's `CUDA_ERROR_STREAM_CAPTURE_*` and
/// `CUDA_ERROR_CAPTURED_EVENT`, HIP's `hipErrorStreamCapture*` and `hipErrorCapturedEvent`:
/// the same numbers, 900 to 908) means, or `None` for another code.
pub fn capture_code_meaning(code: i64) -> Option<&'static str> {
    Some(match code {
        900 => {
            "not allowed while the stream capture is active (it would wait for or observe \
             captured work that has not run); the capture is now invalidated and its \
             end_capture fails"
        }
        901 => {
            "the capture was invalidated by an earlier illegal call; only end_capture (which \
             fails) is useful now"
        }
        902 => "two independent captures would be merged",
        903 => "the capture was not begun on this stream",
        904 => "a stream that joined the capture has not rejoined the stream that began it",
        905 => "a dependency would cross the capture's boundary",
        906 => "an implicit dependency on the legacy default stream is not allowed in a capture",
        907 => {
            "the event was last recorded in a capture: it marks a point of the graph, not of \
             any stream's work"
        }
        908 => {
            "the capture was begun by another thread (only a relaxed capture may be ended by \
             another thread)"
        }
        _ => return None,
    })
}

/// A vendor error of `library` with one of the capture codes (see [`capture_code_meaning`]) as
/// [`HalError::InvalidArgument`] with [`Invalid::Capture`] naming `capture()` and the vendor's
/// call, name and number; any other error unchanged. What each runtime's
/// [`Runtime::capture_error`] calls.
pub fn vendor_capture_error(
    library: &str,
    e: HalError,
    arg: &'static str,
    capture: &dyn Fn() -> Option<CaptureId>,
) -> HalError {
    match &e {
        HalError::Vendor {
            library: l,
            call,
            code,
            name,
            message,
        } if l == library => match capture_code_meaning(*code) {
            Some(meaning) => {
                let text = if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                };
                refused(
                    arg,
                    call,
                    capture(),
                    format!("{library} {name} ({code}){text}; {meaning}"),
                )
            }
            None => e,
        },
        _ => e,
    }
}
