//! The C test controls every simulated library exports over the core's [`crate::fault`]:
//! injected failures and recorded violations.
//!
//! * `unihal_sim_fail(name, n, code)`: the calling thread's `n`th call (from now) of entry point
//!   `name` (any export of the face, e.g. `cuEventCreate`, `hipEventCreateWithFlags`,
//!   `ncclCommGetAsyncError`) returns `code`, any number, also one the vendor's header does not
//!   list; `unihal_sim_fail_clear()` disarms them.
//!   `UNIHAL_SIM_FAIL=name:n:code,...` arms failures process-wide.
//! * sweeps: `unihal_sim_fail_any_thread(name, n, code)` (the `n`th call from any thread),
//!   `unihal_sim_fail_any_thread_clear()` (returns how many had not fired),
//!   `unihal_sim_count_calls(on)`, `unihal_sim_calls(buf, len)` (`name count` lines),
//!   `unihal_sim_live(out[5])` (allocations, bytes, streams, events, modules alive).
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

/// Arms a failure for calls from any thread: the `n`th call in this process (from now, 1 = the
/// next) of entry point `name` returns `code`. Returns 0, or 1 for a null or non-UTF-8 name or
/// `n == 0`.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_fail_any_thread(
    name: *const c_char,
    n: c_uint,
    code: c_int,
) -> c_int {
    if name.is_null() {
        return 1;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
        return 1;
    };
    match fault::arm_process(name, n, code) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Disarms the failures armed for any thread; returns how many had not fired.
#[no_mangle]
pub extern "C" fn unihal_sim_fail_any_thread_clear() -> c_uint {
    fault::clear_process() as c_uint
}

/// Starts (non-zero, from zero) or stops (0) counting the calls of every entry point.
#[no_mangle]
pub extern "C" fn unihal_sim_count_calls(on: c_int) {
    fault::count_calls(on != 0);
}

/// Writes the counted calls as `name count` lines into `buf` (at most `len` bytes, NUL
/// included, cut at a line end); returns the bytes the whole text needs, NUL included.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_calls(buf: *mut c_char, len: usize) -> usize {
    let text: String = fault::calls()
        .iter()
        .map(|(name, n)| format!("{name} {n}\n"))
        .collect();
    if !buf.is_null() && len > 0 {
        let fits = if text.len() < len {
            text.len()
        } else {
            text[..len - 1].rfind('\n').map_or(0, |i| i + 1)
        };
        // SAFETY: `buf` holds `len` bytes (the caller's contract); `fits + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, fits);
            *buf.add(fits) = 0;
        }
    }
    text.len() + 1
}

/// Writes the objects alive in this process (allocations, bytes, streams, events, modules) to
/// `out[0..5]`; returns 0, or 1 for a null `out`.
///
/// # Safety
/// `out` is null or valid for writes of 5 `i64`.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_live(out: *mut i64) -> c_int {
    if out.is_null() {
        return 1;
    }
    let v = fault::live();
    // SAFETY: `out` holds 5 `i64` (the caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 5) };
    0
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
