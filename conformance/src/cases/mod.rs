//! The cases, by area. Ids are stable: reports, manifests and CI filters refer to them.

use crate::case::Case;

pub mod alloc;
pub mod ccl;
pub mod events;
pub mod graphs;
pub mod kernels;
pub mod memory;
pub mod misuse;
pub mod ops;
pub mod streams;

/// Every case of the suite, in id order.
pub fn all() -> Vec<Case> {
    let mut v: Vec<Case> = [
        alloc::cases(),
        ccl::cases(),
        memory::cases(),
        streams::cases(),
        events::cases(),
        graphs::cases(),
        kernels::cases(),
        misuse::cases(),
        ops::cases(),
    ]
    .into_iter()
    .flatten()
    .collect();
    v.sort_by(|a, b| a.id.cmp(&b.id));
    v
}
