//! Stream capture and graphs, vendor-neutral: what CUDA's driver (`cuStreamBeginCapture_v2` …
//! `cuGraphLaunch`) and HIP's runtime (`hipStreamBeginCapture` … `hipGraphLaunch`) document, once.
//!
//! * **Capture.** [`Device::begin_capture`] puts a stream (the *origin*) into a capture: work
//!   enqueued on it from then on becomes a *node* of the capture, not an operation of the queue.
//!   Each capturing stream has a *frontier* (the nodes its next work depends on). Recording an event
//!   on a capturing stream remembers the frontier in the event; a stream waiting on such an event
//!   adds it to its frontier, and a stream outside any capture that waits on it *joins* the capture.
//!   [`Device::end_capture`] checks that every joined stream was joined back into the origin (its
//!   last nodes are ancestors of the origin's frontier) and returns the [`Graph`].
//! * **Rules.** Illegal calls return a [`SimError::Capture`] and *invalidate* the capture they
//!   touch (its end then fails with [`CaptureFault::Invalidated`]): synchronising or querying a
//!   capturing stream (900), an event recorded in a capture (907), the device while a capture is
//!   active on it (900), the legacy default stream while a blocking stream captures (906), a
//!   synchronous copy from or to pageable host memory on a capturing stream (900), waiting on an
//!   event recorded outside the capture (905) or in another capture (902), and the *potentially
//!   unsafe* calls ([`unsafe_call`]: synchronous allocation and free) under the mode rules of
//!   `cuThreadExchangeStreamCaptureMode`.
//! * **Replay.** [`Device::launch_graph`] enqueues one operation on the launch stream that runs the
//!   nodes in a dependency order: the *latest-captured ready node first* (a valid topological
//!   order that reorders independent branches as far as possible, so a missing dependency inside a
//!   capture shows up as wrong data in deferred mode). Nodes run in place, through the closures the
//!   capture made (no allocation per node and replay, but for collectives, whose matching state is
//!   made per replay); in concurrent mode each kernel and host node runs on a kernel thread while
//!   the stream waits. Launches of one [`Exec`] are ordered after each other on any stream (a wait
//!   on the previous launch's position); two instantiations are independent.
//! * **Memory nodes.** A stream-ordered allocation in a capture reserves its memory now (the
//!   address is fixed) and parks it; each replay's allocation node makes it accessible, a free node
//!   (in the graph or, after the replay, outside it) parks it again. A launch while the previous
//!   launch's allocation is still allocated is refused (`CUDA_ERROR_INVALID_VALUE`), as CUDA
//!   documents for executables without auto-free.

use crate::error::CaptureFault;
use crate::{Device, Gate, Memory, Op, SimError, SimResult, State, StreamId};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::ThreadId;

/// `CUstreamCaptureMode` / `hipStreamCaptureMode` (both number them 0, 1, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    Global = 0,
    ThreadLocal = 1,
    Relaxed = 2,
}

impl CaptureMode {
    /// The mode numbered `v`.
    pub fn from_raw(v: i64) -> Option<CaptureMode> {
        match v {
            0 => Some(CaptureMode::Global),
            1 => Some(CaptureMode::ThreadLocal),
            2 => Some(CaptureMode::Relaxed),
            _ => None,
        }
    }
}

/// `CUstreamCaptureStatus` / `hipStreamCaptureStatus` (0 none, 1 active, 2 invalidated), with
/// the capture's process-unique id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    None,
    Active(u64),
    Invalidated(u64),
}

impl CaptureStatus {
    /// The vendors' number of the status.
    pub fn raw(self) -> i32 {
        match self {
            CaptureStatus::None => 0,
            CaptureStatus::Active(_) => 1,
            CaptureStatus::Invalidated(_) => 2,
        }
    }

    /// The capture's id (0 when none).
    pub fn id(self) -> u64 {
        match self {
            CaptureStatus::None => 0,
            CaptureStatus::Active(i) | CaptureStatus::Invalidated(i) => i,
        }
    }
}

fn fault(kind: CaptureFault, why: impl Into<String>) -> SimError {
    SimError::Capture(kind, why.into())
}

thread_local! {
    /// The calling thread's capture interaction mode (`cuThreadExchangeStreamCaptureMode`).
    static THREAD_MODE: Cell<CaptureMode> = const { Cell::new(CaptureMode::Global) };
}

/// Sets the calling thread's capture interaction mode and returns the previous one.
pub fn exchange_thread_mode(mode: CaptureMode) -> CaptureMode {
    THREAD_MODE.replace(mode)
}

/// A capture in progress, for the checks of calls made on any device and thread.
struct Active {
    id: u64,
    thread: ThreadId,
    mode: CaptureMode,
    state: Weak<Mutex<State>>,
}

static ACTIVE: Mutex<Vec<Active>> = Mutex::new(Vec::new());
static NEXT_CAPTURE: AtomicU64 = AtomicU64::new(1);

/// A *potentially unsafe* call (a synchronous allocation or free) is about to run: refused with
/// [`CaptureFault::Unsupported`], invalidating the captures that prohibit it, when the calling
/// thread's mode is not relaxed and it has a capture of its own that is not relaxed, or (in global
/// mode) another thread has a global capture. Call with no device lock held.
///
/// # Errors
/// [`SimError::Capture`] with [`CaptureFault::Unsupported`].
pub fn unsafe_call(what: &str) -> SimResult<()> {
    let mode = THREAD_MODE.get();
    if mode == CaptureMode::Relaxed {
        return Ok(());
    }
    let me = std::thread::current().id();
    let hits: Vec<(u64, Weak<Mutex<State>>)> = ACTIVE
        .lock()
        .iter()
        .filter(|a| {
            a.mode != CaptureMode::Relaxed
                && (a.thread == me
                    || (mode == CaptureMode::Global && a.mode == CaptureMode::Global))
        })
        .map(|a| (a.id, a.state.clone()))
        .collect();
    if hits.is_empty() {
        return Ok(());
    }
    let why = format!("{what} is not permitted while a stream capture is active");
    for (id, state) in hits {
        if let Some(state) = state.upgrade() {
            state.lock().invalidate(id, &why);
        }
    }
    Err(fault(CaptureFault::Unsupported, why))
}

/// Repeatable device work of a node (run once per replay, never two at a time).
pub type RepeatWork = Box<dyn FnMut(&mut Memory) -> SimResult<()> + Send>;
/// A repeatable kernel or host function of a node (runs outside the device lock).
pub type RepeatKernel = Box<dyn FnMut() -> SimResult<()> + Send>;

/// Builds a replay's gate at its stream and position.
pub type MakeGate = Box<dyn FnOnce(StreamId, u64) -> Box<dyn Gate> + Send>;

/// Makes the gate of a captured gate node anew for every replay: `prepare` runs at each launch,
/// in launch order, without the device lock (a collective takes its sequence numbers there, so
/// ranks replaying their graphs match as ranks calling the collectives do); the closure it returns
/// builds the gate at the replay's position in the launch stream (the stream and the position of
/// the operation that runs it), under the device lock.
pub trait GateFactory: Send + Sync {
    /// # Errors
    /// Whatever keeps this replay from running the node (an aborted communicator).
    fn prepare(&self) -> SimResult<MakeGate>;
}

pub(crate) enum NodeKind {
    Work {
        touches: Vec<(u64, u64)>,
        run: Mutex<RepeatWork>,
    },
    Kernel(Arc<Mutex<RepeatKernel>>),
    Gate {
        touches: Vec<(u64, u64)>,
        factory: Arc<dyn GateFactory>,
        slot: usize,
    },
    Alloc(u64),
    Free(u64),
}

pub(crate) struct Node {
    pub(crate) kind: NodeKind,
    deps: Vec<usize>,
}

/// The captured work of a graph, shared by the graph and its executables.
pub(crate) struct Body {
    pub(crate) nodes: Vec<Node>,
    /// The replay order (a topological order, latest-captured ready node first).
    pub(crate) order: Vec<usize>,
    pub(crate) gates: usize,
    /// Reserved allocations of the allocation nodes (returned when the body goes).
    allocs: Vec<u64>,
    /// Allocation nodes whose memory the graph does not free itself (given to the caller at each
    /// replay, to be freed before the next one).
    escaping: Vec<u64>,
    releases: Arc<Mutex<Vec<u64>>>,
}

impl Drop for Body {
    fn drop(&mut self) {
        // The device's lock may be held here (a replay dropped by its stream): the reservations
        // are returned at the device's next call.
        self.releases.lock().extend(self.allocs.iter().copied());
    }
}

/// A captured graph (`CUgraph`, `hipGraph_t`).
pub struct Graph {
    pub(crate) body: Arc<Body>,
    device: u32,
    capture: u64,
    /// Executables of this graph alive now.
    execs: Arc<std::sync::atomic::AtomicUsize>,
}

impl Graph {
    /// Number of nodes (event records and waits are dependencies, not nodes).
    pub fn node_count(&self) -> usize {
        self.body.nodes.len()
    }

    /// The ordinal of the device whose streams may launch it.
    pub fn device(&self) -> u32 {
        self.device
    }

    /// The id of the capture it came from.
    pub fn capture_id(&self) -> u64 {
        self.capture
    }

    /// True when it has memory-allocation or free nodes (at most one executable at a time).
    pub fn has_memory_nodes(&self) -> bool {
        self.body
            .nodes
            .iter()
            .any(|n| matches!(n.kind, NodeKind::Alloc(_) | NodeKind::Free(_)))
    }
}

/// An executable graph (`CUgraphExec`, `hipGraphExec_t`): replays of one are ordered after each
/// other; it stays valid when its graph is destroyed.
pub struct Exec {
    pub(crate) body: Arc<Body>,
    device: u32,
    execs: Arc<std::sync::atomic::AtomicUsize>,
    /// Stream and position of the latest launch (the next launch waits for it).
    last: Mutex<Option<(StreamId, u64)>>,
    auto_free: bool,
}

impl Exec {
    /// An executable of `graph`; `auto_free` frees a previous replay's unfreed allocations before
    /// the next (`CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`).
    ///
    /// # Errors
    /// [`SimError::InvalidValue`] for a second executable of a graph with memory nodes (CUDA allows
    /// one at a time).
    pub fn new(graph: &Graph, auto_free: bool) -> SimResult<Exec> {
        if graph.execs.fetch_add(1, Ordering::AcqRel) > 0 && graph.has_memory_nodes() {
            graph.execs.fetch_sub(1, Ordering::AcqRel);
            return Err(SimError::InvalidValue(
                "a graph with memory nodes already has an executable".into(),
            ));
        }
        Ok(Exec {
            body: graph.body.clone(),
            device: graph.device,
            execs: graph.execs.clone(),
            last: Mutex::new(None),
            auto_free,
        })
    }

    /// The ordinal of its device.
    pub fn device(&self) -> u32 {
        self.device
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.execs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One capture in progress on a device.
pub(crate) struct Capture {
    id: u64,
    origin: StreamId,
    mode: CaptureMode,
    thread: ThreadId,
    invalidated: Option<String>,
    nodes: Vec<Node>,
    /// Every stream in the capture (the origin and those that joined) and its frontier.
    frontier: HashMap<StreamId, Vec<usize>>,
    gates: usize,
    allocs: Vec<u64>,
}

/// A replay at the head of its stream: the next node to run (an index into the body's order).
pub(crate) struct GraphRun {
    pub(crate) body: Arc<Body>,
    pub(crate) next: usize,
    pub(crate) gates: Vec<Option<Box<dyn Gate>>>,
    /// A kernel or host node of this replay is running on its own thread.
    pub(crate) in_kernel: bool,
}

/// What one step of a replay did.
pub(crate) enum Step {
    /// Every node ran.
    Done,
    /// The replay waits (a kernel thread, a gate).
    Blocked(Arc<dyn crate::Blocker>),
}

impl State {
    /// The capture `stream` belongs to (as origin or joined).
    pub(crate) fn capture_of(&self, stream: StreamId) -> Option<u64> {
        self.streams.get(&stream).and_then(|st| st.capture)
    }

    /// Invalidates capture `id` (if it is on this device and still going).
    pub(crate) fn invalidate(&mut self, id: u64, why: &str) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.invalidated.get_or_insert_with(|| why.to_string());
        }
    }

    /// The error of a call that broke a rule of capture `id`, which it invalidates.
    pub(crate) fn broken(&mut self, id: u64, kind: CaptureFault, why: String) -> SimError {
        self.invalidate(id, &why);
        fault(kind, why)
    }

    /// Refuses work on `stream` when it is capturing and the work cannot be captured, or on the
    /// legacy stream while a blocking stream captures (implicit dependency).
    pub(crate) fn check_uncaptured(&mut self, stream: StreamId, what: &str) -> SimResult<()> {
        if let Some(id) = self.capture_of(stream) {
            let why = format!("{what} cannot be captured by the simulator");
            return Err(self.broken(id, CaptureFault::Unsupported, why));
        }
        self.check_legacy(stream)
    }

    /// Work on (or a synchronisation of) the legacy default stream while a blocking stream of the
    /// device captures: [`CaptureFault::Implicit`], invalidating those captures.
    pub(crate) fn check_legacy(&mut self, stream: StreamId) -> SimResult<()> {
        if self.legacy != Some(stream) {
            return Ok(());
        }
        let ids: Vec<u64> = self
            .streams
            .values()
            .filter(|st| st.blocking && !st.destroyed)
            .filter_map(|st| st.capture)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let why = "the legacy default stream would depend on a capturing blocking stream";
        for id in ids {
            self.invalidate(id, why);
        }
        Err(fault(CaptureFault::Implicit, why))
    }

    /// Adds a node on capturing `stream` (capture `id`) after its frontier.
    pub(crate) fn add_node(&mut self, id: u64, stream: StreamId, kind: NodeKind) -> SimResult<()> {
        let c = self
            .captures
            .get_mut(&id)
            .expect("a stream's capture exists");
        if let Some(why) = &c.invalidated {
            return Err(fault(
                CaptureFault::Invalidated,
                format!("capture {id} was invalidated: {why}"),
            ));
        }
        let deps = c.frontier.get(&stream).cloned().unwrap_or_default();
        c.nodes.push(Node { kind, deps });
        let n = c.nodes.len() - 1;
        c.frontier.insert(stream, vec![n]);
        Ok(())
    }

    /// A capturing stream's record of `event`: the event names the stream's frontier.
    pub(crate) fn capture_record(&mut self, id: u64, stream: StreamId) -> SimResult<Vec<usize>> {
        let c = self.captures.get(&id).expect("a stream's capture exists");
        if let Some(why) = &c.invalidated {
            return Err(fault(
                CaptureFault::Invalidated,
                format!("capture {id} was invalidated: {why}"),
            ));
        }
        Ok(c.frontier.get(&stream).cloned().unwrap_or_default())
    }

    /// `stream` waits on an event last recorded in capture `of` with frontier `deps`.
    pub(crate) fn capture_wait(
        &mut self,
        stream: StreamId,
        of: u64,
        deps: &[usize],
    ) -> SimResult<()> {
        match self.capture_of(stream) {
            Some(id) if id == of => {
                let c = self.captures.get_mut(&id).expect("exists");
                if let Some(why) = &c.invalidated {
                    return Err(fault(
                        CaptureFault::Invalidated,
                        format!("capture {id} was invalidated: {why}"),
                    ));
                }
                let f = c.frontier.entry(stream).or_default();
                for d in deps {
                    if !f.contains(d) {
                        f.push(*d);
                    }
                }
                Ok(())
            }
            Some(id) => {
                let why = format!("a stream of capture {id} waits on an event of capture {of}");
                self.invalidate(of, &why);
                Err(self.broken(id, CaptureFault::Merge, why))
            }
            None if !self.captures.contains_key(&of) => Err(fault(
                CaptureFault::CapturedEvent,
                format!("the event was last recorded in capture {of}, which has ended"),
            )),
            None => {
                // Joins the capture.
                if self.legacy == Some(stream) {
                    let why = "the legacy default stream cannot join a capture".to_string();
                    return Err(self.broken(of, CaptureFault::Implicit, why));
                }
                let c = self.captures.get_mut(&of).expect("checked");
                c.frontier.insert(stream, deps.to_vec());
                self.streams.get_mut(&stream).expect("open").capture = Some(of);
                Ok(())
            }
        }
    }

    /// Every capture active on this device.
    pub(crate) fn active_captures(&self) -> Vec<u64> {
        self.captures.keys().copied().collect()
    }

    /// Removes capture `id`: its streams leave capture, it leaves the global registry.
    fn remove_capture(&mut self, id: u64) -> Option<Capture> {
        let c = self.captures.remove(&id)?;
        for s in c.frontier.keys() {
            if let Some(st) = self.streams.get_mut(s) {
                st.capture = None;
            }
        }
        ACTIVE.lock().retain(|a| a.id != id);
        Some(c)
    }

    /// A stream in capture `id` is destroyed: the capture is invalidated (and gone with its
    /// origin).
    pub(crate) fn capture_stream_destroyed(&mut self, id: u64, stream: StreamId) {
        let origin = self.captures.get(&id).map(|c| c.origin);
        if origin == Some(stream) {
            if let Some(c) = self.remove_capture(id) {
                for a in c.allocs {
                    self.memory.unreserve(a);
                }
            }
        } else {
            self.invalidate(id, "a stream in the capture was destroyed");
            if let Some(c) = self.captures.get_mut(&id) {
                c.frontier.remove(&stream);
            }
        }
    }

    /// Returns the reservations of graphs that are gone.
    pub(crate) fn release_graph_memory(&mut self) {
        let gone: Vec<u64> = std::mem::take(&mut *self.releases.lock());
        for a in gone {
            self.memory.unreserve(a);
            self.graph_allocs.remove(&a);
        }
    }

    /// Runs the replay at the head of `stream` as far as it goes.
    pub(crate) fn step_graph(&mut self, stream: StreamId) -> SimResult<Step> {
        loop {
            if self.sticky.is_some() {
                return Ok(Step::Done);
            }
            let State {
                streams,
                memory,
                exec,
                running,
                ..
            } = self;
            let st = streams
                .get_mut(&stream)
                .ok_or_else(|| SimError::InvalidHandle(format!("stream {}", stream.0)))?;
            let Some(Op::Graph(run)) = st.queue.front_mut() else {
                unreachable!("step_graph runs a replay at the head of its stream");
            };
            if run.next == run.body.order.len() {
                return Ok(Step::Done);
            }
            let i = run.body.order[run.next];
            let failed = match &run.body.nodes[i].kind {
                NodeKind::Work { touches, run: w } => touches
                    .iter()
                    .try_for_each(|&(a, l)| memory.check(a, l).map(|_| ()))
                    .and_then(|()| {
                        let mut w = w.lock();
                        (*w)(memory)
                    })
                    .err(),
                NodeKind::Kernel(k) => {
                    if let Some(ex) = exec {
                        let k = k.clone();
                        // Past this node; the stream stays held until its thread returns.
                        run.next += 1;
                        run.in_kernel = true;
                        let job = Box::new(move || {
                            let mut k = k.lock();
                            (*k)()
                        });
                        if let Err(e) = ex.start(stream, job) {
                            run.in_kernel = false;
                            Some(SimError::LaunchFailed(format!(
                                "cannot start a thread for a kernel: {e}"
                            )))
                        } else {
                            running.insert(stream);
                            return Ok(Step::Blocked(self.running_blocker(stream)));
                        }
                    } else {
                        let mut k = k.lock();
                        (*k)().err()
                    }
                }
                NodeKind::Gate { slot, .. } => {
                    let gate = run.gates[*slot].as_mut().expect("made at launch");
                    match gate.poll(memory) {
                        crate::GatePoll::Blocked(b) => return Ok(Step::Blocked(b)),
                        crate::GatePoll::Done(r) => {
                            run.gates[*slot] = None;
                            r.err()
                        }
                    }
                }
                NodeKind::Alloc(a) => memory.unpark(*a).err(),
                NodeKind::Free(a) => memory.free(*a).err(),
            };
            if !matches!(run.body.nodes[i].kind, NodeKind::Kernel(_)) || exec.is_none() {
                run.next += 1;
            }
            if let Some(e) = failed {
                self.fail(e);
            }
        }
    }

    /// Ranges the queued replays touch (a free of them is refused).
    pub(crate) fn graph_touches(run: &GraphRun) -> impl Iterator<Item = &(u64, u64)> {
        run.body.nodes.iter().flat_map(|n| match &n.kind {
            NodeKind::Work { touches, .. } | NodeKind::Gate { touches, .. } => touches.iter(),
            _ => [].iter(),
        })
    }
}

/// The replay order: a topological order of `nodes` that runs the latest-captured ready node
/// first.
fn replay_order(nodes: &[Node]) -> Vec<usize> {
    let mut pending: Vec<usize> = nodes.iter().map(|n| n.deps.len()).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for &d in &n.deps {
            children[d].push(i);
        }
    }
    let mut ready: BinaryHeap<usize> = (0..nodes.len()).filter(|&i| pending[i] == 0).collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(i) = ready.pop() {
        order.push(i);
        for &c in &children[i] {
            pending[c] -= 1;
            if pending[c] == 0 {
                ready.push(c);
            }
        }
    }
    order
}

impl Device {
    /// Begins a capture on `stream` in `mode` from the calling thread.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] for the legacy
    /// default stream; [`CaptureFault::IllegalState`] when the stream is capturing already.
    pub fn begin_capture(&self, stream: StreamId, mode: CaptureMode) -> SimResult<u64> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        if s.legacy == Some(stream) {
            return Err(SimError::InvalidValue(
                "capture may not begin on the legacy default stream".into(),
            ));
        }
        if let Some(id) = s.capture_of(stream) {
            return Err(fault(
                CaptureFault::IllegalState,
                format!("stream {} is capturing already (capture {id})", stream.0),
            ));
        }
        let id = NEXT_CAPTURE.fetch_add(1, Ordering::Relaxed);
        let thread = std::thread::current().id();
        s.captures.insert(
            id,
            Capture {
                id,
                origin: stream,
                mode,
                thread,
                invalidated: None,
                nodes: Vec::new(),
                frontier: HashMap::from([(stream, Vec::new())]),
                gates: 0,
                allocs: Vec::new(),
            },
        );
        s.streams.get_mut(&stream).expect("open").capture = Some(id);
        ACTIVE.lock().push(Active {
            id,
            thread,
            mode,
            state: Arc::downgrade(&self.state),
        });
        Ok(id)
    }

    /// Ends the capture `stream` began and returns its graph; every stream in it leaves capture
    /// (also when this fails, but for a wrong thread).
    ///
    /// # Errors
    /// [`CaptureFault::IllegalState`] when the stream is not capturing;
    /// [`CaptureFault::Unmatched`] for a stream that joined (the capture is invalidated);
    /// [`CaptureFault::WrongThread`] for a capture not in relaxed mode ended from another thread
    /// (it goes on); [`CaptureFault::Invalidated`]; [`CaptureFault::Unjoined`] when a stream that
    /// joined was not joined back into the origin.
    pub fn end_capture(&self, stream: StreamId) -> SimResult<Graph> {
        let mut s = self.state.lock();
        s.release_graph_memory();
        s.open_stream(stream)?;
        let Some(id) = s.capture_of(stream) else {
            return Err(fault(
                CaptureFault::IllegalState,
                format!("stream {} is not capturing", stream.0),
            ));
        };
        let c = s.captures.get(&id).expect("exists");
        if c.origin != stream {
            let why = format!(
                "capture {id} began on stream {}, not on stream {}",
                c.origin.0, stream.0
            );
            return Err(s.broken(id, CaptureFault::Unmatched, why));
        }
        if c.mode != CaptureMode::Relaxed && c.thread != std::thread::current().id() {
            return Err(fault(
                CaptureFault::WrongThread,
                format!("capture {id} ({:?} mode) began on another thread", c.mode),
            ));
        }
        let c = s.remove_capture(id).expect("exists");
        let unjoined = unjoined(&c);
        let failure = match (&c.invalidated, unjoined) {
            (Some(why), _) => Some(fault(
                CaptureFault::Invalidated,
                format!("capture {id} was invalidated: {why}"),
            )),
            (None, Some(s)) => Some(fault(
                CaptureFault::Unjoined,
                format!(
                    "stream {} joined capture {id} and was not joined back into its origin",
                    s.0
                ),
            )),
            (None, None) => None,
        };
        if let Some(e) = failure {
            for a in c.allocs {
                s.memory.unreserve(a);
            }
            return Err(e);
        }
        let frees: HashSet<u64> = c
            .nodes
            .iter()
            .filter_map(|n| match n.kind {
                NodeKind::Free(a) => Some(a),
                _ => None,
            })
            .collect();
        let escaping = c
            .allocs
            .iter()
            .copied()
            .filter(|a| !frees.contains(a))
            .collect();
        let order = replay_order(&c.nodes);
        Ok(Graph {
            body: Arc::new(Body {
                order,
                gates: c.gates,
                allocs: c.allocs,
                escaping,
                nodes: c.nodes,
                releases: s.releases.clone(),
            }),
            device: self.ordinal,
            capture: c.id,
            execs: Arc::default(),
        })
    }

    /// Whether `stream` is capturing, with its capture's id.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`]; [`CaptureFault::Implicit`] for the legacy default stream while
    /// a blocking stream captures (which is not invalidated by asking).
    pub fn capture_status(&self, stream: StreamId) -> SimResult<CaptureStatus> {
        let mut s = self.state.lock();
        s.open_stream(stream)?;
        if s.legacy == Some(stream)
            && s.streams
                .values()
                .any(|st| st.blocking && st.capture.is_some() && !st.destroyed)
        {
            return Err(fault(
                CaptureFault::Implicit,
                "the legacy default stream while a blocking stream captures",
            ));
        }
        Ok(match s.capture_of(stream) {
            None => CaptureStatus::None,
            Some(id) if s.captures[&id].invalidated.is_some() => CaptureStatus::Invalidated(id),
            Some(id) => CaptureStatus::Active(id),
        })
    }

    /// Refuses `what` (work that cannot be captured) on a capturing stream, invalidating its
    /// capture.
    ///
    /// # Errors
    /// [`CaptureFault::Unsupported`]; [`SimError::InvalidHandle`].
    pub fn refuse_capture(&self, stream: StreamId, what: &str) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        match s.capture_of(stream) {
            Some(id) => {
                let why = format!("{what} on capturing stream {}", stream.0);
                Err(s.broken(id, CaptureFault::Unsupported, why))
            }
            None => Ok(()),
        }
    }

    /// True when `stream` is capturing (as the origin or joined).
    pub fn is_capturing(&self, stream: StreamId) -> bool {
        self.state.lock().capture_of(stream).is_some()
    }

    /// Queues repeatable device work on `stream`: a node when it captures, else an operation.
    ///
    /// # Errors
    /// As [`Device::enqueue`]; [`CaptureFault::Invalidated`] on an invalidated capture.
    pub fn enqueue_repeatable(
        &self,
        stream: StreamId,
        touches: Vec<(u64, u64)>,
        run: RepeatWork,
    ) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        match s.capture_of(stream) {
            Some(id) => {
                for &(addr, len) in &touches {
                    if !s.memory.check_reserved(addr, len) {
                        return Err(SimError::InvalidValue(format!(
                            "{len} bytes at {addr:#x} outside every allocation"
                        )));
                    }
                }
                let run = Mutex::new(run);
                s.add_node(id, stream, NodeKind::Work { touches, run })
            }
            None => {
                drop(s);
                let mut run = run;
                self.enqueue(
                    stream,
                    crate::Work {
                        touches,
                        run: Box::new(move |m| run(m)),
                    },
                )
            }
        }
    }

    /// Queues a repeatable kernel or host function (a node while capturing).
    pub(crate) fn enqueue_kernel(&self, stream: StreamId, k: RepeatKernel) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        if let Some(id) = s.capture_of(stream) {
            return s.add_node(id, stream, NodeKind::Kernel(Arc::new(Mutex::new(k))));
        }
        s.push(stream, Op::Kernel(k))?;
        self.after_enqueue(&mut s, stream)
    }

    /// Queues a gate made anew at every replay: a node while `stream` captures, else the gate of
    /// one `prepare` now.
    ///
    /// # Errors
    /// As [`Device::enqueue_gate`]; the factory's.
    pub fn enqueue_gate_repeatable(
        &self,
        stream: StreamId,
        touches: Vec<(u64, u64)>,
        factory: Arc<dyn GateFactory>,
    ) -> SimResult<()> {
        {
            let mut s = self.live()?;
            s.open_stream(stream)?;
            if let Some(id) = s.capture_of(stream) {
                for &(addr, len) in &touches {
                    if !s.memory.check_reserved(addr, len) {
                        return Err(SimError::InvalidValue(format!(
                            "{len} bytes at {addr:#x} outside every allocation"
                        )));
                    }
                }
                let slot = s.captures[&id].gates;
                s.add_node(
                    id,
                    stream,
                    NodeKind::Gate {
                        touches,
                        factory,
                        slot,
                    },
                )?;
                s.captures.get_mut(&id).expect("exists").gates += 1;
                return Ok(());
            }
        }
        let make = factory.prepare()?;
        self.enqueue_gate(stream, touches, move |position| make(stream, position))
    }

    /// A stream-ordered allocation of `len` bytes on `stream`: now, or (while capturing) an
    /// allocation node whose reserved address is returned.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; out of memory.
    pub fn alloc_on(&self, stream: StreamId, len: u64) -> SimResult<u64> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        match s.capture_of(stream) {
            Some(id) => {
                let addr = s.memory.reserve(len)?;
                if let Err(e) = s.add_node(id, stream, NodeKind::Alloc(addr)) {
                    s.memory.unreserve(addr);
                    return Err(e);
                }
                s.captures.get_mut(&id).expect("exists").allocs.push(addr);
                Ok(addr)
            }
            None => s.memory.alloc(len),
        }
    }

    /// A stream-ordered free on `stream` (a free node while capturing).
    ///
    /// # Errors
    /// As [`Device::enqueue`].
    pub fn free_on(&self, stream: StreamId, addr: u64) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        if let Some(id) = s.capture_of(stream) {
            if !s.memory.check_reserved(addr, 0) {
                return Err(SimError::InvalidValue(format!(
                    "{addr:#x} is not an allocation"
                )));
            }
            return s.add_node(id, stream, NodeKind::Free(addr));
        }
        if let Some(allocated) = s.graph_allocs.get_mut(&addr) {
            *allocated = false;
        }
        drop(s);
        self.enqueue(
            stream,
            crate::Work {
                touches: vec![(addr, 0)],
                run: Box::new(move |m| m.free(addr)),
            },
        )
    }

    /// Enqueues a replay of `exec` on `stream`, after the previous launch of `exec` (on any
    /// stream).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] for an exec of
    /// another device, or when a previous launch's allocation is still allocated (without
    /// auto-free); [`CaptureFault::Unsupported`] on a capturing stream (not simulated: CUDA would
    /// add a child-graph node), which invalidates the capture; a gate factory's error.
    pub fn launch_graph(&self, stream: StreamId, exec: &Arc<Exec>) -> SimResult<()> {
        if exec.device != self.ordinal {
            return Err(SimError::InvalidValue(format!(
                "an executable graph of device {} launched on device {}",
                exec.device, self.ordinal
            )));
        }
        {
            let mut s = self.live()?;
            s.open_stream(stream)?;
            s.check_uncaptured(stream, "a graph launch into a capture")?;
            for a in &exec.body.escaping {
                if s.graph_allocs.get(a) == Some(&true) && !exec.auto_free {
                    return Err(SimError::InvalidValue(format!(
                        "graph allocation {a:#x} of the previous launch is not freed"
                    )));
                }
            }
        }
        // Per-replay state (collective sequence numbers), in launch order, without the lock.
        let body = &exec.body;
        let mut makes: Vec<Option<MakeGate>> = Vec::with_capacity(body.gates);
        makes.resize_with(body.gates, || None);
        for &i in &body.order {
            if let NodeKind::Gate { factory, slot, .. } = &body.nodes[i].kind {
                makes[*slot] = Some(factory.prepare()?);
            }
        }
        let mut s = self.live()?;
        s.implicit_waits(stream)?;
        let mut last = exec.last.lock();
        if let Some((on, position)) = *last {
            if on != stream && !s.reached(on, position) {
                s.push(
                    stream,
                    Op::Wait {
                        stream: on,
                        position,
                    },
                )?;
            }
        }
        if exec.auto_free {
            for &a in &body.escaping {
                if s.graph_allocs.get(&a) == Some(&true) {
                    s.push(
                        stream,
                        Op::Work(crate::Work {
                            touches: vec![],
                            run: Box::new(move |m| m.free(a)),
                        }),
                    )?;
                }
            }
        }
        let position = s.stream(stream)?.enqueued + 1;
        let gates = makes
            .into_iter()
            .map(|m| m.map(|m| m(stream, position)))
            .collect();
        for &a in &body.escaping {
            s.graph_allocs.insert(a, true);
        }
        s.push(
            stream,
            Op::Graph(Box::new(GraphRun {
                body: body.clone(),
                next: 0,
                gates,
                in_kernel: false,
            })),
        )?;
        *last = Some((stream, position));
        drop(last);
        self.after_enqueue(&mut s, stream)
    }
}

/// A stream that joined `c` and was not joined back into its origin, if any.
fn unjoined(c: &Capture) -> Option<StreamId> {
    let mut seen: HashSet<usize> = HashSet::new();
    let mut todo: Vec<usize> = c.frontier.get(&c.origin).cloned().unwrap_or_default();
    while let Some(n) = todo.pop() {
        if seen.insert(n) {
            todo.extend(c.nodes[n].deps.iter().copied());
        }
    }
    let mut others: Vec<(&StreamId, &Vec<usize>)> =
        c.frontier.iter().filter(|(s, _)| **s != c.origin).collect();
    others.sort_by_key(|(s, _)| s.0);
    others
        .into_iter()
        .find(|(_, f)| f.iter().any(|n| !seen.contains(n)))
        .map(|(s, _)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(deps: &[usize]) -> Node {
        Node {
            kind: NodeKind::Alloc(0),
            deps: deps.to_vec(),
        }
    }

    #[test]
    fn replay_order_is_topological_and_latest_ready_first() {
        // 0 -> 1, 0 -> 2, {1, 2} -> 3, 4 independent.
        let nodes = vec![node(&[]), node(&[0]), node(&[0]), node(&[1, 2]), node(&[])];
        assert_eq!(replay_order(&nodes), vec![4, 0, 2, 1, 3]);
    }
}
