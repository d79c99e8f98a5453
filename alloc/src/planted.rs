//! Planted defects, for proving that the allocator's model-based test catches them (feature
//! `planted-defects`, never in a normal build; see `unihal_hal::planted` for the HAL's). Off until
//! a test turns one on.
//!
//! Thread safety: process-wide switches (`Relaxed` atomics); a test that turns one on must keep
//! every other test of its process from running meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};

static SEARCH_NEW_SEGMENT: AtomicBool = AtomicBool::new(false);

/// Turns on (or off) the search through the cached-block rules (`size::fits`) for the block of a
/// segment just allocated, instead of handing that block to the request it was made for: under
/// `max_split_size` a request then reserves segment after segment until the device is full and
/// fails with a false out-of-memory (RELIABILITY.md, defect 27).
pub fn set_search_new_segment(on: bool) {
    SEARCH_NEW_SEGMENT.store(on, Ordering::Relaxed);
}

/// True while the search is planted.
pub(crate) fn search_new_segment() -> bool {
    SEARCH_NEW_SEGMENT.load(Ordering::Relaxed)
}

static GRAPH_POOLS_SHARED: AtomicBool = AtomicBool::new(false);

/// Turns on (or off) the search of the graph pools' free lists, fences ignored, by requests
/// outside any capture: a block a graph still uses then serves other work, and the graph's
/// replays write memory another tensor holds.
pub fn set_graph_pools_shared(on: bool) {
    GRAPH_POOLS_SHARED.store(on, Ordering::Relaxed);
}

/// True while the shared graph pools are planted.
pub(crate) fn graph_pools_shared() -> bool {
    GRAPH_POOLS_SHARED.load(Ordering::Relaxed)
}
