//! HCCL's C API, opened at run time: the one place its symbols are declared, written from the
//! facts sheet's section 2 (HCCL's `hccl.h` and `hccl_types.h`; no vendor header is copied).
//!
//! `HcclComm` is a pointer and `HcclRootInfo` 4108 opaque bytes passed by pointer; counts are
//! `uint64_t`, ranks `uint32_t`, streams `aclrtStream`; `HcclDataType`, `HcclReduceOp` and
//! `HcclResult` are C enums (`int`). The all-to-all entries, `HcclBatchSendRecv` (grouped sends
//! and receives) and `HcclGetErrorString` are optional: older HCCLs lack some of them.

use std::ffi::{c_char, c_void};
use unihal_dynlib::Library;
use unihal_hal::Result;

/// `HCCL_ROOT_INFO_BYTES`.
pub const ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: opaque bytes, passed by pointer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RootInfo {
    pub internal: [c_char; ROOT_INFO_BYTES],
}

impl RootInfo {
    /// All zero (what `HcclGetRootInfo` fills).
    pub fn zeroed() -> Box<RootInfo> {
        Box::new(RootInfo {
            internal: [0; ROOT_INFO_BYTES],
        })
    }

    /// The bytes, as a unique id carries them.
    pub fn bytes(&self) -> Vec<u8> {
        self.internal.iter().map(|&c| c as u8).collect()
    }

    /// From a unique id's bytes (`None` unless exactly [`ROOT_INFO_BYTES`] long).
    pub fn from_bytes(b: &[u8]) -> Option<Box<RootInfo>> {
        if b.len() != ROOT_INFO_BYTES {
            return None;
        }
        let mut r = RootInfo::zeroed();
        for (d, &s) in r.internal.iter_mut().zip(b) {
            *d = s as c_char;
        }
        Some(r)
    }
}

/// `HcclComm`.
pub type Comm = *mut c_void;
/// `aclrtStream`.
pub type Stream = *mut c_void;

/// `HcclSendRecvType`: `HCCL_SEND`.
pub const SEND: i32 = 0;
/// `HcclSendRecvType`: `HCCL_RECV`.
pub const RECV: i32 = 1;

/// `HcclSendRecvItem`: one send or receive of `HcclBatchSendRecv`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SendRecvItem {
    /// [`SEND`] or [`RECV`].
    pub send_recv_type: i32,
    pub buf: *mut c_void,
    pub count: u64,
    pub data_type: i32,
    pub remote_rank: u32,
}

/// `HcclAllReduce(sendBuf, recvBuf, count, dataType, op, comm, stream)`.
pub type AllReduce =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, i32, i32, Comm, Stream) -> i32;
/// `HcclBroadcast(buf, count, dataType, root, comm, stream)`: in place only.
pub type Broadcast = unsafe extern "C" fn(*mut c_void, u64, i32, u32, Comm, Stream) -> i32;
/// `HcclReduce(sendBuf, recvBuf, count, dataType, op, root, comm, stream)`.
pub type Reduce =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, i32, i32, u32, Comm, Stream) -> i32;
/// `HcclAllGather(sendBuf, recvBuf, sendCount, dataType, comm, stream)`.
pub type AllGather = unsafe extern "C" fn(*mut c_void, *mut c_void, u64, i32, Comm, Stream) -> i32;
/// `HcclReduceScatter(sendBuf, recvBuf, recvCount, dataType, op, comm, stream)`.
pub type ReduceScatter =
    unsafe extern "C" fn(*mut c_void, *mut c_void, u64, i32, i32, Comm, Stream) -> i32;
/// `HcclSend(sendBuf, count, dataType, destRank, comm, stream)` and `HcclRecv(recvBuf, count,
/// dataType, srcRank, comm, stream)`.
pub type P2p = unsafe extern "C" fn(*mut c_void, u64, i32, u32, Comm, Stream) -> i32;
/// `HcclAlltoAll(sendBuf, sendCount, sendType, recvBuf, recvCount, recvType, comm, stream)`.
pub type AlltoAll =
    unsafe extern "C" fn(*const c_void, u64, i32, *const c_void, u64, i32, Comm, Stream) -> i32;
/// `HcclAlltoAllV(sendBuf, sendCounts, sdispls, sendType, recvBuf, recvCounts, rdispls,
/// recvType, comm, stream)`: counts and displacements are `uint64_t[nranks]` in elements.
pub type AlltoAllV = unsafe extern "C" fn(
    *const c_void,
    *const c_void,
    *const c_void,
    i32,
    *const c_void,
    *const c_void,
    *const c_void,
    i32,
    Comm,
    Stream,
) -> i32;
/// `HcclBatchSendRecv(items, itemNum, comm, stream)`.
pub type BatchSendRecv = unsafe extern "C" fn(*mut SendRecvItem, u32, Comm, Stream) -> i32;

/// HCCL, opened: where it came from and its entry points (`Deref` to [`HcclApi`]).
pub struct Hccl {
    /// Where it was opened from.
    pub path: String,
    api: HcclApi,
}

impl std::ops::Deref for Hccl {
    type Target = HcclApi;
    fn deref(&self) -> &HcclApi {
        &self.api
    }
}

unihal_dynlib::symbol_table! {
    /// The resolved entry points (valid for the whole process: the library is never unloaded).
    pub struct HcclApi;
    required {
        get_root_info = "HcclGetRootInfo": unsafe extern "C" fn(*mut RootInfo) -> i32;
        comm_init_root_info = "HcclCommInitRootInfo": unsafe extern "C" fn(u32, *const RootInfo, u32, *mut Comm) -> i32;
        comm_destroy = "HcclCommDestroy": unsafe extern "C" fn(Comm) -> i32;
        get_rank_size = "HcclGetRankSize": unsafe extern "C" fn(Comm, *mut u32) -> i32;
        get_rank_id = "HcclGetRankId": unsafe extern "C" fn(Comm, *mut u32) -> i32;
        get_comm_async_error = "HcclGetCommAsyncError": unsafe extern "C" fn(Comm, *mut i32) -> i32;
        all_reduce = "HcclAllReduce": AllReduce;
        broadcast = "HcclBroadcast": Broadcast;
        reduce = "HcclReduce": Reduce;
        all_gather = "HcclAllGather": AllGather;
        reduce_scatter = "HcclReduceScatter": ReduceScatter;
        send = "HcclSend": P2p;
        recv = "HcclRecv": P2p;
    }
    optional {
        get_error_string = "HcclGetErrorString": unsafe extern "C" fn(i32) -> *const c_char;
        all_to_all = "HcclAlltoAll": AlltoAll;
        /// Resolved for completeness; the engine's `all_to_allv` is one `HcclBatchSendRecv`, matched
        /// like every other send and receive.
        all_to_allv = "HcclAlltoAllV": AlltoAllV;
        batch_send_recv = "HcclBatchSendRecv": BatchSendRecv;
    }
}

impl Hccl {
    /// Opens HCCL: `UNIHAL_HCCL_LIB` alone when set, else `libhccl.so` next to the ACL runtime,
    /// through the system loader and under the CANN install roots ([`crate::loader::candidates`]).
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] with every path tried and why, or a missing
    /// required symbol.
    pub fn load() -> Result<Hccl> {
        let near = crate::loader::cann().ok().and_then(|c| c.lib64.as_deref());
        let lib = Library::open(&crate::loader::candidates(crate::loader::Role::Hccl, near))?;
        Ok(Hccl {
            path: lib.path().to_string(),
            api: HcclApi::new(&lib)?,
        })
    }
}
