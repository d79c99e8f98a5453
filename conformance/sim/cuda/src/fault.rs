//! Test controls of the simulated NVIDIA stack: injected failures and recorded violations.
//!
//! **Injected failures.** The `n`th call (1 = the next one) of an entry point, counted from
//! when the failure is armed, returns a chosen code instead of running — any code, including one
//! that `cuda.h` does not list (a backend must not assume the driver returns only known codes).
//! Each armed failure fires once. Two ways to arm one:
//!
//! * `unihal_sim_fail(name, n, code)` (exported C function): for calls made *by the calling
//!   thread* only, so tests running in parallel in one process do not disturb each other;
//!   `unihal_sim_fail_clear()` disarms the calling thread's failures;
//! * `UNIHAL_SIM_FAIL=name:n:code[,name:n:code...]` (read when the library starts): for calls
//!   from any thread, counted process-wide (for the CLI and whole-process tests).
//!
//! Every `cu*` and `nccl*` entry point that returns a result code can be failed this way (by its
//! exported name, e.g. `cuEventCreate`, `cuLaunchHostFunc`, `ncclCommGetAsyncError`).
//!
//! **Violations.** Misuse that the real libraries do not report but that is undefined behaviour
//! there (a driver call from inside a host function, a use of an NCCL communicator after
//! `ncclCommAbort`/`ncclCommDestroy`, two threads inside calls on one communicator at once) is
//! refused with an error code *and* recorded: `unihal_sim_violations()` returns how many were
//! recorded in this process, and `unihal_sim_last_violation(buf, len)` copies the latest
//! message (NUL-terminated, truncated to `len`). Each is also printed to stderr.

use parking_lot::Mutex;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// An armed failure.
struct Armed {
    name: String,
    /// Calls still to let through before failing.
    skip: u32,
    code: i32,
}

thread_local! {
    static THREAD: RefCell<Vec<Armed>> = const { RefCell::new(Vec::new()) };
}

fn process() -> &'static Mutex<Vec<Armed>> {
    static P: OnceLock<Mutex<Vec<Armed>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(parse(&std::env::var("UNIHAL_SIM_FAIL").unwrap_or_default())))
}

/// `name:n:code` items, comma-separated (malformed items are ignored, with a message).
fn parse(spec: &str) -> Vec<Armed> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|item| {
            let parts: Vec<&str> = item.split(':').collect();
            let armed = match parts.as_slice() {
                [name, n, code] => n
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .zip(code.trim().parse::<i32>().ok())
                    .map(|(n, code)| Armed {
                        name: name.trim().to_string(),
                        skip: n - 1,
                        code,
                    }),
                _ => None,
            };
            if armed.is_none() {
                eprintln!("unihal-sim: UNIHAL_SIM_FAIL item {item:?} is not name:n:code");
            }
            armed
        })
        .collect()
}

/// Counts a call of `name` against the armed failures; the code to return if one fires.
fn fire(list: &mut Vec<Armed>, name: &str) -> Option<i32> {
    let i = list.iter().position(|a| a.name == name)?;
    if list[i].skip > 0 {
        list[i].skip -= 1;
        return None;
    }
    Some(list.remove(i).code)
}

/// The injected result of this call of entry point `name`, if a failure fires now.
pub(crate) fn injected(name: &str) -> Option<i32> {
    if let Some(code) = THREAD.with(|t| fire(&mut t.borrow_mut(), name)) {
        return Some(code);
    }
    fire(&mut process().lock(), name)
}

/// Arms a failure for the calling thread: its `n`th call (from now, 1 = the next) of entry point
/// `name` returns `code` without running. Returns 0, or 1 for a null or non-UTF-8 name or `n == 0`.
///
/// # Safety
/// `name` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_fail(name: *const c_char, n: c_uint, code: c_int) -> c_int {
    if name.is_null() || n == 0 {
        return 1;
    }
    // SAFETY: non-null and NUL-terminated (the caller's contract).
    let Ok(name) = unsafe { CStr::from_ptr(name) }.to_str() else {
        return 1;
    };
    THREAD.with(|t| {
        t.borrow_mut().push(Armed {
            name: name.to_string(),
            skip: n - 1,
            code,
        })
    });
    0
}

/// Disarms the calling thread's failures.
#[no_mangle]
pub extern "C" fn unihal_sim_fail_clear() {
    THREAD.with(|t| t.borrow_mut().clear());
}

static VIOLATIONS: AtomicU32 = AtomicU32::new(0);
static LAST_VIOLATION: Mutex<String> = Mutex::new(String::new());

/// Records a violation (see the module docs).
pub(crate) fn violation(msg: String) {
    eprintln!("unihal-sim: VIOLATION: {msg}");
    *LAST_VIOLATION.lock() = msg;
    VIOLATIONS.fetch_add(1, Ordering::SeqCst);
}

/// How many violations were recorded in this process.
#[no_mangle]
pub extern "C" fn unihal_sim_violations() -> c_uint {
    VIOLATIONS.load(Ordering::SeqCst)
}

/// Copies the latest violation's message into `buf` (at most `len` bytes, NUL included); returns
/// the number of violations recorded.
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn unihal_sim_last_violation(buf: *mut c_char, len: usize) -> c_uint {
    if !buf.is_null() && len > 0 {
        let msg = LAST_VIOLATION.lock();
        let n = msg.len().min(len - 1);
        // SAFETY: `buf` holds `len` bytes (the caller's contract); `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
    }
    unihal_sim_violations()
}
