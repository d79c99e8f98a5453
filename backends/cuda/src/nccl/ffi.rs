//! The NCCL C API, opened at run time: the one place its symbols are declared. The same table
//! serves RCCL (same names and signatures, another library): all-to-all is resolved under either
//! spelling (`ncclAlltoAll` on NVIDIA >= 2.28.3, `ncclAllToAll` on RCCL) and is optional, as is
//! `ncclCommSplit` (NCCL >= 2.18).

use std::ffi::{c_char, c_int, c_void};
use unihal_hal::{HalError, Result};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [c_char; 128],
}

/// `ncclComm_t`.
pub type Comm = *mut c_void;
/// `cudaStream_t` / `hipStream_t`.
pub type Stream = *mut c_void;

type Coll =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
type Gather = unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int;
type Rooted =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> c_int;
type P2p = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
/// `ncclCommSplit(comm, color, key, newcomm*, config* /* NULL: the parent's */)`.
type Split = unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int;

/// `NCCL_SPLIT_NOCOLOR`: the rank joins no communicator of the split.
pub const SPLIT_NOCOLOR: c_int = -1;

/// The resolved entry points (function pointers valid while `_lib` is loaded: forever, since it
/// is never unloaded).
pub struct Nccl {
    /// Leaked on purpose: NCCL is never unloaded (its threads, and memory it handed out, may
    /// outlive every handle of ours; unloading it under them is undefined behaviour).
    _lib: &'static libloading::Library,
    /// Where it was found.
    pub path: String,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    pub get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    pub comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int,
    pub comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    pub comm_destroy: unsafe extern "C" fn(Comm) -> c_int,
    pub comm_abort: unsafe extern "C" fn(Comm) -> c_int,
    pub comm_get_async_error: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub comm_count: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub comm_user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    pub get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    pub get_last_error: Option<unsafe extern "C" fn(Comm) -> *const c_char>,
    pub group_start: unsafe extern "C" fn() -> c_int,
    pub group_end: unsafe extern "C" fn() -> c_int,
    pub all_reduce: Coll,
    pub broadcast: Rooted,
    pub reduce: ReduceFn,
    pub all_gather: Gather,
    pub reduce_scatter: Coll,
    pub send: P2p,
    pub recv: P2p,
    pub all_to_all: Option<Gather>,
    /// NCCL >= 2.18 and RCCL.
    pub comm_split: Option<Split>,
}

/// Library names tried after `UNIHAL_NCCL_LIB`.
pub const CANDIDATES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

impl Nccl {
    /// Opens NCCL: `UNIHAL_NCCL_LIB` if set, else the candidates through the system loader.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] with every name tried and why, or a missing symbol.
    pub fn load() -> Result<Nccl> {
        let names: Vec<String> = match std::env::var("UNIHAL_NCCL_LIB") {
            Ok(p) if !p.trim().is_empty() => vec![p.trim().to_string()],
            _ => CANDIDATES.iter().map(|s| s.to_string()).collect(),
        };
        let mut tried = Vec::new();
        for name in &names {
            // SAFETY: loading NCCL runs its initialisers, which are benign.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => return Nccl::resolve(Box::leak(Box::new(lib)), name.clone()),
                Err(e) => tried.push(format!("{name}: {e}")),
            }
        }
        Err(HalError::Unavailable {
            what: "NCCL".into(),
            reason: format!("no NCCL library found ({})", tried.join("; ")),
        })
    }

    fn resolve(lib: &'static libloading::Library, path: String) -> Result<Nccl> {
        /// # Safety
        /// `T` must be the C signature of `name`.
        unsafe fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T> {
            // SAFETY: the caller's contract.
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| HalError::Unavailable {
                    what: "NCCL".into(),
                    reason: format!("symbol {name} missing: {e}"),
                })
        }
        // SAFETY: each type is the signature of the symbol of that name in nccl.h (and rccl.h).
        unsafe {
            Ok(Nccl {
                get_version: sym(lib, "ncclGetVersion")?,
                get_unique_id: sym(lib, "ncclGetUniqueId")?,
                comm_init_rank: sym(lib, "ncclCommInitRank")?,
                comm_init_all: sym(lib, "ncclCommInitAll")?,
                comm_destroy: sym(lib, "ncclCommDestroy")?,
                comm_abort: sym(lib, "ncclCommAbort")?,
                comm_get_async_error: sym(lib, "ncclCommGetAsyncError")?,
                comm_count: sym(lib, "ncclCommCount")?,
                comm_user_rank: sym(lib, "ncclCommUserRank")?,
                get_error_string: sym(lib, "ncclGetErrorString")?,
                get_last_error: sym(lib, "ncclGetLastError").ok(),
                group_start: sym(lib, "ncclGroupStart")?,
                group_end: sym(lib, "ncclGroupEnd")?,
                all_reduce: sym(lib, "ncclAllReduce")?,
                broadcast: sym(lib, "ncclBroadcast")?,
                reduce: sym(lib, "ncclReduce")?,
                all_gather: sym(lib, "ncclAllGather")?,
                reduce_scatter: sym(lib, "ncclReduceScatter")?,
                send: sym(lib, "ncclSend")?,
                recv: sym(lib, "ncclRecv")?,
                all_to_all: sym(lib, "ncclAlltoAll")
                    .or_else(|_| sym(lib, "ncclAllToAll"))
                    .ok(),
                comm_split: sym(lib, "ncclCommSplit").ok(),
                _lib: lib,
                path,
            })
        }
    }

    /// `ncclGetVersion` (e.g. 23007 for 2.30.7).
    pub fn version(&self) -> i32 {
        let mut v = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { (self.get_version)(&mut v) };
        v
    }
}
