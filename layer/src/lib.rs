//! # unihal-layer: a backend wrapping any other, for validation and for a timeline
//!
//! The layer sits between the program and a backend and changes nothing the program sees. It
//! has two observers, switched on separately for every backend of `unihal::registry`:
//! **validation** (`UNIHAL_VALIDATE`, below) and **the timeline** (`UNIHAL_TRACE=FILE`, see
//! [`trace`]). With neither set, nothing is wrapped.
//!
//! # Validation
//!
//! A backend that wraps any other and reports what the HAL leaves to the program: stream work the
//! program did not order. Switched on for every backend of [`unihal::registry`] by
//! `UNIHAL_VALIDATE=1` (report) or `UNIHAL_VALIDATE=error` (refuse), or wrapped explicitly with
//! [`wrap`]. Like Vulkan's validation layers and Unified Runtime's, it sits between the program
//! and the backend and changes nothing the program sees but the findings.
//!
//! ## What validation checks
//! * **Unordered stream access** ([`FindingKind::UnorderedAccess`]): for every byte range of
//!   every allocation, the last writer and the readers since (stream, epoch, call site). An
//!   access by another stream that is not ordered after an earlier write (or a write not ordered
//!   after an earlier read) is reported with both call sites. Order comes from vector clocks:
//!   each stream's, carried by `record_event`/`wait_event`, and the host's, which learns from
//!   stream, event and device synchronisation and from queries that say "complete"; whatever
//!   the host knows is ordered before what it enqueues next. Collectives, library ops (their
//!   outputs per [`unihal_hal::OpCall::outputs`]), copies, fills and kernel launches (every
//!   buffer a launch names counts as written: the HAL cannot see what a kernel does) are tracked.
//! * **Host maps during queued work** ([`FindingKind::UnorderedHostMap`]): the HAL refuses a map
//!   while queued work uses the buffer, but a map made without a synchronisation succeeds when the
//!   work *happened* to finish, a race that passes tests and fails in production. The layer sees
//!   every map ([`unihal_hal::observe_maps`]) and reports one the host's clock does not cover.
//! * **Handle misuse backends may leave undefined**: use of memory `free_async` freed through a
//!   handle the HAL cannot connect to it ([`FindingKind::UseAfterFreeAsync`]), and events, streams
//!   or devices that did not come through this layer instance ([`FindingKind::ForeignHandle`]).
//!
//! A finding is made only for a call the backend accepted: a call the backend refuses already
//! returned an error. In [`Mode::Report`] findings are logged (WARN, target `unihal::validate`)
//! and kept ([`LayerBackend::findings`]); in [`Mode::Error`] the offending call returns
//! [`unihal_hal::HalError::InvalidArgument`] with the finding and enqueues nothing (a map cannot
//! be refused after the fact: its findings are reported; nor can a call with a foreign handle,
//! which the backend judges first in both modes: it refuses a handle it did not make with its
//! own typed error, and one it accepts is reported).
//!
//! Sub-allocators tell the layer of every block they hand out (`Device::block_handed_out`, which
//! the caching allocator calls): the history of those bytes on other streams is over (the
//! allocator reuses memory for another stream only once its work completed), and so is a
//! `free_async` of an earlier block there; the hand-out stream's own unfinished accesses stay,
//! so a block reused at once by the stream whose queued work still uses it must be ordered
//! after that work before another stream touches it. Accesses out of a view's range are the
//! HAL's to refuse and make no finding.
//!
//! ## Design
//! Streams, events, devices, communicators and the backend are wrapped; buffers, host buffers,
//! modules and functions pass through untouched (they carry no ordering), so backends see their
//! own objects: every wrapper unwraps what it passes down. One mutex per validated backend guards
//! the model ([`tracker`]); it is held for bookkeeping only, never across a backend call. Each
//! stream's enqueues are serialised by the wrapper (the HAL makes each enqueue atomic anyway), so
//! the epochs the layer gives follow the stream's order.
//!
//! Limits: host threads count as one (a synchronisation by any thread orders what every thread
//! enqueues next: no false reports, some missed ones); at most 64 access records are kept per
//! allocation; work inside host callbacks is not tracked.

mod backend;
mod ccl;
mod layer;
mod stream;
pub mod trace;
mod validate;

pub use backend::{LayerBackend, LayerDevice};
pub use ccl::{LayerCollectives, LayerCommunicator};
pub use stream::{LayerEvent, LayerStream};
pub use trace::Trace;
pub use validate::finding::{Finding, FindingKind, Site};
pub use validate::{exempt, total_findings, Mode, VALIDATE_ENV};

use std::sync::Arc;
use unihal_hal::Backend;

/// What a layer does: validate (in a mode), trace (into a trace), or both.
#[derive(Clone, Default)]
pub struct Observers {
    pub validate: Option<Mode>,
    pub trace: Option<Arc<Trace>>,
}

impl Observers {
    /// What the environment asks for: [`VALIDATE_ENV`] and [`trace::TRACE_ENV`].
    ///
    /// # Errors
    /// As [`Mode::from_env`] (the trace variable takes any path).
    pub fn from_env() -> Result<Observers, String> {
        Ok(Observers {
            validate: Mode::from_env()?,
            trace: Trace::from_env(),
        })
    }

    /// True when neither observer is on (the backend needs no layer).
    pub fn is_empty(&self) -> bool {
        self.validate.is_none() && self.trace.is_none()
    }
}

/// Wraps `backend` in a validation layer.
///
/// Ownership: the layer owns `backend`. Thread safety: as the backend's.
pub fn wrap(backend: Arc<dyn Backend>, mode: Mode) -> Arc<LayerBackend> {
    wrap_with(
        backend,
        Observers {
            validate: Some(mode),
            trace: None,
        },
    )
}

/// Wraps `backend` in a layer with `observers`.
///
/// Ownership: the layer owns `backend` and shares the trace. Thread safety: as the backend's.
pub fn wrap_with(backend: Arc<dyn Backend>, observers: Observers) -> Arc<LayerBackend> {
    LayerBackend::new(backend, observers)
}
