//! NVRTC's C API: the symbols unihal resolves from `libnvrtc.so.<major>` (declarations written from
//! NVIDIA's documentation of nvrtc.h). Every function returns an `nvrtcResult` (0 = success).

use std::ffi::{c_char, c_int, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

pub type NvrtcResult = c_int;
pub type NvrtcProgram = *mut c_void;

/// The resolved symbol table. Function pointers stay valid for the process (the library is
/// never unloaded).
pub struct NvrtcSys {
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    pub get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    pub create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    pub compile_program:
        unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult,
    pub get_program_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub get_program_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub get_ptx_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub get_ptx: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub get_cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub get_cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol's C signature is the one declared in the field it fills.
        unsafe { $lib.get($name) }?
    };
}

impl NvrtcSys {
    /// Resolves every symbol from `lib`.
    pub fn new(lib: &Library) -> Result<NvrtcSys> {
        Ok(NvrtcSys {
            version: sym!(lib, "nvrtcVersion"),
            get_error_string: sym!(lib, "nvrtcGetErrorString"),
            create_program: sym!(lib, "nvrtcCreateProgram"),
            compile_program: sym!(lib, "nvrtcCompileProgram"),
            get_program_log_size: sym!(lib, "nvrtcGetProgramLogSize"),
            get_program_log: sym!(lib, "nvrtcGetProgramLog"),
            get_ptx_size: sym!(lib, "nvrtcGetPTXSize"),
            get_ptx: sym!(lib, "nvrtcGetPTX"),
            get_cubin_size: sym!(lib, "nvrtcGetCUBINSize"),
            get_cubin: sym!(lib, "nvrtcGetCUBIN"),
            destroy_program: sym!(lib, "nvrtcDestroyProgram"),
        })
    }
}
