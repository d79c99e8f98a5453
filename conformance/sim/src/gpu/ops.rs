//! The runtime calls every GPU face shares, once: memory, copies and fills in stream order,
//! streams, events, modules, launches, peers and pinned host memory, with the semantics NVIDIA
//! documents for the CUDA driver and AMD for the HIP runtime (where they agree, which is nearly
//! everywhere: HIP was designed after CUDA). A face decodes its handles and arguments, calls
//! these, and maps a [`Fail`] to its own result code.
//!
//! Copies from and to pageable host memory follow the documented rules (host-to-device copies
//! capture the source when called; device-to-host copies return once the stream produced the
//! data); copies from and to pinned host memory happen when the stream executes them, so a host
//! buffer reused before synchronising shows up as wrong data, and freeing pinned memory that a
//! queued copy still uses is refused instead of racing.

use super::GpuFace;
use crate::graph::{CaptureMode, Exec, Graph};
use crate::module::Entry;
use crate::peer::Remote;
use crate::{Device, EventId, FunctionId, ModuleId, SimError, StreamId, Work};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why a call failed, in the terms both APIs share; the face maps it to its code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// An argument out of range, a null out-pointer (`*_INVALID_VALUE`).
    Value,
    /// A handle of no live object (`*_INVALID_HANDLE`).
    Handle,
    /// No current device or context (`*_INVALID_CONTEXT`).
    Context,
    /// A device ordinal out of range (`*_INVALID_DEVICE`).
    Device,
    /// A name a module does not have (`*_NOT_FOUND`).
    NotFound,
    /// What the simulator does not do (`*_NOT_SUPPORTED`).
    NotSupported,
    /// Host memory exhausted (`*_OUT_OF_MEMORY`).
    OutOfMemory,
    /// Peer access enabled twice (`*_PEER_ACCESS_ALREADY_ENABLED`).
    PeerAlreadyEnabled,
    /// Peer access disabled while not enabled (`*_PEER_ACCESS_NOT_ENABLED`).
    PeerNotEnabled,
    /// The core's error.
    Sim(SimError),
}

impl From<SimError> for Fail {
    fn from(e: SimError) -> Fail {
        Fail::Sim(e)
    }
}

/// A result of a shared call.
pub type OpResult<T> = Result<T, Fail>;

impl GpuFace {
    /// The device with this ordinal.
    ///
    /// # Errors
    /// [`Fail::Device`].
    pub fn dev(&self, ordinal: i64) -> OpResult<&Arc<Device>> {
        self.device(ordinal).ok_or(Fail::Device)
    }

    /// The calling thread's current device.
    ///
    /// # Errors
    /// [`Fail::Context`] without one.
    pub fn current_dev(&self) -> OpResult<&Arc<Device>> {
        Ok(&self.devices[self.current().ok_or(Fail::Context)?])
    }

    /// The device a handle (stream, event, module, function) belongs to.
    ///
    /// # Errors
    /// [`Fail::Handle`].
    pub fn handle_owner(&self, handle: u64) -> OpResult<&Arc<Device>> {
        self.owner(handle).ok_or(Fail::Handle)
    }

    /// A stream handle's device and stream; the null stream is the current device's default.
    ///
    /// # Errors
    /// [`Fail::Context`] for the null stream without a current device; [`Fail::Handle`].
    pub fn stream_of(&self, h: *mut c_void) -> OpResult<(&Arc<Device>, StreamId)> {
        match self.stream(h as u64) {
            Some(s) => Ok(s),
            None if h.is_null() => Err(Fail::Context),
            None => Err(Fail::Handle),
        }
    }

    /// The device whose memory holds `addr` (else the current device, which then reports the
    /// address as unknown).
    ///
    /// # Errors
    /// [`Fail::Context`] when neither exists.
    pub fn memory_owner_or_current(&self, addr: u64) -> OpResult<&Arc<Device>> {
        match self.memory_owner(addr) {
            Some(d) => Ok(d),
            None => self.current_dev(),
        }
    }
}

/// `bytes > 0` of device memory on the current device.
///
/// # Errors
/// [`Fail::Value`] for zero bytes; the core's out-of-memory.
pub fn malloc(f: &GpuFace, bytes: usize) -> OpResult<u64> {
    let dev = f.current_dev()?;
    crate::graph::unsafe_call("a synchronous allocation")?;
    if bytes == 0 {
        return Err(Fail::Value);
    }
    Ok(dev.alloc(bytes as u64)?)
}

/// Frees device memory (of whichever device holds it).
///
/// # Errors
/// The core's (an unknown address, a double free, memory queued work still uses).
pub fn free(f: &GpuFace, p: u64) -> OpResult<()> {
    let dev = f.memory_owner_or_current(p)?;
    crate::graph::unsafe_call("a synchronous free")?;
    Ok(dev.free(p)?)
}

/// Stream-ordered allocation: allocated at once (memory that exists now is valid for work
/// enqueued after this call).
///
/// # Errors
/// [`Fail::Value`] for zero bytes or a failed stream; the core's.
pub fn malloc_async(f: &GpuFace, bytes: usize, stream: *mut c_void) -> OpResult<u64> {
    let (dev, id) = f.stream_of(stream)?;
    if bytes == 0 || dev.query_stream(id).is_err() {
        return Err(Fail::Value);
    }
    // While the stream captures: a memory-allocation node (its address reserved now).
    Ok(dev.alloc_on(id, bytes as u64)?)
}

/// Stream-ordered free: the memory returns when the stream reaches this point.
///
/// # Errors
/// The core's.
pub fn free_async(f: &GpuFace, p: u64, stream: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    // While the stream captures: a memory-free node.
    Ok(dev.free_on(id, p)?)
}

/// Fills `count` elements of `width` bytes with `value` in stream order.
///
/// # Errors
/// The core's.
pub fn fill(
    f: &GpuFace,
    p: u64,
    value: u32,
    width: u64,
    count: usize,
    stream: *mut c_void,
) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    let len = width * count as u64;
    let run = Box::new(move |m: &mut crate::Memory| m.fill(p, value, width, count as u64));
    Ok(dev.enqueue_repeatable(id, vec![(p, len)], run)?)
}

/// Host-to-device copy in stream order.
///
/// # Safety
/// `src` is readable for `n` bytes (for pinned memory: until the copy ran, which the face's
/// pinned table enforces).
///
/// # Errors
/// [`Fail::Value`] for a null source; the core's.
pub unsafe fn copy_h2d(
    f: &GpuFace,
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    if src.is_null() && n > 0 {
        return Err(Fail::Value);
    }
    if let Some(used) = f.pinned_use(src as u64, n as u64) {
        // Pinned source: read when the stream executes the copy (DMA), at every replay of a
        // captured copy; the use lasts as long as the copy (or the graph) does.
        let from = src as usize;
        let run = Box::new(move |m: &mut crate::Memory| {
            let _ = &used;
            // SAFETY: a live pinned range: the face refuses to free it while `used` lives.
            let data = unsafe { std::slice::from_raw_parts(from as *const u8, n) };
            m.write(dst, data)
        });
        return Ok(dev.enqueue_repeatable(id, vec![(dst, n as u64)], run)?);
    }
    // Pageable source: captured now, as the runtime stages it before returning (synchronously:
    // refused on a capturing stream).
    dev.refuse_capture(id, "a copy from pageable host memory")?;
    let data = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: the caller provides `n` readable bytes at `src`.
        unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec()
    };
    let work = Work {
        touches: vec![(dst, n as u64)],
        run: Box::new(move |m| m.write(dst, &data)),
    };
    Ok(dev.enqueue(id, work)?)
}

/// Device-to-host copy in stream order.
///
/// # Safety
/// `dst` is writable for `n` bytes (for pinned memory: until the copy ran).
///
/// # Errors
/// [`Fail::Value`] for a null destination; the core's.
pub unsafe fn copy_d2h(
    f: &GpuFace,
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    if dst.is_null() && n > 0 {
        return Err(Fail::Value);
    }
    if n == 0 {
        return Ok(());
    }
    if let Some(used) = f.pinned_use(dst as u64, n as u64) {
        // Pinned destination: written when the stream executes the copy; returns at once.
        let to = dst as usize;
        let run = Box::new(move |m: &mut crate::Memory| {
            let _ = &used;
            // SAFETY: a live pinned range (the face refuses to free it while `used` lives);
            // the caller must not read it before synchronising, as with a GPU.
            let buf = unsafe { std::slice::from_raw_parts_mut(to as *mut u8, n) };
            m.read(src, buf)
        });
        return Ok(dev.enqueue_repeatable(id, vec![(src, n as u64)], run)?);
    }
    // Pageable destination: returns once the stream has produced the data.
    // SAFETY: the caller provides `n` writable bytes at `dst`.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, n) };
    Ok(dev.read_on(id, src, buf)?)
}

/// A copy between two ranges of one device's memory, on `stream` of `dev`.
fn dtod(dev: &Device, stream: StreamId, dst: u64, src: u64, len: u64) -> crate::SimResult<()> {
    let run = Box::new(move |m: &mut crate::Memory| m.copy(dst, src, len));
    dev.enqueue_repeatable(stream, vec![(dst, len), (src, len)], run)
}

/// Device-to-device copy on one device in stream order.
///
/// # Errors
/// The core's.
pub fn copy_d2d(f: &GpuFace, dst: u64, src: u64, n: usize, stream: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    Ok(dtod(dev, id, dst, src, n as u64)?)
}

/// A copy between the memories of devices `dst.0` and `src.0` in the stream's order (one of
/// them the stream's device).
///
/// # Errors
/// [`Fail::Device`]; [`Fail::NotSupported`] when neither side is on the stream's device.
pub fn copy_peer(
    f: &GpuFace,
    dst: (usize, u64),
    src: (usize, u64),
    n: usize,
    stream: *mut c_void,
) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    let dd = f.dev(dst.0 as i64)?;
    let sd = f.dev(src.0 as i64)?;
    let len = n as u64;
    if len == 0 {
        return Ok(());
    }
    let here = |x: &Arc<Device>| std::ptr::eq(x.as_ref(), dev.as_ref());
    let r = match (here(dd), here(sd)) {
        (true, true) => dtod(dev, id, dst.1, src.1, len),
        (true, false) => dev.enqueue_peer_copy(id, sd, dst.1, src.1, len, Remote::Source),
        (false, true) => dev.enqueue_peer_copy(id, dd, dst.1, src.1, len, Remote::Destination),
        // Neither side on the stream's device: not simulated.
        (false, false) => return Err(Fail::NotSupported),
    };
    Ok(r?)
}

/// A stream of the current device (`blocking`: ordered with the legacy default stream).
///
/// # Errors
/// [`Fail::Context`]; the core's.
pub fn stream_create(f: &GpuFace, blocking: bool) -> OpResult<u64> {
    Ok(f.current_dev()?.create_stream_with(blocking)?.0)
}

/// Destroys a stream (its queued work still runs).
///
/// # Errors
/// [`Fail::Handle`] for the null stream or an unknown one.
pub fn stream_destroy(f: &GpuFace, stream: *mut c_void) -> OpResult<()> {
    if stream.is_null() {
        return Err(Fail::Handle);
    }
    let (dev, id) = f.stream_of(stream)?;
    Ok(dev.destroy_stream(id)?)
}

/// Waits for a stream's work.
///
/// # Errors
/// The stream's failure.
pub fn stream_synchronize(f: &GpuFace, stream: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    Ok(dev.stream_synchronize(id)?)
}

/// Whether a stream's work completed (the core's `NotReady` otherwise).
///
/// # Errors
/// `NotReady`; the stream's failure.
pub fn stream_query(f: &GpuFace, stream: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    Ok(dev.query_stream_done(id)?)
}

/// Queues `g` in stream order, run as a host function (runtime calls from it are refused).
///
/// # Errors
/// The core's.
pub fn launch_host_fn(
    f: &GpuFace,
    stream: *mut c_void,
    g: Box<dyn FnMut() + Send>,
) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    // It must not call the runtime: such calls are refused and recorded as violations.
    Ok(dev.enqueue_host_fn(id, g)?)
}

/// Makes `stream` wait for `event`'s last record (an event of any device).
///
/// # Errors
/// [`Fail::Handle`]; the core's.
pub fn stream_wait_event(f: &GpuFace, stream: *mut c_void, event: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    let owner = f.handle_owner(event as u64)?;
    let e = EventId(event as u64);
    if std::ptr::eq(owner.as_ref(), dev.as_ref()) {
        Ok(dev.wait(id, e)?)
    } else {
        Ok(dev.wait_other(id, owner, e)?)
    }
}

/// An event of the current device.
///
/// # Errors
/// [`Fail::Context`]; the core's.
pub fn event_create(f: &GpuFace) -> OpResult<u64> {
    Ok(f.current_dev()?.create_event()?.0)
}

/// Destroys an event.
///
/// # Errors
/// [`Fail::Handle`]; the core's.
pub fn event_destroy(f: &GpuFace, event: *mut c_void) -> OpResult<()> {
    let h = event as u64;
    Ok(f.handle_owner(h)?.destroy_event(EventId(h))?)
}

/// Records an event on a stream of its device.
///
/// # Errors
/// [`Fail::Handle`] for an event of another device; the core's.
pub fn event_record(f: &GpuFace, event: *mut c_void, stream: *mut c_void) -> OpResult<()> {
    let (dev, id) = f.stream_of(stream)?;
    if !std::ptr::eq(f.handle_owner(event as u64)?.as_ref(), dev.as_ref()) {
        return Err(Fail::Handle);
    }
    Ok(dev.record(EventId(event as u64), id)?)
}

/// Waits for an event's last record.
///
/// # Errors
/// [`Fail::Handle`]; the recording stream's failure.
pub fn event_synchronize(f: &GpuFace, event: *mut c_void) -> OpResult<()> {
    let h = event as u64;
    Ok(f.handle_owner(h)?.event_synchronize(EventId(h))?)
}

/// Whether an event's last record completed (the core's `NotReady` otherwise).
///
/// # Errors
/// `NotReady`; [`Fail::Handle`].
pub fn event_query(f: &GpuFace, event: *mut c_void) -> OpResult<()> {
    let h = event as u64;
    Ok(f.handle_owner(h)?.query(EventId(h))?)
}

/// Milliseconds between two completed events.
///
/// # Errors
/// [`Fail::Handle`]; the core's.
pub fn event_elapsed(f: &GpuFace, start: *mut c_void, end: *mut c_void) -> OpResult<f32> {
    Ok(f.handle_owner(start as u64)?
        .elapsed_ms(EventId(start as u64), EventId(end as u64))?)
}

/// Loads a module of `entries` (read by the face from its image) into the current device.
///
/// # Errors
/// [`Fail::Context`]; the core's.
pub fn module_load(f: &GpuFace, entries: Vec<Entry>) -> OpResult<u64> {
    Ok(f.current_dev()?.load_module(entries)?.0)
}

/// The function `name` of a module.
///
/// # Errors
/// [`Fail::Handle`]; [`Fail::NotFound`] for a name that is not UTF-8; the core's `NotFound`.
pub fn module_function(f: &GpuFace, module: *mut c_void, name: &std::ffi::CStr) -> OpResult<u64> {
    let dev = f.handle_owner(module as u64)?;
    let name = name.to_str().map_err(|_| Fail::NotFound)?;
    Ok(dev.function(ModuleId(module as u64), name)?.0)
}

/// Unloads a module.
///
/// # Errors
/// [`Fail::Handle`].
pub fn module_unload(f: &GpuFace, module: *mut c_void) -> OpResult<()> {
    let h = module as u64;
    Ok(f.handle_owner(h)?.unload_module(ModuleId(h))?)
}

/// Launches `function` on `stream` with `kernelParams` (one pointer per parameter to its value,
/// sized by the module's declaration).
///
/// # Safety
/// `params` holds one valid pointer per kernel parameter, each to a value of its size.
///
/// # Errors
/// [`Fail::Handle`] for a stream of another device; [`Fail::Value`] for missing parameters;
/// the core's.
pub unsafe fn launch(
    f: &GpuFace,
    function: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> OpResult<()> {
    let id_f = FunctionId(function as u64);
    let dev = f.handle_owner(function as u64)?;
    let entry = dev.entry(id_f)?;
    let (stream_dev, id) = f.stream_of(stream)?;
    if !std::ptr::eq(stream_dev.as_ref(), dev.as_ref()) {
        return Err(Fail::Handle);
    }
    if params.is_null() && !entry.param_sizes.is_empty() {
        return Err(Fail::Value);
    }
    let mut args = Vec::with_capacity(entry.param_sizes.len());
    for (i, &size) in entry.param_sizes.iter().enumerate() {
        // SAFETY: the caller passes one valid pointer per kernel parameter.
        let p = unsafe { *params.add(i) };
        if p.is_null() {
            return Err(Fail::Value);
        }
        // SAFETY: each parameter pointer addresses a value of the parameter's size.
        args.push(unsafe { std::slice::from_raw_parts(p as *const u8, size) });
    }
    Ok(dev.launch(id, id_f, grid, block, shared, &args)?)
}

/// Whether device `d` can access `peer`'s memory (distinct devices reach each other; a device
/// is not its own peer).
///
/// # Errors
/// [`Fail::Device`].
pub fn can_access_peer(f: &GpuFace, d: i64, peer: i64) -> OpResult<bool> {
    f.dev(d)?;
    f.dev(peer)?;
    Ok(d != peer)
}

/// Enables access from the current device to `peer`'s memory.
///
/// # Errors
/// [`Fail::Context`]; [`Fail::Value`] for flags; [`Fail::Device`] for itself;
/// [`Fail::PeerAlreadyEnabled`].
pub fn enable_peer(f: &GpuFace, peer: usize, flags: u32) -> OpResult<()> {
    let me = f.current().ok_or(Fail::Context)?;
    f.dev(peer as i64)?;
    if flags != 0 {
        return Err(Fail::Value);
    }
    if me == peer {
        return Err(Fail::Device);
    }
    if !f.enable_peer(me, peer) {
        return Err(Fail::PeerAlreadyEnabled);
    }
    Ok(())
}

/// Disables access from the current device to `peer`'s memory.
///
/// # Errors
/// [`Fail::Context`]; [`Fail::PeerNotEnabled`].
pub fn disable_peer(f: &GpuFace, peer: usize) -> OpResult<()> {
    let me = f.current().ok_or(Fail::Context)?;
    if !f.disable_peer(me, peer) {
        return Err(Fail::PeerNotEnabled);
    }
    Ok(())
}

/// The byte fresh pinned host memory holds: the runtimes do not clear what they return, so the
/// simulator hands out a garbage pattern, and a backend that shows fresh pinned memory to safe
/// code without clearing it is caught (`memory.host.zeroed`).
const GARBAGE: u8 = 0xcd;

/// Page-aligned pinned host memory of `bytes > 0`, registered so that async copies from and to
/// it happen when the stream executes them.
///
/// # Errors
/// [`Fail::Value`] for zero bytes; [`Fail::OutOfMemory`].
pub fn host_alloc(f: &GpuFace, bytes: usize) -> OpResult<*mut c_void> {
    let _ = f;
    crate::graph::unsafe_call("a pinned host allocation")?;
    if bytes == 0 {
        return Err(Fail::Value);
    }
    let layout = std::alloc::Layout::from_size_align(bytes, 4096).map_err(|_| Fail::OutOfMemory)?;
    // SAFETY: a non-zero size.
    let a = unsafe { std::alloc::alloc(layout) };
    if a.is_null() {
        return Err(Fail::OutOfMemory);
    }
    // SAFETY: `a` is valid for `bytes` bytes, just allocated, not yet shared.
    unsafe { std::ptr::write_bytes(a, GARBAGE, bytes) };
    f.pin(a as u64, bytes as u64, layout);
    Ok(a as *mut c_void)
}

/// Frees pinned host memory of [`host_alloc`].
///
/// # Errors
/// [`Fail::Value`] for an unknown address, or one a queued copy still uses (freeing now would
/// race with the copy).
pub fn host_free(f: &GpuFace, p: *mut c_void) -> OpResult<()> {
    crate::graph::unsafe_call("a pinned host free")?;
    let layout = f.unpin(p as u64).map_err(|_| Fail::Value)?;
    // SAFETY: allocated by host_alloc with this layout; removed from the table (no new copy can
    // treat it as pinned) with no queued copy using it.
    unsafe { std::alloc::dealloc(p as *mut u8, layout) };
    Ok(())
}

/// Copies `text` into the caller's `len`-byte buffer, NUL-terminated and truncated to fit (how
/// every face answers a device-name query). False for a null or empty buffer (the face's
/// invalid-value code).
///
/// # Safety
/// `buf` is null or valid for `len` bytes.
pub unsafe fn copy_c_str(text: &str, buf: *mut std::ffi::c_char, len: usize) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let bytes = text.trim_end_matches('\0').as_bytes();
    let n = bytes.len().min(len - 1);
    // SAFETY: the caller provides `len` bytes; `n + 1 <= len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr() as *const std::ffi::c_char, buf, n);
        *buf.add(n) = 0;
    }
    true
}

/// Waits for all work of the current device.
///
/// # Errors
/// [`Fail::Context`]; a stream's failure.
pub fn device_synchronize(f: &GpuFace) -> OpResult<()> {
    Ok(f.current_dev()?.synchronize()?)
}

/// Free and total bytes of the current device.
///
/// # Errors
/// [`Fail::Context`].
pub fn mem_info(f: &GpuFace) -> OpResult<(u64, u64)> {
    Ok(f.current_dev()?.memory_info())
}

/// The codes an entry point returns for what every face checks itself.
#[derive(Debug, Clone, Copy)]
pub struct EntryCodes {
    /// A call from inside a host function (CUDA's `CUDA_ERROR_NOT_PERMITTED`).
    pub not_permitted: i32,
    /// A panic inside the simulator (`*_UNKNOWN`).
    pub unknown: i32,
}

/// Runs entry point `name` of a face (success is 0): a call from inside a host function is
/// refused and recorded as a violation (the runtimes forbid it; here the device lock is also
/// held); an injected failure ([`crate::fault`]) returns its code instead; panics never cross the
/// C boundary.
pub fn entry(name: &str, codes: EntryCodes, f: impl FnOnce() -> Result<(), i32>) -> i32 {
    if super::in_host_fn() {
        crate::fault::violation(format!("{name} called from inside a host function"));
        return codes.not_permitted;
    }
    if let Some(code) = crate::fault::injected(name) {
        return code;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => e,
        Err(_) => codes.unknown,
    }
}

/// Writes `v` through an out-pointer; `invalid` for a null one.
///
/// # Safety
/// `p` is null (an error) or valid for a write of `T`.
pub unsafe fn out<T>(p: *mut T, v: T, invalid: i32) -> Result<(), i32> {
    if p.is_null() {
        return Err(invalid);
    }
    // SAFETY: non-null; the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// Begins a capture on `stream` (never the null stream) in `mode` (0 global, 1 thread-local,
/// 2 relaxed).
///
/// # Errors
/// [`Fail::Value`] for another mode or the legacy default stream; the core's capture faults.
pub fn begin_capture(f: &GpuFace, stream: *mut c_void, mode: i64) -> OpResult<()> {
    let mode = CaptureMode::from_raw(mode).ok_or(Fail::Value)?;
    let (dev, id) = f.stream_of(stream)?;
    dev.begin_capture(id, mode)?;
    Ok(())
}

/// Ends the capture `stream` began: the handle of its graph.
///
/// # Errors
/// The core's capture faults.
pub fn end_capture(f: &GpuFace, stream: *mut c_void) -> OpResult<u64> {
    let (dev, id) = f.stream_of(stream)?;
    let graph = dev.end_capture(id)?;
    Ok(handles().add_graph(graph))
}

/// Whether `stream` captures: (status 0/1/2, capture id).
///
/// # Errors
/// The core's (the legacy stream while a blocking stream captures).
pub fn capture_status(f: &GpuFace, stream: *mut c_void) -> OpResult<(i32, u64)> {
    let (dev, id) = f.stream_of(stream)?;
    let st = dev.capture_status(id)?;
    Ok((st.raw(), st.id()))
}

/// Swaps the calling thread's capture interaction mode.
///
/// # Errors
/// [`Fail::Value`] for another mode.
pub fn exchange_capture_mode(mode: i64) -> OpResult<i32> {
    let mode = CaptureMode::from_raw(mode).ok_or(Fail::Value)?;
    Ok(crate::graph::exchange_thread_mode(mode) as i32)
}

/// An executable of graph `graph` (`auto_free`: free a previous launch's allocations first).
///
/// # Errors
/// [`Fail::Handle`]; [`Fail::Value`] for a second executable of a graph with memory nodes.
pub fn instantiate(graph: *mut c_void, auto_free: bool) -> OpResult<u64> {
    let h = handles();
    let g = h.graph(graph as u64).ok_or(Fail::Handle)?;
    let exec = Exec::new(&g, auto_free)?;
    Ok(h.add_exec(exec))
}

/// Launches executable `exec` on `stream` (a stream of its device).
///
/// # Errors
/// [`Fail::Handle`]; the core's.
pub fn graph_launch(f: &GpuFace, exec: *mut c_void, stream: *mut c_void) -> OpResult<()> {
    let e = handles().exec(exec as u64).ok_or(Fail::Handle)?;
    let (dev, id) = f.stream_of(stream)?;
    if dev.ordinal() != e.device() {
        return Err(Fail::Handle);
    }
    Ok(dev.launch_graph(id, &e)?)
}

/// Destroys a graph (its executables stay valid).
///
/// # Errors
/// [`Fail::Handle`].
pub fn graph_destroy(graph: *mut c_void) -> OpResult<()> {
    handles()
        .graphs
        .lock()
        .remove(&(graph as u64))
        .map(|_| ())
        .ok_or(Fail::Handle)
}

/// Destroys an executable graph (queued launches still run).
///
/// # Errors
/// [`Fail::Handle`].
pub fn exec_destroy(exec: *mut c_void) -> OpResult<()> {
    handles()
        .execs
        .lock()
        .remove(&(exec as u64))
        .map(|_| ())
        .ok_or(Fail::Handle)
}

/// The handles of a graph's nodes: `*count` on entry is the room in `nodes` (null: only the
/// count is written), on return the number written (or the total with a null `nodes`).
///
/// # Safety
/// `nodes` is null or valid for `*count` writes; `count` is null or valid.
///
/// # Errors
/// [`Fail::Handle`]; [`Fail::Value`] for a null `count`.
pub unsafe fn graph_nodes(
    graph: *mut c_void,
    nodes: *mut *mut c_void,
    count: *mut usize,
) -> OpResult<()> {
    let g = handles().graph(graph as u64).ok_or(Fail::Handle)?;
    if count.is_null() {
        return Err(Fail::Value);
    }
    let total = g.node_count();
    if nodes.is_null() {
        // SAFETY: non-null, the caller's.
        unsafe { count.write(total) };
        return Ok(());
    }
    // SAFETY: non-null, the caller's.
    let room = unsafe { count.read() };
    for i in 0..room {
        let v = if i < total {
            (graph as u64 + 1 + i as u64) << 8
        } else {
            0
        };
        // SAFETY: the caller provides `room` entries.
        unsafe { nodes.add(i).write(v as *mut c_void) };
    }
    // SAFETY: as above.
    unsafe { count.write(room.min(total)) };
    Ok(())
}

/// The graph and executable handle tables of the process.
pub struct Handles {
    graphs: Mutex<BTreeMap<u64, Arc<Graph>>>,
    execs: Mutex<BTreeMap<u64, Arc<Exec>>>,
    next: AtomicU64,
}

/// The process's handle tables.
pub fn handles() -> &'static Handles {
    static H: Handles = Handles {
        graphs: Mutex::new(BTreeMap::new()),
        execs: Mutex::new(BTreeMap::new()),
        next: AtomicU64::new(0x6a00_0000),
    };
    &H
}

impl Handles {
    fn fresh(&self) -> u64 {
        self.next.fetch_add(0x1_0000, Ordering::Relaxed)
    }

    fn add_graph(&self, g: Graph) -> u64 {
        let h = self.fresh();
        self.graphs.lock().insert(h, Arc::new(g));
        h
    }

    fn add_exec(&self, e: Exec) -> u64 {
        let h = self.fresh();
        self.execs.lock().insert(h, Arc::new(e));
        h
    }

    /// The graph of handle `h`.
    pub fn graph(&self, h: u64) -> Option<Arc<Graph>> {
        self.graphs.lock().get(&h).cloned()
    }

    /// The executable of handle `h`.
    pub fn exec(&self, h: u64) -> Option<Arc<Exec>> {
        self.execs.lock().get(&h).cloned()
    }
}
