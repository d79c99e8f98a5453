//! A Rust backend exported as a plugin: the function table over any `dyn Backend`.
//!
//! A plugin crate (crate-type `cdylib`) names its backend once:
//!
//! ```ignore
//! unihal_plugin::export_backend!(|| std::sync::Arc::new(my_backend::MyBackend::new()));
//! ```
//!
//! which exports `unihal_plugin_entry`. Every entry of the table turns its handles back into the
//! HAL objects they own and calls the backend; a panic is caught at the boundary and becomes
//! `UH_ERR_INTERNAL` (never unwinding into C). Ownership follows the HAL across the boundary:
//! each handle owns one HAL handle (a `Buffer`, an `Arc<dyn Stream>` ...) and its release drops
//! it, so queued work, which keeps its own handles, finishes whatever the host releases.

use crate::conv::{self, CclCapsStore, PropsStore, SourceStore};
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use unihal_hal::{
    Backend, Buffer, CollectiveOp, Communicator, Device, Event, EventFlags, FillValue, Function,
    GroupCall, HalError, HostBuffer, Invalid, KernelArgs, LaunchConfig, Module, Result, Stream,
};
use unihal_plugin_abi::*;

/// Exports `unihal_plugin_entry` for the backend `make` returns (called once, at the first
/// entry call). Use once per `cdylib`.
#[macro_export]
macro_rules! export_backend {
    ($make:expr) => {
        /// The plugin's entry point (unihal_plugin.h).
        ///
        /// # Safety
        /// Called by a unihal host as the header documents.
        #[no_mangle]
        pub unsafe extern "C" fn unihal_plugin_entry(
            host: *const $crate::abi::UhHostApi,
            err: *mut $crate::abi::UhError,
        ) -> *const $crate::abi::UhPluginApi {
            // SAFETY: the host's pointers are valid as the header documents.
            unsafe { $crate::export::entry(host, err, $make) }
        }
    };
}

/// What the exported backend shares with every entry.
struct Exported {
    backend: Arc<dyn Backend>,
    info: InfoStore,
    ccl: Option<(UhCclCaps, CclCapsStore)>,
    /// Test kernels per device ordinal, valid forever once made.
    kernels: parking_lot::Mutex<HashMap<u32, &'static KernelsStore>>,
    log: Option<unsafe extern "C" fn(i32, *const c_char, *const c_char)>,
}

struct InfoStore {
    strings: Vec<CString>,
    libraries: Vec<UhLibraryInfo>,
    info: UhPluginInfo,
}

struct KernelsStore {
    source: Option<UhModuleSource>,
    _keep: SourceStore,
}

// SAFETY: the raw pointers inside point into data owned by the same value, never written after
// construction; sharing read-only pointers between threads is sound.
unsafe impl Send for Exported {}
// SAFETY: as above.
unsafe impl Sync for Exported {}
// SAFETY: as above (the store is leaked and only read).
unsafe impl Send for KernelsStore {}
// SAFETY: as above.
unsafe impl Sync for KernelsStore {}

static EXPORTED: OnceLock<Exported> = OnceLock::new();
static TABLE: OnceLock<UhPluginApi> = OnceLock::new();

fn exported() -> &'static Exported {
    EXPORTED.get().expect("entry ran before any other call")
}

/// The entry point behind [`export_backend!`]: checks the host's major version, makes the
/// backend once and returns the table.
///
/// # Safety
/// `host` and `err` are valid as unihal_plugin.h documents (`err` may be NULL).
pub unsafe fn entry(
    host: *const UhHostApi,
    err: *mut UhError,
    make: impl FnOnce() -> Arc<dyn Backend>,
) -> *const UhPluginApi {
    let fail = |e: HalError| {
        if !err.is_null() {
            // SAFETY: non-null and valid by the caller's promise.
            conv::put_error(unsafe { &mut *err }, &e);
        }
        std::ptr::null()
    };
    if host.is_null() {
        return fail(HalError::invalid(
            "host",
            Invalid::Other("NULL host API".into()),
        ));
    }
    // SAFETY: non-null; the first four fields are frozen across majors.
    let head = unsafe { *(host as *const UhTableHead) };
    if head.abi_major != UH_ABI_MAJOR {
        return fail(HalError::AbiMismatch {
            what: format!(
                "the host speaks plugin ABI {}.{}, this plugin {UH_ABI_MAJOR}.{UH_ABI_MINOR}",
                head.abi_major, head.abi_minor
            ),
        });
    }
    // SAFETY: same major: the struct is at least as long as its `size` says, and fields past
    // it are not read.
    let log = if head.size as usize >= std::mem::size_of::<UhHostApi>() {
        // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
        unsafe { (*host).log }
    } else {
        None
    };
    let made = catch_unwind(AssertUnwindSafe(|| {
        EXPORTED.get_or_init(|| Exported::new(make(), log));
    }));
    if made.is_err() {
        return fail(HalError::Internal(
            "the plugin's backend panicked while being made".into(),
        ));
    }
    TABLE.get_or_init(table) as *const UhPluginApi
}

impl Exported {
    fn new(
        backend: Arc<dyn Backend>,
        log: Option<unsafe extern "C" fn(i32, *const c_char, *const c_char)>,
    ) -> Exported {
        let bi = backend.info();
        let mut strings = Vec::new();
        let mut s = |t: &str| {
            let c = CString::new(t.replace('\0', " ")).unwrap_or_default();
            let p = c.as_ptr();
            strings.push(c);
            p
        };
        let opt = |t: &Option<String>, s: &mut dyn FnMut(&str) -> *const c_char| {
            t.as_deref().map_or(std::ptr::null(), s)
        };
        let libraries: Vec<UhLibraryInfo> = bi
            .libraries
            .iter()
            .map(|l| UhLibraryInfo {
                size: std::mem::size_of::<UhLibraryInfo>() as u32,
                reserved: 0,
                role: s(&l.role),
                name: s(&l.name),
                path: opt(&l.path, &mut s),
                version: opt(&l.version, &mut s),
                error: opt(&l.error, &mut s),
            })
            .collect();
        let info = UhPluginInfo {
            size: std::mem::size_of::<UhPluginInfo>() as u32,
            reserved: 0,
            name: s(backend.name()),
            version: s(&bi.version),
            simulated: bi.simulated as u32,
            concurrent: bi.concurrent as u32,
            n_libraries: libraries.len() as u32,
            reserved2: 0,
            libraries: libraries.as_ptr(),
            manifest: s(backend.conformance_manifest()),
        };
        let ccl = backend.collectives().map(|c| {
            let mut store = CclCapsStore::default();
            let caps = conv::put_ccl_caps(c.capabilities(), &mut store);
            (caps, store)
        });
        Exported {
            backend,
            info: InfoStore {
                strings,
                libraries,
                info,
            },
            ccl,
            kernels: parking_lot::Mutex::new(HashMap::new()),
            log,
        }
    }
}

/// Runs `f` at the boundary: its error, or a panic, goes into `err` as the ABI's status.
fn guard(err: *mut UhError, f: impl FnOnce() -> Result<()>) -> UhStatus {
    let r = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = unihal_hal::panic_message(&*p).unwrap_or_else(|| "a panic".into());
            Err(HalError::Internal(format!("the plugin panicked: {what}")))
        }
    };
    match r {
        Ok(()) => UH_OK,
        Err(e) if !err.is_null() => {
            // SAFETY: the host passes a valid record (header rule 4).
            conv::put_error(unsafe { &mut *err }, &e)
        }
        Err(e) => conv::put_error(&mut UhError::new(), &e),
    }
}

/// Sends one line to the host's log sink, if it gave one.
pub fn log(level: i32, message: &str) {
    if let Some(f) = EXPORTED.get().and_then(|e| e.log) {
        let target = c"unihal::plugin";
        let m = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the host's sink takes two NUL-terminated strings it copies.
        unsafe { f(level, target.as_ptr(), m.as_ptr()) };
    }
}

// ---- handles ------------------------------------------------------------------------------

struct Dev {
    dev: Arc<dyn Device>,
    props: PropsStore,
}
struct Mem(Buffer);
struct HostMem(HostBuffer);
struct Strm(Arc<dyn Stream>);
struct Ev(Arc<dyn Event>);
struct Modl(Arc<dyn Module>);
struct Func {
    f: Arc<dyn Function>,
    sizes: Option<Vec<u64>>,
}
struct Comm(Arc<dyn Communicator>);

fn out<T, H>(p: *mut *mut H, v: T) -> Result<()> {
    if p.is_null() {
        return Err(HalError::invalid(
            "out",
            Invalid::Other("NULL output pointer".into()),
        ));
    }
    // SAFETY: non-null output pointer from the host; the handle is a leaked Box of the handle
    // type `T` stands for, turned back by `obj` and `release`.
    unsafe { *p = Box::into_raw(Box::new(v)) as *mut H };
    Ok(())
}

/// The handle object behind `p`.
fn obj<'a, T, H>(p: *mut H, what: &'static str) -> Result<&'a T> {
    if p.is_null() {
        return Err(HalError::invalid(
            what,
            Invalid::Other("NULL handle".into()),
        ));
    }
    // SAFETY: a non-null handle is one `out` made from a `Box<T>` and the host has not released
    // it (header rule 5).
    Ok(unsafe { &*(p as *const T) })
}

/// Drops the handle object behind `p`.
fn release<T, H>(p: *mut H) {
    if !p.is_null() {
        // SAFETY: as in `obj`; the host releases each handle once.
        let b = unsafe { Box::from_raw(p as *mut T) };
        let _ = catch_unwind(AssertUnwindSafe(|| drop(b)));
    }
}

fn buf(mem: *mut UhMem, offset: u64, len: u64, what: &'static str) -> Result<Buffer> {
    obj::<Mem, _>(mem, what)?.0.slice(offset, len)
}

fn set<T: Copy>(p: *mut T, v: T) {
    if !p.is_null() {
        // SAFETY: a non-null output pointer from the host.
        unsafe { *p = v };
    }
}

fn timeout(ms: u64) -> unihal_hal::CommConfig {
    unihal_hal::CommConfig {
        timeout: (ms != 0).then(|| std::time::Duration::from_millis(ms)),
    }
}

// ---- the table ----------------------------------------------------------------------------

fn table() -> UhPluginApi {
    UhPluginApi {
        size: std::mem::size_of::<UhPluginApi>() as u32,
        abi_major: UH_ABI_MAJOR,
        abi_minor: UH_ABI_MINOR,
        reserved: 0,
        info: Some(info),
        probe: Some(probe),
        device_open: Some(device_open),
        device_release: Some(device_release),
        device_props: Some(device_props),
        device_memory_info: Some(device_memory_info),
        device_synchronize: Some(device_synchronize),
        device_native: Some(device_native),
        mem_alloc: Some(mem_alloc),
        mem_release: Some(mem_release),
        host_alloc: Some(host_alloc),
        host_release: Some(host_release),
        mem_import: Some(mem_import),
        stream_create: Some(stream_create),
        stream_release: Some(stream_release),
        copy_h2d: Some(copy_h2d),
        copy_d2h: Some(copy_d2h),
        copy_d2d: Some(copy_d2d),
        copy_peer: Some(copy_peer),
        fill: Some(fill),
        launch: Some(launch),
        run_op: Some(run_op),
        host_callback: Some(host_callback),
        stream_synchronize: Some(stream_synchronize),
        stream_query: Some(stream_query),
        stream_async_error: Some(stream_async_error),
        stream_native: Some(stream_native),
        event_create: Some(event_create),
        event_release: Some(event_release),
        event_record: Some(event_record),
        stream_wait_event: Some(stream_wait_event),
        event_query: Some(event_query),
        event_synchronize: Some(event_synchronize),
        event_elapsed: Some(event_elapsed),
        event_native: Some(event_native),
        module_load: Some(module_load),
        module_release: Some(module_release),
        module_function: Some(module_function),
        function_release: Some(function_release),
        test_kernels: Some(test_kernels),
        ccl_caps: exported().ccl.as_ref().map(|_| ccl_caps as _),
        ccl_unique_id: Some(ccl_unique_id),
        ccl_init_rank: Some(ccl_init_rank),
        ccl_init_all: Some(ccl_init_all),
        comm_release: Some(comm_release),
        comm_rank_size: Some(comm_rank_size),
        comm_collective: Some(comm_collective),
        comm_group: Some(comm_group),
        comm_split: Some(comm_split),
        comm_abort: Some(comm_abort),
        comm_async_error: Some(comm_async_error),
        host_callback_node: Some(host_callback_node),
    }
}

type Err = *mut UhError;

unsafe extern "C" fn info() -> *const UhPluginInfo {
    let e = exported();
    let _ = (&e.info.strings, &e.info.libraries);
    &e.info.info
}

unsafe extern "C" fn probe(count: *mut u32, err: Err) -> UhStatus {
    guard(err, || {
        let n = exported().backend.probe()?;
        set(count, u32::try_from(n).unwrap_or(u32::MAX));
        Ok(())
    })
}

unsafe extern "C" fn device_open(ordinal: u32, o: *mut *mut UhDevice, err: Err) -> UhStatus {
    guard(err, || {
        let dev = exported().backend.open(ordinal as usize)?;
        out(
            o,
            Dev {
                dev,
                props: PropsStore::default(),
            },
        )
    })
}

unsafe extern "C" fn device_release(d: *mut UhDevice) {
    release::<Dev, _>(d)
}

unsafe extern "C" fn device_props(d: *mut UhDevice, o: *mut UhDeviceProps, err: Err) -> UhStatus {
    guard(err, || {
        if d.is_null() {
            return Err(HalError::invalid(
                "dev",
                Invalid::Other("NULL handle".into()),
            ));
        }
        // SAFETY: a live device handle (header rule 5); the host does not call this
        // concurrently for one handle (it reads the properties once, at open).
        let dev = unsafe { &mut *(d as *mut Dev) };
        let props = conv::put_props(dev.dev.info(), dev.dev.capabilities(), &mut dev.props);
        set(o, props);
        Ok(())
    })
}

unsafe extern "C" fn device_memory_info(
    d: *mut UhDevice,
    total: *mut u64,
    free: *mut u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let m = obj::<Dev, _>(d, "dev")?.dev.memory_info()?;
        set(total, m.total);
        set(free, m.free);
        Ok(())
    })
}

unsafe extern "C" fn device_synchronize(d: *mut UhDevice, err: Err) -> UhStatus {
    guard(err, || obj::<Dev, _>(d, "dev")?.dev.synchronize())
}

unsafe extern "C" fn device_native(d: *mut UhDevice, o: *mut UhNative) -> UhStatus {
    guard(std::ptr::null_mut(), || {
        set(
            o,
            conv::put_native(obj::<Dev, _>(d, "dev")?.dev.native_handle()),
        );
        Ok(())
    })
}

unsafe extern "C" fn mem_alloc(
    d: *mut UhDevice,
    len: u64,
    o: *mut *mut UhMem,
    addr: *mut u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let len = usize::try_from(len).map_err(|_| HalError::OutOfMemory {
            requested: len,
            free: 0,
        })?;
        let b = obj::<Dev, _>(d, "dev")?.dev.alloc(len)?;
        set(addr, b.device_addr());
        out(o, Mem(b))
    })
}

unsafe extern "C" fn mem_release(m: *mut UhMem) {
    release::<Mem, _>(m)
}

unsafe extern "C" fn host_alloc(
    d: *mut UhDevice,
    len: u64,
    o: *mut *mut UhHostMem,
    ptr: *mut *mut c_void,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let len = usize::try_from(len).map_err(|_| HalError::OutOfMemory {
            requested: len,
            free: 0,
        })?;
        let h = obj::<Dev, _>(d, "dev")?.dev.alloc_host(len)?;
        set(ptr, h.host_addr() as *mut c_void);
        out(o, HostMem(h))
    })
}

unsafe extern "C" fn host_release(m: *mut UhHostMem) {
    release::<HostMem, _>(m)
}

/// Calls the host's release function once, when the backend drops the import's owner.
struct ImportOwner {
    release: UhReleaseFn,
    user: *mut c_void,
}
// SAFETY: the header requires release functions callable from any thread.
unsafe impl Send for ImportOwner {}
// SAFETY: as above; the owner is never read, only dropped.
unsafe impl Sync for ImportOwner {}
impl Drop for ImportOwner {
    fn drop(&mut self) {
        // SAFETY: called exactly once, as the header promises the host.
        unsafe { (self.release)(self.user) }
    }
}

unsafe extern "C" fn mem_import(
    d: *mut UhDevice,
    addr: u64,
    len: u64,
    rel: Option<UhReleaseFn>,
    user: *mut c_void,
    o: *mut *mut UhMem,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let dev = &obj::<Dev, _>(d, "dev")?.dev;
        let owner: unihal_hal::Keep = match rel {
            Some(release) => Box::new(ImportOwner { release, user }),
            None => Box::new(()),
        };
        // SAFETY: the host vouches for the range as Device::import_memory requires (it is the
        // caller of the HAL's unsafe import on its side).
        let b = unsafe { dev.import_memory(addr, len, owner)? };
        out(o, Mem(b))
    })
}

unsafe extern "C" fn stream_create(d: *mut UhDevice, o: *mut *mut UhStream, err: Err) -> UhStatus {
    guard(err, || {
        let s = obj::<Dev, _>(d, "dev")?.dev.create_stream()?;
        out(o, Strm(s))
    })
}

unsafe extern "C" fn stream_release(s: *mut UhStream) {
    release::<Strm, _>(s)
}

fn strm<'a>(s: *mut UhStream) -> Result<&'a Arc<dyn Stream>> {
    Ok(&obj::<Strm, _>(s, "stream")?.0)
}

unsafe extern "C" fn copy_h2d(
    s: *mut UhStream,
    src: *mut UhHostMem,
    so: u64,
    dst: *mut UhMem,
    doff: u64,
    len: u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let h = &obj::<HostMem, _>(src, "src")?.0;
        let d = &obj::<Mem, _>(dst, "dst")?.0;
        strm(s)?.copy_h2d(h, so, d, doff, len)
    })
}

unsafe extern "C" fn copy_d2h(
    s: *mut UhStream,
    src: *mut UhMem,
    so: u64,
    dst: *mut UhHostMem,
    doff: u64,
    len: u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let d = &obj::<Mem, _>(src, "src")?.0;
        let h = &obj::<HostMem, _>(dst, "dst")?.0;
        strm(s)?.copy_d2h(d, so, h, doff, len)
    })
}

unsafe extern "C" fn copy_d2d(
    s: *mut UhStream,
    src: *mut UhMem,
    so: u64,
    dst: *mut UhMem,
    doff: u64,
    len: u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let a = &obj::<Mem, _>(src, "src")?.0;
        let b = &obj::<Mem, _>(dst, "dst")?.0;
        strm(s)?.copy_d2d(a, so, b, doff, len)
    })
}

unsafe extern "C" fn copy_peer(
    s: *mut UhStream,
    src: *mut UhMem,
    so: u64,
    dst: *mut UhMem,
    doff: u64,
    len: u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let a = &obj::<Mem, _>(src, "src")?.0;
        let b = &obj::<Mem, _>(dst, "dst")?.0;
        strm(s)?.copy_peer(a, so, b, doff, len)
    })
}

unsafe extern "C" fn fill(
    s: *mut UhStream,
    dst: *mut UhMem,
    offset: u64,
    len: u64,
    width: u32,
    value: u32,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let v = match width {
            1 => FillValue::U8(value as u8),
            2 => FillValue::U16(value as u16),
            4 => FillValue::U32(value),
            w => {
                return Err(HalError::invalid(
                    "width",
                    Invalid::Value {
                        value: w.to_string(),
                        accepted: "1, 2 or 4".into(),
                    },
                ))
            }
        };
        strm(s)?.fill(&obj::<Mem, _>(dst, "dst")?.0, offset, len, v)
    })
}

unsafe extern "C" fn launch(
    s: *mut UhStream,
    f: *mut UhFunction,
    config: *const UhLaunchConfig,
    n_args: u64,
    args: *const *mut c_void,
    sizes: *const u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let func = &obj::<Func, _>(f, "function")?.f;
        if config.is_null() {
            return Err(HalError::invalid(
                "config",
                Invalid::Other("NULL config".into()),
            ));
        }
        // SAFETY: non-null, valid by the header's contract.
        let c = unsafe { *config };
        let cfg = LaunchConfig {
            grid: unihal_hal::Dim3::new(c.grid[0], c.grid[1], c.grid[2]),
            block: unihal_hal::Dim3::new(c.block[0], c.block[1], c.block[2]),
            shared_mem_bytes: c.shared_mem_bytes,
        };
        // SAFETY: `n_args` pointers and sizes, valid during the call (header).
        let (ptrs, sz) = unsafe {
            (
                conv::slice(args, n_args as usize),
                conv::slice(sizes, n_args as usize),
            )
        };
        if ptrs.len() != sz.len() || ptrs.len() != n_args as usize {
            return Err(HalError::invalid(
                "args",
                Invalid::Other("NULL argument arrays".into()),
            ));
        }
        let mut ka = KernelArgs::new();
        for (p, &n) in ptrs.iter().zip(sz) {
            // SAFETY: each argument pointer addresses `n` readable bytes (header: CUDA
            // kernelParams), copied here.
            let bytes = unsafe { conv::slice(*p as *const u8, n as usize) };
            ka.push_bytes(bytes);
        }
        // SAFETY: the host's caller vouched for the arguments' meaning (Stream::launch is
        // unsafe on its side); the bytes are passed on unchanged.
        unsafe { strm(s)?.launch(func, &cfg, &ka) }
    })
}

unsafe extern "C" fn run_op(s: *mut UhStream, call: *const UhOpCall, err: Err) -> UhStatus {
    guard(err, || {
        if call.is_null() {
            return Err(HalError::invalid(
                "call",
                Invalid::Other("NULL call".into()),
            ));
        }
        // SAFETY: non-null and valid by the header's contract.
        let c = unsafe { conv::get_op_call(&*call, |m, o, l| buf(m, o, l, "tensors"))? };
        strm(s)?.run_op(&c)
    })
}

/// The host's function, called exactly once (header): with `UH_OK` when the backend runs the
/// closure, with `UH_ERR_ABORTED` when it drops the closure unrun (the enqueue failed, the
/// stream failed or went away).
struct HostFn {
    f: UhHostFn,
    user: *mut c_void,
    called: bool,
}
// SAFETY: the header requires host functions callable from any thread, `user` included.
unsafe impl Send for HostFn {}
impl HostFn {
    fn call(mut self, status: UhStatus) {
        self.called = true;
        // SAFETY: the host's function with its own pointer, called once (`called` disarms the
        // drop).
        unsafe { (self.f)(self.user, status) }
    }
}
impl Drop for HostFn {
    fn drop(&mut self) {
        if !self.called {
            // SAFETY: as in `call`; this is the one call.
            unsafe { (self.f)(self.user, UH_ERR_ABORTED) }
        }
    }
}

unsafe extern "C" fn host_callback(
    s: *mut UhStream,
    f: Option<UhHostFn>,
    user: *mut c_void,
    err: Err,
) -> UhStatus {
    // Made first: whatever happens below, the host's function is called once.
    let h = f.map(|f| HostFn {
        f,
        user,
        called: false,
    });
    guard(err, || {
        let Some(h) = h else {
            return Err(HalError::invalid(
                "fn",
                Invalid::Other("NULL host function".into()),
            ));
        };
        strm(s)?.host_callback(Box::new(move || h.call(UH_OK)))
    })
}

/// A host node (ABI 1.2), run exactly once (header): with `UH_OK` when the backend runs the
/// closure, with `UH_ERR_ABORTED` when it drops the closure unrun. The closure the HAL's
/// `host_callback` takes (a `Box<dyn FnOnce>`) holding it is the one allocation of this side.
struct HostNode(*mut UhHostNode, UhNodeFn);
// SAFETY: the header makes the node the plugin's until `run`, and `run` callable from any
// thread.
unsafe impl Send for HostNode {}
impl HostNode {
    fn call(self, status: UhStatus) {
        let (node, run) = (self.0, self.1);
        std::mem::forget(self);
        // SAFETY: the host's node with its own function, called once (`forget` disarms the
        // drop); the node is not touched after.
        unsafe { run(node, status) }
    }
}
impl Drop for HostNode {
    fn drop(&mut self) {
        // SAFETY: as in `call`; this is the one call.
        unsafe { (self.1)(self.0, UH_ERR_ABORTED) }
    }
}

unsafe extern "C" fn host_callback_node(
    s: *mut UhStream,
    node: *mut UhHostNode,
    err: Err,
) -> UhStatus {
    // Made first: whatever happens below, the node runs once. A node without `run` within its
    // size cannot be run (nor returned): refused.
    let run_end = std::mem::offset_of!(UhHostNode, run) + std::mem::size_of::<UhNodeFn>();
    let h = if node.is_null() {
        None
    } else {
        // SAFETY: a non-null node from the host, valid for its `size` bytes (header rule 2);
        // `run` is read only when within them.
        unsafe {
            ((*node).size as usize >= run_end)
                .then(|| (*node).run)
                .flatten()
                .map(|run| HostNode(node, run))
        }
    };
    guard(err, || {
        let Some(h) = h else {
            return Err(HalError::invalid(
                "node",
                Invalid::Other("a NULL host node, or one without `run`".into()),
            ));
        };
        strm(s)?.host_callback(Box::new(move || h.call(UH_OK)))
    })
}

unsafe extern "C" fn stream_synchronize(s: *mut UhStream, err: Err) -> UhStatus {
    guard(err, || strm(s)?.synchronize())
}

unsafe extern "C" fn stream_query(s: *mut UhStream, done: *mut u32, err: Err) -> UhStatus {
    guard(err, || {
        set(done, strm(s)?.query()? as u32);
        Ok(())
    })
}

unsafe extern "C" fn stream_async_error(s: *mut UhStream, err: Err) -> UhStatus {
    guard(err, || match strm(s)?.async_error() {
        Some(e) => Err(e),
        None => Ok(()),
    })
}

unsafe extern "C" fn stream_native(s: *mut UhStream, o: *mut UhNative) -> UhStatus {
    guard(std::ptr::null_mut(), || {
        set(o, conv::put_native(strm(s)?.native_handle()));
        Ok(())
    })
}

unsafe extern "C" fn event_create(
    d: *mut UhDevice,
    flags: u32,
    o: *mut *mut UhEvent,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let e = obj::<Dev, _>(d, "dev")?.dev.create_event(EventFlags {
            disable_timing: flags & 1 != 0,
        })?;
        out(o, Ev(e))
    })
}

unsafe extern "C" fn event_release(e: *mut UhEvent) {
    release::<Ev, _>(e)
}

fn ev<'a>(e: *mut UhEvent) -> Result<&'a Arc<dyn Event>> {
    Ok(&obj::<Ev, _>(e, "event")?.0)
}

unsafe extern "C" fn event_record(s: *mut UhStream, e: *mut UhEvent, err: Err) -> UhStatus {
    guard(err, || strm(s)?.record_event(ev(e)?))
}

unsafe extern "C" fn stream_wait_event(s: *mut UhStream, e: *mut UhEvent, err: Err) -> UhStatus {
    guard(err, || strm(s)?.wait_event(ev(e)?))
}

unsafe extern "C" fn event_query(e: *mut UhEvent, done: *mut u32, err: Err) -> UhStatus {
    guard(err, || {
        set(done, ev(e)?.query()? as u32);
        Ok(())
    })
}

unsafe extern "C" fn event_synchronize(e: *mut UhEvent, err: Err) -> UhStatus {
    guard(err, || ev(e)?.synchronize())
}

unsafe extern "C" fn event_elapsed(
    a: *mut UhEvent,
    b: *mut UhEvent,
    ms: *mut f32,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let end = ev(b)?;
        set(ms, ev(a)?.elapsed_ms(end.as_ref())?);
        Ok(())
    })
}

unsafe extern "C" fn event_native(e: *mut UhEvent, o: *mut UhNative) -> UhStatus {
    guard(std::ptr::null_mut(), || {
        set(o, conv::put_native(ev(e)?.native_handle()));
        Ok(())
    })
}

unsafe extern "C" fn module_load(
    d: *mut UhDevice,
    src: *const UhModuleSource,
    o: *mut *mut UhModule,
    err: Err,
) -> UhStatus {
    guard(err, || {
        if src.is_null() {
            return Err(HalError::invalid(
                "source",
                Invalid::Other("NULL source".into()),
            ));
        }
        // SAFETY: non-null and valid by the header's contract.
        let source = unsafe { conv::get_module_source(&*src)? };
        let m = obj::<Dev, _>(d, "dev")?.dev.load_module(&source)?;
        out(o, Modl(m))
    })
}

unsafe extern "C" fn module_release(m: *mut UhModule) {
    release::<Modl, _>(m)
}

unsafe extern "C" fn module_function(
    m: *mut UhModule,
    name: *const c_char,
    o: *mut *mut UhFunction,
    has_sizes: *mut u32,
    n_params: *mut u64,
    param_sizes: *mut *const u64,
    err: Err,
) -> UhStatus {
    guard(err, || {
        if name.is_null() {
            return Err(HalError::invalid(
                "name",
                Invalid::Other("NULL name".into()),
            ));
        }
        // SAFETY: non-null, NUL-terminated by the header's contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let f = obj::<Modl, _>(m, "module")?.0.function(&name)?;
        let sizes = f
            .param_sizes()
            .map(|s| s.iter().map(|&n| n as u64).collect::<Vec<_>>());
        let handle = Box::new(Func { f, sizes });
        set(has_sizes, handle.sizes.is_some() as u32);
        set(
            n_params,
            handle.sizes.as_ref().map_or(0, |s| s.len() as u64),
        );
        set(
            param_sizes,
            handle
                .sizes
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr()),
        );
        if o.is_null() {
            return Err(HalError::invalid(
                "out",
                Invalid::Other("NULL output pointer".into()),
            ));
        }
        // SAFETY: non-null output pointer; the box is turned back by `release::<Func>`.
        unsafe { *o = Box::into_raw(handle) as *mut UhFunction };
        Ok(())
    })
}

unsafe extern "C" fn function_release(f: *mut UhFunction) {
    release::<Func, _>(f)
}

unsafe extern "C" fn test_kernels(d: *mut UhDevice, o: *mut UhModuleSource, err: Err) -> UhStatus {
    guard(err, || {
        let dev = &obj::<Dev, _>(d, "dev")?.dev;
        let e = exported();
        let store = {
            let mut map = e.kernels.lock();
            *map.entry(dev.id().ordinal).or_insert_with(|| {
                let mut keep = SourceStore::default();
                let source = e
                    .backend
                    .test_kernels(dev.as_ref())
                    .and_then(|s| conv::put_module_source(&s, &mut keep).ok());
                Box::leak(Box::new(KernelsStore {
                    source,
                    _keep: keep,
                }))
            })
        };
        match store.source {
            Some(s) => {
                set(o, s);
                Ok(())
            }
            None => Err(HalError::unsupported(format!(
                "the conformance test kernels on {}",
                dev.id()
            ))),
        }
    })
}

fn ccl() -> Result<&'static dyn unihal_hal::Collectives> {
    exported()
        .backend
        .collectives()
        .ok_or_else(|| HalError::unsupported("collectives"))
}

unsafe extern "C" fn ccl_caps() -> *const UhCclCaps {
    exported()
        .ccl
        .as_ref()
        .map_or(std::ptr::null(), |(c, _)| c as *const UhCclCaps)
}

unsafe extern "C" fn ccl_unique_id(b: *mut u8, cap: u64, len: *mut u64, err: Err) -> UhStatus {
    guard(err, || {
        let id = ccl()?.unique_id()?;
        set(len, id.0.len() as u64);
        if (cap as usize) < id.0.len() || b.is_null() {
            return Err(HalError::invalid(
                "buf",
                Invalid::Value {
                    value: format!("{cap} bytes"),
                    accepted: format!("at least {}", id.0.len()),
                },
            ));
        }
        // SAFETY: `b` holds `cap` >= len writable bytes (header).
        unsafe { std::ptr::copy_nonoverlapping(id.0.as_ptr(), b, id.0.len()) };
        Ok(())
    })
}

unsafe extern "C" fn ccl_init_rank(
    id: *const u8,
    id_len: u64,
    nranks: u32,
    rank: u32,
    d: *mut UhDevice,
    timeout_ms: u64,
    o: *mut *mut UhComm,
    err: Err,
) -> UhStatus {
    guard(err, || {
        // SAFETY: `id_len` readable bytes (header).
        let id = unihal_hal::UniqueId(unsafe { conv::slice(id, id_len as usize) }.to_vec());
        let dev = &obj::<Dev, _>(d, "dev")?.dev;
        let c = ccl()?.init_rank(
            &id,
            nranks as usize,
            rank as usize,
            dev,
            &timeout(timeout_ms),
        )?;
        out(o, Comm(c))
    })
}

unsafe extern "C" fn ccl_init_all(
    devs: *const *mut UhDevice,
    n: u32,
    timeout_ms: u64,
    o: *mut *mut UhComm,
    err: Err,
) -> UhStatus {
    guard(err, || {
        // SAFETY: `n` device handles (header).
        let handles = unsafe { conv::slice(devs, n as usize) };
        let devices = handles
            .iter()
            .map(|&d| Ok(obj::<Dev, _>(d, "devs")?.dev.clone()))
            .collect::<Result<Vec<_>>>()?;
        if o.is_null() {
            return Err(HalError::invalid(
                "out",
                Invalid::Other("NULL output array".into()),
            ));
        }
        let comms = ccl()?.init_all(&devices, &timeout(timeout_ms))?;
        for (i, c) in comms.into_iter().enumerate().take(n as usize) {
            // SAFETY: the host's array has room for `n` handles (header).
            out(unsafe { o.add(i) }, Comm(c))?;
        }
        Ok(())
    })
}

unsafe extern "C" fn comm_release(c: *mut UhComm) {
    release::<Comm, _>(c)
}

unsafe extern "C" fn comm_rank_size(c: *mut UhComm, rank: *mut u32, size: *mut u32) {
    if let Ok(c) = obj::<Comm, _>(c, "comm") {
        set(rank, c.0.rank() as u32);
        set(size, c.0.size() as u32);
    }
}

fn comm<'a>(c: *mut UhComm) -> Result<&'a Arc<dyn Communicator>> {
    Ok(&obj::<Comm, _>(c, "comm")?.0)
}

unsafe extern "C" fn comm_collective(
    c: *mut UhComm,
    call: *const UhCollective,
    s: *mut UhStream,
    err: Err,
) -> UhStatus {
    guard(err, || {
        if call.is_null() {
            return Err(HalError::invalid(
                "call",
                Invalid::Other("NULL call".into()),
            ));
        }
        // SAFETY: non-null and valid by the header's contract.
        let k = unsafe { *call };
        let comm = comm(c)?;
        let stream = strm(s)?;
        let send = buf(k.send, k.send_offset, k.send_len, "send")?;
        let recv = buf(k.recv, k.recv_offset, k.recv_len, "recv")?;
        let dtype = conv::dtype_of(k.dtype)?;
        let root = k.root as usize;
        match conv::coll_of(k.op)? {
            CollectiveOp::AllReduce => {
                comm.all_reduce(&send, &recv, k.count, dtype, conv::red_of(k.red)?, stream)
            }
            CollectiveOp::Broadcast => comm.broadcast(&send, &recv, k.count, dtype, root, stream),
            CollectiveOp::Reduce => comm.reduce(
                &send,
                &recv,
                k.count,
                dtype,
                conv::red_of(k.red)?,
                root,
                stream,
            ),
            CollectiveOp::AllGather => comm.all_gather(&send, &recv, k.count, dtype, stream),
            CollectiveOp::ReduceScatter => {
                comm.reduce_scatter(&send, &recv, k.count, dtype, conv::red_of(k.red)?, stream)
            }
            CollectiveOp::AllToAll => comm.all_to_all(&send, &recv, k.count, dtype, stream),
            CollectiveOp::SendRecv => Err(HalError::invalid(
                "op",
                Invalid::Other("send and receive go through comm_group".into()),
            )),
        }
    })
}

unsafe extern "C" fn comm_group(
    c: *mut UhComm,
    calls: *const UhP2p,
    n: u64,
    s: *mut UhStream,
    err: Err,
) -> UhStatus {
    guard(err, || {
        // SAFETY: `n` entries (header).
        let raw = unsafe { conv::slice(calls, n as usize) };
        let group = raw
            .iter()
            .map(|p| {
                let buf = buf(p.mem, p.offset, p.len, "calls")?;
                let dtype = conv::dtype_of(p.dtype)?;
                let peer = p.peer as usize;
                Ok(if p.recv != 0 {
                    GroupCall::Recv {
                        buf,
                        count: p.count,
                        dtype,
                        peer,
                    }
                } else {
                    GroupCall::Send {
                        buf,
                        count: p.count,
                        dtype,
                        peer,
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        comm(c)?.group(&group, strm(s)?)
    })
}

unsafe extern "C" fn comm_split(
    c: *mut UhComm,
    color: i64,
    key: i32,
    timeout_ms: u64,
    o: *mut *mut UhComm,
    err: Err,
) -> UhStatus {
    guard(err, || {
        let color = u32::try_from(color).ok();
        match comm(c)?.split(color, key, &timeout(timeout_ms))? {
            Some(n) => out(o, Comm(n)),
            None => {
                set(o, std::ptr::null_mut());
                Ok(())
            }
        }
    })
}

unsafe extern "C" fn comm_abort(c: *mut UhComm) {
    let _ = guard(std::ptr::null_mut(), || {
        comm(c)?.abort();
        Ok(())
    });
}

unsafe extern "C" fn comm_async_error(c: *mut UhComm, err: Err) -> UhStatus {
    guard(err, || match comm(c)?.async_error() {
        Some(e) => Err(e),
        None => Ok(()),
    })
}
