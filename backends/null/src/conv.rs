//! Conversions between the vendor's values and the HAL's: error codes as `HalError::Vendor`
//! naming the call (and its documented name for the code), dtypes, attribute numbers.

use unihal_hal::HalError;

/// The error of a raw call the null runtime does not implement: `Unsupported`, naming the
/// call of the shared layer, the vendor calls it maps to, and the conformance cases that check
/// it once implemented.
pub fn unimplemented(call: &str, maps_to: &str, cases: &str) -> HalError {
    HalError::unsupported(format!(
        "the null runtime does not implement {call} yet (maps to {maps_to}; checked by {cases})"
    ))
}
