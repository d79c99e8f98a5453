//! The C test controls every simulated library exports over the core's [`crate::fault`]:
//! injected failures and recorded violations.
//!
//! * `unihal_sim_fail(name, n, code)`: the calling thread's `n`th call (from now) of entry point
//!   `name` (any export of the face, e.g. `cuEventCreate`, `hipEventCreateWithFlags`,
//!   `ncclCommGetAsyncError`) returns `code`, any number, also one the vendor's header does not
//!   list; `unihal_sim_fail_clear()` disarms them.
//!   `UNIHAL_SIM_FAIL=name:n:code,...` arms failures process-wide.
//! * `unihal_sim_violations()` and `unihal_sim_last_violation(buf, len)`: misuse the simulator
//!   refused and recorded (a driver call from a host function, an NCCL communicator used after
//!   abort or by two threads at once).

use crate::fault;
use std::ffi::{c_char, c_int, c_uint, CStr};

/// Arms a failure for the calling thread: its `n`th call (from now, 1 = the next) of entry point
/// `name` returns `code` without running. Returns 0, or 1 for a null or non-UTF-8 name or `n == 0`.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_fail(name: *const c_char, n: c_uint, code: c_int) -> c_int {
    if name.is_null() {
        return 1;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
        return 1;
    };
    match fault::arm_thread(name, n, code) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Disarms the calling thread's failures.
#[no_mangle]
pub extern "C" fn unihal_sim_fail_clear() {
    fault::clear_thread();
}

/// How many violations were recorded in this process.
#[no_mangle]
pub extern "C" fn unihal_sim_violations() -> c_uint {
    fault::violations()
}

/// Copies the latest violation's message into `buf` (at most `len` bytes, NUL included); returns
/// the number of violations recorded.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_last_violation(buf: *mut c_char, len: usize) -> c_uint {
    if !buf.is_null() && len > 0 {
        let msg = fault::last_violation();
        let n = msg.len().min(len - 1);
        // SAFETY: `buf` holds `len` bytes (the caller's contract); `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
    }
    fault::violations()
}
