//! Plugins that return what the ABI forbids: the host checks every handle, pointer, length and
//! count a plugin returns and refuses the plugin (at load or device open, naming the entry) or
//! the call (`AbiMismatch` naming the entry and the plugin), releasing whatever valid handle came
//! with the bad value: never a crash, never a HAL object built on it.
//!
//! Each hostile plugin is the CPU backend's plugin table with one or two entries replaced by a
//! wrapper, built here in Rust and loaded through `host::load_entry`.

use crate::support;

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock};
use unihal_hal::{Backend, CommConfig, Device, EventFlags, HalError, Result};
use unihal_plugin::abi::*;
use unihal_plugin::host::{self, Plugin, PluginBackend};

type E = *mut UhError;

/// The CPU backend's plugin table (the real entries every wrapper calls).
fn real() -> &'static UhPluginApi {
    support::cpu_plugin_table()
}

/// The table the next load hands out (one load at a time).
static NEXT: AtomicPtr<UhPluginApi> = AtomicPtr::new(null_mut());
static LOADING: Mutex<()> = Mutex::new(());

unsafe extern "C" fn hostile_entry(_: *const UhHostApi, _: *mut UhError) -> *const UhPluginApi {
    NEXT.load(SeqCst)
}

/// Loads the CPU plugin's table with `edit` applied, as plugin `hostile:<tag>`.
fn load(tag: &str, edit: impl FnOnce(&mut UhPluginApi)) -> Result<&'static Plugin> {
    let mut t = *real();
    edit(&mut t);
    let t: &'static mut UhPluginApi = Box::leak(Box::new(t));
    let _one = LOADING.lock().unwrap();
    NEXT.store(t, SeqCst);
    // SAFETY: `hostile_entry` returns a table of valid entries (the CPU plugin's and this
    // file's wrappers), kept forever.
    unsafe { host::load_entry(&format!("hostile:{tag}"), hostile_entry) }
}

/// Device 0 of a hostile plugin that must load and open.
fn open(tag: &str, edit: impl FnOnce(&mut UhPluginApi)) -> (Arc<PluginBackend>, Arc<dyn Device>) {
    let b = Arc::new(PluginBackend::new(load(tag, edit).expect("loads")));
    let d = b.open(0).expect("opens");
    (b, d)
}

/// `r` is an `AbiMismatch` naming every one of `needles` (the entry, the plugin, the fault).
#[track_caller]
fn broke<T>(r: Result<T>, needles: &[&str]) {
    match r {
        Err(HalError::AbiMismatch { what }) => {
            for n in needles {
                assert!(what.contains(n), "{what:?} does not say {n:?}");
            }
        }
        Err(e) => panic!("expected an ABI mismatch saying {needles:?}, got {e}"),
        Ok(_) => panic!("accepted; expected a refusal saying {needles:?}"),
    }
}

// ---- memory ---------------------------------------------------------------------------------

static HOST_RELEASES: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn host_release_counted(m: *mut UhHostMem) {
    HOST_RELEASES.fetch_add(1, SeqCst);
    // SAFETY: forwarded as the host called it.
    unsafe { (real().host_release.unwrap())(m) }
}

unsafe extern "C" fn host_alloc_null_ptr(
    d: *mut UhDevice,
    len: u64,
    out: *mut *mut UhHostMem,
    ptr: *mut *mut c_void,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded as the host called it; then the pointer is lost.
    unsafe {
        let s = (real().host_alloc.unwrap())(d, len, out, ptr, err);
        *ptr = null_mut();
        s
    }
}

unsafe extern "C" fn host_alloc_null_handle(
    d: *mut UhDevice,
    len: u64,
    out: *mut *mut UhHostMem,
    ptr: *mut *mut c_void,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded as the host called it; the real handle is released, NULL returned.
    unsafe {
        let s = (real().host_alloc.unwrap())(d, len, out, ptr, err);
        (real().host_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

#[test]
fn a_host_allocation_at_null_is_refused_and_its_handle_released() {
    let (_b, d) = open("host-null-ptr", |t| {
        t.host_alloc = Some(host_alloc_null_ptr);
        t.host_release = Some(host_release_counted);
    });
    broke(
        d.alloc_host(64),
        &["`host_alloc`", "hostile:host-null-ptr", "NULL pointer"],
    );
    assert_eq!(
        HOST_RELEASES.load(SeqCst),
        1,
        "the plugin's handle went back"
    );
    let (_b, d) = open("host-null-handle", |t| {
        t.host_alloc = Some(host_alloc_null_handle)
    });
    broke(d.alloc_host(64), &["`host_alloc`", "NULL host allocation"]);
}

static MEM_RELEASES: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn mem_release_counted(m: *mut UhMem) {
    MEM_RELEASES.fetch_add(1, SeqCst);
    // SAFETY: forwarded as the host called it.
    unsafe { (real().mem_release.unwrap())(m) }
}

unsafe extern "C" fn mem_alloc_null_handle(
    d: *mut UhDevice,
    len: u64,
    out: *mut *mut UhMem,
    addr: *mut u64,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded; the real handle is released, NULL returned.
    unsafe {
        let s = (real().mem_alloc.unwrap())(d, len, out, addr, err);
        (real().mem_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

unsafe extern "C" fn mem_alloc_near_top(
    d: *mut UhDevice,
    len: u64,
    out: *mut *mut UhMem,
    addr: *mut u64,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded; the address moves to 4 KiB below 2^64.
    unsafe {
        let s = (real().mem_alloc.unwrap())(d, len, out, addr, err);
        *addr = u64::MAX - 4095;
        s
    }
}

unsafe extern "C" fn mem_alloc_misaligned(
    d: *mut UhDevice,
    len: u64,
    out: *mut *mut UhMem,
    addr: *mut u64,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded; the address moves one byte on.
    unsafe {
        let s = (real().mem_alloc.unwrap())(d, len, out, addr, err);
        *addr += 1;
        s
    }
}

#[test]
fn device_allocations_must_have_a_handle_and_a_range_below_2_64() {
    let (_b, d) = open("mem-null", |t| t.mem_alloc = Some(mem_alloc_null_handle));
    broke(
        d.alloc(64),
        &["`mem_alloc`", "hostile:mem-null", "NULL allocation"],
    );
    // 64 KiB from 4 KiB below 2^64: every view's address past the first 4 KiB would wrap.
    let (_b, d) = open("mem-wraps", |t| {
        t.mem_alloc = Some(mem_alloc_near_top);
        t.mem_release = Some(mem_release_counted);
    });
    broke(d.alloc(1 << 16), &["`mem_alloc`", "wraps past 2^64"]);
    assert_eq!(
        MEM_RELEASES.load(SeqCst),
        1,
        "the plugin's handle went back"
    );
    let (_b, d) = open("mem-misaligned", |t| {
        t.mem_alloc = Some(mem_alloc_misaligned)
    });
    broke(d.alloc(64), &["`mem_alloc`", "alignment"]);
}

static OWNER_DROPS: AtomicUsize = AtomicUsize::new(0);
struct Owner;
impl Drop for Owner {
    fn drop(&mut self) {
        OWNER_DROPS.fetch_add(1, SeqCst);
    }
}

unsafe extern "C" fn mem_import_null_handle(
    d: *mut UhDevice,
    addr: u64,
    len: u64,
    release: Option<UhReleaseFn>,
    user: *mut c_void,
    out: *mut *mut UhMem,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded; the real handle is released (which releases the owner), NULL returned.
    unsafe {
        let s = (real().mem_import.unwrap())(d, addr, len, release, user, out, err);
        (real().mem_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

#[test]
fn imports_are_refused_for_a_range_past_2_64_or_a_null_handle() {
    let (_b, d) = open("import", |t| t.mem_import = Some(mem_import_null_handle));
    let mem = [0u8; 64];
    // SAFETY: refused before any memory is used.
    let r = unsafe { d.import_memory(u64::MAX - 7, 64, Box::new(Owner)) };
    assert!(
        matches!(r, Err(HalError::InvalidArgument { arg: "len", .. })),
        "{:?}",
        r.err()
    );
    assert_eq!(OWNER_DROPS.load(SeqCst), 1);
    // SAFETY: 64 bytes of ours, alive past the import (which is refused).
    let r = unsafe { d.import_memory(mem.as_ptr() as u64, 64, Box::new(Owner)) };
    broke(r, &["`mem_import`", "NULL allocation"]);
    assert_eq!(OWNER_DROPS.load(SeqCst), 2, "released by the plugin, once");
}

unsafe extern "C" fn memory_info_more_free_than_total(
    d: *mut UhDevice,
    total: *mut u64,
    free: *mut u64,
    err: E,
) -> UhStatus {
    // SAFETY: forwarded; then more is free than there is.
    unsafe {
        let s = (real().device_memory_info.unwrap())(d, total, free, err);
        *free = *total + 1;
        s
    }
}

#[test]
fn more_memory_free_than_total_is_refused() {
    let (_b, d) = open("meminfo", |t| {
        t.device_memory_info = Some(memory_info_more_free_than_total)
    });
    broke(d.memory_info(), &["`device_memory_info`", "free of"]);
}

// ---- the table and the device ----------------------------------------------------------------

#[test]
fn entries_the_hal_requires_are_required_at_load() {
    broke(
        load("nofill", |t| {
            t.fill = None;
            t.device_memory_info = None;
            t.stream_async_error = None;
        }),
        &[
            "hostile:nofill leaves out required entries: device_memory_info, fill, stream_async_error",
        ],
    );
}

unsafe extern "C" fn device_open_null(o: u32, out: *mut *mut UhDevice, err: E) -> UhStatus {
    // SAFETY: forwarded; the real handle is released, NULL returned.
    unsafe {
        let s = (real().device_open.unwrap())(o, out, err);
        (real().device_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

#[test]
fn a_null_device_is_refused() {
    let b =
        PluginBackend::new(load("devnull", |t| t.device_open = Some(device_open_null)).unwrap());
    broke(
        b.open(0),
        &["`device_open`", "hostile:devnull", "NULL device"],
    );
}

#[test]
fn capabilities_without_their_entries_refuse_the_device() {
    // The CPU backend claims event timing, host callbacks, library ops and host kernels.
    type Edit = fn(&mut UhPluginApi);
    let cases: [(&str, Edit, &str, &str); 4] = [
        (
            "notiming",
            |t| t.event_elapsed = None,
            "event timing",
            "`event_elapsed`",
        ),
        (
            "nocallbacks",
            |t| t.host_callback = None,
            "host callbacks",
            "`host_callback`",
        ),
        ("noops", |t| t.run_op = None, "library ops", "`run_op`"),
        (
            "nomodules",
            |t| t.launch = None,
            "module formats",
            "`launch`",
        ),
    ];
    for (tag, edit, claim, entry) in cases {
        let b = PluginBackend::new(load(tag, edit).expect("loads"));
        broke(b.open(0), &["`device_props`", claim, entry, tag]);
    }
}

static BAD_PEERS: [u32; 1] = [4096];

fn props_edit(
    d: *mut UhDevice,
    p: *mut UhDeviceProps,
    err: E,
    edit: impl FnOnce(&mut UhDeviceProps),
) -> UhStatus {
    // SAFETY: forwarded as the host called it; `p` is the host's struct.
    unsafe {
        let s = (real().device_props.unwrap())(d, p, err);
        edit(&mut *p);
        s
    }
}
unsafe extern "C" fn props_huge_peers(d: *mut UhDevice, p: *mut UhDeviceProps, e: E) -> UhStatus {
    props_edit(d, p, e, |p| p.n_peers = u32::MAX)
}
unsafe extern "C" fn props_foreign_peer(d: *mut UhDevice, p: *mut UhDeviceProps, e: E) -> UhStatus {
    props_edit(d, p, e, |p| {
        p.n_peers = 1;
        p.peers = BAD_PEERS.as_ptr();
    })
}
unsafe extern "C" fn props_null_ops(d: *mut UhDevice, p: *mut UhDeviceProps, e: E) -> UhStatus {
    props_edit(d, p, e, |p| p.ops = std::ptr::null())
}
unsafe extern "C" fn props_zero_alignment(
    d: *mut UhDevice,
    p: *mut UhDeviceProps,
    e: E,
) -> UhStatus {
    props_edit(d, p, e, |p| p.alloc_alignment = 0)
}

#[test]
fn device_properties_out_of_range_refuse_the_device() {
    type Props = unsafe extern "C" fn(*mut UhDevice, *mut UhDeviceProps, E) -> UhStatus;
    let cases: [(&str, Props, &str); 4] = [
        ("peers-huge", props_huge_peers, "4294967295 peers"),
        ("peers-foreign", props_foreign_peer, "peer device 4096"),
        ("ops-null", props_null_ops, "op supports at NULL"),
        ("align-zero", props_zero_alignment, "alignment of 0"),
    ];
    for (tag, f, needle) in cases {
        let b = PluginBackend::new(load(tag, |t| t.device_props = Some(f)).expect("loads"));
        broke(b.open(0), &["`device_props`", needle, tag]);
    }
}

// ---- streams, events, modules ----------------------------------------------------------------

unsafe extern "C" fn stream_create_null(
    d: *mut UhDevice,
    out: *mut *mut UhStream,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; the real handle is released, NULL returned.
    unsafe {
        let s = (real().stream_create.unwrap())(d, out, e);
        (real().stream_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

unsafe extern "C" fn event_create_null(
    d: *mut UhDevice,
    flags: u32,
    out: *mut *mut UhEvent,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; the real handle is released, NULL returned.
    unsafe {
        let s = (real().event_create.unwrap())(d, flags, out, e);
        (real().event_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

unsafe extern "C" fn event_elapsed_nan(
    a: *mut UhEvent,
    b: *mut UhEvent,
    ms: *mut f32,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; then the time is not a number.
    unsafe {
        let s = (real().event_elapsed.unwrap())(a, b, ms, e);
        *ms = f32::NAN;
        s
    }
}

#[test]
fn null_streams_and_events_and_timings_that_are_no_number_are_refused() {
    let (_b, d) = open("streamnull", |t| t.stream_create = Some(stream_create_null));
    broke(d.create_stream(), &["`stream_create`", "NULL stream"]);
    let (_b, d) = open("eventnull", |t| t.event_create = Some(event_create_null));
    broke(
        d.create_event(EventFlags::default()),
        &["`event_create`", "NULL event"],
    );
    let (_b, d) = open("nan", |t| t.event_elapsed = Some(event_elapsed_nan));
    let s = d.create_stream().unwrap();
    let (a, b) = (
        d.create_event(EventFlags::default()).unwrap(),
        d.create_event(EventFlags::default()).unwrap(),
    );
    s.record_event(&a).unwrap();
    s.record_event(&b).unwrap();
    s.synchronize().unwrap();
    broke(
        a.elapsed_ms(b.as_ref()),
        &["`event_elapsed`", "NaN milliseconds"],
    );
}

unsafe extern "C" fn module_load_null(
    d: *mut UhDevice,
    src: *const UhModuleSource,
    out: *mut *mut UhModule,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; the real handle is released, NULL returned.
    unsafe {
        let s = (real().module_load.unwrap())(d, src, out, e);
        (real().module_release.unwrap())(*out);
        *out = null_mut();
        s
    }
}

unsafe extern "C" fn module_function_sizes_at_null(
    m: *mut UhModule,
    name: *const c_char,
    out: *mut *mut UhFunction,
    has: *mut u32,
    n: *mut u64,
    sizes: *mut *const u64,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; then a count of sizes at NULL.
    unsafe {
        let s = (real().module_function.unwrap())(m, name, out, has, n, sizes, e);
        *has = 1;
        *n = 3;
        *sizes = std::ptr::null();
        s
    }
}

unsafe extern "C" fn test_kernels_huge(
    d: *mut UhDevice,
    out: *mut UhModuleSource,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; then far more kernels than the array holds.
    unsafe {
        let s = (real().test_kernels.unwrap())(d, out, e);
        (*out).n_symbols = u64::MAX / 2;
        s
    }
}

#[test]
fn modules_functions_and_kernel_sources_are_checked() {
    let (b, d) = open("modnull", |t| t.module_load = Some(module_load_null));
    let src = b
        .test_kernels(d.as_ref())
        .expect("the CPU plugin's test kernels");
    broke(d.load_module(&src), &["`module_load`", "NULL module"]);
    let (b, d) = open("fnsizes", |t| {
        t.module_function = Some(module_function_sizes_at_null)
    });
    let m = d.load_module(&b.test_kernels(d.as_ref()).unwrap()).unwrap();
    broke(
        m.function("unihal_test_iota_u32"),
        &["`module_function`", "3 parameter sizes at NULL"],
    );
    // A source the host cannot read is no test kernels (the suite then skips kernel cases).
    let (b, d) = open("kernelshuge", |t| t.test_kernels = Some(test_kernels_huge));
    assert!(b.test_kernels(d.as_ref()).is_none());
}

// ---- collectives ------------------------------------------------------------------------------

unsafe extern "C" fn unique_id_too_long(buf: *mut u8, cap: u64, len: *mut u64, e: E) -> UhStatus {
    // SAFETY: forwarded; then a length past the buffer.
    unsafe {
        let s = (real().ccl_unique_id.unwrap())(buf, cap, len, e);
        *len = cap + 1;
        s
    }
}

unsafe extern "C" fn rank_size_out_of_range(c: *mut UhComm, rank: *mut u32, size: *mut u32) {
    // SAFETY: forwarded; then the rank is the size.
    unsafe {
        (real().comm_rank_size.unwrap())(c, rank, size);
        *rank = *size;
    }
}

static COMM_RELEASES: AtomicUsize = AtomicUsize::new(0);
unsafe extern "C" fn comm_release_counted(c: *mut UhComm) {
    COMM_RELEASES.fetch_add(1, SeqCst);
    // SAFETY: forwarded as the host called it.
    unsafe { (real().comm_release.unwrap())(c) }
}

unsafe extern "C" fn init_all_second_null(
    devs: *const *mut UhDevice,
    n: u32,
    timeout: u64,
    out: *mut *mut UhComm,
    e: E,
) -> UhStatus {
    // SAFETY: forwarded; the second real handle is released, NULL returned in its place.
    unsafe {
        let s = (real().ccl_init_all.unwrap())(devs, n, timeout, out, e);
        (real().comm_release.unwrap())(*out.add(1));
        *out.add(1) = null_mut();
        s
    }
}

fn two_devices(b: &PluginBackend) -> Vec<Arc<dyn Device>> {
    vec![b.open(0).unwrap(), b.open(1).unwrap()]
}

#[test]
fn collective_handles_ids_and_ranks_are_checked() {
    let (b, _) = open("uid", |t| t.ccl_unique_id = Some(unique_id_too_long));
    let ccl = b.collectives().expect("the CPU plugin's collectives");
    broke(ccl.unique_id(), &["`ccl_unique_id`", "into a buffer of"]);

    let (b, _) = open("ranks", |t| {
        t.comm_rank_size = Some(rank_size_out_of_range);
        t.comm_release = Some(comm_release_counted);
    });
    let devs = two_devices(&b);
    broke(
        b.collectives()
            .unwrap()
            .init_all(&devs, &CommConfig::default()),
        &["`ccl_init_all`", "rank 2 of 2", "rank 0 of 2"],
    );
    assert_eq!(COMM_RELEASES.load(SeqCst), 2, "every handle went back");

    let (b, _) = open("initnull", |t| t.ccl_init_all = Some(init_all_second_null));
    let devs = two_devices(&b);
    broke(
        b.collectives()
            .unwrap()
            .init_all(&devs, &CommConfig::default()),
        &["`ccl_init_all`", "NULL communicator"],
    );
}

// ---- what `info` and `ccl_caps` describe -----------------------------------------------------

unsafe extern "C" fn info_huge_libraries() -> *const UhPluginInfo {
    static INFO: OnceLock<usize> = OnceLock::new();
    let p = *INFO.get_or_init(|| {
        // SAFETY: the real plugin's info, valid forever.
        let mut i = unsafe { *(real().info.unwrap())() };
        i.n_libraries = u32::MAX;
        Box::leak(Box::new(i)) as *const UhPluginInfo as usize
    });
    p as *const UhPluginInfo
}

unsafe extern "C" fn ccl_caps_huge_accumulation() -> *const UhCclCaps {
    static CAPS: OnceLock<usize> = OnceLock::new();
    let p = *CAPS.get_or_init(|| {
        // SAFETY: the real plugin's capabilities, valid forever.
        let mut c = unsafe { *(real().ccl_caps.unwrap())() };
        c.n_accumulation = u32::MAX;
        Box::leak(Box::new(c)) as *const UhCclCaps as usize
    });
    p as *const UhCclCaps
}

#[test]
fn descriptions_with_counts_out_of_range_refuse_the_plugin() {
    broke(
        load("libs", |t| t.info = Some(info_huge_libraries)),
        &["hostile:libs: `info` returned 4294967295 libraries"],
    );
    broke(
        load("accumulation", |t| {
            t.ccl_caps = Some(ccl_caps_huge_accumulation)
        }),
        &["hostile:accumulation: `ccl_caps` returned 4294967295 accumulation types"],
    );
    broke(
        load("norank", |t| t.comm_rank_size = None),
        &[
            "collective engine",
            "leaves out entries it needs: comm_rank_size",
        ],
    );
}
