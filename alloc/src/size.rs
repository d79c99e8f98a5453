//! Size classes, PyTorch's: how a request is rounded, which pool serves it, how large a segment
//! the device is asked for, and when a cached block is split.

/// Every block is a multiple of this many bytes (PyTorch's `kMinBlockSize`).
pub const MIN_BLOCK: u64 = 512;
/// Requests up to this size come from the small pool (`kSmallSize`).
pub const SMALL_SIZE: u64 = 1 << 20;
/// Segment size of the small pool (`kSmallBuffer`).
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Segment size for requests between [`SMALL_SIZE`] and [`MIN_LARGE_ALLOC`] (`kLargeBuffer`).
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Requests from this size get a segment of their own size, rounded (`kMinLargeAlloc`).
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 << 20;

/// The two pools: small blocks are never mixed with large ones, so small, short-lived tensors do
/// not fragment the segments of large ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolKind {
    /// Requests of at most 1 MiB, from 2 MiB segments.
    Small,
    /// Larger requests.
    Large,
}

impl PoolKind {
    /// The pool that serves a block of `size` (rounded) bytes.
    pub fn of(size: u64) -> PoolKind {
        if size <= SMALL_SIZE {
            PoolKind::Small
        } else {
            PoolKind::Large
        }
    }

    /// PyTorch's name of the pool in statistic keys (`small_pool`, `large_pool`).
    pub fn key(self) -> &'static str {
        match self {
            PoolKind::Small => "small_pool",
            PoolKind::Large => "large_pool",
        }
    }
}

/// The block size a request of `len` bytes takes: a multiple of [`MIN_BLOCK`], at least one.
/// `None` when rounding overflows.
pub fn round_size(len: u64) -> Option<u64> {
    if len < MIN_BLOCK {
        Some(MIN_BLOCK)
    } else {
        len.checked_next_multiple_of(MIN_BLOCK)
    }
}

/// The segment the device is asked for when no cached block fits a block of `size` bytes.
/// `None` when rounding overflows.
pub fn segment_size(size: u64) -> Option<u64> {
    if size <= SMALL_SIZE {
        Some(SMALL_SEGMENT)
    } else if size < MIN_LARGE_ALLOC {
        Some(LARGE_SEGMENT)
    } else {
        size.checked_next_multiple_of(ROUND_LARGE)
    }
}

/// True when a free block of `block` bytes taken for `size` bytes is split, leaving the rest
/// cached: in the small pool when at least [`MIN_BLOCK`] remains, in the large pool when more
/// than [`SMALL_SIZE`] remains (a smaller rest would only serve small requests, which never come
/// from large segments). Blocks of `max_split` bytes or more are never split.
pub fn should_split(block: u64, size: u64, max_split: u64) -> bool {
    let rest = block - size;
    match PoolKind::of(size) {
        PoolKind::Small => rest >= MIN_BLOCK,
        PoolKind::Large => size < max_split && rest > SMALL_SIZE,
    }
}

/// True when a free block of `block` bytes may serve a request of `size` bytes under a
/// `max_split` limit (PyTorch's rule for oversize blocks): a request below the limit never takes
/// an unsplittable oversize block, and an oversize request takes one only if it wastes less
/// than a large segment.
pub fn fits(block: u64, size: u64, max_split: u64) -> bool {
    if block < size {
        return false;
    }
    if size < max_split {
        block < max_split
    } else {
        block - size < LARGE_SEGMENT
    }
}

/// True when serving a request of `size` bytes from a free block of `block` bytes wastes little
/// enough to do while the device has memory: the block is at most twice the request, or no
/// larger than a large segment. PyTorch lets any request split any cached block (unless
/// `max_split_size_mb` is set), so a small tensor can carve up the segment a large one will ask
/// for again, and the large one gets a new segment: on the MLP training trace scaled to 1 GiB
/// that wastes 16% of the reserved memory (0.838 allocated/reserved) where this rule wastes 2%
/// (0.982; `cargo bench --bench alloc`). Under memory pressure the rule is dropped before the
/// cache is released (see `CachingAllocator::alloc`).
pub fn thrifty(block: u64, size: u64) -> bool {
    block <= size.saturating_mul(2).max(LARGE_SEGMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_size_classes() {
        assert_eq!(round_size(0), Some(512));
        assert_eq!(round_size(1), Some(512));
        assert_eq!(round_size(512), Some(512));
        assert_eq!(round_size(513), Some(1024));
        assert_eq!(round_size(u64::MAX), None);
        assert_eq!(PoolKind::of(1 << 20), PoolKind::Small);
        assert_eq!(PoolKind::of((1 << 20) + 512), PoolKind::Large);
        assert_eq!(segment_size(4096), Some(2 << 20));
        assert_eq!(segment_size(3 << 20), Some(20 << 20));
        assert_eq!(segment_size((10 << 20) + 512), Some(12 << 20));
        assert!(should_split(2 << 20, 1024, u64::MAX));
        assert!(should_split(1536, 1024, u64::MAX));
        assert!(!should_split(1024, 1024, u64::MAX));
        assert!(!should_split(3 << 20, 2 << 20, u64::MAX));
        assert!(should_split((3 << 20) + 512, 2 << 20, u64::MAX));
        assert!(should_split(20 << 20, 2 << 20, u64::MAX));
        assert!(!should_split(20 << 20, 2 << 20, 2 << 20));
        assert!(fits(20 << 20, 2 << 20, u64::MAX));
        assert!(!fits(20 << 20, 2 << 20, 16 << 20));
        assert!(fits(40 << 20, 32 << 20, 16 << 20));
        assert!(!fits(60 << 20, 32 << 20, 16 << 20));
        assert!(thrifty(20 << 20, 512));
        assert!(thrifty(24 << 20, 12 << 20));
        assert!(!thrifty(192 << 20, 12 << 20));
    }
}
