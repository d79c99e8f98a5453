//! Host callbacks in recycled nodes (ABI 1.2, `host_callback_node`).
//!
//! Each stream keeps a pool of nodes: a node holds the HAL's closure and the host-buffer uses it
//! ends, crosses the boundary as one `uh_host_node*`, and the plugin's thread that runs it
//! returns it to its pool instead of freeing it. In the steady state an enqueue takes a returned
//! node and allocates nothing; nothing is freed across threads. The pool holds as many nodes as
//! the stream once had queued at the same time, and frees them when the stream goes.
//!
//! The pool is a [`Pool`] (`recycle.rs`, model-checked with loom in `tests/loom.rs`): a lock-free
//! `returned` stack the plugin's threads push onto, and `free`, the enqueuers' list behind a
//! short lock, refilled from `returned` when it runs dry. When the stream goes, the pool is
//! closed (`returned` swapped for a sentinel in one step): a node pushed before is freed by the
//! stream, a node returned after sees the sentinel and frees itself, so each node is freed
//! exactly once. This module adds the node itself: the ABI struct, the HAL's closure and uses,
//! its queued/free state, and the process-wide counts.

use super::recycle::{Link, Pool, Recycle};
use super::stream::PluginStream;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use unihal_hal::{HalError, HostUse};
use unihal_plugin_abi::*;

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
    /// The next node in its pool's lists (the pool's alone).
    link: Link<Node>,
    call: Option<Box<dyn FnOnce() + Send>>,
    uses: Vec<HostUse>,
    /// The node's stream, for what a callback that never runs gives back and a panic's error.
    stream: Weak<PluginStream>,
    pool: Arc<NodePool>,
}

// SAFETY: a node is in one place at a time (its pool, the enqueuer that took it, the plugin
// that queued it, the plugin thread that runs it), so whoever holds it uses it alone; what it
// carries is `Send` (the closure, the uses, the `Weak`/`Arc`), and its raw pointers are the
// plugin's scratch (`abi.plugin`, which the ABI lets cross threads) and the pool's link.
unsafe impl Send for Node {}

// SAFETY: `link` is a field of the node (the same cell for its whole life), touched only by the
// pool; nodes are made by `Box::into_raw` (`NodePool::node`) and freed only by `free`.
unsafe impl Recycle for Node {
    fn link(&self) -> &Link<Node> {
        &self.link
    }

    unsafe fn free(node: *mut Node) {
        // SAFETY: made by `Box::into_raw`, the pool's alone and freed only here (the trait's
        // contract).
        free_node(unsafe { Box::from_raw(node) });
    }
}

/// A stream's nodes. Owned by the stream and by each of its nodes (a node returned after the
/// stream went still finds its pool); `Send + Sync`.
pub(crate) struct NodePool(Pool<Node>);

impl NodePool {
    pub(crate) fn new() -> Arc<NodePool> {
        Arc::new(NodePool(Pool::new()))
    }

    /// A node holding `call` and `uses`, queued (the caller hands it to the plugin, whose
    /// `run` returns it here).
    pub(crate) fn node(
        self: &Arc<NodePool>,
        stream: &Weak<PluginStream>,
        call: Box<dyn FnOnce() + Send>,
        uses: Vec<HostUse>,
    ) -> *mut UhHostNode {
        if let Some(n) = self.0.take() {
            // SAFETY: a taken node is ours alone (the pool's contract) and alive (made below by
            // `Box::into_raw`, freed only by the pool, which no longer holds it).
            let node = unsafe { &mut *n };
            node.call = Some(call);
            node.uses = uses;
            node.state.store(QUEUED, Ordering::Relaxed);
            return n as *mut UhHostNode;
        }
        LIVE.fetch_add(1, Ordering::SeqCst);
        Box::into_raw(Box::new(Node {
            abi: UhHostNode {
                size: std::mem::size_of::<UhHostNode>() as u32,
                reserved: 0,
                run: Some(run_node),
                plugin: [std::ptr::null_mut(); 2],
            },
            state: AtomicU8::new(QUEUED),
            link: Link::new(std::ptr::null_mut()),
            call: Some(call),
            uses,
            stream: stream.clone(),
            pool: self.clone(),
        })) as *mut UhHostNode
    }

    /// Frees the free nodes and makes nodes returned from now on free themselves (the stream
    /// goes).
    pub(crate) fn close(&self) {
        self.0.close();
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
    let pool: *const Pool<Node> = unsafe { std::ptr::addr_of!((*Arc::as_ptr(&(*n).pool)).0) };
    // SAFETY: `n` is ours alone, alive, in no pool and made by `Box::into_raw` (so `free` can
    // free it); its `Arc` keeps the pool alive until the pool holds it or it is freed, and
    // `give_back` touches neither after that.
    unsafe { Pool::give_back(pool, n) };
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
