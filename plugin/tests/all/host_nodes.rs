//! Host callbacks in recycled nodes (ABI 1.2, `host_callback_node`): the host uses the entry
//! when the plugin has it and its older `host_callback` otherwise, a steady stream of callbacks
//! makes no new node, and every node goes back exactly once on every path (run, refused,
//! failed or released stream, a callback that panics), counted by
//! `host::callback_nodes()`.
//!
//! The plugins are the CPU backend's plugin table with entries wrapped, loaded through
//! `host::load_entry`, as in `hostile.rs`.

use crate::support;

use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use unihal_hal::{Backend, Device, HalError, Stream};
use unihal_plugin::abi::*;
use unihal_plugin::host::{self, PluginBackend};

type E = *mut UhError;

/// The CPU backend's plugin table (the real entries every wrapper calls).
fn real() -> &'static UhPluginApi {
    support::cpu_plugin_table()
}

/// The table the next load hands out (one load at a time).
static NEXT: AtomicPtr<UhPluginApi> = AtomicPtr::new(null_mut());
/// One test at a time: the node counts are the process's.
static ONE: Mutex<()> = Mutex::new(());

unsafe extern "C" fn entry(_: *const UhHostApi, _: *mut UhError) -> *const UhPluginApi {
    NEXT.load(SeqCst)
}

/// Device 0 of the CPU plugin's table with `edit` applied, loaded as plugin `nodes:<tag>`.
fn open(tag: &str, edit: impl FnOnce(&mut UhPluginApi)) -> Arc<dyn Device> {
    let mut t = *real();
    t.host_callback = Some(counted_host_callback);
    t.host_callback_node = Some(counted_node);
    edit(&mut t);
    let t: &'static mut UhPluginApi = Box::leak(Box::new(t));
    NEXT.store(t, SeqCst);
    // SAFETY: `entry` returns a table of valid entries (the CPU plugin's and this file's
    // wrappers), kept forever.
    let p = unsafe { host::load_entry(&format!("nodes:{tag}"), entry) }.expect("loads");
    Arc::new(PluginBackend::new(p)).open(0).expect("opens")
}

static OLD_CALLS: AtomicUsize = AtomicUsize::new(0);
static NODE_CALLS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn counted_host_callback(
    s: *mut UhStream,
    f: Option<UhHostFn>,
    user: *mut std::ffi::c_void,
    err: E,
) -> UhStatus {
    OLD_CALLS.fetch_add(1, SeqCst);
    // SAFETY: forwarded as received.
    unsafe { (real().host_callback.unwrap())(s, f, user, err) }
}

unsafe extern "C" fn counted_node(s: *mut UhStream, node: *mut UhHostNode, err: E) -> UhStatus {
    NODE_CALLS.fetch_add(1, SeqCst);
    // SAFETY: forwarded as received.
    unsafe { (real().host_callback_node.unwrap())(s, node, err) }
}

/// A host callback that holds `s` until the returned function opens it.
fn hold(s: &Arc<dyn Stream>) -> impl FnOnce() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let g = gate.clone();
    s.host_callback(Box::new(move || {
        let mut open = g.0.lock().unwrap();
        while !*open {
            open = g.1.wait(open).unwrap();
        }
    }))
    .unwrap();
    move || {
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
    }
}

/// Counts runs and drops of the closures it makes: each must end exactly once, run or not.
#[derive(Default)]
struct Ends {
    runs: AtomicUsize,
    drops: AtomicUsize,
}
struct Tracked(Arc<Ends>);
impl Drop for Tracked {
    fn drop(&mut self) {
        self.0.drops.fetch_add(1, SeqCst);
    }
}
fn tracked(ends: &Arc<Ends>) -> Box<dyn FnOnce() + Send> {
    let t = Tracked(ends.clone());
    Box::new(move || {
        t.0.runs.fetch_add(1, SeqCst);
    })
}

/// Waits (up to 10 s) until the live nodes are `live`; the counts then.
#[track_caller]
fn settle(live: usize) -> host::CallbackNodes {
    let t0 = Instant::now();
    loop {
        let n = host::callback_nodes();
        if n.live == live || t0.elapsed() > Duration::from_secs(10) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_plugin_with_the_node_entry_gets_recycled_nodes() {
    if crate::own_process() {
        return;
    }
    let _one = ONE.lock().unwrap();
    let before = host::callback_nodes();
    let dev = open("recycled", |_| {});
    let s = dev.create_stream().unwrap();
    let (old0, node0) = (OLD_CALLS.load(SeqCst), NODE_CALLS.load(SeqCst));
    let ends = Arc::new(Ends::default());
    let mut peak = 0;
    for round in 0..4 {
        let open = hold(&s);
        for _ in 0..100 {
            s.host_callback(tracked(&ends)).unwrap();
        }
        open();
        s.synchronize().unwrap();
        let n = host::callback_nodes();
        if round == 0 {
            peak = n.live;
            assert!(
                peak > before.live && peak <= before.live + 101,
                "{n:?} after 101 queued callbacks ({before:?} before)"
            );
        } else {
            assert!(
                n.live <= peak,
                "round {round} made new nodes: {n:?}, peak {peak}"
            );
        }
    }
    assert_eq!(ends.runs.load(SeqCst), 400);
    assert_eq!(ends.drops.load(SeqCst), 400);
    assert_eq!(OLD_CALLS.load(SeqCst) - old0, 0, "the old entry was used");
    assert_eq!(NODE_CALLS.load(SeqCst) - node0, 404);
    drop(s);
    assert_eq!(settle(before.live), before, "nodes leaked or run twice");
}

#[test]
fn an_older_plugin_goes_through_host_callback() {
    if crate::own_process() {
        return;
    }
    let _one = ONE.lock().unwrap();
    let before = host::callback_nodes();
    // A plugin of ABI 1.1 (whatever lies past its table), and one of 1.2 without the entry.
    let older = |t: &mut UhPluginApi| {
        t.abi_minor = 1;
        t.size = std::mem::offset_of!(UhPluginApi, host_callback_node) as u32;
    };
    let minor_only = |t: &mut UhPluginApi| t.abi_minor = 1;
    let without = |t: &mut UhPluginApi| t.host_callback_node = None;
    for (tag, edit) in [
        ("1.1", &older as &dyn Fn(&mut UhPluginApi)),
        ("1.1-minor", &minor_only),
        ("1.2-without", &without),
    ] {
        let dev = open(tag, edit);
        let s = dev.create_stream().unwrap();
        let (old0, node0) = (OLD_CALLS.load(SeqCst), NODE_CALLS.load(SeqCst));
        let ends = Arc::new(Ends::default());
        for _ in 0..10 {
            s.host_callback(tracked(&ends)).unwrap();
        }
        s.synchronize().unwrap();
        assert_eq!(ends.runs.load(SeqCst), 10, "{tag}");
        assert_eq!(OLD_CALLS.load(SeqCst) - old0, 10, "{tag}");
        assert_eq!(NODE_CALLS.load(SeqCst) - node0, 0, "{tag}");
        assert_eq!(host::callback_nodes(), before, "{tag}: nodes made");
    }
}

/// Refuses every node after running it with `UH_ERR_ABORTED` (as the header asks).
unsafe extern "C" fn refuse(_: *mut UhStream, node: *mut UhHostNode, err: E) -> UhStatus {
    // SAFETY: the host's node, run once; the host's error record.
    unsafe {
        ((*node).run.unwrap())(node, UH_ERR_ABORTED);
        (*err).code = UH_ERR_UNSUPPORTED;
    }
    UH_ERR_UNSUPPORTED
}

/// Queues nothing and runs the node later, on another thread, with `UH_ERR_ABORTED`: a stream
/// that failed after the enqueue.
unsafe extern "C" fn fail_later(_: *mut UhStream, node: *mut UhHostNode, _: E) -> UhStatus {
    let n = node as usize;
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        let node = n as *mut UhHostNode;
        // SAFETY: the host's node, still queued (nothing else runs it), run once.
        unsafe { ((*node).run.unwrap())(node, UH_ERR_ABORTED) }
    });
    UH_OK
}

/// Runs the node twice (a broken plugin): the host ignores and counts the second run.
unsafe extern "C" fn run_twice(_: *mut UhStream, node: *mut UhHostNode, _: E) -> UhStatus {
    // SAFETY: the host's node; the second run is the fault under test, which the host detects
    // before touching anything but the node's state.
    unsafe {
        ((*node).run.unwrap())(node, UH_OK);
        ((*node).run.unwrap())(node, UH_OK);
    }
    UH_OK
}

#[test]
fn every_node_goes_back_once_on_every_path() {
    if crate::own_process() {
        return;
    }
    let _one = ONE.lock().unwrap();
    let before = host::callback_nodes();

    // A refused enqueue: the closure is dropped unrun, the error comes back.
    let dev = open("refuse", |t| t.host_callback_node = Some(refuse));
    let s = dev.create_stream().unwrap();
    let ends = Arc::new(Ends::default());
    for _ in 0..3 {
        assert!(matches!(
            s.host_callback(tracked(&ends)),
            Err(HalError::Unsupported { .. })
        ));
    }
    assert_eq!((ends.runs.load(SeqCst), ends.drops.load(SeqCst)), (0, 3));
    assert_eq!(
        host::callback_nodes().live,
        before.live + 1,
        "one node, reused"
    );
    drop(s);
    assert_eq!(settle(before.live), before);

    // The exporter refuses a bad stream, a NULL node and a node without `run`, running what it
    // can run once.
    let dev = open("exporter", |t| {
        t.host_callback_node = Some({
            unsafe extern "C" fn null_stream(
                _: *mut UhStream,
                node: *mut UhHostNode,
                err: E,
            ) -> UhStatus {
                // SAFETY: forwarded, with a NULL stream the exporter must refuse.
                unsafe { (real().host_callback_node.unwrap())(null_mut(), node, err) }
            }
            null_stream
        })
    });
    let s = dev.create_stream().unwrap();
    let ends = Arc::new(Ends::default());
    assert!(matches!(
        s.host_callback(tracked(&ends)),
        Err(HalError::InvalidArgument { .. })
    ));
    assert_eq!((ends.runs.load(SeqCst), ends.drops.load(SeqCst)), (0, 1));
    drop(s);
    assert_eq!(settle(before.live), before);
    let mut err = UhError::new();
    let node_entry = real().host_callback_node.unwrap();
    // SAFETY: the exporter's entry with a NULL node (refused) and a node whose size leaves out
    // `run` (refused without reading it).
    unsafe {
        assert_eq!(
            node_entry(null_mut(), null_mut(), &mut err),
            UH_ERR_INVALID_ARGUMENT
        );
        let mut bare = UhHostNode {
            size: 4,
            reserved: 0,
            run: None,
            plugin: [null_mut(); 2],
        };
        assert_eq!(
            node_entry(null_mut(), &mut bare, &mut err),
            UH_ERR_INVALID_ARGUMENT
        );
    }

    // A stream that fails after the enqueue: run later with an error, never called.
    let dev = open("fail", |t| t.host_callback_node = Some(fail_later));
    let s = dev.create_stream().unwrap();
    let ends = Arc::new(Ends::default());
    for _ in 0..5 {
        s.host_callback(tracked(&ends)).unwrap();
    }
    let t0 = Instant::now();
    while ends.drops.load(SeqCst) < 5 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!((ends.runs.load(SeqCst), ends.drops.load(SeqCst)), (0, 5));
    drop(s);
    assert_eq!(settle(before.live), before);

    // The stream released with callbacks queued: each ends once, and its node is freed.
    let dev = open("released", |_| {});
    let s = dev.create_stream().unwrap();
    let ends = Arc::new(Ends::default());
    let open_gate = hold(&s);
    for _ in 0..50 {
        s.host_callback(tracked(&ends)).unwrap();
    }
    drop(s);
    open_gate();
    assert_eq!(settle(before.live), before, "nodes of a released stream");
    assert_eq!(ends.drops.load(SeqCst), 50);
    assert!(ends.runs.load(SeqCst) <= 50);

    // A callback that panics: the stream's error sticks; its node goes back.
    let s = dev.create_stream().unwrap();
    s.host_callback(Box::new(|| panic!("a host callback that panics")))
        .unwrap();
    let _ = s.synchronize();
    assert!(s.host_callback(Box::new(|| {})).is_err());
    drop(s);
    assert_eq!(settle(before.live), before);

    // A plugin that runs a node twice: the second run is counted and ignored.
    let dev = open("twice", |t| t.host_callback_node = Some(run_twice));
    let s = dev.create_stream().unwrap();
    let ends = Arc::new(Ends::default());
    s.host_callback(tracked(&ends)).unwrap();
    assert_eq!((ends.runs.load(SeqCst), ends.drops.load(SeqCst)), (1, 1));
    drop(s);
    let after = settle(before.live);
    assert_eq!(after.live, before.live);
    assert_eq!(after.stray_runs, before.stray_runs + 1);
    drop(dev);
}
