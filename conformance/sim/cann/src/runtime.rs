//! The ACL runtime entry points (`acl*`, `aclrt*`) unihal's Ascend backend calls, on the
//! simulator core's shared GPU calls (`unihal_sim::gpu::ops`).
//!
//! **Initialisation.** `aclInit` once per process: a second call is `ACL_ERROR_REPEAT_INITIALIZE`
//! (as CANN before the reference-counted `aclInit` did, the stricter reading); every other call
//! before it is `ACL_ERROR_UNINITIALIZE`. `aclFinalize` ends ACL for the process: afterwards
//! every call is `ACL_ERROR_UNINITIALIZE`, a second `aclFinalize` `ACL_ERROR_REPEAT_FINALIZE`,
//! and `aclInit` again `ACL_ERROR_REPEAT_INITIALIZE`.
//!
//! **Contexts.** `aclrtSetDevice` makes the device's default context current on the calling
//! thread (creating it, with its default stream, on the first set; reference-counted, undone by
//! `aclrtResetDevice`); `aclrtCreateContext` makes a new context current (assumed, as CUDA's
//! `cuCtxCreate`); `aclrtSetCurrentContext` switches. Every call that needs a device (memory,
//! streams, events, copies, operators) fails with `ACL_ERROR_RT_CONTEXT_NULL` on a thread with
//! no current context, and a stream used from a thread whose current context is not the
//! stream's is `ACL_ERROR_RT_STREAM_CONTEXT`. The null stream is the current context's default
//! stream (an ordinary stream: not assumed to synchronise with the others).
//!
//! **Events.** `aclrtCreateEvent` events may be waited on and may time;
//! `aclrtCreateEventWithFlag` ones only as their flags say: `ACL_EVENT_SYNC` to be waited on,
//! `ACL_EVENT_TIME_LINE` to time (as the flags are documented). Elapsed time needs both events
//! recorded on one stream, as documented. Both status queries answer with their own values
//! (`aclrtQueryEventStatus`: COMPLETE = 1; the deprecated `aclrtQueryEvent`: COMPLETE = 0).
//!
//! **Copies.** Every documented kind; the kind must match where the memory is (device memory of
//! a simulated device, or host memory), `ACL_MEMCPY_DEFAULT` infers it; `destMax` must hold
//! `count`; a copy between two devices needs peer access enabled (as documented for Atlas
//! training and A2 parts); an asynchronous host-to-host copy is
//! `ACL_ERROR_RT_FEATURE_NOT_SUPPORT`. With pinned host memory (`aclrtMallocHost`) an
//! asynchronous copy happens when the stream runs it; with pageable memory it is complete when
//! the call returns (documented for recent CANN). `aclrtMemcpy` runs on the current context's
//! default stream and waits for it (assumed).

use crate::conv::*;
use crate::{api, out};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::{Arc, OnceLock};
use unihal_sim::gpu::{ops, GpuFace};
use unihal_sim::{EventId, StreamId};

/// `ACL_EVENT_SYNC`: the event may be waited on.
pub const ACL_EVENT_SYNC: u32 = 0x1;
/// `ACL_EVENT_CAPTURE_STREAM_PROGRESS`.
pub const ACL_EVENT_CAPTURE_STREAM_PROGRESS: u32 = 0x2;
/// `ACL_EVENT_TIME_LINE`: the event may time.
pub const ACL_EVENT_TIME_LINE: u32 = 0x8;
/// `ACL_EVENT_EXTERNAL`, `ACL_EVENT_IPC`: accepted, not simulated beyond SYNC.
const ACL_EVENT_OTHER: u32 = 0x20 | 0x40;
/// `aclrtCreateStreamWithConfig` flags: FAST_LAUNCH, FAST_SYNC, PERSISTENT, HUGE.
const STREAM_FLAGS: u32 = 1 | 2 | 4 | 8;

/// A context: a device and its streams.
pub(crate) struct Context {
    pub(crate) device: usize,
    pub(crate) default_stream: u64,
    /// The device's default context (made by `aclrtSetDevice`).
    pub(crate) is_default: bool,
}

/// What an event was created for.
#[derive(Debug, Clone, Copy)]
struct EventInfo {
    device: usize,
    can_wait: bool,
    can_time: bool,
    /// The stream of its latest record.
    recorded_on: Option<u64>,
}

#[derive(Default)]
struct Tables {
    contexts: HashMap<u64, Arc<Context>>,
    /// Per device: `aclrtSetDevice` count and the default context.
    devices: HashMap<usize, (u32, u64)>,
    /// Stream handle → its context.
    streams: HashMap<u64, u64>,
    events: HashMap<u64, EventInfo>,
    next: u64,
}

/// The started runtime.
pub(crate) struct Sim {
    pub(crate) face: &'static GpuFace,
    pub(crate) soc: &'static crate::soc::Soc,
    tables: Mutex<Tables>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Life {
    Never,
    Live,
    Finalized,
}

static LIFE: Mutex<Life> = Mutex::new(Life::Never);
static SIM: OnceLock<Result<Sim, Err>> = OnceLock::new();

thread_local! {
    /// The calling thread's current context (0: none).
    static CURRENT: Cell<u64> = const { Cell::new(0) };
}

fn start() -> Result<Sim, Err> {
    let soc = crate::soc::Soc::from_env().map_err(Err::param)?;
    let face = unihal_sim::gpu::global()?;
    Ok(Sim {
        face,
        soc,
        tables: Mutex::new(Tables {
            next: 1,
            ..Tables::default()
        }),
    })
}

/// The runtime, between `aclInit` and `aclFinalize`.
///
/// # Errors
/// `ACL_ERROR_UNINITIALIZE` outside that span; the start's error.
pub(crate) fn sim() -> Result<&'static Sim, Err> {
    if *LIFE.lock() != Life::Live {
        return Err(Err::new(
            ACL_ERROR_UNINITIALIZE,
            "ACL is not initialised (aclInit not called, or aclFinalize called)",
        ));
    }
    SIM.get()
        .expect("set before LIFE is Live")
        .as_ref()
        .map_err(Clone::clone)
}

impl Sim {
    /// The calling thread's current context.
    ///
    /// # Errors
    /// `ACL_ERROR_RT_CONTEXT_NULL` without one (or when it was destroyed).
    pub(crate) fn context(&self) -> Result<(u64, Arc<Context>), Err> {
        let id = CURRENT.get();
        let ctx = self.tables.lock().contexts.get(&id).cloned();
        match ctx {
            Some(c) => {
                self.face.set_current(Some(c.device));
                Ok((id, c))
            }
            None => Err(Err::new(
                ACL_ERROR_RT_CONTEXT_NULL,
                "no current context on this thread: call aclrtSetDevice or aclrtSetCurrentContext first",
            )),
        }
    }

    /// A stream handle of the current context (null: its default stream) as the core's handle.
    ///
    /// # Errors
    /// `ACL_ERROR_RT_CONTEXT_NULL`; `ACL_ERROR_RT_INVALID_HANDLE` for an unknown stream;
    /// `ACL_ERROR_RT_STREAM_CONTEXT` for a stream of another context.
    pub(crate) fn stream(&self, h: *mut c_void) -> Result<(Arc<Context>, *mut c_void), Err> {
        let (cid, ctx) = self.context()?;
        if h.is_null() {
            return Ok((ctx.clone(), ctx.default_stream as *mut c_void));
        }
        match self.tables.lock().streams.get(&(h as u64)) {
            None => Err(Err::new(
                ACL_ERROR_RT_INVALID_HANDLE,
                format!("stream {h:p} does not exist (destroyed, or never created)"),
            )),
            Some(&owner) if owner != cid => Err(Err::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                format!("stream {h:p} belongs to another context than the thread's current one"),
            )),
            Some(_) => Ok((ctx, h)),
        }
    }

    /// The device a stream handle runs on, with the core's stream id.
    pub(crate) fn core_stream(
        &self,
        h: *mut c_void,
    ) -> Result<(Arc<unihal_sim::Device>, StreamId), Err> {
        let (_, s) = self.stream(h)?;
        let (dev, id) = self.face.stream_of(s)?;
        Ok((dev.clone(), id))
    }

    fn fresh(&self) -> u64 {
        let mut t = self.tables.lock();
        t.next += 1;
        // Context handles look like pointers: aligned, never null, never a core handle.
        0x00c0_0000_0000 | (t.next << 4)
    }

    fn new_context(&self, device: usize, is_default: bool) -> Result<u64, Err> {
        let dev = self.face.dev(device as i64)?;
        let stream = dev.create_stream()?.0;
        let id = self.fresh();
        let mut t = self.tables.lock();
        t.contexts.insert(
            id,
            Arc::new(Context {
                device,
                default_stream: stream,
                is_default,
            }),
        );
        t.streams.insert(stream, id);
        Ok(id)
    }

    /// Destroys a context: its streams' queued work runs first (bounded by the watchdog).
    fn drop_context(&self, id: u64) -> Result<(), Err> {
        let (ctx, streams) = {
            let mut t = self.tables.lock();
            let ctx = t
                .contexts
                .remove(&id)
                .ok_or_else(|| Err::new(ACL_ERROR_RT_INVALID_HANDLE, format!("context {id:#x}")))?;
            let streams: Vec<u64> = t
                .streams
                .iter()
                .filter(|(_, &c)| c == id)
                .map(|(&s, _)| s)
                .collect();
            for s in &streams {
                t.streams.remove(s);
            }
            (ctx, streams)
        };
        let dev = self.face.dev(ctx.device as i64)?;
        for s in streams {
            let _ = dev.stream_synchronize(StreamId(s));
            let _ = dev.destroy_stream(StreamId(s));
        }
        if CURRENT.get() == id {
            CURRENT.set(0);
        }
        Ok(())
    }

    fn event(&self, h: *mut c_void) -> Result<EventInfo, Err> {
        self.tables
            .lock()
            .events
            .get(&(h as u64))
            .copied()
            .ok_or_else(|| {
                Err::new(
                    ACL_ERROR_RT_INVALID_HANDLE,
                    format!("event {h:p} does not exist (destroyed, or never created)"),
                )
            })
    }

    /// Where `addr` is: `Some(device)` for device memory of a simulated device, None for host.
    pub(crate) fn place(&self, addr: u64) -> Option<usize> {
        self.face.devices.iter().position(|d| d.owns(addr))
    }
}

/// The SoC name as `aclrtGetSocName` returns it, NUL-terminated.
fn soc_name() -> &'static CStr {
    static NAME: OnceLock<std::ffi::CString> = OnceLock::new();
    NAME.get_or_init(|| {
        std::ffi::CString::new(crate::soc::Soc::from_env().map_or("", |s| s.name))
            .unwrap_or_default()
    })
}

#[no_mangle]
pub extern "C" fn aclInit(_config_path: *const c_char) -> i32 {
    api("aclInit", || {
        let mut life = LIFE.lock();
        match *life {
            Life::Live => Err(Err::new(
                ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit called twice in this process",
            )),
            Life::Finalized => Err(Err::new(
                ACL_ERROR_REPEAT_INITIALIZE,
                "aclInit after aclFinalize: ACL cannot be initialised again in this process",
            )),
            Life::Never => {
                SIM.get_or_init(start).as_ref().map_err(Clone::clone)?;
                *life = Life::Live;
                Ok(())
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn aclFinalize() -> i32 {
    api("aclFinalize", || {
        let mut life = LIFE.lock();
        match *life {
            Life::Never => Err(Err::new(ACL_ERROR_UNINITIALIZE, "aclInit was never called")),
            Life::Finalized => Err(Err::new(
                ACL_ERROR_REPEAT_FINALIZE,
                "aclFinalize called twice in this process",
            )),
            Life::Live => {
                *life = Life::Finalized;
                Ok(())
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn aclrtGetSocName() -> *const c_char {
    match sim() {
        Ok(_) => soc_name().as_ptr(),
        Err(e) => {
            crate::set_recent(format!("aclrtGetSocName: {}", e.msg));
            std::ptr::null()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceCount(count: *mut u32) -> i32 {
    api("aclrtGetDeviceCount", || {
        let n = sim()?.face.devices.len() as u32;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(count, n) }
    })
}

fn device_index(s: &Sim, d: i32) -> Result<usize, Err> {
    usize::try_from(d)
        .ok()
        .filter(|&d| d < s.face.devices.len())
        .ok_or_else(|| {
            Err::new(
                ACL_ERROR_RT_INVALID_DEVICEID,
                format!(
                    "device {d} (this process has {} devices)",
                    s.face.devices.len()
                ),
            )
        })
}

#[no_mangle]
pub extern "C" fn aclrtSetDevice(d: i32) -> i32 {
    api("aclrtSetDevice", || {
        let s = sim()?;
        let d = device_index(s, d)?;
        let existing = s.tables.lock().devices.get(&d).map(|e| e.1);
        let ctx = match existing {
            Some(c) => c,
            None => s.new_context(d, true)?,
        };
        s.tables.lock().devices.entry(d).or_insert((0, ctx)).0 += 1;
        CURRENT.set(ctx);
        s.face.set_current(Some(d));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtResetDevice(d: i32) -> i32 {
    api("aclrtResetDevice", || {
        let s = sim()?;
        let d = device_index(s, d)?;
        let last = {
            let mut t = s.tables.lock();
            let e = t.devices.get_mut(&d).ok_or_else(|| {
                Err::param(format!(
                    "device {d} was not set (aclrtSetDevice) in this process"
                ))
            })?;
            e.0 -= 1;
            (e.0 == 0).then_some(e.1)
        };
        if let Some(ctx) = last {
            s.tables.lock().devices.remove(&d);
            s.drop_context(ctx)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(d: *mut i32) -> i32 {
    api("aclrtGetDevice", || {
        let (_, ctx) = sim()?.context()?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(d, ctx.device as i32) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeDevice() -> i32 {
    api("aclrtSynchronizeDevice", || {
        let s = sim()?;
        let (_, ctx) = s.context()?;
        Ok(s.face.dev(ctx.device as i64)?.synchronize()?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateContext(ctx: *mut *mut c_void, d: i32) -> i32 {
    api("aclrtCreateContext", || {
        let s = sim()?;
        let d = device_index(s, d)?;
        if ctx.is_null() {
            return Err(Err::param("null context pointer"));
        }
        let id = s.new_context(d, false)?;
        CURRENT.set(id);
        s.face.set_current(Some(d));
        // SAFETY: checked non-null above; the caller's out-pointer.
        unsafe { out(ctx, id as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtDestroyContext(ctx: *mut c_void) -> i32 {
    api("aclrtDestroyContext", || {
        let s = sim()?;
        let id = ctx as u64;
        let is_default = s
            .tables
            .lock()
            .contexts
            .get(&id)
            .map(|c| c.is_default)
            .ok_or_else(|| Err::new(ACL_ERROR_RT_INVALID_HANDLE, format!("context {ctx:p}")))?;
        if is_default {
            return Err(Err::param(
                "a device's default context is released by aclrtResetDevice, not destroyed",
            ));
        }
        s.drop_context(id)
    })
}

#[no_mangle]
pub extern "C" fn aclrtSetCurrentContext(ctx: *mut c_void) -> i32 {
    api("aclrtSetCurrentContext", || {
        let s = sim()?;
        let device = s
            .tables
            .lock()
            .contexts
            .get(&(ctx as u64))
            .map(|c| c.device)
            .ok_or_else(|| Err::new(ACL_ERROR_RT_INVALID_HANDLE, format!("context {ctx:p}")))?;
        CURRENT.set(ctx as u64);
        s.face.set_current(Some(device));
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetCurrentContext(ctx: *mut *mut c_void) -> i32 {
    api("aclrtGetCurrentContext", || {
        let (id, _) = sim()?.context()?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(ctx, id as *mut c_void) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetRunMode(mode: *mut i32) -> i32 {
    api("aclrtGetRunMode", || {
        sim()?;
        // ACL_HOST (1): the program runs on the host, with the NPU as an accelerator.
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(mode, 1) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetMemInfo(attr: i32, free: *mut usize, total: *mut usize) -> i32 {
    api("aclrtGetMemInfo", || {
        let s = sim()?;
        s.context()?;
        // ACL_DDR_MEM .. ACL_HBM_MEM_P2P_HUGE1G: all the one device memory here.
        if !(0..=11).contains(&attr) {
            return Err(Err::param(format!("memory attribute {attr}")));
        }
        let (f, t) = ops::mem_info(s.face)?;
        // SAFETY: `out` refuses null out-pointers; non-null ones are the caller's.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetDeviceInfo(d: u32, attr: i32, value: *mut i64) -> i32 {
    api("aclrtGetDeviceInfo", || {
        let s = sim()?;
        let dev = s
            .face
            .dev(d as i64)
            .map_err(|_| Err::new(ACL_ERROR_RT_INVALID_DEVICEID, format!("device {d}")))?;
        let v = match attr {
            1 => 6,                            // AICPU_CORE_NUM
            101 | 102 => s.soc.ai_cores(),     // AICORE_CORE_NUM, CUBE_CORE_NUM
            201 => 2 * s.soc.ai_cores(),       // VECTOR_CORE_NUM
            202 => 1,                          // WARP_SIZE
            301 => dev.memory_info().1 as i64, // TOTAL_GLOBAL_MEM_SIZE
            302 => 192 << 20,                  // L2_CACHE_SIZE
            _ => return Err(Err::param(format!("device attribute {attr}"))),
        };
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(value, v) }
    })
}

/// `aclrtMalloc` policies: HUGE_FIRST .. HUGE1G_ONLY_P2P.
const POLICIES: std::ops::RangeInclusive<i32> = 0..=7;

#[no_mangle]
pub unsafe extern "C" fn aclrtMalloc(p: *mut *mut c_void, size: usize, policy: i32) -> i32 {
    api("aclrtMalloc", || {
        let s = sim()?;
        s.context()?;
        if p.is_null() {
            return Err(Err::param("null pointer for the address"));
        }
        if size == 0 {
            return Err(Err::param("size 0"));
        }
        if !POLICIES.contains(&policy) {
            return Err(Err::param(format!("memory policy {policy}")));
        }
        // As the header says: rounded up to 32 bytes, plus 32 bytes of padding.
        let bytes = size
            .checked_next_multiple_of(32)
            .and_then(|b| b.checked_add(32))
            .ok_or_else(|| Err::param(format!("size {size}")))?;
        let a = ops::malloc(s.face, bytes)?;
        // SAFETY: checked non-null above; the caller's out-pointer.
        unsafe { out(p, a as *mut c_void) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtFree(p: *mut c_void) -> i32 {
    api("aclrtFree", || {
        let s = sim()?;
        if p.is_null() {
            return Err(Err::param("null address"));
        }
        if s.place(p as u64).is_none() {
            return Err(Err::new(
                ACL_ERROR_RT_MEMORY_FREE,
                format!("{p:p} is not device memory from aclrtMalloc (freed already?)"),
            ));
        }
        Ok(ops::free(s.face, p as u64)?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMallocHost(p: *mut *mut c_void, size: usize) -> i32 {
    api("aclrtMallocHost", || {
        let s = sim()?;
        s.context()?;
        if p.is_null() {
            return Err(Err::param("null pointer for the address"));
        }
        if size == 0 {
            return Err(Err::param("size 0"));
        }
        let a = ops::host_alloc(s.face, size)?;
        // SAFETY: checked non-null above; the caller's out-pointer.
        unsafe { out(p, a) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtFreeHost(p: *mut c_void) -> i32 {
    api("aclrtFreeHost", || {
        let s = sim()?;
        ops::host_free(s.face, p).map_err(|_| {
            Err::param(format!(
                "{p:p} is not host memory from aclrtMallocHost, or a queued copy still uses it"
            ))
        })
    })
}

/// `aclrtMemcpyKind` values.
pub mod memcpy {
    pub const H2H: i32 = 0;
    pub const H2D: i32 = 1;
    pub const D2H: i32 = 2;
    pub const D2D: i32 = 3;
    pub const DEFAULT: i32 = 4;
    pub const H2BUF2D: i32 = 5;
    pub const INNER_D2D: i32 = 6;
    pub const INTER_D2D: i32 = 7;
}
use memcpy::*;

/// Checks a copy's kind against where its memory is; returns the places of (dst, src).
fn check_kind(
    s: &Sim,
    dst: u64,
    src: u64,
    kind: i32,
) -> Result<(Option<usize>, Option<usize>), Err> {
    let (pd, ps) = (s.place(dst), s.place(src));
    let want = match kind {
        H2H => (false, false),
        H2D | H2BUF2D => (true, false),
        D2H => (false, true),
        D2D | INNER_D2D | INTER_D2D => (true, true),
        DEFAULT => (pd.is_some(), ps.is_some()),
        _ => return Err(Err::param(format!("memcpy kind {kind}"))),
    };
    let side = |ok: bool, dev: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(Err::param(format!(
                "memcpy kind {kind}: {what} must be {} memory",
                if dev { "device" } else { "host" }
            )))
        }
    };
    side(pd.is_some() == want.0, want.0, "the destination")?;
    side(ps.is_some() == want.1, want.1, "the source")?;
    if kind == INNER_D2D && pd != ps {
        return Err(Err::param(
            "ACL_MEMCPY_INNER_DEVICE_TO_DEVICE between two devices",
        ));
    }
    if kind == INTER_D2D && pd == ps {
        return Err(Err::param(
            "ACL_MEMCPY_INTER_DEVICE_TO_DEVICE within one device",
        ));
    }
    Ok((pd, ps))
}

/// Enqueues a copy of `count` bytes on `stream` (a core stream handle).
///
/// # Safety
/// Host sides are valid for `count` bytes.
unsafe fn copy_on(
    s: &Sim,
    dst: *mut c_void,
    src: *const c_void,
    count: usize,
    places: (Option<usize>, Option<usize>),
    stream: *mut c_void,
) -> Result<(), Err> {
    let f = s.face;
    match places {
        (Some(dd), Some(sd)) if dd != sd => {
            let me = f
                .current()
                .ok_or_else(|| Err::new(ACL_ERROR_RT_CONTEXT_NULL, "no device"))?;
            let other = if dd == me { sd } else { dd };
            if !f.peer_enabled(me, other) {
                return Err(Err::param(format!(
                    "a copy between devices {sd} and {dd} needs aclrtDeviceEnablePeerAccess first"
                )));
            }
            Ok(ops::copy_peer(
                f,
                (dd, dst as u64),
                (sd, src as u64),
                count,
                stream,
            )?)
        }
        (Some(_), Some(_)) => Ok(ops::copy_d2d(f, dst as u64, src as u64, count, stream)?),
        // SAFETY: the caller's contract on the host side.
        (Some(_), None) => Ok(unsafe { ops::copy_h2d(f, dst as u64, src, count, stream) }?),
        // SAFETY: the caller's contract on the host side.
        (None, Some(_)) => Ok(unsafe { ops::copy_d2h(f, dst, src as u64, count, stream) }?),
        (None, None) => {
            if count > 0 {
                // SAFETY: the caller provides `count` bytes on both sides.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, count) };
            }
            Ok(())
        }
    }
}

fn check_counts(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
) -> Result<(), Err> {
    if count > dest_max {
        return Err(Err::param(format!(
            "count {count} exceeds destMax {dest_max}"
        )));
    }
    if count > 0 && (dst.is_null() || src.is_null()) {
        return Err(Err::param("null address"));
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: i32,
) -> i32 {
    api("aclrtMemcpy", || {
        let s = sim()?;
        let (ctx, stream) = s.stream(std::ptr::null_mut())?;
        check_counts(dst, dest_max, src, count)?;
        let places = check_kind(s, dst as u64, src as u64, kind)?;
        // SAFETY: the caller provides `count` bytes on the host sides.
        unsafe { copy_on(s, dst, src, count, places, stream) }?;
        let dev = s.face.dev(ctx.device as i64)?;
        Ok(dev.stream_synchronize(StreamId(stream as u64))?)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpyAsync(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: i32,
    stream: *mut c_void,
) -> i32 {
    api("aclrtMemcpyAsync", || {
        let s = sim()?;
        let (_, stream) = s.stream(stream)?;
        check_counts(dst, dest_max, src, count)?;
        let places = check_kind(s, dst as u64, src as u64, kind)?;
        if places == (None, None) {
            return Err(Err::new(
                ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                "an asynchronous copy within the host is not supported",
            ));
        }
        // SAFETY: the caller provides `count` bytes on the host side.
        unsafe { copy_on(s, dst, src, count, places, stream) }
    })
}

fn memset_on(
    p: *mut c_void,
    max: usize,
    value: i32,
    count: usize,
    stream: *mut c_void,
) -> Result<(), Err> {
    let s = sim()?;
    let (_, stream) = s.stream(stream)?;
    if count > max {
        return Err(Err::param(format!("count {count} exceeds maxCount {max}")));
    }
    if p.is_null() || s.place(p as u64).is_none() {
        return Err(Err::param(format!("{p:p} is not device memory")));
    }
    ops::fill(s.face, p as u64, value as u8 as u32, 1, count, stream)?;
    Ok(())
}

#[no_mangle]
pub extern "C" fn aclrtMemset(p: *mut c_void, max: usize, value: i32, count: usize) -> i32 {
    api("aclrtMemset", || {
        memset_on(p, max, value, count, std::ptr::null_mut())?;
        let s = sim()?;
        let (dev, id) = s.core_stream(std::ptr::null_mut())?;
        Ok(dev.stream_synchronize(id)?)
    })
}

#[no_mangle]
pub extern "C" fn aclrtMemsetAsync(
    p: *mut c_void,
    max: usize,
    value: i32,
    count: usize,
    stream: *mut c_void,
) -> i32 {
    api("aclrtMemsetAsync", || {
        memset_on(p, max, value, count, stream)
    })
}

fn create_stream(p: *mut *mut c_void) -> Result<(), Err> {
    let s = sim()?;
    let (cid, ctx) = s.context()?;
    if p.is_null() {
        return Err(Err::param("null stream pointer"));
    }
    let id = s.face.dev(ctx.device as i64)?.create_stream()?.0;
    s.tables.lock().streams.insert(id, cid);
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { out(p, id as *mut c_void) }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(p: *mut *mut c_void) -> i32 {
    api("aclrtCreateStream", || create_stream(p))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStreamWithConfig(
    p: *mut *mut c_void,
    _priority: u32,
    flag: u32,
) -> i32 {
    api("aclrtCreateStreamWithConfig", || {
        if flag & !STREAM_FLAGS != 0 {
            return Err(Err::param(format!("stream flags {flag:#x}")));
        }
        create_stream(p)
    })
}

fn destroy_stream(name: &str, stream: *mut c_void) -> Result<(), Err> {
    let s = sim()?;
    if stream.is_null() {
        return Err(Err::param(format!(
            "{name}: the default stream is released with its context"
        )));
    }
    let (_, h) = s.stream(stream)?;
    s.tables.lock().streams.remove(&(h as u64));
    Ok(ops::stream_destroy(s.face, h)?)
}

#[no_mangle]
pub extern "C" fn aclrtDestroyStream(stream: *mut c_void) -> i32 {
    api("aclrtDestroyStream", || {
        destroy_stream("aclrtDestroyStream", stream)
    })
}

/// As `aclrtDestroyStream` (queued work still runs: the forced form's discarding of queued
/// work is not simulated).
#[no_mangle]
pub extern "C" fn aclrtDestroyStreamForce(stream: *mut c_void) -> i32 {
    api("aclrtDestroyStreamForce", || {
        destroy_stream("aclrtDestroyStreamForce", stream)
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeStream(stream: *mut c_void) -> i32 {
    api("aclrtSynchronizeStream", || {
        let s = sim()?;
        let (_, h) = s.stream(stream)?;
        Ok(ops::stream_synchronize(s.face, h)?)
    })
}

/// Polls `done` until it is ready or `timeout_ms` passed (-1: the core's synchronisation, bounded
/// by the watchdog).
fn wait_with_timeout(
    timeout_ms: i32,
    timeout_code: i32,
    mut done: impl FnMut() -> Result<bool, Err>,
    sync: impl FnOnce() -> Result<(), Err>,
) -> Result<(), Err> {
    if timeout_ms == -1 {
        return sync();
    }
    if timeout_ms < -1 {
        return Err(Err::param(format!("timeout {timeout_ms} ms")));
    }
    let deadline = unihal_hal::deadline::after(std::time::Duration::from_millis(timeout_ms as u64));
    loop {
        if done()? {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(Err::new(
                timeout_code,
                format!("not complete after {timeout_ms} ms"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Ok(true) when done, Ok(false) when not ready, else the failure.
fn ready(r: Result<(), unihal_sim::SimError>) -> Result<bool, Err> {
    match r {
        Ok(()) => Ok(true),
        Err(unihal_sim::SimError::NotReady) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeStreamWithTimeout(stream: *mut c_void, timeout: i32) -> i32 {
    api("aclrtSynchronizeStreamWithTimeout", || {
        let s = sim()?;
        let (dev, id) = s.core_stream(stream)?;
        wait_with_timeout(
            timeout,
            ACL_ERROR_RT_STREAM_SYNC_TIMEOUT,
            || ready(dev.query_stream_done(id)),
            || Ok(dev.stream_synchronize(id)?),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtStreamQuery(stream: *mut c_void, status: *mut i32) -> i32 {
    api("aclrtStreamQuery", || {
        let s = sim()?;
        let (dev, id) = s.core_stream(stream)?;
        let done = ready(dev.query_stream_done(id))?;
        // ACL_STREAM_STATUS_COMPLETE = 0, NOT_READY = 1.
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(status, if done { 0 } else { 1 }) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtStreamWaitEvent(stream: *mut c_void, event: *mut c_void) -> i32 {
    api("aclrtStreamWaitEvent", || {
        let s = sim()?;
        let (_, h) = s.stream(stream)?;
        let info = s.event(event)?;
        if !info.can_wait {
            return Err(Err::param(
                "the event was created without ACL_EVENT_SYNC: it cannot be waited on",
            ));
        }
        Ok(ops::stream_wait_event(s.face, h, event)?)
    })
}

fn create_event(p: *mut *mut c_void, info: (bool, bool)) -> Result<(), Err> {
    let s = sim()?;
    let (_, ctx) = s.context()?;
    if p.is_null() {
        return Err(Err::param("null event pointer"));
    }
    let id = s.face.dev(ctx.device as i64)?.create_event()?.0;
    s.tables.lock().events.insert(
        id,
        EventInfo {
            device: ctx.device,
            can_wait: info.0,
            can_time: info.1,
            recorded_on: None,
        },
    );
    // SAFETY: checked non-null above; the caller's out-pointer.
    unsafe { out(p, id as *mut c_void) }
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEvent(p: *mut *mut c_void) -> i32 {
    api("aclrtCreateEvent", || create_event(p, (true, true)))
}

fn create_event_with_flag(p: *mut *mut c_void, flag: u32) -> Result<(), Err> {
    let known =
        ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE | ACL_EVENT_OTHER;
    if flag == 0 || flag & !known != 0 {
        return Err(Err::param(format!("event flags {flag:#x}")));
    }
    create_event(
        p,
        (
            flag & (ACL_EVENT_SYNC | ACL_EVENT_OTHER) != 0,
            flag & ACL_EVENT_TIME_LINE != 0,
        ),
    )
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEventWithFlag(p: *mut *mut c_void, flag: u32) -> i32 {
    api("aclrtCreateEventWithFlag", || {
        create_event_with_flag(p, flag)
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateEventExWithFlag(p: *mut *mut c_void, flag: u32) -> i32 {
    api("aclrtCreateEventExWithFlag", || {
        create_event_with_flag(p, flag)
    })
}

#[no_mangle]
pub extern "C" fn aclrtDestroyEvent(event: *mut c_void) -> i32 {
    api("aclrtDestroyEvent", || {
        let s = sim()?;
        s.event(event)?;
        s.tables.lock().events.remove(&(event as u64));
        Ok(ops::event_destroy(s.face, event)?)
    })
}

#[no_mangle]
pub extern "C" fn aclrtRecordEvent(event: *mut c_void, stream: *mut c_void) -> i32 {
    api("aclrtRecordEvent", || {
        let s = sim()?;
        let (ctx, h) = s.stream(stream)?;
        let info = s.event(event)?;
        if info.device != ctx.device {
            return Err(Err::new(
                ACL_ERROR_RT_STREAM_CONTEXT,
                "the event belongs to another device than the stream",
            ));
        }
        ops::event_record(s.face, event, h)?;
        if let Some(e) = s.tables.lock().events.get_mut(&(event as u64)) {
            e.recorded_on = Some(h as u64);
        }
        Ok(())
    })
}

/// Resetting an event in stream order is not simulated.
#[no_mangle]
pub extern "C" fn aclrtResetEvent(_event: *mut c_void, _stream: *mut c_void) -> i32 {
    api("aclrtResetEvent", || {
        sim()?;
        Err(Err::new(
            ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
            "aclrtResetEvent is not simulated",
        ))
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeEvent(event: *mut c_void) -> i32 {
    api("aclrtSynchronizeEvent", || {
        let s = sim()?;
        s.event(event)?;
        Ok(ops::event_synchronize(s.face, event)?)
    })
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeEventWithTimeout(event: *mut c_void, timeout: i32) -> i32 {
    api("aclrtSynchronizeEventWithTimeout", || {
        let s = sim()?;
        s.event(event)?;
        let dev = s.face.handle_owner(event as u64)?;
        let e = EventId(event as u64);
        wait_with_timeout(
            timeout,
            ACL_ERROR_RT_EVENT_SYNC_TIMEOUT,
            || ready(dev.query(e)),
            || Ok(dev.event_synchronize(e)?),
        )
    })
}

fn event_done(event: *mut c_void) -> Result<bool, Err> {
    let s = sim()?;
    s.event(event)?;
    ready(ops::event_query(s.face, event).map_err(|f| match f {
        ops::Fail::Sim(e) => e,
        other => unihal_sim::SimError::InvalidHandle(format!("{other:?}")),
    }))
}

#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEventStatus(event: *mut c_void, status: *mut i32) -> i32 {
    api("aclrtQueryEventStatus", || {
        let done = event_done(event)?;
        // aclrtEventRecordedStatus: NOT_READY = 0, COMPLETE = 1.
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(status, if done { 1 } else { 0 }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtQueryEvent(event: *mut c_void, status: *mut i32) -> i32 {
    api("aclrtQueryEvent", || {
        let done = event_done(event)?;
        // aclrtEventStatus (deprecated): COMPLETE = 0, NOT_READY = 1.
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(status, if done { 0 } else { 1 }) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> i32 {
    api("aclrtEventElapsedTime", || {
        let s = sim()?;
        let (a, b) = (s.event(start)?, s.event(end)?);
        if !a.can_time || !b.can_time {
            return Err(Err::param(
                "elapsed time needs events that may time (aclrtCreateEvent, or ACL_EVENT_TIME_LINE)",
            ));
        }
        if a.recorded_on.is_none() || a.recorded_on != b.recorded_on {
            return Err(Err::param(
                "elapsed time needs both events recorded, on the same stream",
            ));
        }
        let v = ops::event_elapsed(s.face, start, end)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(ms, v) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn aclrtDeviceCanAccessPeer(can: *mut i32, d: i32, peer: i32) -> i32 {
    api("aclrtDeviceCanAccessPeer", || {
        let s = sim()?;
        device_index(s, d)?;
        device_index(s, peer)?;
        if d == peer {
            return Err(Err::param("a device and itself are not peers"));
        }
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { out(can, 1) }
    })
}

#[no_mangle]
pub extern "C" fn aclrtDeviceEnablePeerAccess(peer: i32, flags: u32) -> i32 {
    api("aclrtDeviceEnablePeerAccess", || {
        let s = sim()?;
        s.context()?;
        let peer = device_index(s, peer)?;
        Ok(ops::enable_peer(s.face, peer, flags)?)
    })
}

#[no_mangle]
pub extern "C" fn aclrtDeviceDisablePeerAccess(peer: i32) -> i32 {
    api("aclrtDeviceDisablePeerAccess", || {
        let s = sim()?;
        s.context()?;
        let peer = device_index(s, peer)?;
        Ok(ops::disable_peer(s.face, peer)?)
    })
}

/// The name of device `ordinal`: says it is simulated, and (in concurrent mode) that kernels run
/// while the host goes on.
pub fn device_name(soc: &str, ordinal: usize, mode: unihal_sim::Mode) -> String {
    let concurrent = if mode == unihal_sim::Mode::Concurrent {
        ", concurrent"
    } else {
        ""
    };
    let family = if soc.starts_with("Ascend910B") && soc.len() > "Ascend910B".len() {
        "Ascend910B"
    } else {
        soc
    };
    format!("unihal simulated {family} NPU {ordinal} (not an NPU{concurrent})")
}

/// Not CANN's: `aclError unihal_sim_cann_device_name(int32_t device, char *name, size_t len)`
/// writes device `device`'s name, NUL-terminated and truncated to `len` bytes, saying that it is
/// simulated ("unihal simulated Ascend910B NPU 0 (not an NPU)"). ACL has no device-name call (a
/// backend names devices after `aclrtGetSocName`, which returns the SoC verbatim); a backend
/// that finds this symbol reports the name instead, so no report mistakes the simulator for an
/// NPU.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_cann_device_name(d: i32, name: *mut c_char, len: usize) -> i32 {
    api("unihal_sim_cann_device_name", || {
        let s = sim()?;
        let d = device_index(s, d)?;
        let full = device_name(s.soc.name, d, s.face.devices[d].mode());
        // SAFETY: the caller provides `len` bytes.
        if unsafe { ops::copy_c_str(&full, name, len) } {
            Ok(())
        } else {
            Err(Err::param("NULL or empty name buffer"))
        }
    })
}
