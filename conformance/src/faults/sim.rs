//! The [`Injector`] of every simulated vendor runtime: the C test controls each simulated
//! library exports (`unihal_sim_fail_any_thread`, `unihal_sim_count_calls`, `unihal_sim_calls`,
//! `unihal_sim_live`; conformance/sim/src/fault_c.rs), found in the already loaded library.

use super::{Code, Injector, Live};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, CString};
use std::path::Path;

/// The codes injected at each entry point, by its library's prefix: an out-of-memory code where
/// the library has one, an internal or system error, and a number no header lists (a backend
/// must not assume a library returns only known codes).
fn codes_for(point: &str) -> Vec<Code> {
    let unlisted = Code::new(424_242, "a code no header lists");
    if point.starts_with("nccl") {
        vec![
            Code::new(2, "ncclSystemError"),
            Code::new(3, "ncclInternalError"),
            Code::new(6, "ncclRemoteError"),
            unlisted,
        ]
    } else if point.starts_with("Hccl") {
        vec![
            Code::new(4, "HCCL_E_INTERNAL"),
            Code::timeout(9, "HCCL_E_TIMEOUT"),
            unlisted,
        ]
    } else if point.starts_with("acl") {
        vec![
            Code::oom(207_001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
            Code::new(507_000, "ACL_ERROR_RT_INTERNAL_ERROR"),
            unlisted,
        ]
    } else if point.starts_with("hip") {
        vec![
            Code::oom(2, "hipErrorOutOfMemory"),
            Code::new(999, "hipErrorUnknown"),
            unlisted,
        ]
    } else if point.starts_with("rocblas") {
        vec![
            Code::new(3, "rocblas_status_memory_error"),
            Code::new(7, "rocblas_status_internal_error"),
            unlisted,
        ]
    } else {
        // The CUDA driver (`cu*`) and anything else.
        vec![
            Code::oom(2, "CUDA_ERROR_OUT_OF_MEMORY"),
            Code::new(999, "CUDA_ERROR_UNKNOWN"),
            unlisted,
        ]
    }
}

/// The controls of one simulated library.
pub struct SimInjector {
    what: String,
    lib: libloading::Library,
    quiesce: Option<fn()>,
}

impl SimInjector {
    /// The controls of the simulated library at `path` (the one the backend loaded: opening it
    /// again gives the same loaded copy). `what` describes it in reports.
    ///
    /// # Errors
    /// The loader's message, or a missing control.
    pub fn open(path: &Path, what: &str) -> Result<SimInjector, String> {
        // SAFETY: a simulated runtime of this repository, already loaded by the backend; its
        // initialisers are benign.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let me = SimInjector {
            what: what.to_string(),
            lib,
            quiesce: None,
        };
        for sym in [
            "unihal_sim_fail_any_thread",
            "unihal_sim_fail_any_thread_clear",
            "unihal_sim_count_calls",
            "unihal_sim_calls",
            "unihal_sim_live",
        ] {
            // SAFETY: only the symbol's presence is checked (as an untyped pointer).
            unsafe { me.lib.get::<*const ()>(sym.as_bytes()) }
                .map_err(|e| format!("{}: no {sym}: {e}", path.display()))?;
        }
        Ok(me)
    }

    /// Runs `f` before every count of live objects: releases the backend deferred (such as the
    /// GPU backends' releases requested on a host-callback thread, which run at the next call)
    /// belong to the handles that dropped, and must have run before the count.
    pub fn with_quiesce(mut self, f: fn()) -> SimInjector {
        self.quiesce = Some(f);
        self
    }

    /// A control of the library, typed as its signature in fault_c.rs.
    fn sym<T: Copy>(&self, name: &str) -> T {
        // SAFETY: `open` checked that every control exists; the caller names the type of its
        // signature in conformance/sim/src/fault_c.rs.
        *unsafe { self.lib.get::<T>(name.as_bytes()) }.expect("checked in open")
    }
}

impl Injector for SimInjector {
    fn describe(&self) -> String {
        self.what.clone()
    }

    fn count_calls(&self, on: bool) {
        let f: unsafe extern "C" fn(c_int) = self.sym("unihal_sim_count_calls");
        // SAFETY: the signature of `unihal_sim_count_calls`.
        unsafe { f(c_int::from(on)) }
    }

    fn calls(&self) -> BTreeMap<String, u64> {
        let f: unsafe extern "C" fn(*mut c_char, usize) -> usize = self.sym("unihal_sim_calls");
        // SAFETY: the signature of `unihal_sim_calls`; a null buffer asks for the length.
        let need = unsafe { f(std::ptr::null_mut(), 0) };
        let mut buf = vec![0u8; need + 64];
        // SAFETY: the signature; `buf` holds `buf.len()` bytes.
        unsafe { f(buf.as_mut_ptr().cast(), buf.len()) };
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end])
            .lines()
            .filter_map(|l| {
                let (name, n) = l.rsplit_once(' ')?;
                Some((name.to_string(), n.parse().ok()?))
            })
            .collect()
    }

    fn arm(&self, point: &str, n: u32, code: i32) {
        let f: unsafe extern "C" fn(*const c_char, c_uint, c_int) -> c_int =
            self.sym("unihal_sim_fail_any_thread");
        let name = CString::new(point).expect("entry point names have no NUL");
        // SAFETY: the signature of `unihal_sim_fail_any_thread`; a NUL-terminated name.
        let r = unsafe { f(name.as_ptr(), n, code) };
        assert_eq!(r, 0, "arming {point}:{n}");
    }

    fn disarm(&self) -> usize {
        let f: unsafe extern "C" fn() -> c_uint = self.sym("unihal_sim_fail_any_thread_clear");
        // SAFETY: the signature of `unihal_sim_fail_any_thread_clear`.
        unsafe { f() as usize }
    }

    fn codes(&self, point: &str) -> Vec<Code> {
        codes_for(point)
    }

    fn live(&self) -> Live {
        if let Some(q) = self.quiesce {
            q();
        }
        let f: unsafe extern "C" fn(*mut i64) -> c_int = self.sym("unihal_sim_live");
        let mut v = [0i64; 5];
        // SAFETY: the signature of `unihal_sim_live`; `v` holds 5 `i64`.
        unsafe { f(v.as_mut_ptr()) };
        Live {
            allocations: v[0],
            bytes: v[1],
            streams: v[2],
            events: v[3],
            modules: v[4],
        }
    }
}
