//! hiprtc's C API: the symbols unihal resolves from `libamdhip64.so.<major>` (hiprtc is exported by
//! the HIP runtime library itself in ROCm 5.x; declarations written from AMD's hiprtc.h
//! documentation). Every function returns a `hiprtcResult` (0 = success).

use std::ffi::{c_char, c_int, c_void};

pub type HiprtcResult = c_int;
pub type HiprtcProgram = *mut c_void;

unihal_dynlib::symbol_table! {
    /// The resolved symbol table. Function pointers stay valid for the process (the library is
    /// never unloaded).
    pub struct HiprtcSys;
    required {
        version = "hiprtcVersion": unsafe extern "C" fn(*mut c_int, *mut c_int) -> HiprtcResult;
        get_error_string = "hiprtcGetErrorString": unsafe extern "C" fn(HiprtcResult) -> *const c_char;
        create_program = "hiprtcCreateProgram": unsafe extern "C" fn(*mut HiprtcProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> HiprtcResult;
        compile_program = "hiprtcCompileProgram": unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult;
        get_program_log_size = "hiprtcGetProgramLogSize": unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        get_program_log = "hiprtcGetProgramLog": unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
        get_code_size = "hiprtcGetCodeSize": unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult;
        get_code = "hiprtcGetCode": unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult;
        destroy_program = "hiprtcDestroyProgram": unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult;
    }
    optional {
    }
}
