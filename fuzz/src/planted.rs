//! The planted defects the fuzzing step must find (scripts/fuzz.sh), chosen at run time so that
//! one fuzz build serves the planted runs and the real ones: `UNIHAL_FUZZ_PLANTED` names one.
//!
//! * `panic`: a fill whose value byte is in 0x4a..=0x4d panics (every target driven by
//!   [`crate::run`]): proves that a short run reaches the calls it drives and reports a panic.
//! * `uncounted-slice`: the uncounted view (RELIABILITY.md, defect 25: a dropped `Buffer::slice`
//!   of an allocator block freed the block), planted back in the HAL (`unihal_hal::planted`) by
//!   the `alloc_blocks` target, which must fail on it.
//!
//! Unset (as in every real run), nothing is planted. Any other value panics at the first check,
//! naming the accepted ones, so a misspelt switch cannot pass as a run that found nothing.
//! Thread safety: read once per process.

use std::sync::OnceLock;

/// The planted defect this process runs with, if any.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Planted {
    Panic,
    UncountedSlice,
}

fn planted() -> Option<Planted> {
    static P: OnceLock<Option<Planted>> = OnceLock::new();
    *P.get_or_init(|| match std::env::var("UNIHAL_FUZZ_PLANTED").ok().as_deref() {
        None | Some("") => None,
        Some("panic") => Some(Planted::Panic),
        Some("uncounted-slice") => Some(Planted::UncountedSlice),
        Some(other) => panic!(
            "UNIHAL_FUZZ_PLANTED={other:?} is not a planted defect: use 'panic' or 'uncounted-slice'"
        ),
    })
}

/// True when the planted panic is on (`UNIHAL_FUZZ_PLANTED=panic`).
pub fn panic() -> bool {
    planted() == Some(Planted::Panic)
}

/// True when the uncounted view is to be planted (`UNIHAL_FUZZ_PLANTED=uncounted-slice`).
pub fn uncounted_slice() -> bool {
    planted() == Some(Planted::UncountedSlice)
}
