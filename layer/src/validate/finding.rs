//! What the layer reports.

use std::fmt;
use std::panic::Location;

/// A call site (the caller of the HAL method, through `#[track_caller]`).
pub type Site = &'static Location<'static>;

/// The kinds of mistake the layer reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FindingKind {
    /// Two streams touch overlapping bytes, at least one writes, and no event wait or host
    /// synchronisation orders the later after the earlier.
    UnorderedAccess,
    /// Work uses memory `free_async` freed, through a handle the HAL cannot recognise as freed
    /// (another allocation over the same addresses).
    UseAfterFreeAsync,
    /// The host mapped a host buffer that queued work used, without a synchronisation covering
    /// that work: the map succeeded only because the work happened to be done.
    UnorderedHostMap,
    /// A stream, event or device of another backend instance (or not created through this
    /// layer): its ordering is invisible to the layer, and backends need not define it.
    ForeignHandle,
}

/// One finding: what happened, where, and (for an ordering finding) the earlier call it
/// conflicts with.
#[derive(Clone, Debug)]
pub struct Finding {
    pub kind: FindingKind,
    pub message: String,
    /// The call that made the mistake.
    pub site: Site,
    /// The earlier call it conflicts with, if any.
    pub earlier: Option<Site>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {}: {}", self.kind, self.site, self.message)?;
        if let Some(e) = self.earlier {
            write!(f, " (earlier call at {e})")?;
        }
        Ok(())
    }
}
