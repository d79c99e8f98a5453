//! # A simulated Huawei CANN stack: the ACL runtime, the aclnn operators and HCCL
//!
//! Test infrastructure, never a product path. No machine here has an Ascend NPU and CANN's
//! libraries cannot be installed, so this face of the simulator core (`unihal-sim`) implements
//! the parts of CANN that unihal's Ascend backend calls, written from Huawei's documented API
//! (independently of the backend: the two are separate readings of the same documents, and the
//! simulator is the stricter one):
//!
//! * [`runtime`]: `aclInit`/`aclFinalize` (once per process), devices, contexts (one must be
//!   current on the calling thread), device memory with a capacity, pinned host memory, copies
//!   and fills of every documented kind, streams, events (both status queries with their own
//!   enum values; elapsed time only between events that may time), and ACL's error codes with
//!   `aclGetRecentErrMsg`;
//! * [`report`]: host callbacks in stream order, delivered only to a thread subscribed with
//!   `aclrtSubscribeReport` that calls `aclrtProcessReport`;
//! * [`kernel`]: AscendC kernel binaries cannot run here: loading one is an error that says so;
//! * [`nnopbase`] and [`aclnn`]: the descriptor API (`aclCreateTensor` ...) and the two-phase
//!   operators of the op map, computing through unihal's portable kernel library compiled for
//!   the host, with real workspaces and run-once executors; chip tables in [`soc`];
//! * [`hccl`]: HCCL's communicators and collectives on the core's in-process ranks.
//!
//! Built as one shared object, `libunihal_sim_cann.so`. [`layout`] builds the directories a
//! backend loads it from: the real library names of the classic CANN layout (`libascendcl.so`,
//! `libopapi.so`, `libnnopbase.so`, `libhccl.so`) and of the split one (`libacl_rt.so`,
//! `libopapi_math.so`, `libopapi_nn.so`, ...), forwarding libraries that build.rs makes from
//! `symbols.txt`: each exports only its own symbols and jumps into the one object, so that they
//! share one state.
//!
//! Devices are named "unihal simulated Ascend910B NPU N (not an NPU)": nobody mistakes their
//! results for an NPU's.
//!
//! Settings (besides the core's `UNIHAL_SIM_MODE`, `UNIHAL_SIM_DEVICES`, `UNIHAL_SIM_MEMORY`,
//! `UNIHAL_SIM_WATCHDOG_MS`, `UNIHAL_SIM_FAIL`): `UNIHAL_SIM_SOC`, `Ascend910B2` (default, an
//! Atlas A2 part) or `Ascend910A` (the first generation), returned verbatim by
//! `aclrtGetSocName` and choosing the operator × dtype table ([`soc`]).
//!
//! Where Huawei's documentation leaves a behaviour open, the code says what was assumed and why
//! (`docs/conformance/cann-simulated.md` lists every assumption).

#![deny(clippy::undocumented_unsafe_blocks)]
#![allow(non_snake_case)]
#![allow(clippy::missing_safety_doc)]
// every entry point follows its vendor API's contract
// Descriptor handles are dereferenced only under the registry's lock after being found live
// there (executors are never dereferenced: the registry owns them), which is what makes those
// entry points sound for any pointer.
#![allow(clippy::not_unsafe_ptr_arg_deref)]
// Operator helpers take the operator's arguments as the C API lists them.
#![allow(clippy::too_many_arguments)]

pub mod aclnn;
pub mod conv;
pub mod hccl;
pub mod kernel;
pub mod layout;
pub mod nnopbase;
pub mod report;
pub mod runtime;
pub mod soc;
pub mod symbols;

/// Huawei's ACL and HCCL declarations as bindgen reads them from the torch-npu wheel's headers
/// (feature `abi-check`; build.rs): what the ABI tests of this simulator and of the Ascend
/// backend compare their own declarations with. Generated, never edited.
#[cfg(feature = "abi-check")]
#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
pub mod header {
    include!(concat!(env!("OUT_DIR"), "/cann_abi.rs"));
}

/// The C test controls (injected failures, violations), exported from this object.
pub use unihal_sim::fault_c as fault;
/// How backends learn that this runtime is simulated (`unihal_dynlib::SIMULATED_SYMBOL`).
pub use unihal_sim::gpu::unihal_simulated_runtime;

use conv::Err;
use std::cell::RefCell;
use std::ffi::CString;

thread_local! {
    /// The message of the calling thread's most recent failed call (`aclGetRecentErrMsg`).
    static RECENT: RefCell<Option<CString>> = const { RefCell::new(None) };
    /// What the last `aclGetRecentErrMsg` returned (kept alive until the next call).
    static HANDED_OUT: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `msg` as the calling thread's most recent error message.
pub(crate) fn set_recent(msg: String) {
    let text = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    RECENT.with(|r| *r.borrow_mut() = Some(text));
}

/// Runs entry point `name`: injected failures first (`unihal_sim_fail`), a panic becomes
/// `unknown`, and a failure's message is kept for `aclGetRecentErrMsg` (or HCCL's log).
pub(crate) fn entry(name: &str, unknown: i32, f: impl FnOnce() -> Result<(), Err>) -> i32 {
    if let Some(code) = unihal_sim::fault::injected(name) {
        set_recent(format!("{name}: injected failure {code} (unihal_sim_fail)"));
        return code;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_recent(format!("{name}: {} (simulated CANN)", e.msg));
            e.code
        }
        Err(_) => {
            set_recent(format!("{name}: internal error of the simulator"));
            unknown
        }
    }
}

/// An ACL runtime entry point ([`entry`] with `ACL_ERROR_FAILURE` for a panic).
pub(crate) fn api(name: &str, f: impl FnOnce() -> Result<(), Err>) -> i32 {
    entry(name, conv::ACL_ERROR_FAILURE, f)
}

/// Writes `v` through an out-pointer (`ACL_ERROR_INVALID_PARAM` for a null one).
///
/// # Safety
/// `p` is null (an error) or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), Err> {
    if p.is_null() {
        return Err(Err::param("null output pointer"));
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

/// `const char *aclGetRecentErrMsg(void)`: the message of the calling thread's most recent failed
/// call (ACL, aclnn or HCCL), or NULL when there is none; reading it clears it. The text stays
/// valid until this thread's next call of `aclGetRecentErrMsg` (assumed: Huawei documents only
/// "the most recent error message").
#[no_mangle]
pub extern "C" fn aclGetRecentErrMsg() -> *const std::ffi::c_char {
    let msg = RECENT.with(|r| r.borrow_mut().take());
    HANDED_OUT.with(|h| {
        let mut h = h.borrow_mut();
        *h = msg;
        h.as_ref().map_or(std::ptr::null(), |m| m.as_ptr())
    })
}

/// The built simulator (`libunihal_sim_cann.so`) next to the running test executable.
///
/// # Panics
/// When it is not built there (see [`unihal_sim::built_library`]).
pub fn built_library() -> std::path::PathBuf {
    unihal_sim::built_library("libunihal_sim_cann.so")
}
