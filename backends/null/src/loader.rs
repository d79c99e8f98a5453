//! Opening the vendor runtime at run time. A port opens its library with `unihal_dynlib`
//! (`Candidates::new("MyChip runtime", "UNIHAL_MYCHIP_LIB", &["libmychip.so.1"])`: an override
//! variable, then the system loader's names, then install roots), resolves its symbol table
//! ([`crate::ffi`]), initialises the runtime and counts devices: no library, or no device, is
//! `HalError::Unavailable` naming every path tried, never "0 devices". Whether the library is a
//! simulated runtime comes from `Library::identity`, never from a name.

use unihal_hal::Result;

/// What the loader found. One per process.
pub struct Opened {
    /// Where the runtime came from.
    pub path: String,
    /// Devices the runtime reports (at least one).
    pub devices: usize,
    /// Whether it is a simulated runtime.
    pub identity: unihal_dynlib::Identity,
}

/// The runtime, opened once per process. The null runtime opens no library and reports one
/// device, so the conformance suite reaches its report.
///
/// # Errors
/// None here; a port's loader returns `HalError::Unavailable` with every path tried.
pub fn runtime() -> Result<&'static Opened> {
    static OPENED: Opened = Opened {
        path: String::new(),
        devices: 1,
        identity: unihal_dynlib::Identity {
            simulated: false,
            concurrent: true,
        },
    };
    Ok(&OPENED)
}
