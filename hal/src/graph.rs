//! Graphs: a stream's work captured once and replayed many times.
//!
//! The shape is the one CUDA, HIP and Ascend share (`cuStreamBeginCapture` … `cuStreamEndCapture`,
//! `hipStreamBeginCapture`, `aclmdlRICaptureBegin`):
//!
//! 1. [`crate::Stream::begin_capture`] puts a stream (the *origin*) into capture: work enqueued on
//!    it from then on is recorded, not run.
//! 2. Another stream *joins* the capture by waiting on an event recorded on a capturing stream; its
//!    later work is recorded too. It *leaves* by recording an event the origin then waits on; every
//!    stream that joined must have left by the end (the vendors' "unjoined" error otherwise).
//! 3. [`crate::Stream::end_capture`] ends it and returns an executable [`Graph`].
//! 4. [`crate::Stream::launch_graph`] replays the graph on any stream of its device. A replay reads
//!    and writes the buffers' contents at the time it runs, never those at capture time.
//! 5. Dropping the last handle destroys the graph once its queued replays have run.
//!
//! While a capture is active, calls that would wait for, or observe, captured work that has not
//! run (synchronising a capturing stream, its device or an event recorded in the capture, a query,
//! a blocking host read) are errors ([`crate::Invalid::Capture`]) that also *invalidate* the
//! capture, as on CUDA: `end_capture` then fails. The [`CaptureMode`] decides whether
//! capture-unsafe calls made elsewhere (a synchronous `Device::alloc`, which may synchronise the
//! device on a vendor runtime) are refused too.
//!
//! Replays of one [`Graph`] are ordered after each other (as `cuGraphLaunch` orders launches of one
//! executable graph), whichever streams they are launched on; [`Graph::instantiate`] makes an
//! independent executable from the same captured work, whose replays are not ordered against the
//! first's. A graph keeps every buffer its captured work uses alive while it lives, and outlives
//! the stream that captured it.

use crate::device::{DeviceId, NativeHandle};
use crate::error::Result;
use crate::stream::StreamId;
use serde::Serialize;
use std::any::Any;
use std::sync::Arc;

/// Which capture-unsafe calls a capture refuses (CUDA's `CUstreamCaptureMode`, HIP's
/// `hipStreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum CaptureMode {
    /// Capture-unsafe calls from any thread are refused while this capture is active
    /// (`CU_STREAM_CAPTURE_MODE_GLOBAL`; PyTorch's default).
    Global,
    /// Only the capturing thread's capture-unsafe calls are refused
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`).
    ThreadLocal,
    /// Capture-unsafe calls are not refused (`CU_STREAM_CAPTURE_MODE_RELAXED`); calls that act on
    /// the capture itself (synchronising or querying a capturing stream) still are.
    Relaxed,
}

impl CaptureMode {
    /// Every mode, in the vendors' numbering order (0, 1, 2).
    pub const ALL: [CaptureMode; 3] = [
        CaptureMode::Global,
        CaptureMode::ThreadLocal,
        CaptureMode::Relaxed,
    ];
}

/// The identity of one capture (CUDA's capture sequence id), unique in the process. Errors about a
/// capture name it, so a caller with several captures can tell which one failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CaptureId(u64);

impl CaptureId {
    /// A new identity, never returned before in this process. Taken from the stream identities'
    /// counter, so that [`CaptureId::stream_id`] names no real stream.
    pub fn fresh() -> CaptureId {
        CaptureId(StreamId::fresh().get())
    }

    /// The identity as a number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The stream identity under which captured work keeps its buffers ([`crate::Buffer::use_on`]).
    ///
    /// A graph's uses are a queue of their own: no real stream has this identity, so a caching
    /// allocator never hands a block a graph uses to other work while the graph lives (the uses
    /// end when the graph is destroyed), and blocks the capture allocates and frees are reused
    /// only by requests of the same capture (PyTorch's graph-private pools).
    pub fn stream_id(self) -> StreamId {
        StreamId::from_raw(self.0)
    }
}

impl std::fmt::Display for CaptureId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capture #{}", self.0)
    }
}

/// Whether a stream is capturing (CUDA's `CUstreamCaptureStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing: work runs when enqueued.
    None,
    /// Recording into the capture.
    Active(CaptureId),
    /// The capture was invalidated by an illegal call; only `end_capture` (which fails and leaves
    /// capture) is useful now.
    Invalidated(CaptureId),
}

impl CaptureStatus {
    /// The capture, whether active or invalidated.
    pub fn capture(self) -> Option<CaptureId> {
        match self {
            CaptureStatus::None => None,
            CaptureStatus::Active(c) | CaptureStatus::Invalidated(c) => Some(c),
        }
    }
}

/// How a device implements graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum GraphSupport {
    /// The vendor's own graphs (CUDA graphs, HIP graphs): a replay is one vendor launch.
    Native,
    /// The backend records its own queue operations and replays them (the CPU backend).
    Emulated,
    /// No capture: `begin_capture` returns [`crate::HalError::Unsupported`].
    Unsupported,
}

/// What a device can capture. The conformance suite runs a capture case only where its operations
/// are listed; a listed kind that then fails to capture is a failure, not a skip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphCaps {
    /// How graphs are implemented, or that they are not.
    pub support: GraphSupport,
    /// Why not, or what is missing, in words (shown in skip reasons); empty when nothing is.
    pub note: String,
    /// Copies (`copy_h2d`, `copy_d2h`, `copy_d2d`, `copy_peer`) may be captured.
    pub copies: bool,
    /// Fills may be captured.
    pub fills: bool,
    /// Raw kernel launches may be captured.
    pub kernels: bool,
    /// Library operations (`run_op`) may be captured.
    pub ops: bool,
    /// Collectives of the device's communicators may be captured (each replay runs them; every
    /// rank must replay its graph as it would issue the calls).
    pub collectives: bool,
    /// Host callbacks may be captured (each replay runs the callback once).
    pub host_callbacks: bool,
    /// Stream-ordered allocation (`alloc_async`/`free_async`) may be captured.
    pub stream_alloc: bool,
}

impl GraphCaps {
    /// No capture at all, for the reason given.
    pub fn unsupported(note: impl Into<String>) -> GraphCaps {
        GraphCaps {
            support: GraphSupport::Unsupported,
            note: note.into(),
            copies: false,
            fills: false,
            kernels: false,
            ops: false,
            collectives: false,
            host_callbacks: false,
            stream_alloc: false,
        }
    }

    /// True when the device captures at all.
    pub fn available(&self) -> bool {
        self.support != GraphSupport::Unsupported
    }
}

/// An executable graph: work captured from streams, replayed by [`crate::Stream::launch_graph`].
///
/// Ownership: `Arc<dyn Graph>`; the graph keeps every buffer, event and function its captured work
/// uses, and queued replays keep the graph. Dropping the last handle destroys it after its queued
/// replays have run. Thread safety: any thread; replays of one graph are ordered after each other.
pub trait Graph: Send + Sync {
    /// The device whose streams may launch the graph.
    fn device_id(&self) -> DeviceId;

    /// The capture it was made from.
    fn capture_id(&self) -> CaptureId;

    /// Number of recorded operations (nodes); event records and waits inside the capture are
    /// dependencies, not nodes.
    fn node_count(&self) -> usize;

    /// A new executable of the same captured work (`cuGraphInstantiate` again): its replays are
    /// independent of this one's, and they share the buffers the work uses.
    ///
    /// # Errors
    /// [`crate::HalError::OutOfMemory`] or the vendor's instantiation error.
    fn instantiate(&self) -> Result<Arc<dyn Graph>>;

    /// The vendor's executable graph (`CUgraphExec`, `hipGraphExec_t`), or `None` when emulated.
    fn native_handle(&self) -> NativeHandle;

    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

impl std::fmt::Debug for dyn Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Graph({}, {}, {} nodes)",
            self.device_id(),
            self.capture_id(),
            self.node_count()
        )
    }
}
