//! Graph-private pools: the memory of stream captures (PyTorch's `graph_pool_handle`).
//!
//! A request made on a stream that is capturing ([`unihal_hal::Stream::capture_status`] names a
//! capture) is served from a pool private to that capture, and to the graph made from it:
//!
//! * **Reuse inside the capture.** Blocks the capture frees serve only later requests of the same
//!   capture. Captured work keeps its buffers on the capture's own stream identity
//!   ([`unihal_hal::CaptureId::stream_id`]), and the capture's requests are keyed on that
//!   identity, so a block freed while captured work uses it serves the capture's next request
//!   at once (the captured work is ordered, as on one stream), exactly as a stream's own freed
//!   blocks serve that stream.
//! * **Kept while the graph lives.** After the capture ends nothing but a request of a capture
//!   of the same pool searches the pool's free lists, and the graph's uses fence every block it
//!   touches until the graph is destroyed ([`unihal_hal::BlockOwner::retired`]): a replay never
//!   writes memory another tensor holds.
//! * **Graph memory is dropped, reserved memory goes back to the cache.** A segment a capture
//!   got from `alloc_async` is graph memory (CUDA's memory nodes): only work of that capture
//!   may use it, and once the capture ends its handle is unusable
//!   ([`unihal_hal::Invalid::FreeEnqueued`]; the memory exists only inside replays). So it
//!   serves requests of that capture only, never another capture sharing the pool, and once it
//!   is idle (handles dropped, the graph's uses ended) with its capture over it is dropped:
//!   released reserved memory (`reserved_bytes` and `segment` fall, `num_device_free` counts
//!   it), never joined to the general cache, even while a [`GraphPool`] handle keeps the pool.
//!   Segments reserved before the capture ([`crate::CachingAllocator::reserve_graph_pool`],
//!   from `Device::alloc`) serve every capture of the pool, and once every block of the pool is
//!   idle again, its captures are over and no [`GraphPool`] handle holds it, join the general
//!   cache. Both happen at the allocator's next call (an allocation, `empty_cache`, `stats`, a
//!   snapshot): the owner callbacks that learn of the idle blocks may not call into a stream,
//!   and whether a capture is over is the stream's to say.
//!
//! ## Segments during a capture
//!
//! `Device::alloc` is capture-unsafe: a backend refuses it while a capture in
//! [`unihal_hal::CaptureMode::Global`] is active (from any thread), and the refusal invalidates
//! the capture, as `cuMemAlloc` does. PyTorch switches its thread to relaxed mode around
//! `cudaMalloc`; the HAL has no such switch, and its rule is to allocate with
//! `Stream::alloc_async` inside a capture. So a graph pool's segments come from
//! `alloc_async(segment size)` on the capturing stream, where the device's
//! `GraphCaps::stream_alloc` says stream-ordered allocation may be captured (a memory node of
//! the graph, at an address fixed while the graph lives; see above for what becomes of it).
//! Where it may not, a capture's
//! request that its pool cannot serve is refused with [`unihal_hal::Invalid::Capture`] without
//! calling `Device::alloc`, whose refusal would invalidate the capture (a stream does not say
//! whether its capture is relaxed); reserve the pool's segments before the capture with
//! [`crate::CachingAllocator::graph_pool_handle`],
//! [`crate::CachingAllocator::reserve_graph_pool`] and
//! [`crate::CachingAllocator::capture_into`]. A request of a capture never releases the
//! general cache to retry after an out-of-memory (that frees device memory, capture-unsafe too;
//! PyTorch skips it while captures are underway as well).
//!
//! Requests outside the capture are unchanged: a stream that is not capturing gets segments
//! from `Device::alloc`, which a backend refuses while a [`unihal_hal::CaptureMode::Global`]
//! capture is active on the device (the cache still serves what it can), as CUDA refuses
//! `cudaMalloc` from another thread then.
//!
//! ## Sharing a pool between captures
//!
//! [`crate::CachingAllocator::graph_pool_handle`] makes a pool no capture owns, and
//! [`crate::CachingAllocator::capture_into`] makes a capture's requests use it (PyTorch's
//! `torch.cuda.graph(g, pool=handle)`). The captures then share its reserved segments
//! ([`crate::CachingAllocator::reserve_graph_pool`]) and their free, idle blocks; a segment one
//! capture got from `alloc_async` is that capture's graph memory and never serves another.
//! Unlike PyTorch, a block one graph still uses does not serve another capture of the pool
//! before that graph is destroyed: PyTorch trusts its user to replay the graphs in the order
//! they were captured, which nothing here could check.

use serde::Serialize;
use unihal_hal::CaptureId;

/// The identity of a graph pool, PyTorch's `MempoolId_t` (a pair): `(capture, 0)` for the pool a
/// capture made for itself (`capture` is [`CaptureId::get`]), `(0, n)` for the `n`-th pool of
/// [`crate::CachingAllocator::graph_pool_handle`]. Snapshots show it as `segment_pool_id`, and
/// `(0, 0)`, the general cache, is never a graph pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct GraphPoolId(pub u64, pub u64);

/// A pool that captures may share ([`crate::CachingAllocator::graph_pool_handle`]). While a
/// handle (or a clone) lives, the pool keeps its reserved segments even when idle, for the
/// captures to come (its captures' own `alloc_async` segments are dropped once idle and their
/// capture over: no other capture may use them); once the handles are gone the pool goes back
/// to the general cache as a capture's own does.
///
/// Ownership: clones share the pool; the handle keeps the allocator's bookkeeping (not the
/// allocator's segments' device) alive. Thread safety: `Send + Sync`.
pub struct GraphPool {
    pub(crate) id: GraphPoolId,
    pub(crate) owner: std::sync::Arc<crate::allocator::Shared>,
}

impl GraphPool {
    /// The pool's identity.
    pub fn id(&self) -> GraphPoolId {
        self.id
    }
}

impl Clone for GraphPool {
    fn clone(&self) -> GraphPool {
        self.owner.pools.lock().graph_pool_handle(self.id, true);
        GraphPool {
            id: self.id,
            owner: self.owner.clone(),
        }
    }
}

impl Drop for GraphPool {
    fn drop(&mut self) {
        self.owner.pools.lock().graph_pool_handle(self.id, false);
    }
}

impl std::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphPool({}, {})", self.id.0, self.id.1)
    }
}

/// One graph pool as [`crate::CachingAllocator::graph_pools`] shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphPoolInfo {
    pub id: GraphPoolId,
    /// The captures whose requests it served, in order.
    pub captures: Vec<CaptureId>,
    /// Live [`GraphPool`] handles.
    pub handles: usize,
    /// Its segments.
    pub segments: usize,
    /// Bytes of its segments.
    pub reserved_bytes: u64,
    /// Bytes of its blocks handed out and not yet freed.
    pub allocated_bytes: u64,
    /// Every block is free and unused by queued work (a graph that used them is gone): the pool
    /// goes back to the general cache at the allocator's next call once its captures are over
    /// and no handle holds it.
    pub idle: bool,
}
