//! AscendC kernel binaries (the kernel-loading API of `acl_rt.h`): there is no NPU to run one,
//! so loading a binary is refused with `ACL_ERROR_RT_FEATURE_NOT_SUPPORT` and a message that
//! says so. The entry points exist so that a backend resolving them finds them, as on a CANN
//! install that has the API.

use crate::conv::*;
use crate::runtime::sim;
use crate::{api, Err};
use std::ffi::{c_char, c_void};

fn refuse() -> Result<(), Err> {
    sim()?;
    Err(Err::new(
        ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
        "AscendC kernel binaries cannot run on the simulated CANN runtime (no NPU executes their code)",
    ))
}

#[no_mangle]
pub extern "C" fn aclrtBinaryLoadFromFile(
    _path: *const c_char,
    _options: *mut c_void,
    _handle: *mut *mut c_void,
) -> i32 {
    api("aclrtBinaryLoadFromFile", refuse)
}

#[no_mangle]
pub extern "C" fn aclrtBinaryLoadFromData(
    _data: *const c_void,
    _length: usize,
    _options: *const c_void,
    _handle: *mut *mut c_void,
) -> i32 {
    api("aclrtBinaryLoadFromData", refuse)
}
