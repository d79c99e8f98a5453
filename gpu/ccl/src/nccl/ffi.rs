//! The NCCL C API, opened at run time: the one place its symbols are declared (written from
//! NVIDIA's nccl.h documentation). The same table serves RCCL (same names and signatures, another
//! library): all-to-all is resolved under the flavor's spelling first, then the other
//! (`ncclAlltoAll` on NVIDIA >= 2.28.3, `ncclAllToAll` on RCCL) and is optional, as is
//! `ncclCommSplit` (NCCL >= 2.18).

use super::Flavor;
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

/// A library of the NCCL API, opened: its flavor's label, where it came from, the all-to-all
/// spelling it has, and its entry points (`Deref` to [`NcclApi`]).
pub struct Nccl {
    /// The flavor's label for messages and errors ("NCCL", "RCCL").
    pub label: &'static str,
    /// Where it was found.
    pub path: String,
    /// The all-to-all entry point resolved, if any (two spellings: `ncclAlltoAll`, RCCL's
    /// `ncclAllToAll`).
    pub all_to_all: Option<Gather>,
    /// The spelling of [`Nccl::all_to_all`] found.
    pub all_to_all_name: Option<&'static str>,
    api: NcclApi,
}

impl std::ops::Deref for Nccl {
    type Target = NcclApi;
    fn deref(&self) -> &NcclApi {
        &self.api
    }
}

unihal_dynlib::symbol_table! {
    /// The resolved entry points (function pointers valid for the whole process: the library is
    /// never unloaded).
    pub struct NcclApi;
    required {
        get_version = "ncclGetVersion": unsafe extern "C" fn(*mut c_int) -> c_int;
        get_unique_id = "ncclGetUniqueId": unsafe extern "C" fn(*mut UniqueId) -> c_int;
        comm_init_rank = "ncclCommInitRank": unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int;
        comm_init_all = "ncclCommInitAll": unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int;
        comm_destroy = "ncclCommDestroy": unsafe extern "C" fn(Comm) -> c_int;
        comm_abort = "ncclCommAbort": unsafe extern "C" fn(Comm) -> c_int;
        comm_get_async_error = "ncclCommGetAsyncError": unsafe extern "C" fn(Comm, *mut c_int) -> c_int;
        comm_count = "ncclCommCount": unsafe extern "C" fn(Comm, *mut c_int) -> c_int;
        comm_user_rank = "ncclCommUserRank": unsafe extern "C" fn(Comm, *mut c_int) -> c_int;
        get_error_string = "ncclGetErrorString": unsafe extern "C" fn(c_int) -> *const c_char;
        group_start = "ncclGroupStart": unsafe extern "C" fn() -> c_int;
        group_end = "ncclGroupEnd": unsafe extern "C" fn() -> c_int;
        all_reduce = "ncclAllReduce": Coll;
        broadcast = "ncclBroadcast": Rooted;
        reduce = "ncclReduce": ReduceFn;
        all_gather = "ncclAllGather": Gather;
        reduce_scatter = "ncclReduceScatter": Coll;
        send = "ncclSend": P2p;
        recv = "ncclRecv": P2p;
    }
    optional {
        get_last_error = "ncclGetLastError": unsafe extern "C" fn(Comm) -> *const c_char;
        /// NCCL >= 2.18 and RCCL.
        comm_split = "ncclCommSplit": Split;
    }
}

impl Nccl {
    /// Opens the flavor's library: its override variable if set, else its candidates.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] with every name tried and why, or a missing
    /// required symbol.
    pub fn load(flavor: &Flavor) -> Result<Nccl> {
        let lib = Library::open(&flavor.candidates())?;
        // SAFETY: every spelling's type is `Gather`, the documented C signature of all-to-all.
        let all_to_all = unsafe { lib.first_of::<Gather>(&flavor.all_to_all) };
        Ok(Nccl {
            label: flavor.label,
            path: lib.path().to_string(),
            all_to_all: all_to_all.map(|(f, _)| f),
            all_to_all_name: all_to_all.map(|(_, n)| n),
            api: NcclApi::new(&lib)?,
        })
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
