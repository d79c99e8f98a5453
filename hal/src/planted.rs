//! Planted defects, for proving that the soundness tools catch them (feature `planted-defects`,
//! never in a normal build). Each switch is off until a test turns it on; while on, the HAL
//! behaves as it did before the fix of the defect named, so a tool that should find that class
//! of defect must fail.
//!
//! Thread safety: process-wide switches (`Relaxed` atomics); a test that turns one on must keep
//! every other test of its process from running meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};

static UNCOUNTED_SLICE: AtomicBool = AtomicBool::new(false);

/// Turns on (or off) the uncounted view: [`crate::Buffer::slice`] makes a view without counting
/// it as a handle, so dropping a view of an allocator block while the block is held hands the
/// block back to its owner (RELIABILITY.md, defect 25).
pub fn set_uncounted_slice(on: bool) {
    UNCOUNTED_SLICE.store(on, Ordering::Relaxed);
}

/// True while the uncounted view is planted.
pub(crate) fn uncounted_slice() -> bool {
    UNCOUNTED_SLICE.load(Ordering::Relaxed)
}
