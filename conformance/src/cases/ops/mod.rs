//! `ops.*`: the portable op library through `Stream::run_op`, against independent references.

pub mod elementwise;
pub mod misuse;
pub mod nn;
pub mod random;
pub mod reference;
pub mod values;

use crate::case::Case;

/// Every op case.
pub fn cases() -> Vec<Case> {
    let mut v = elementwise::cases();
    v.extend(random::cases());
    v.extend(misuse::cases());
    v.extend(nn::cases());
    v
}
