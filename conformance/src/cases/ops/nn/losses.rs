//! stub

use crate::case::Case;

/// The cases.
pub fn cases() -> Vec<Case> {
    Vec::new()
}
