//! hiprtc's C API: the symbols unihal resolves from `libamdhip64.so.<major>` (hiprtc is exported by
//! the HIP runtime library itself in ROCm 5.x; declarations written from AMD's hiprtc.h
//! documentation). Every function returns a `hiprtcResult` (0 = success).

use std::ffi::{c_char, c_int, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

pub type HiprtcResult = c_int;
pub type HiprtcProgram = *mut c_void;

/// The resolved symbol table. Function pointers stay valid for the process (the library is
/// never unloaded).
pub struct HiprtcSys {
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> HiprtcResult,
    pub get_error_string: unsafe extern "C" fn(HiprtcResult) -> *const c_char,
    pub create_program: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    pub compile_program:
        unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    pub get_program_log_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub get_program_log: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub get_code_size: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub get_code: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub destroy_program: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's C signature is the one declared in the field it fills.
        unsafe { $lib.get($name) }?
    };
}

impl HiprtcSys {
    /// Resolves every symbol from `lib`.
    pub fn new(lib: &Library) -> Result<HiprtcSys> {
        Ok(HiprtcSys {
            version: sym!(lib, "hiprtcVersion"),
            get_error_string: sym!(lib, "hiprtcGetErrorString"),
            create_program: sym!(lib, "hiprtcCreateProgram"),
            compile_program: sym!(lib, "hiprtcCompileProgram"),
            get_program_log_size: sym!(lib, "hiprtcGetProgramLogSize"),
            get_program_log: sym!(lib, "hiprtcGetProgramLog"),
            get_code_size: sym!(lib, "hiprtcGetCodeSize"),
            get_code: sym!(lib, "hiprtcGetCode"),
            destroy_program: sym!(lib, "hiprtcDestroyProgram"),
        })
    }
}
