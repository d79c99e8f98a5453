//! Stream capture and graph replay, emulated: a capture records the queue operations that its
//! streams would have run ([`crate::worker::Op`], `FnMut` so that they can run again), and a
//! replay runs them, in the order they were recorded, as one operation on the launching stream.
//!
//! * **Order.** The recorded order is the host's enqueue order across every stream of the capture.
//!   A stream joins by waiting on an event recorded in the capture, after that record in host
//!   order, so the recorded order respects every dependency of the captured work: replaying it
//!   serially is one valid schedule of the captured graph (the vendors may run independent
//!   branches concurrently; results are the same for race-free work).
//! * **No per-node allocation on replay.** One queue operation per launch runs every node; nodes
//!   own what they use (buffer uses under [`CaptureId::stream_id`], scratch memory, plans).
//! * **Launch-time state.** A node whose work needs a value assigned in issue order (a
//!   collective's sequence number, which matches the ranks' calls) registers a hook; every launch
//!   runs the hooks in node order on the launching thread, as an eager enqueue would. A hook's
//!   value travels inside that launch's replay operation and is handed to its node just before
//!   the node runs, so a launch that fails half-way drops what its hooks took (a host buffer's
//!   use is released) and leaves nothing behind for later launches.
//! * **Replays of one graph are ordered**: a launch on another stream than the previous launch's
//!   waits for it first. [`Graph::instantiate`] gives a second executable over the same nodes,
//!   not ordered against the first; the nodes sit behind one lock, so overlapping replays of the
//!   two run one after the other, in either order.
//! * **Illegal calls** (synchronising or querying a capturing stream or its device, an event
//!   recorded in the capture, a capture-unsafe `Device::alloc`) fail with
//!   [`unihal_hal::Invalid::Capture`] and invalidate the capture; its `end_capture` then fails.

use crate::worker::{Op, WorkerShared};
use parking_lot::Mutex;
use std::any::Any;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;
use unihal_hal::{
    Buffer, CaptureId, CaptureMode, DeviceId, Graph, HalError, Invalid, NativeHandle, Result,
    StreamId,
};

/// A hook run on the host at every launch of the graph, before its replay is queued: it takes
/// what an eager enqueue takes at enqueue time (a collective's sequence number, a host buffer's
/// use) and returns the [`Setter`] that hands it to its node in that launch's replay. A failing
/// hook fails the launch; the setters of the hooks before it are dropped with what they took.
pub(crate) type Hook = Box<dyn FnMut() -> Result<Setter> + Send>;

/// Hands one launch's value to its node (run by the replay just before the node).
pub(crate) type Setter = Box<dyn FnOnce() + Send>;

/// A stream's view of the capture it takes part in (shared by the stream and the capture, which
/// clears it when the capture ends).
#[derive(Default)]
pub(crate) struct CaptureSlot {
    /// Fast check for the enqueue path: a capture is set.
    active: AtomicBool,
    current: Mutex<Option<Arc<Capture>>>,
}

impl CaptureSlot {
    /// The capture this stream records into, if any.
    pub(crate) fn get(&self) -> Option<Arc<Capture>> {
        if !self.active.load(Ordering::Acquire) {
            return None;
        }
        self.current.lock().clone()
    }

    fn set(&self, c: Option<Arc<Capture>>) {
        let mut g = self.current.lock();
        self.active.store(c.is_some(), Ordering::Release);
        *g = c;
    }
}

/// A stream that joined a capture it did not begin.
struct Member {
    sid: StreamId,
    slot: Arc<CaptureSlot>,
    /// Bumped by the join and by every operation the stream records.
    tip: u64,
    /// The origin waited on an event recorded on this stream at its current `tip`.
    rejoined: bool,
}

struct State {
    /// Why the capture was invalidated, if it was.
    invalid: Option<String>,
    ended: bool,
    nodes: Vec<Op>,
    /// Each with the index of its node.
    hooks: Vec<(usize, Hook)>,
    members: Vec<Member>,
    /// The capture's own allocations (`alloc_async` while capturing): the graph's, unusable by
    /// other work once the capture ends.
    allocations: Vec<Buffer>,
}

/// One capture, from `begin_capture` to `end_capture`.
pub(crate) struct Capture {
    pub(crate) id: CaptureId,
    mode: CaptureMode,
    thread: ThreadId,
    origin: StreamId,
    origin_slot: Arc<CaptureSlot>,
    device: DeviceId,
    state: Mutex<State>,
}

/// Where an event recorded inside a capture points: a stream's position in the capture.
#[derive(Clone)]
pub(crate) struct CapturedMark {
    pub(crate) capture: Arc<Capture>,
    stream: StreamId,
    tip: u64,
}

impl Capture {
    /// Begins a capture on the stream `origin`.
    pub(crate) fn begin(
        origin: StreamId,
        slot: Arc<CaptureSlot>,
        device: DeviceId,
        mode: CaptureMode,
    ) -> Arc<Capture> {
        let c = Arc::new(Capture {
            id: CaptureId::fresh(),
            mode,
            thread: std::thread::current().id(),
            origin,
            origin_slot: slot.clone(),
            device,
            state: Mutex::new(State {
                invalid: None,
                ended: false,
                nodes: Vec::new(),
                hooks: Vec::new(),
                members: Vec::new(),
                allocations: Vec::new(),
            }),
        });
        slot.set(Some(c.clone()));
        c
    }

    /// True until `end_capture`.
    pub(crate) fn is_active(&self) -> bool {
        !self.state.lock().ended
    }

    /// True once an illegal call invalidated the capture.
    pub(crate) fn is_invalidated(&self) -> bool {
        self.state.lock().invalid.is_some()
    }

    /// Invalidates the capture (the first cause is kept).
    pub(crate) fn invalidate(&self, cause: &str) {
        let mut st = self.state.lock();
        if !st.ended && st.invalid.is_none() {
            tracing::debug!(capture = %self.id, cause, "stream capture invalidated");
            st.invalid = Some(cause.to_string());
        }
    }

    /// Invalidates the capture because `call` is illegal in it; returns the error for `call`.
    pub(crate) fn illegal(&self, arg: &'static str, call: &str) -> HalError {
        self.invalidate(call);
        HalError::illegal_in_capture(arg, call, self.id)
    }

    /// The refusal of `call`, which this backend cannot capture (not a call the capture rules
    /// forbid): nothing was recorded and the capture stays valid, as on the GPU backends.
    pub(crate) fn refuse(&self, call: &str, err: HalError) -> HalError {
        tracing::debug!(capture = %self.id, call, "refused in a stream capture");
        err
    }

    /// True when a capture-unsafe call (`Device::alloc`) on this thread is refused.
    pub(crate) fn refuses_unsafe_calls(&self) -> bool {
        match self.mode {
            CaptureMode::Global => true,
            CaptureMode::ThreadLocal => std::thread::current().id() == self.thread,
            CaptureMode::Relaxed => false,
        }
    }

    fn error(&self, call: &str, detail: String) -> HalError {
        HalError::invalid(
            "stream",
            Invalid::Capture {
                capture: Some(self.id),
                call: call.into(),
                detail,
            },
        )
    }

    /// Records `node` (and its launch `hook`) as work of stream `sid`.
    ///
    /// # Errors
    /// `Invalid::Capture` once the capture is invalidated or ended.
    pub(crate) fn push(&self, sid: StreamId, node: Op, hook: Option<Hook>) -> Result<()> {
        let mut st = self.state.lock();
        if let Some(cause) = &st.invalid {
            let detail = format!("the capture was invalidated by {cause}; end it and begin again");
            drop(st);
            return Err(self.error("enqueue", detail));
        }
        if st.ended {
            return Err(self.error("enqueue", "the capture has ended".into()));
        }
        if let Some(m) = st.members.iter_mut().find(|m| m.sid == sid) {
            m.tip += 1;
            m.rejoined = false;
        }
        if let Some(h) = hook {
            let k = st.nodes.len();
            st.hooks.push((k, h));
        }
        st.nodes.push(node);
        Ok(())
    }

    /// Records `b`, allocated by `alloc_async` in this capture, as the graph's (CUDA's memory
    /// nodes): kept by a node of its own while the graph lives, and unusable by any other work
    /// once the capture ends.
    pub(crate) fn push_allocation(&self, sid: StreamId, b: &Buffer) -> Result<()> {
        let keep = b.use_on(self.id.stream_id());
        self.push(
            sid,
            Box::new(move |_| {
                let _ = &keep;
                Ok(())
            }),
            None,
        )?;
        self.state.lock().allocations.push(b.clone());
        Ok(())
    }

    /// An event recorded on stream `sid` now: a mark of its position in the capture.
    pub(crate) fn mark(self: &Arc<Self>, sid: StreamId) -> CapturedMark {
        let st = self.state.lock();
        let tip = st
            .members
            .iter()
            .find(|m| m.sid == sid)
            .map_or(0, |m| m.tip);
        CapturedMark {
            capture: self.clone(),
            stream: sid,
            tip,
        }
    }

    /// Stream `sid` (not capturing) waits on `mark`: it joins the capture.
    pub(crate) fn join(self: &Arc<Self>, sid: StreamId, slot: &Arc<CaptureSlot>) -> Result<()> {
        let mut st = self.state.lock();
        if st.ended {
            drop(st);
            return Err(self.error(
                "wait_event",
                "the event was recorded inside a capture that has ended: it marks a point in the \
                 graph, not in any stream's work (record it after launch_graph instead)"
                    .into(),
            ));
        }
        st.members.push(Member {
            sid,
            slot: slot.clone(),
            tip: 1,
            rejoined: false,
        });
        slot.set(Some(self.clone()));
        Ok(())
    }

    /// Stream `sid`, capturing in this capture, waits on `mark` of the same capture: when the
    /// origin waits on a member's mark at its current tip, that member has rejoined.
    pub(crate) fn depend(&self, sid: StreamId, mark: &CapturedMark) {
        if sid != self.origin {
            return;
        }
        let mut st = self.state.lock();
        if let Some(m) = st.members.iter_mut().find(|m| m.sid == mark.stream) {
            if m.tip == mark.tip {
                m.rejoined = true;
            }
        }
    }

    /// Ends the capture from stream `sid`: every stream leaves it; the graph of its work, or why
    /// there is none.
    pub(crate) fn end(self: &Arc<Self>, sid: StreamId) -> Result<CpuGraph> {
        if sid != self.origin {
            let e = self.illegal("stream", "end_capture on a stream that joined the capture");
            return Err(e);
        }
        let mut st = self.state.lock();
        if st.ended {
            drop(st);
            return Err(self.error("end_capture", "the capture has ended already".into()));
        }
        st.ended = true;
        self.origin_slot.set(None);
        for m in &st.members {
            m.slot.set(None);
        }
        let nodes = std::mem::take(&mut st.nodes);
        let hooks = std::mem::take(&mut st.hooks);
        for b in std::mem::take(&mut st.allocations) {
            // Already marked when the capture freed it itself.
            let _ = b.mark_free_enqueued("buffer");
        }
        if let Some(cause) = st.invalid.take() {
            drop(st);
            return Err(self.error(
                "end_capture",
                format!("the capture was invalidated by {cause}; no graph was made"),
            ));
        }
        if let Some(m) = st.members.iter().find(|m| !m.rejoined) {
            let detail = format!(
                "stream {} joined the capture and its work was not joined back into the origin \
                 stream (record an event on it and wait on that event from the origin before \
                 ending the capture)",
                m.sid
            );
            drop(st);
            return Err(self.error("end_capture", detail));
        }
        Ok(CpuGraph {
            device: self.device,
            capture: self.id,
            count: nodes.len(),
            template: Arc::new(Template {
                nodes: Mutex::new(nodes),
                hooks: Mutex::new(hooks),
            }),
            last: Mutex::new(None),
        })
    }
}

impl CapturedMark {
    /// The error of a host wait or query on an event whose last record is this mark; an active
    /// capture is invalidated.
    pub(crate) fn host_wait_error(&self, call: &str) -> HalError {
        if self.capture.is_active() {
            return self.capture.illegal("event", call);
        }
        self.capture.error(
            call,
            "the event was recorded inside a capture that has ended: it marks a point in the \
             graph, not in any stream's work (record it after launch_graph instead)"
                .into(),
        )
    }
}

/// The recorded work, shared by every instantiation.
struct Template {
    nodes: Mutex<Vec<Op>>,
    hooks: Mutex<Vec<(usize, Hook)>>,
}

/// An executable graph of the CPU backend.
pub struct CpuGraph {
    device: DeviceId,
    capture: CaptureId,
    count: usize,
    template: Arc<Template>,
    /// The previous launch: its stream and position, so a launch elsewhere waits for it.
    last: Mutex<Option<(Arc<WorkerShared>, u64)>>,
}

impl CpuGraph {
    /// Queues a replay on `worker`, after the previous launch of this graph.
    ///
    /// # Errors
    /// The stream's sticky error.
    pub(crate) fn launch_on(&self, worker: &Arc<WorkerShared>) -> Result<()> {
        let mut last = self.last.lock();
        if let Some(e) = worker.error() {
            return Err(e);
        }
        // This launch's values, in node order (dropped with what they took if the launch fails).
        let setters = self
            .template
            .hooks
            .lock()
            .iter_mut()
            .map(|(k, h)| Ok((*k, h()?)))
            .collect::<Result<Vec<(usize, Setter)>>>()?;
        if let Some((w, pos)) = last.as_ref().filter(|(w, _)| !Arc::ptr_eq(w, worker)) {
            let (w, pos) = (w.clone(), *pos);
            worker.enqueue(Box::new(move |err| {
                if err.is_none() {
                    w.wait_for(pos)?;
                }
                Ok(())
            }))?;
        }
        let template = self.template.clone();
        let mut setters = Some(setters);
        let pos = worker.enqueue(Box::new(move |err| {
            let mut nodes = template.nodes.lock();
            let mut setters = setters.take().unwrap_or_default().into_iter().peekable();
            let mut first: Option<HalError> = None;
            for (k, n) in nodes.iter_mut().enumerate() {
                while let Some((_, set)) = setters.next_if(|(i, _)| *i == k) {
                    set();
                }
                if let Err(e) = n(err.or(first.as_ref())) {
                    first.get_or_insert(e);
                }
            }
            first.map_or(Ok(()), Err)
        }))?;
        *last = Some((worker.clone(), pos));
        Ok(())
    }
}

impl Graph for CpuGraph {
    fn device_id(&self) -> DeviceId {
        self.device
    }

    fn capture_id(&self) -> CaptureId {
        self.capture
    }

    fn node_count(&self) -> usize {
        self.count
    }

    fn instantiate(&self) -> Result<Arc<dyn Graph>> {
        Ok(Arc::new(CpuGraph {
            device: self.device,
            capture: self.capture,
            count: self.count,
            template: self.template.clone(),
            last: Mutex::new(None),
        }))
    }

    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
