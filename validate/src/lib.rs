//! # unihal-validate: the validation layer
//!
//! A backend that wraps any other and reports what the HAL leaves to the program: stream work the
//! program did not order. Switched on for every backend of [`unihal::registry`] by
//! `UNIHAL_VALIDATE=1` (report) or `UNIHAL_VALIDATE=error` (refuse), or wrapped explicitly with
//! [`wrap`]. Like Vulkan's validation layers and Unified Runtime's, it sits between the program
//! and the backend and changes nothing the program sees but the findings.
//!
//! ## What it checks
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
//! and kept ([`ValidatingBackend::findings`]); in [`Mode::Error`] the offending call returns
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
mod finding;
mod layer;
mod stream;
mod tracker;

pub use backend::{ValidatingBackend, ValidatingDevice};
pub use ccl::{ValidatingCollectives, ValidatingCommunicator};
pub use finding::{Finding, FindingKind, Site};
pub use stream::{ValidatingEvent, ValidatingStream};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use unihal_hal::Backend;

/// The variable that switches the layer on for the facade's registry.
pub const VALIDATE_ENV: &str = "UNIHAL_VALIDATE";

/// What the layer does with a finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Log it (WARN) and keep it; the call proceeds.
    Report,
    /// Refuse the call with `InvalidArgument` naming the finding (nothing is enqueued).
    Error,
}

impl Mode {
    /// The mode a value of [`VALIDATE_ENV`] asks for: `None` for unset, empty, `0` or `off`.
    ///
    /// # Errors
    /// A message naming the accepted values.
    pub fn parse(value: Option<&str>) -> Result<Option<Mode>, String> {
        match value.map(str::trim) {
            None | Some("" | "0" | "off") => Ok(None),
            Some("1" | "report" | "on") => Ok(Some(Mode::Report)),
            Some("error") => Ok(Some(Mode::Error)),
            Some(v) => Err(format!(
                "{VALIDATE_ENV}={v:?}: accepted values are 1 (or report), error, 0 (or off)"
            )),
        }
    }

    /// [`Mode::parse`] of the environment's [`VALIDATE_ENV`].
    ///
    /// # Errors
    /// As [`Mode::parse`].
    pub fn from_env() -> Result<Option<Mode>, String> {
        Mode::parse(std::env::var(VALIDATE_ENV).ok().as_deref())
    }
}

/// Findings made by every validation layer of the process so far (for run summaries).
pub fn total_findings() -> u64 {
    TOTAL.load(Ordering::Relaxed)
}

static TOTAL: AtomicU64 = AtomicU64::new(0);

/// Declares that the program orders every access to `buffer`'s allocation itself, through
/// device-side synchronisation the layer cannot see (a flag a spinning kernel polls while another
/// stream writes it): the layer stops tracking that allocation until its memory is allocated
/// again. Does nothing when `device` is not a device of a validation layer.
///
/// Thread safety: any thread.
pub fn exempt(device: &dyn unihal_hal::Device, buffer: &unihal_hal::Buffer) {
    if let Some(v) = device.as_any().downcast_ref::<ValidatingDevice>() {
        let base = buffer.device_addr().wrapping_sub(buffer.offset());
        v.layer()
            .tracker
            .lock()
            .exempt(tracker::Space::Device(buffer.device()), base);
    }
}

/// Wraps `backend` in a validation layer.
///
/// Ownership: the layer owns `backend`. Thread safety: as the backend's.
pub fn wrap(backend: Arc<dyn Backend>, mode: Mode) -> Arc<ValidatingBackend> {
    ValidatingBackend::new(backend, mode)
}
