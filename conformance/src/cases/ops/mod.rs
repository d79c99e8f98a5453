//! `ops.*`: the portable op library through `Stream::run_op`, against independent references.

pub mod elementwise;
pub mod reference;
pub mod values;

use crate::case::Case;

/// Every op case.
pub fn cases() -> Vec<Case> {
    elementwise::cases()
}
