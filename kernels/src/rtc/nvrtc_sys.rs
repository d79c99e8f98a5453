//! NVRTC's C API: the symbols unihal resolves from `libnvrtc.so.<major>` (declarations written from
//! NVIDIA's documentation of nvrtc.h). Every function returns an `nvrtcResult` (0 = success).

use std::ffi::{c_char, c_int, c_void};

pub type NvrtcResult = c_int;
pub type NvrtcProgram = *mut c_void;

unihal_dynlib::symbol_table! {
    /// The resolved symbol table. Function pointers stay valid for the process (the library is
    /// never unloaded).
    pub struct NvrtcSys;
    required {
        version = "nvrtcVersion": unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult;
        get_error_string = "nvrtcGetErrorString": unsafe extern "C" fn(NvrtcResult) -> *const c_char;
        create_program = "nvrtcCreateProgram": unsafe extern "C" fn(*mut NvrtcProgram, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> NvrtcResult;
        compile_program = "nvrtcCompileProgram": unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult;
        get_program_log_size = "nvrtcGetProgramLogSize": unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult;
        get_program_log = "nvrtcGetProgramLog": unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult;
        get_ptx_size = "nvrtcGetPTXSize": unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult;
        get_ptx = "nvrtcGetPTX": unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult;
        get_cubin_size = "nvrtcGetCUBINSize": unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult;
        get_cubin = "nvrtcGetCUBIN": unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult;
        destroy_program = "nvrtcDestroyProgram": unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult;
    }
    optional {
    }
}
