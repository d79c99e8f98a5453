//! The NCCL C API, opened at run time: the one place its symbols are declared (written from
//! NVIDIA's nccl.h documentation). The same table serves RCCL (same names and signatures, another
//! library): all-to-all is resolved under the flavor's spelling first, then the other
//! (`ncclAlltoAll` on NVIDIA >= 2.28.3, `ncclAllToAll` on RCCL) and is optional, as is
//! `ncclCommSplit` (NCCL >= 2.18).

use crate::engine::Flavor;
use std::ffi::{c_char, c_int, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

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

pub type Coll =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
pub type Gather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int;
pub type Rooted =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
pub type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    Stream,
) -> c_int;
pub type P2p = unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
/// `ncclCommSplit(comm, color, key, newcomm*, config* /* NULL: the parent's */)`.
pub type Split = unsafe extern "C" fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int;

/// `NCCL_SPLIT_NOCOLOR`: the rank joins no communicator of the split.
pub const SPLIT_NOCOLOR: c_int = -1;

/// The resolved entry points (function pointers valid for the whole process: the library is
/// never unloaded).
pub struct Nccl {
    /// The flavor's label for messages and errors ("NCCL", "RCCL").
    pub label: &'static str,
    /// Where it was found.
    pub path: String,
    /// The all-to-all entry point resolved, if any.
    pub all_to_all_name: Option<&'static str>,
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

impl Nccl {
    /// Opens the flavor's library: its override variable if set, else its candidates.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] with every name tried and why, or a missing
    /// required symbol.
    pub fn load(flavor: &Flavor) -> Result<Nccl> {
        let lib = Library::open(&flavor.candidates())?;
        Nccl::resolve(flavor, &lib)
    }

    /// Resolves the symbol table from an opened library.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] naming a missing required symbol.
    pub fn resolve(flavor: &Flavor, lib: &Library) -> Result<Nccl> {
        // SAFETY: each type is the signature of the symbol of that name in nccl.h (and rccl.h).
        unsafe {
            let all_to_all = lib.first_of::<Gather>(&flavor.all_to_all);
            Ok(Nccl {
                get_version: lib.get("ncclGetVersion")?,
                get_unique_id: lib.get("ncclGetUniqueId")?,
                comm_init_rank: lib.get("ncclCommInitRank")?,
                comm_init_all: lib.get("ncclCommInitAll")?,
                comm_destroy: lib.get("ncclCommDestroy")?,
                comm_abort: lib.get("ncclCommAbort")?,
                comm_get_async_error: lib.get("ncclCommGetAsyncError")?,
                comm_count: lib.get("ncclCommCount")?,
                comm_user_rank: lib.get("ncclCommUserRank")?,
                get_error_string: lib.get("ncclGetErrorString")?,
                get_last_error: lib.optional("ncclGetLastError"),
                group_start: lib.get("ncclGroupStart")?,
                group_end: lib.get("ncclGroupEnd")?,
                all_reduce: lib.get("ncclAllReduce")?,
                broadcast: lib.get("ncclBroadcast")?,
                reduce: lib.get("ncclReduce")?,
                all_gather: lib.get("ncclAllGather")?,
                reduce_scatter: lib.get("ncclReduceScatter")?,
                send: lib.get("ncclSend")?,
                recv: lib.get("ncclRecv")?,
                all_to_all: all_to_all.map(|(f, _)| f),
                all_to_all_name: all_to_all.map(|(_, n)| n),
                comm_split: lib.optional("ncclCommSplit"),
                label: flavor.label,
                path: lib.path().to_string(),
            })
        }
    }

    /// The version as `major.minor.patch` (from [`Nccl::version`]).
    pub fn version_string(&self) -> String {
        let v = self.version();
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }

    /// `ncclGetVersion` (e.g. 23007 for 2.30.7).
    pub fn version(&self) -> i32 {
        let mut v = 0;
        // SAFETY: an out-pointer to a local.
        unsafe { (self.get_version)(&mut v) };
        v
    }
}
