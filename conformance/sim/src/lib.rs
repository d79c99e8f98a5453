//! # unihal-sim: the core of unihal's simulated vendor runtimes
//!
//! Test infrastructure, never a product path. A simulated runtime is this core plus a *face*: a
//! shared library exporting a vendor's C API (the CUDA driver, NCCL; later HIP/RCCL and
//! ACL/HCCL) that a backend loads through its library override exactly like the real one. The
//! core is vendor-neutral:
//!
//! * **memory** ([`memory`]): host allocations tracked in a table; every copy and fill is checked
//!   against a live allocation; double frees, frees of memory that queued work still uses, and a
//!   configurable capacity (out-of-memory) are detected;
//! * **streams** ([`Device::enqueue`]): FIFO queues of work. In [`Mode::Deferred`] work runs only
//!   at a synchronisation point (stream, event or device synchronise), so a missing cross-stream
//!   wait gives wrong results instead of passing by luck; [`Mode::Eager`] runs work as it is
//!   enqueued; [`Mode::Concurrent`] does too, with each kernel on a pooled thread outside the
//!   device lock, so the host and other streams go on while a kernel runs, as on a GPU;
//! * **events**: markers in a stream, timestamped when the stream executes them; a stream waiting
//!   on an event first runs the recording stream up to it (so dependencies, and only they, order
//!   work across streams);
//! * **sticky errors**: a fault in device work (an illegal address, a failed kernel) poisons the
//!   device: every later call returns it, as on hardware;
//! * **kernels** ([`module`]): modules are PTX text; each `.entry` runs the host function
//!   registered under its name (unihal's portable library has one per kernel), with argument values
//!   copied at launch (CUDA's `kernelParams` convention) and grid/block/shared-memory limits
//!   checked. Kernels run natively on host memory: their own loads and stores are not checked
//!   against the allocation table (a wild pointer in a kernel is a crash, not an error code).
//!
//! * **two devices** ([`peer`]): copies between devices' memories and waits on another device's
//!   events, as gates that touch the other device without ever waiting on its lock.
//!
//! A [`Device`] is thread-safe: one lock orders API calls and the execution of device work.

pub mod ccl;
pub mod error;
pub mod fault;
pub mod fault_c;
pub mod gpu;
pub mod graph;
pub mod memory;
pub mod module;
pub mod peer;
mod workers;

pub use error::{CaptureFault, SimError, SimResult};

/// The simulated library `file` (e.g. `libunihal_sim_cuda.so`) built next to the running test
/// executable: cargo builds a dev-dependency's cdylib into `target/<profile>/deps` (`cargo test`)
/// or `target/<profile>` (`cargo build`).
///
/// # Panics
/// When it is not built there (a test that needs it cannot run; the message says where).
pub fn built_library(file: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    let deps = exe.parent().expect("the executable's directory");
    [Some(deps.join(file)), deps.parent().map(|p| p.join(file))]
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "the simulated library {file} is not built next to {}",
                deps.display()
            )
        })
}
pub use memory::Memory;
pub use module::{Entry, Kernels, Limits};

use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When queued work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// At enqueue (after the waits it depends on).
    Eager,
    /// Only at synchronisation points: stream, event and device synchronise.
    Deferred,
    /// As it is enqueued, as in `Eager`, but each kernel on a thread of its own outside the
    /// device lock, as a GPU runs it: the host and the other streams go on while it runs (a
    /// kernel spinning on a flag can be released by a copy on another stream), and its stream
    /// stays behind it until it returns.
    Concurrent,
}

/// A stream handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(pub u64);

/// An event handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// A module handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModuleId(pub u64);

/// A kernel (function) handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FunctionId(pub u64);

/// The body of device work: runs once, on the device's memory.
pub type WorkFn = Box<dyn FnOnce(&mut Memory) -> SimResult<()> + Send>;

/// The body of a kernel: runs once, on device memory through the addresses in its arguments
/// (never through the allocation table, so it can run outside the device lock).
type KernelFn = Box<dyn FnOnce() -> SimResult<()> + Send>;

/// Device work: a closure over device memory, with the ranges it touches (checked when it is
/// enqueued, again when it runs, and against frees while it is queued).
pub struct Work {
    /// `(address, length)` of every range the work reads or writes.
    pub touches: Vec<(u64, u64)>,
    pub run: WorkFn,
}

/// What a [`Gate`] reports when polled.
pub enum GatePoll {
    /// Finished (with the gate's result; an error poisons the device as a failed kernel does).
    Done(SimResult<()>),
    /// Waiting on something outside this device (the peers of a collective).
    Blocked(Arc<dyn Blocker>),
}

/// Device work that may have to wait for something outside its device, such as the other ranks
/// of a collective. Polled under the device lock each time its stream reaches it; it stays at the
/// head of its stream (and its ranges stay in use) until it reports [`GatePoll::Done`].
pub trait Gate: Send {
    /// Makes what progress it can without blocking.
    fn poll(&mut self, memory: &mut Memory) -> GatePoll;
}

/// What a blocked [`Gate`] waits for. Called with no device lock held.
pub trait Blocker: Send + Sync {
    /// Lets the awaited work progress (runs the peers' streams up to their part, which is
    /// non-blocking) and then waits up to `timeout` for a change.
    fn unblock(&self, timeout: Duration);
    /// The watchdog expired while waiting: fail the awaited work everywhere, so no peer waits
    /// for it either, and say what never came.
    fn expire(&self) -> String;
}

/// Default time a synchronisation waits for a blocked gate before the watchdog fails it.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(60);

enum Op {
    Work(Work),
    Kernel(KernelFn),
    Gate {
        touches: Vec<(u64, u64)>,
        gate: Box<dyn Gate>,
    },
    Record {
        event: EventId,
        generation: u64,
    },
    Wait {
        stream: StreamId,
        position: u64,
    },
    /// A replay of an executable graph, run node by node at the head of its stream.
    Graph(Box<graph::GraphRun>),
}

#[derive(Default)]
struct StreamState {
    queue: VecDeque<Op>,
    /// Synchronises with the legacy default stream (CUDA's blocking streams).
    blocking: bool,
    /// Operations enqueued and executed so far.
    enqueued: u64,
    executed: u64,
    /// Destroyed with work still queued: no new work; removed once the queue has run.
    destroyed: bool,
    /// The capture this stream records into (as its origin or joined), if any.
    capture: Option<u64>,
}

#[derive(Default)]
struct EventState {
    /// Stream and position of the latest record (None: never recorded).
    record: Option<(StreamId, u64)>,
    generation: u64,
    time: Option<Instant>,
    /// Last recorded on a capturing stream: the capture and the nodes the record follows.
    captured: Option<(u64, Vec<usize>)>,
}

struct State {
    memory: Memory,
    streams: HashMap<StreamId, StreamState>,
    events: HashMap<EventId, EventState>,
    modules: HashMap<ModuleId, Vec<Entry>>,
    functions: HashMap<FunctionId, (ModuleId, Entry)>,
    next_id: u64,
    sticky: Option<SimError>,
    legacy: Option<StreamId>,
    /// Streams whose head kernel runs on its own thread ([`Mode::Concurrent`]).
    running: HashSet<StreamId>,
    /// How kernels leave the lock in [`Mode::Concurrent`] (None: they run inline).
    exec: Option<Exec>,
    /// Captures in progress on this device's streams, by id.
    captures: HashMap<u64, graph::Capture>,
    /// Graph allocations that escape their graph, and whether the last launch's allocation is
    /// still allocated (a launch is refused until it is freed).
    graph_allocs: HashMap<u64, bool>,
    /// Reservations of graphs that are gone, returned at the next call.
    releases: Arc<Mutex<Vec<u64>>>,
}

/// The way back to a device's state from a kernel's thread.
struct Exec {
    state: std::sync::Weak<Mutex<State>>,
    /// Notified whenever a kernel returns.
    done: Arc<Condvar>,
}

/// How far [`State::run_until`] got.
enum Progress {
    Reached,
    Blocked(Arc<dyn Blocker>),
}

/// One simulated device.
pub struct Device {
    mode: Mode,
    kernels: Kernels,
    limits: Limits,
    ordinal: u32,
    watchdog: Duration,
    state: Arc<Mutex<State>>,
}

/// Handles of a device are `ordinal << HANDLE_SHIFT | n`, so a face can tell a handle's device.
pub const HANDLE_SHIFT: u32 = 40;

impl Device {
    /// A device with `capacity` bytes of memory running work in `mode`, without kernels.
    pub fn new(capacity: u64, mode: Mode) -> Device {
        Device::with_kernels(capacity, mode, Kernels::new(), Limits::default())
    }

    /// A device that runs `kernels` under `limits`.
    pub fn with_kernels(capacity: u64, mode: Mode, kernels: Kernels, limits: Limits) -> Device {
        let state = Arc::new(Mutex::new(State {
            memory: Memory::new(capacity),
            streams: HashMap::new(),
            events: HashMap::new(),
            modules: HashMap::new(),
            functions: HashMap::new(),
            next_id: 1,
            sticky: None,
            legacy: None,
            running: HashSet::new(),
            exec: None,
            captures: HashMap::new(),
            graph_allocs: HashMap::new(),
            releases: Arc::new(Mutex::new(Vec::new())),
        }));
        if mode == Mode::Concurrent {
            state.lock().exec = Some(Exec {
                state: Arc::downgrade(&state),
                done: Arc::new(Condvar::new()),
            });
        }
        Device {
            mode,
            kernels,
            limits,
            ordinal: 0,
            watchdog: DEFAULT_WATCHDOG,
            state,
        }
    }

    /// The same device as device number `ordinal` of its face: its handles (streams, events,
    /// modules, functions) become `ordinal << HANDLE_SHIFT | n` (see [`Device::ordinal_of`]).
    /// Call before creating any handle.
    pub fn with_ordinal(mut self, ordinal: u32) -> Device {
        self.ordinal = ordinal;
        self.state.lock().next_id = u64::from(ordinal) << HANDLE_SHIFT;
        self
    }

    /// The same device with another watchdog: how long a synchronisation waits for a blocked
    /// gate (a collective whose peers never come) before failing it with [`SimError::Timeout`].
    pub fn with_watchdog(mut self, watchdog: Duration) -> Device {
        self.watchdog = watchdog;
        self
    }

    /// The device's ordinal (0 unless set by [`Device::with_ordinal`]).
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The ordinal of the device that made handle `h`.
    pub fn ordinal_of(h: u64) -> u32 {
        (h >> HANDLE_SHIFT) as u32
    }

    /// The launch limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Loads a module from its entry points, as the face read them from its image format (PTX
    /// through [`module::parse_ptx`] today; AMD code objects next): the core never parses an
    /// image itself.
    ///
    /// # Errors
    /// The sticky error.
    pub fn load_module(&self, entries: Vec<module::Entry>) -> SimResult<ModuleId> {
        let mut s = self.live()?;
        let id = ModuleId(s.fresh());
        s.modules.insert(id, entries);
        fault::track(&fault::LIVE_MODULES, 1);
        Ok(id)
    }

    /// Unloads a module; its functions become invalid handles.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`].
    pub fn unload_module(&self, module: ModuleId) -> SimResult<()> {
        let mut s = self.state.lock();
        s.modules
            .remove(&module)
            .ok_or_else(|| SimError::InvalidHandle(format!("module {}", module.0)))?;
        s.functions.retain(|_, (m, _)| *m != module);
        fault::track(&fault::LIVE_MODULES, -1);
        Ok(())
    }

    /// The kernel `name` of a module.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`]; [`SimError::NotFound`] when the module has no such entry.
    pub fn function(&self, module: ModuleId, name: &str) -> SimResult<FunctionId> {
        let mut s = self.live()?;
        let entry = s
            .modules
            .get(&module)
            .ok_or_else(|| SimError::InvalidHandle(format!("module {}", module.0)))?
            .iter()
            .find(|e| e.name == name)
            .cloned()
            .ok_or_else(|| SimError::NotFound(format!("kernel {name}")))?;
        let id = FunctionId(s.fresh());
        s.functions.insert(id, (module, entry));
        Ok(id)
    }

    /// The PTX entry of a function (name and parameter sizes).
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`].
    pub fn entry(&self, function: FunctionId) -> SimResult<Entry> {
        let s = self.state.lock();
        s.functions
            .get(&function)
            .map(|(_, e)| e.clone())
            .ok_or_else(|| SimError::InvalidHandle(format!("function {}", function.0)))
    }

    /// Queues a launch of `function` on `stream` with the argument values `args` (copied now, one
    /// per parameter, each exactly the parameter's size).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] for a launch
    /// beyond the limits or arguments that do not match the parameters;
    /// [`SimError::Unsupported`] when no host function runs the entry.
    pub fn launch(
        &self,
        stream: StreamId,
        function: FunctionId,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        args: &[&[u8]],
    ) -> SimResult<()> {
        let entry = self.entry(function)?;
        self.limits.check(grid, block, shared_bytes)?;
        let sizes: Vec<usize> = args.iter().map(|a| a.len()).collect();
        if sizes != entry.param_sizes {
            return Err(SimError::InvalidValue(format!(
                "kernel {}: argument sizes {sizes:?}, parameters {:?}",
                entry.name, entry.param_sizes
            )));
        }
        let f = self.kernels.get(&entry.name).ok_or_else(|| {
            SimError::Unsupported(format!("kernel {} has no host function", entry.name))
        })?;
        // Argument copies, 16-byte aligned as parameter space is: the values of the launch, and
        // the copies a run hands the kernel (restored before every run, so that a replay of a
        // captured launch sees the launch's values even if a kernel wrote its parameters).
        let owned: Vec<Vec<u128>> = args
            .iter()
            .map(|a| {
                let mut v = vec![0u128; a.len().div_ceil(16).max(1)];
                // SAFETY: `v` holds at least `a.len()` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(a.as_ptr(), v.as_mut_ptr() as *mut u8, a.len())
                };
                v
            })
            .collect();
        let mut scratch = owned.clone();
        let mut params: Vec<usize> = vec![0; owned.len()];
        let name = entry.name;
        let run: graph::RepeatKernel = Box::new(move || {
            for ((s, o), p) in scratch.iter_mut().zip(&owned).zip(params.iter_mut()) {
                s.copy_from_slice(o);
                *p = s.as_mut_ptr() as usize;
            }
            // SAFETY: `f` follows the host-kernel ABI (a registered library or test kernel);
            // `params` holds one pointer per parameter to a 16-byte-aligned copy of the size the
            // entry declares (checked above), alive for the call (`usize` and `*mut c_void` have
            // one layout).
            unsafe {
                let params = std::slice::from_raw_parts(
                    params.as_ptr() as *const *mut std::ffi::c_void,
                    params.len(),
                );
                module::run_blocks(f, &name, grid, block, shared_bytes, params)
            }
        });
        self.enqueue_kernel(stream, run)
    }

    /// Queues a host function on `stream`. As the vendors' runtimes do, it never runs on the
    /// thread that enqueues it when device work runs concurrently with the host
    /// ([`Mode::Concurrent`]: on a thread of its own, as a kernel, its stream held until it
    /// returns), so a callback that blocks until the host releases it holds its stream, not the
    /// host; in the other modes it runs where that mode runs kernels. `f` runs as a host function
    /// (runtime calls from it are refused by the face, see `gpu::run_host_fn`).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`].
    pub fn enqueue_host_fn(&self, stream: StreamId, f: Box<dyn FnMut() + Send>) -> SimResult<()> {
        let mut f = f;
        let run: graph::RepeatKernel = Box::new(move || {
            crate::gpu::run_host_fn(&mut f);
            Ok(())
        });
        self.enqueue_kernel(stream, run)
    }

    /// The execution mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The device's sticky error, if a fault poisoned it.
    pub fn sticky(&self) -> Option<SimError> {
        self.state.lock().sticky.clone()
    }

    /// (free, total) bytes.
    pub fn memory_info(&self) -> (u64, u64) {
        self.state.lock().memory.info()
    }

    /// True when `addr` lies inside one of this device's live allocations.
    pub fn owns(&self, addr: u64) -> bool {
        self.state.lock().memory.holds(addr)
    }

    /// Allocates `len` bytes of device memory.
    ///
    /// # Errors
    /// The sticky error; [`SimError::OutOfMemory`].
    pub fn alloc(&self, len: u64) -> SimResult<u64> {
        let mut s = self.live()?;
        s.memory.alloc(len)
    }

    /// Frees an allocation now (`cuMemFree` semantics: the caller must have synchronised).
    ///
    /// # Errors
    /// The sticky error; [`SimError::FreeInFlight`] when queued work still touches it;
    /// [`SimError::DoubleFree`]; [`SimError::InvalidValue`].
    pub fn free(&self, addr: u64) -> SimResult<()> {
        let mut s = self.live()?;
        if let Ok(start) = s.memory.check(addr, 0) {
            if start == addr && s.touched_by_queued_work(addr) {
                return Err(SimError::FreeInFlight(addr));
            }
        }
        s.memory.free(addr)?;
        if let Some(allocated) = s.graph_allocs.get_mut(&addr) {
            *allocated = false;
        }
        Ok(())
    }

    /// Writes host bytes to device memory synchronously (after all queued work, as a blocking
    /// copy on the legacy default stream would).
    ///
    /// # Errors
    /// The sticky error; [`SimError::IllegalAddress`].
    pub fn write(&self, addr: u64, src: &[u8]) -> SimResult<()> {
        self.synchronize()?;
        self.live()?.memory.write(addr, src)
    }

    /// Reads device memory synchronously (after all queued work).
    ///
    /// # Errors
    /// The sticky error; [`SimError::IllegalAddress`].
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> SimResult<()> {
        self.synchronize()?;
        self.live()?.memory.read(addr, dst)
    }

    /// Reads device memory once `stream`'s queued work has run (and what it waits on), without
    /// synchronising other streams: a blocking copy to pageable host memory.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::IllegalAddress`].
    pub fn read_on(&self, stream: StreamId, addr: u64, dst: &mut [u8]) -> SimResult<()> {
        {
            let mut s = self.live()?;
            if let Some(id) = s.capture_of(stream) {
                let why = "a synchronous copy to pageable host memory on a capturing stream";
                return Err(s.broken(id, error::CaptureFault::Unsupported, why.into()));
            }
        }
        self.stream_synchronize(stream)?;
        self.live()?.memory.read(addr, dst)
    }

    /// Whether `stream` exists.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`].
    pub fn query_stream(&self, stream: StreamId) -> SimResult<()> {
        self.live()?.open_stream(stream).map(|_| ())
    }

    /// Creates a stream.
    ///
    /// # Errors
    /// The sticky error.
    pub fn create_stream(&self) -> SimResult<StreamId> {
        self.create_stream_with(false)
    }

    /// Creates a stream; a `blocking` one is ordered with the legacy default stream (see
    /// [`Device::create_legacy_stream`]) as CUDA's streams created without
    /// `CU_STREAM_NON_BLOCKING` are.
    ///
    /// # Errors
    /// The sticky error.
    pub fn create_stream_with(&self, blocking: bool) -> SimResult<StreamId> {
        let mut s = self.live()?;
        let id = StreamId(s.fresh());
        s.streams.insert(
            id,
            StreamState {
                blocking,
                ..StreamState::default()
            },
        );
        fault::track(&fault::LIVE_STREAMS, 1);
        Ok(id)
    }

    /// Creates the device's legacy default stream: work queued on it first waits for all work
    /// queued before on blocking streams, and work queued later on a blocking stream waits for
    /// it (CUDA's implicit synchronisation of the null stream). One per device.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidUsage`] for a second one.
    pub fn create_legacy_stream(&self) -> SimResult<StreamId> {
        let id = self.create_stream_with(false)?;
        let mut s = self.state.lock();
        if s.legacy.is_some() {
            s.streams.remove(&id);
            fault::track(&fault::LIVE_STREAMS, -1);
            return Err(SimError::InvalidUsage("a second legacy stream".into()));
        }
        s.legacy = Some(id);
        Ok(id)
    }

    /// Destroys a stream without waiting (`cuStreamDestroy` semantics): the handle is invalid at
    /// once; work already queued still runs (and events recorded on it complete) as the device
    /// gets to it, then the stream is gone.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`].
    pub fn destroy_stream(&self, stream: StreamId) -> SimResult<()> {
        let mut s = self.state.lock();
        s.open_stream(stream)?.destroyed = true;
        if let Some(id) = s.capture_of(stream) {
            s.capture_stream_destroyed(id, stream);
        }
        s.purge(stream);
        fault::track(&fault::LIVE_STREAMS, -1);
        Ok(())
    }

    /// Queues device work on `stream`; in eager mode it runs now.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] when a touched
    /// range is outside every live allocation at enqueue time.
    pub fn enqueue(&self, stream: StreamId, work: Work) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        s.check_uncaptured(stream, "one-shot device work")?;
        for &(addr, len) in &work.touches {
            s.memory
                .check(addr, len)
                .map_err(|e| SimError::InvalidValue(e.to_string()))?;
        }
        s.push(stream, Op::Work(work))?;
        self.after_enqueue(&mut s, stream)
    }

    /// Queues a [`Gate`] on `stream`. `make` receives the gate's position in the stream (the
    /// count of operations enqueued on it, this one included), which peers use to run the stream
    /// up to it; it is called under the device lock, before the gate can run.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] when a touched
    /// range is outside every live allocation.
    pub fn enqueue_gate(
        &self,
        stream: StreamId,
        touches: Vec<(u64, u64)>,
        make: impl FnOnce(u64) -> Box<dyn Gate>,
    ) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        s.check_uncaptured(stream, "a one-shot gate")?;
        for &(addr, len) in &touches {
            s.memory
                .check(addr, len)
                .map_err(|e| SimError::InvalidValue(e.to_string()))?;
        }
        s.implicit_waits(stream)?;
        let position = s.stream(stream)?.enqueued + 1;
        let gate = make(position);
        s.push(stream, Op::Gate { touches, gate })?;
        self.after_enqueue(&mut s, stream)
    }

    /// Operations enqueued on `stream` so far (a position to [`Device::advance`] to).
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`].
    pub fn enqueued(&self, stream: StreamId) -> SimResult<u64> {
        let mut s = self.state.lock();
        Ok(s.stream(stream)?.enqueued)
    }

    /// Runs `stream` up to `position` as far as it goes without blocking (a peer's gate asks this
    /// of the devices it waits for). Errors land in this device's sticky state.
    pub fn advance(&self, stream: StreamId, position: u64) {
        let mut s = self.state.lock();
        if s.sticky.is_none() {
            let _ = s.run_until(stream, position, &mut HashSet::new());
        }
    }

    /// Creates an event.
    ///
    /// # Errors
    /// The sticky error.
    pub fn create_event(&self) -> SimResult<EventId> {
        let mut s = self.live()?;
        let id = EventId(s.fresh());
        s.events.insert(id, EventState::default());
        fault::track(&fault::LIVE_EVENTS, 1);
        Ok(id)
    }

    /// Destroys an event.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`].
    pub fn destroy_event(&self, event: EventId) -> SimResult<()> {
        let mut s = self.state.lock();
        s.events
            .remove(&event)
            .map(|_| fault::track(&fault::LIVE_EVENTS, -1))
            .ok_or_else(|| SimError::InvalidHandle(format!("event {}", event.0)))
    }

    /// Records `event` at the end of `stream` (replacing an earlier record).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`].
    pub fn record(&self, event: EventId, stream: StreamId) -> SimResult<()> {
        let mut s = self.live()?;
        s.event(event)?;
        s.open_stream(stream)?;
        if let Some(id) = s.capture_of(stream) {
            let deps = s.capture_record(id, stream)?;
            s.event(event)?.captured = Some((id, deps));
            return Ok(());
        }
        s.check_legacy(stream)?;
        s.event(event)?.captured = None;
        s.implicit_waits(stream)?;
        let position = s.stream(stream)?.enqueued + 1;
        let ev = s.event(event)?;
        ev.generation += 1;
        ev.record = Some((stream, position));
        ev.time = None;
        let generation = ev.generation;
        s.push(stream, Op::Record { event, generation })?;
        self.after_enqueue(&mut s, stream)
    }

    /// Makes later work on `stream` wait for the event's latest record (no-op if never recorded).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`].
    pub fn wait(&self, stream: StreamId, event: EventId) -> SimResult<()> {
        let mut s = self.live()?;
        s.open_stream(stream)?;
        if let Some((of, deps)) = s.event(event)?.captured.clone() {
            return s.capture_wait(stream, of, &deps);
        }
        let Some((on, position)) = s.event(event)?.record else {
            return Ok(());
        };
        if let Some(id) = s.capture_of(stream) {
            let why = format!(
                "capturing stream {} waits on event {} recorded outside the capture",
                stream.0, event.0
            );
            return Err(s.broken(id, error::CaptureFault::Isolation, why));
        }
        s.push(
            stream,
            Op::Wait {
                stream: on,
                position,
            },
        )?;
        self.after_enqueue(&mut s, stream)
    }

    /// Whether the event's work has run. A query is an observation point: it runs the recording
    /// stream up to the event as far as that goes without blocking (what a GPU does by itself),
    /// so polling loops finish; unrelated streams stay queued.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::NotReady`]; errors of the work
    /// it runs.
    pub fn query(&self, event: EventId) -> SimResult<()> {
        let Some((stream, position)) = self.uncaptured_event(event, "a query")? else {
            return Ok(());
        };
        self.poll(stream, position)
    }

    /// Whether all of `stream`'s queued work has run; an observation point like [`Device::query`].
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::NotReady`]; errors of the work
    /// it runs.
    pub fn query_stream_done(&self, stream: StreamId) -> SimResult<()> {
        let end = self.uncaptured_stream(stream, "a query")?;
        self.poll(stream, end)
    }

    /// Runs `stream` up to `position` without waiting: twice at most, a blocked gate first
    /// letting its peers catch up. In deferred mode, work that had not run when asked is reported
    /// `NotReady` even though this call ran it (it was in flight at the query, as on a GPU, where
    /// a query right after an enqueue sees the work still running): a caller that polls sees it
    /// done on its next query, and one that took a single query as proof of completion fails.
    fn poll(&self, stream: StreamId, position: u64) -> SimResult<()> {
        let in_flight = {
            let mut s = self.live()?;
            self.mode == Mode::Deferred && s.stream(stream)?.executed < position
        };
        for attempt in 0..2 {
            let mut s = self.live()?;
            let progress = s.run_until(stream, position, &mut HashSet::new())?;
            if let Some(e) = s.sticky.clone() {
                return Err(e);
            }
            match progress {
                Progress::Reached if in_flight => return Err(SimError::NotReady),
                Progress::Reached => return Ok(()),
                Progress::Blocked(b) if attempt == 0 => {
                    drop(s);
                    b.unblock(Duration::ZERO);
                }
                Progress::Blocked(_) => {}
            }
        }
        Err(SimError::NotReady)
    }

    /// Runs the recording stream up to the event (a synchronisation point).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::Timeout`]; errors of the work
    /// it runs.
    pub fn event_synchronize(&self, event: EventId) -> SimResult<()> {
        let record = self.uncaptured_event(event, "a synchronisation")?;
        match record {
            Some((stream, position)) => self.drive(stream, position),
            None => Ok(()),
        }
    }

    /// Milliseconds between two completed events.
    ///
    /// # Errors
    /// [`SimError::InvalidHandle`] for unknown events and events never recorded (as CUDA);
    /// [`SimError::NotReady`] when either has not completed.
    pub fn elapsed_ms(&self, start: EventId, end: EventId) -> SimResult<f32> {
        let mut s = self.live()?;
        let mut time = |e: EventId| -> SimResult<Instant> {
            let ev = s.event(e)?;
            if ev.record.is_none() {
                return Err(SimError::InvalidHandle(format!(
                    "event {} was never recorded",
                    e.0
                )));
            }
            ev.time.ok_or(SimError::NotReady)
        };
        let a = time(start)?;
        let b = time(end)?;
        Ok(if b >= a {
            (b - a).as_secs_f32() * 1e3
        } else {
            -((a - b).as_secs_f32() * 1e3)
        })
    }

    /// Runs all of `stream`'s queued work (a synchronisation point).
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; errors of the work it runs.
    pub fn stream_synchronize(&self, stream: StreamId) -> SimResult<()> {
        let end = self.uncaptured_stream(stream, "a synchronisation")?;
        self.drive(stream, end)
    }

    /// Runs every stream's queued work (device synchronise).
    ///
    /// # Errors
    /// The sticky error; [`SimError::Timeout`]; errors of the work it runs.
    pub fn synchronize(&self) -> SimResult<()> {
        let mut ends: Vec<(StreamId, u64)> = {
            let mut s = self.live()?;
            let active = s.active_captures();
            if !active.is_empty() {
                let why = "a device synchronisation while a stream of the device captures";
                for id in active {
                    s.invalidate(id, why);
                }
                return Err(SimError::Capture(
                    error::CaptureFault::Unsupported,
                    why.into(),
                ));
            }
            s.streams
                .iter()
                .map(|(id, st)| (*id, st.enqueued))
                .collect()
        };
        ends.sort_by_key(|(id, _)| id.0);
        for (id, end) in ends {
            match self.drive(id, end) {
                // Destroyed meanwhile by another thread: nothing left to run.
                Err(SimError::InvalidHandle(_)) => {}
                r => r?,
            }
        }
        self.live().map(|_| ())
    }

    /// Runs `stream` up to `position`, waiting (without the device lock) for blocked gates, at
    /// most the watchdog's time; then the device fails with [`SimError::Timeout`], as a hung
    /// kernel killed by a watchdog does.
    fn drive(&self, stream: StreamId, position: u64) -> SimResult<()> {
        let deadline = unihal_hal::deadline::after(self.watchdog);
        loop {
            let mut s = self.live()?;
            let blocker = match s.run_until(stream, position, &mut HashSet::new())? {
                Progress::Reached => return s.sticky.clone().map_or(Ok(()), Err),
                Progress::Blocked(b) => b,
            };
            drop(s);
            let now = Instant::now();
            if now >= deadline {
                let why = blocker.expire();
                let mut s = self.state.lock();
                let e = s.sticky.get_or_insert(SimError::Timeout(why)).clone();
                return Err(e);
            }
            blocker.unblock((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// The record of an event that a query or synchronisation may wait for.
    fn uncaptured_event(&self, event: EventId, what: &str) -> SimResult<Option<(StreamId, u64)>> {
        let mut s = self.live()?;
        let ev = s.event(event)?;
        if let Some((id, _)) = ev.captured {
            let why = format!("{what} of event {} recorded in capture {id}", event.0);
            return Err(s.broken(id, error::CaptureFault::CapturedEvent, why));
        }
        Ok(ev.record)
    }

    /// The end of a stream's queue, for a query or synchronisation (refused while it captures).
    fn uncaptured_stream(&self, stream: StreamId, what: &str) -> SimResult<u64> {
        let mut s = self.live()?;
        s.stream(stream)?;
        if let Some(id) = s.capture_of(stream) {
            let why = format!("{what} of capturing stream {}", stream.0);
            return Err(s.broken(id, error::CaptureFault::Unsupported, why));
        }
        s.check_legacy(stream)?;
        Ok(s.stream(stream)?.enqueued)
    }

    fn live(&self) -> SimResult<parking_lot::MutexGuard<'_, State>> {
        let mut s = self.state.lock();
        s.release_graph_memory();
        match &s.sticky {
            Some(e) => Err(e.clone()),
            None => Ok(s),
        }
    }

    fn after_enqueue(&self, s: &mut State, stream: StreamId) -> SimResult<()> {
        if self.mode != Mode::Deferred {
            // As far as it goes: a blocked gate stays queued until a peer or a sync moves it.
            let end = s.stream(stream)?.enqueued;
            s.run_until(stream, end, &mut HashSet::new())?;
        }
        Ok(())
    }
}

impl State {
    fn fresh(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn stream(&mut self, id: StreamId) -> SimResult<&mut StreamState> {
        self.streams
            .get_mut(&id)
            .ok_or_else(|| SimError::InvalidHandle(format!("stream {}", id.0)))
    }

    fn event(&mut self, id: EventId) -> SimResult<&mut EventState> {
        self.events
            .get_mut(&id)
            .ok_or_else(|| SimError::InvalidHandle(format!("event {}", id.0)))
    }

    /// Queues the waits CUDA's legacy default stream implies before an operation on `stream`.
    fn implicit_waits(&mut self, stream: StreamId) -> SimResult<()> {
        self.open_stream(stream)?;
        let Some(legacy) = self.legacy else {
            return Ok(());
        };
        let ends: Vec<(StreamId, u64)> = if stream == legacy {
            self.streams
                .iter()
                .filter(|(id, st)| **id != legacy && st.blocking && st.enqueued > st.executed)
                .map(|(id, st)| (*id, st.enqueued))
                .collect()
        } else if self.stream(stream)?.blocking {
            let st = self.stream(legacy)?;
            if st.enqueued > st.executed {
                vec![(legacy, st.enqueued)]
            } else {
                Vec::new()
            }
        } else {
            Vec::new()
        };
        for (on, position) in ends {
            let st = self.stream(stream)?;
            st.queue.push_back(Op::Wait {
                stream: on,
                position,
            });
            st.enqueued += 1;
        }
        Ok(())
    }

    fn push(&mut self, stream: StreamId, op: Op) -> SimResult<()> {
        self.check_legacy(stream)?;
        if !matches!(op, Op::Gate { .. } | Op::Record { .. } | Op::Graph(_)) {
            self.implicit_waits(stream)?;
        }
        let st = self.open_stream(stream)?;
        st.queue.push_back(op);
        st.enqueued += 1;
        Ok(())
    }

    /// A stream the API may still name (not destroyed).
    fn open_stream(&mut self, id: StreamId) -> SimResult<&mut StreamState> {
        match self.streams.get_mut(&id) {
            Some(st) if !st.destroyed => Ok(st),
            _ => Err(SimError::InvalidHandle(format!("stream {}", id.0))),
        }
    }

    /// Removes a destroyed stream once everything queued on it has run.
    fn purge(&mut self, id: StreamId) {
        let drained = self
            .streams
            .get(&id)
            .is_some_and(|st| st.destroyed && st.queue.is_empty() && st.executed == st.enqueued);
        if drained && !self.running.contains(&id) {
            self.streams.remove(&id);
        }
    }

    /// True when `stream` has executed its first `position` operations (or no longer exists).
    fn reached(&self, stream: StreamId, position: u64) -> bool {
        self.streams
            .get(&stream)
            .is_none_or(|st| st.executed >= position)
    }

    fn touched_by_queued_work(&self, start: u64) -> bool {
        self.streams.values().any(|st| {
            st.queue.iter().any(|op| {
                let hit = |&(a, l): &(u64, u64)| self.memory.check(a, l).ok() == Some(start);
                match op {
                    Op::Work(w) => w.touches.iter().any(hit),
                    Op::Gate { touches, .. } => touches.iter().any(hit),
                    Op::Graph(run) => State::graph_touches(run).any(hit),
                    _ => false,
                }
            })
        })
    }

    /// Executes `stream`'s operations up to `position`, first running the streams its waits
    /// depend on, and stops early at a blocked gate. `active` holds the streams being run up the
    /// call chain (a cycle is an error).
    fn run_until(
        &mut self,
        stream: StreamId,
        position: u64,
        active: &mut HashSet<StreamId>,
    ) -> SimResult<Progress> {
        // A wait already satisfied is no cycle, even on a stream that is running now (the legacy
        // stream and a blocking stream each wait for the other's earlier work).
        if self.reached(stream, position) {
            return Ok(Progress::Reached);
        }
        if !active.insert(stream) {
            return Err(SimError::WaitCycle);
        }
        let progress = self.run_ops(stream, position, active);
        active.remove(&stream);
        self.purge(stream);
        progress
    }

    fn run_ops(
        &mut self,
        stream: StreamId,
        position: u64,
        active: &mut HashSet<StreamId>,
    ) -> SimResult<Progress> {
        while !self.reached(stream, position) && self.sticky.is_none() {
            if self.running.contains(&stream) {
                return Ok(Progress::Blocked(self.running_blocker(stream)));
            }
            let st = self
                .streams
                .get_mut(&stream)
                .ok_or_else(|| SimError::InvalidHandle(format!("stream {}", stream.0)))?;
            match st.queue.front_mut() {
                Some(Op::Gate { gate, .. }) => match gate.poll(&mut self.memory) {
                    GatePoll::Blocked(b) => return Ok(Progress::Blocked(b)),
                    GatePoll::Done(Ok(())) => {}
                    GatePoll::Done(Err(e)) => self.fail(e),
                },
                Some(Op::Graph(_)) => match self.step_graph(stream)? {
                    graph::Step::Blocked(b) => return Ok(Progress::Blocked(b)),
                    graph::Step::Done => {}
                },
                _ => {}
            }
            let op = self
                .stream(stream)?
                .queue
                .pop_front()
                .expect("positions count queued operations");
            match op {
                Op::Gate { .. } | Op::Graph(_) => {}
                Op::Kernel(run) => {
                    if let Some(exec) = &self.exec {
                        // Counted as executed when it returns (on its thread).
                        if let Err(e) = exec.start(stream, run) {
                            self.fail(SimError::LaunchFailed(format!(
                                "cannot start a thread for a kernel: {e}"
                            )));
                            continue;
                        }
                        self.running.insert(stream);
                        return Ok(Progress::Blocked(self.running_blocker(stream)));
                    }
                    if let Err(e) = run() {
                        self.fail(e);
                    }
                }
                Op::Work(w) => {
                    let checked = w
                        .touches
                        .iter()
                        .try_for_each(|&(a, l)| self.memory.check(a, l).map(|_| ()));
                    if let Err(e) = checked.and_then(|()| (w.run)(&mut self.memory)) {
                        self.fail(e);
                    }
                }
                Op::Record { event, generation } => {
                    if let Some(ev) = self.events.get_mut(&event) {
                        if ev.generation == generation {
                            ev.time = Some(Instant::now());
                        }
                    }
                }
                // A wait on this stream's own earlier record is already satisfied by order.
                Op::Wait {
                    stream: on,
                    position: p,
                } if on != stream => match self.run_until(on, p, active) {
                    Ok(Progress::Reached) => {}
                    // Not done waiting: the wait stays at the head of this stream.
                    Ok(Progress::Blocked(b)) => {
                        self.stream(stream)?.queue.push_front(op);
                        return Ok(Progress::Blocked(b));
                    }
                    Err(e) => {
                        self.stream(stream)?.queue.push_front(op);
                        return Err(e);
                    }
                },
                Op::Wait { .. } => {}
            }
            self.stream(stream)?.executed += 1;
        }
        Ok(Progress::Reached)
    }

    /// What a synchronisation waiting for `stream`'s running kernel blocks on.
    fn running_blocker(&self, stream: StreamId) -> Arc<dyn Blocker> {
        let exec = self
            .exec
            .as_ref()
            .expect("kernels run outside only with an executor");
        Arc::new(KernelRunning {
            state: exec.state.clone(),
            done: exec.done.clone(),
            stream,
        })
    }

    /// Runs every stream as far as it goes without blocking (after a kernel returned).
    fn run_all(&mut self) {
        let mut ids: Vec<(StreamId, u64)> = self
            .streams
            .iter()
            .map(|(id, st)| (*id, st.enqueued))
            .collect();
        ids.sort_by_key(|(id, _)| id.0);
        for (id, end) in ids {
            if self.sticky.is_some() {
                return;
            }
            if let Err(e) = self.run_until(id, end, &mut HashSet::new()) {
                self.fail(e);
            }
        }
    }

    /// Poisons the device with `e` (a non-sticky kind becomes a failed launch).
    fn fail(&mut self, e: SimError) {
        self.sticky = Some(if e.is_sticky() {
            e
        } else {
            SimError::LaunchFailed(e.to_string())
        });
    }
}

impl Exec {
    /// Runs `run` on a kernel thread ([`workers`]); when it returns, its stream moves past it and
    /// every stream runs on as far as it goes. The job keeps the device's state (and so its
    /// memory) alive while the kernel runs.
    ///
    /// # Errors
    /// The operating system's error when no thread can run it (`run` is dropped unrun).
    fn start(&self, stream: StreamId, run: KernelFn) -> std::io::Result<()> {
        let Some(state) = self.state.upgrade() else {
            return Ok(());
        };
        let done = self.done.clone();
        workers::run(Box::new(move || {
            let r = run();
            let mut s = state.lock();
            s.running.remove(&stream);
            if let Some(st) = s.streams.get_mut(&stream) {
                match st.queue.front_mut() {
                    // A node of a replay: the replay goes on with its next node.
                    Some(Op::Graph(run)) if run.in_kernel => run.in_kernel = false,
                    _ => st.executed += 1,
                }
            }
            if let Err(e) = r {
                s.fail(e);
            }
            s.run_all();
            done.notify_all();
        }))
    }
}

/// A stream held behind its running kernel.
struct KernelRunning {
    state: std::sync::Weak<Mutex<State>>,
    done: Arc<Condvar>,
    stream: StreamId,
}

impl Blocker for KernelRunning {
    fn unblock(&self, timeout: Duration) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let mut s = state.lock();
        if s.running.contains(&self.stream) && !timeout.is_zero() {
            self.done.wait_for(&mut s, timeout);
        }
    }
    fn expire(&self) -> String {
        format!("a kernel on stream {} is still running", self.stream.0)
    }
}
