//! Validation: the model of stream order ([`tracker`]), what it finds ([`finding`]), and the
//! switch ([`Mode`], [`VALIDATE_ENV`]).

pub(crate) mod finding;
pub(crate) mod tracker;

use crate::backend::LayerDevice;
use std::sync::atomic::{AtomicU64, Ordering};

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

pub(crate) static TOTAL: AtomicU64 = AtomicU64::new(0);

/// Declares that the program orders every access to `buffer`'s allocation itself, through
/// device-side synchronisation the layer cannot see (a flag a spinning kernel polls while another
/// stream writes it): the layer stops tracking that allocation until its memory is allocated
/// again. Does nothing when `device` is not a device of a validation layer.
///
/// Thread safety: any thread.
pub fn exempt(device: &dyn unihal_hal::Device, buffer: &unihal_hal::Buffer) {
    if let Some(v) = device.as_any().downcast_ref::<LayerDevice>() {
        let base = buffer.device_addr().wrapping_sub(buffer.offset());
        v.layer()
            .tracker
            .lock()
            .exempt(tracker::Space::Device(buffer.device()), base);
    }
}
