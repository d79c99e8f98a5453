//! Host callbacks in recycled nodes (ABI 1.2, `host_callback_node`).
//!
//! Each stream keeps a pool of nodes: a node holds the HAL's closure and the host-buffer uses it
//! ends, crosses the boundary as one `uh_host_node*`, and the plugin's thread that runs it
//! returns it to its pool instead of freeing it. In the steady state an enqueue takes a returned
//! node and allocates nothing; nothing is freed across threads. The pool holds as many nodes as
//! the stream once had queued at the same time, and frees them when the stream goes.
//!
//! Two lists: `returned`, a lock-free stack the plugin's threads push onto (a push cannot suffer
//! ABA, and the only pop takes the whole stack with one swap), and `free`, the enqueuers' list
//! behind a short lock, refilled from `returned` when it runs dry. When the stream goes,
//! `returned` is swapped for [`CLOSED`] in one step: a node pushed before is freed by the stream,
//! a node returned after sees `CLOSED` and frees itself, so each node is freed exactly once.

use super::stream::PluginStream;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use unihal_hal::{HalError, HostUse};
use unihal_plugin_abi::*;

/// `returned` of a pool whose stream is gone (never a node's address: not null, and below the
/// alignment of any allocation).
const CLOSED: *mut Node = std::ptr::without_provenance_mut(1);

/// A node's states: in a pool, or handed to the plugin.
const FREE: u8 = 0;
const QUEUED: u8 = 1;

/// Nodes alive in this process (made, not yet freed), and runs of a node that was not queued.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static STRAY_RUNS: AtomicUsize = AtomicUsize::new(0);

/// What [`callback_nodes`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallbackNodes {
    /// Host callback nodes alive in this process: queued or free in a stream's pool.
    pub live: usize,
    /// Runs of a node that was not queued (a plugin that ran a node twice); ignored.
    pub stray_runs: usize,
}

/// The host callback nodes of this process (a diagnostic: a node leaked or run twice shows here).
pub fn callback_nodes() -> CallbackNodes {
    CallbackNodes {
        live: LIVE.load(Ordering::SeqCst),
        stray_runs: STRAY_RUNS.load(Ordering::SeqCst),
    }
}

#[repr(C)]
struct Node {
    /// First: the pointer the plugin gets is the node's.
    abi: UhHostNode,
    state: AtomicU8,
    /// The next node in `free` or `returned`.
    next: *mut Node,
    call: Option<Box<dyn FnOnce() + Send>>,
    uses: Vec<HostUse>,
    /// The node's stream, for what a callback that never runs gives back and a panic's error.
    stream: Weak<PluginStream>,
    pool: Arc<NodePool>,
}

/// The enqueuers' list.
struct FreeList(*mut Node);
// SAFETY: the nodes are reached only behind the pool's lock (this list) or by whoever took
// them from `returned` with a swap.
unsafe impl Send for FreeList {}

/// A stream's nodes.
pub(crate) struct NodePool {
    free: parking_lot::Mutex<FreeList>,
    returned: AtomicPtr<Node>,
}

impl NodePool {
    pub(crate) fn new() -> Arc<NodePool> {
        Arc::new(NodePool {
            free: parking_lot::Mutex::new(FreeList(std::ptr::null_mut())),
            returned: AtomicPtr::new(std::ptr::null_mut()),
        })
    }

    /// A node holding `call` and `uses`, queued (the caller hands it to the plugin, whose
    /// `run` returns it here).
    pub(crate) fn node(
        self: &Arc<NodePool>,
        stream: &Weak<PluginStream>,
        call: Box<dyn FnOnce() + Send>,
        uses: Vec<HostUse>,
    ) -> *mut UhHostNode {
        let mut free = self.free.lock();
        if free.0.is_null() {
            // The stream is alive (the caller enqueues on it), so `returned` is not `CLOSED`.
            free.0 = self.returned.swap(std::ptr::null_mut(), Ordering::Acquire);
        }
        let n = free.0;
        if !n.is_null() {
            // SAFETY: nodes in `free` are the pool's alone (behind the lock) and alive.
            let node = unsafe { &mut *n };
            free.0 = node.next;
            drop(free);
            node.next = std::ptr::null_mut();
            node.call = Some(call);
            node.uses = uses;
            node.state.store(QUEUED, Ordering::Relaxed);
            return n as *mut UhHostNode;
        }
        drop(free);
        LIVE.fetch_add(1, Ordering::SeqCst);
        Box::into_raw(Box::new(Node {
            abi: UhHostNode {
                size: std::mem::size_of::<UhHostNode>() as u32,
                reserved: 0,
                run: Some(run_node),
                plugin: [std::ptr::null_mut(); 2],
            },
            state: AtomicU8::new(QUEUED),
            next: std::ptr::null_mut(),
            call: Some(call),
            uses,
            stream: stream.clone(),
            pool: self.clone(),
        })) as *mut UhHostNode
    }

    /// Frees the free nodes and makes nodes returned from now on free themselves (the stream
    /// goes).
    pub(crate) fn close(&self) {
        let free = std::mem::replace(&mut self.free.lock().0, std::ptr::null_mut());
        let returned = self.returned.swap(CLOSED, Ordering::AcqRel);
        for head in [free, returned] {
            let mut n = head;
            while !n.is_null() && n != CLOSED {
                // SAFETY: a chain taken whole (the lock's list, or `returned` by one swap):
                // its nodes are ours alone, each made by `Box::into_raw`.
                let node = unsafe { Box::from_raw(n) };
                n = node.next;
                free_node(node);
            }
        }
    }
}

fn free_node(node: Box<Node>) {
    LIVE.fetch_sub(1, Ordering::SeqCst);
    drop(node);
}

/// Returns `n` (run, emptied) to its pool, or frees it when the pool's stream is gone.
///
/// # Safety
/// `n` is a node of this module that its caller alone holds; it is not touched after.
unsafe fn give_back(n: *mut Node) {
    // A raw pointer, read while the node (whose `Arc` keeps the pool) is still ours.
    // SAFETY: the caller's promise: `n` is alive and ours.
    let returned: *const AtomicPtr<Node> = unsafe { &(*Arc::as_ptr(&(*n).pool)).returned };
    // SAFETY: the pool lives while the node does, and the node is ours until the exchange.
    let mut head = unsafe { &*returned }.load(Ordering::Relaxed);
    loop {
        if head == CLOSED {
            // SAFETY: ours alone (the caller's promise), made by `Box::into_raw`; nobody else
            // can reach it, as the pool's lists are closed. The pool is not read after.
            free_node(unsafe { Box::from_raw(n) });
            return;
        }
        // SAFETY: ours alone until the exchange below publishes it.
        unsafe { (*n).next = head };
        // SAFETY: as for the load: the node, and with it the pool, is still ours here.
        let exchanged = unsafe { &*returned }.compare_exchange_weak(
            head,
            n,
            Ordering::Release,
            Ordering::Relaxed,
        );
        match exchanged {
            // The node (and maybe the pool) may be gone from here on: not touched again.
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

/// The node's `run` (header: exactly once per `host_callback_node` call).
unsafe extern "C" fn run_node(node: *mut UhHostNode, status: UhStatus) {
    let n = node as *mut Node;
    // SAFETY: the plugin passes back the node the host gave it (header), alive while queued or
    // pooled; `state` is atomic, so a stray second run only reads it.
    if unsafe { &(*n).state }.swap(FREE, Ordering::AcqRel) != QUEUED {
        STRAY_RUNS.fetch_add(1, Ordering::SeqCst);
        return;
    }
    // SAFETY: a queued node is the plugin's, and the plugin gave it back by this one run: ours
    // alone until `give_back`.
    let node = unsafe { &mut *n };
    let call = node.call.take();
    let uses = std::mem::take(&mut node.uses);
    if status != UH_OK {
        // Never runs: the work before it may still hold the uses (a refused enqueue), so they
        // go back to the stream, released once that work is known to have run.
        if !uses.is_empty() {
            if let Some(s) = node.stream.upgrade() {
                s.give_back_uses(uses);
            }
        }
        // A closure's drop may panic; it must not unwind across the C boundary.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(call)));
    } else {
        // The work before the callback has completed: the uses end.
        drop(uses);
        if let Some(f) = call {
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
                if let Some(s) = node.stream.upgrade() {
                    s.callback_failed(HalError::Internal("a host callback panicked".into()));
                }
            }
        }
    }
    // SAFETY: ours alone (above), not touched after.
    unsafe { give_back(n) };
}
