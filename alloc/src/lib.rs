//! # unihal-alloc: the caching device allocator
//!
//! Training engines allocate and free tensors thousands of times per step; a device allocation
//! costs microseconds to milliseconds and may synchronise the device. [`CachingAllocator`] sits
//! above any backend's `Device::alloc` and serves requests from cached segments, as PyTorch's
//! CUDA caching allocator does, with the same size classes ([`size`]), the same statistics under
//! the same keys ([`stats`]) and a snapshot of segments and blocks, also in PyTorch's pickled
//! layout for its memory tools ([`torch`]).
//!
//! ## Design
//!
//! * **Backend-neutral.** Segments come from `Device::alloc`; blocks are carved out of them with
//!   [`unihal_hal::Segment::block`], so a block is a `Buffer` that every backend's stream
//!   accepts and checks like any other (device, range, stream-ordered free).
//! * **Reuse from the HAL's own tracking.** Backends keep the buffers of queued work with
//!   [`unihal_hal::Buffer::use_on`], which records the stream. When a block's last handle is
//!   dropped, its owner learns which streams still use it ([`unihal_hal::BlockOwner`]): none,
//!   and the block is free at once; one stream S, and it serves S at once (stream order) and
//!   other streams once S's work has completed; several, and it waits for them all. PyTorch
//!   needs `record_stream` for the second case and corrupts memory silently when it is missing.
//! * **Pools and fences** ([`pool`]): blocks in address order per segment, free lists per pool
//!   ordered by size, best fit; memory still used by one stream's queued work is *fenced* to that
//!   stream and coalesces with nothing until the fence closes.
//! * **Thrifty best fit** ([`size::thrifty`]): a cached block more than twice a request (and
//!   above a large segment) is left for requests of its size while the device has memory; PyTorch
//!   splits it, and on a training trace wastes 16% of its reserved memory where this wastes 2%.
//! * **Out of memory**: let any cached block serve, then release every cached segment and retry
//!   once (`num_alloc_retries`), then
//!   fail with [`unihal_hal::HalError::AllocatorOutOfMemory`], whose report gives the request,
//!   allocated, reserved and free bytes and the largest free block (`num_ooms`).
//! * **Graph-private pools** ([`graph`]): a request made on a capturing stream is served from a
//!   pool private to its capture (and the graph made from it), as PyTorch's graph pools, with
//!   segments from the capture-safe `Stream::alloc_async`. Those are graph memory, the
//!   capture's alone: once the graph is destroyed and they are idle they are released, never
//!   cached; segments reserved before the capture (`reserve_graph_pool`) return to the general
//!   cache instead.
//! * **One lock per device**, never held across a device call, so allocation never waits for a
//!   stream and the release callbacks (which run on stream workers) never wait for a device.

mod allocator;
mod bins;
pub mod graph;
#[cfg(feature = "planted-defects")]
pub mod planted;
mod pool;
pub mod size;
pub mod stats;
mod summary;
pub mod torch;

pub use allocator::{AllocatorConfig, CachingAllocator};
pub use graph::{GraphPool, GraphPoolId, GraphPoolInfo};
pub use size::PoolKind;
pub use stats::{
    BlockSnapshot, BlockState, MemoryStats, SegmentSnapshot, Stat, StatArray, TraceEvent,
};
