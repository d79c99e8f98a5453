//! HCCL (`hccl.h`): root info, communicators (ranks as threads of this process, each on its own
//! simulated NPU), the collectives with HCCL's dtypes and reductions (no average), send and
//! receive, `HcclBatchSendRecv`, all-to-all(v), the asynchronous error query and destroy, on the
//! core's in-process ranks (`unihal_sim::ccl`): each operation is a gate on the ACL stream, as
//! the NCCL face's are. HCCL has no abort call, and neither has this face.
//!
//! `HcclCommInitRootInfo` blocks until every rank arrived, at most the simulator's watchdog
//! (`HCCL_E_TIMEOUT` naming the missing ranks); the caller's current context decides the device,
//! as torch_npu sets the device first. Operations whose ranks disagree (kind, dtype, count,
//! reduction, root) fail on every rank. Not simulated: `HcclGroupStart`/`HcclGroupEnd`,
//! `HcclBarrier`, the config-taking init, and the 8-bit float and 128-bit types.

use crate::conv::*;
use crate::runtime::sim;
use crate::{entry, Err};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::{Arc, OnceLock};
use unihal_sim::ccl::{fresh_id, Collective, Comm, CommError, Kind, P2p, Queued, Registry};
use unihal_sim::{SimError, StreamId};

/// `HCCL_ROOT_INFO_BYTES`.
pub const ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: opaque bytes, passed by pointer.
#[repr(C)]
pub struct HcclRootInfo {
    pub internal: [c_char; ROOT_INFO_BYTES],
}

/// `HcclSendRecvItem`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HcclSendRecvItem {
    /// `HCCL_SEND` = 0, `HCCL_RECV` = 1.
    pub send_recv_type: i32,
    pub buf: *mut c_void,
    pub count: u64,
    pub data_type: i32,
    pub remote_rank: u32,
}

/// Marks root infos made by this simulator.
const MAGIC: &[u8; 16] = b"unihal-sim-hccl\0";

/// A communicator handle's target: the rank and its queued operations.
struct HcclComm {
    comm: Comm,
    queued: Queued,
}

impl std::ops::Deref for HcclComm {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.comm
    }
}

struct Globals {
    registry: Registry,
    comms: Mutex<HashMap<usize, Arc<HcclComm>>>,
    next: Mutex<usize>,
}

fn globals() -> &'static Globals {
    static G: OnceLock<Globals> = OnceLock::new();
    G.get_or_init(|| Globals {
        registry: Registry::new(),
        comms: Mutex::new(HashMap::new()),
        next: Mutex::new(0x4cc1_0000),
    })
}

fn hccl(name: &str, f: impl FnOnce() -> Result<(), Err>) -> i32 {
    entry(name, HCCL_E_INTERNAL, f)
}

fn code_of(e: &SimError) -> i32 {
    match e {
        SimError::Timeout(_) => HCCL_E_TIMEOUT,
        SimError::InvalidValue(_) | SimError::InvalidUsage(_) | SimError::Capture(..) => {
            HCCL_E_PARA
        }
        SimError::OutOfMemory { .. } => HCCL_E_MEMORY,
        SimError::InvalidHandle(_) => HCCL_E_PTR,
        _ => HCCL_E_INTERNAL,
    }
}

fn err(e: SimError) -> Err {
    Err::new(code_of(&e), e.to_string())
}

fn comm(h: *mut c_void) -> Result<Arc<HcclComm>, Err> {
    globals()
        .comms
        .lock()
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| {
            Err::new(
                HCCL_E_PTR,
                format!("communicator {h:p} does not exist (destroyed?)"),
            )
        })
}

/// The stream's core id; it must be on the communicator's device.
fn stream_of(c: &Comm, stream: *mut c_void) -> Result<StreamId, Err> {
    let s = sim().map_err(|e| Err::new(HCCL_E_RUNTIME, e.msg))?;
    let (dev, id) = s
        .core_stream(stream)
        .map_err(|e| Err::new(HCCL_E_RUNTIME, e.msg))?;
    if !Arc::ptr_eq(&dev, c.device()) {
        return Err(Err::new(
            HCCL_E_PARA,
            "the stream is not on the communicator's device",
        ));
    }
    Ok(id)
}

fn dtype(t: i32) -> Result<unihal_hal::DType, Err> {
    dtype_of_hccl(t).ok_or_else(|| Err::new(HCCL_E_NOT_SUPPORT, format!("HcclDataType {t}")))
}

fn op(o: i32) -> Result<unihal_hal::ReduceOp, Err> {
    reduce_of_hccl(o).ok_or_else(|| {
        Err::new(
            HCCL_E_PARA,
            format!("HcclReduceOp {o} (SUM, PROD, MAX, MIN)"),
        )
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRootInfo(root: *mut HcclRootInfo) -> i32 {
    hccl("HcclGetRootInfo", || {
        if root.is_null() {
            return Err(Err::new(HCCL_E_PTR, "NULL root info"));
        }
        let mut bytes = [0u8; ROOT_INFO_BYTES];
        bytes[..16].copy_from_slice(MAGIC);
        bytes[16..32].copy_from_slice(&fresh_id());
        // SAFETY: checked non-null; the caller's 4108-byte struct.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), root as *mut u8, ROOT_INFO_BYTES) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclCommInitRootInfo(
    nranks: u32,
    root: *const HcclRootInfo,
    rank: u32,
    out: *mut *mut c_void,
) -> i32 {
    hccl("HcclCommInitRootInfo", || {
        let s = sim().map_err(|e| Err::new(HCCL_E_RUNTIME, e.msg))?;
        if root.is_null() || out.is_null() {
            return Err(Err::new(
                HCCL_E_PTR,
                "NULL root info or communicator pointer",
            ));
        }
        // SAFETY: checked non-null; the caller's 4108-byte struct.
        let bytes = unsafe { std::slice::from_raw_parts(root as *const u8, ROOT_INFO_BYTES) };
        if &bytes[..16] != MAGIC {
            return Err(Err::new(
                HCCL_E_PARA,
                "the root info was not made by HcclGetRootInfo",
            ));
        }
        let (_, ctx) = s.context().map_err(|e| Err::new(HCCL_E_RUNTIME, e.msg))?;
        let dev = s.face.dev(ctx.device as i64).map_err(Err::from)?.clone();
        let c = globals()
            .registry
            .init_rank(
                &bytes[..32],
                nranks as usize,
                rank as usize,
                dev,
                s.face.watchdog,
            )
            .map_err(err)?;
        let g = globals();
        let h = {
            let mut n = g.next.lock();
            *n += 16;
            *n
        };
        g.comms.lock().insert(
            h,
            Arc::new(HcclComm {
                comm: c,
                queued: Queued::default(),
            }),
        );
        // SAFETY: checked non-null; the caller's out-pointer.
        unsafe { out.write(h as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn HcclCommDestroy(h: *mut c_void) -> i32 {
    hccl("HcclCommDestroy", || {
        let c = globals()
            .comms
            .lock()
            .remove(&(h as usize))
            .ok_or_else(|| Err::new(HCCL_E_PTR, format!("communicator {h:p}")))?;
        // This communicator's queued operations finish first (bounded by the watchdog), as a
        // destroy must not free what the device still uses; other work is not waited for.
        c.queued.drain(c.device());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRankSize(h: *mut c_void, n: *mut u32) -> i32 {
    hccl("HcclGetRankSize", || {
        let c = comm(h)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { crate::out(n, c.nranks() as u32) }.map_err(|e| Err::new(HCCL_E_PTR, e.msg))
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetRankId(h: *mut c_void, r: *mut u32) -> i32 {
    hccl("HcclGetRankId", || {
        let c = comm(h)?;
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { crate::out(r, c.rank() as u32) }.map_err(|e| Err::new(HCCL_E_PTR, e.msg))
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclGetCommAsyncError(h: *mut c_void, e: *mut i32) -> i32 {
    hccl("HcclGetCommAsyncError", || {
        let c = comm(h)?;
        let code = match c.error() {
            None => HCCL_SUCCESS,
            Some(CommError::Failed(SimError::Timeout(_))) => HCCL_E_TIMEOUT,
            Some(CommError::PeerAborted(_) | CommError::PeerExited { .. }) => HCCL_E_REMOTE,
            Some(_) => HCCL_E_INTERNAL,
        };
        // SAFETY: `out` refuses a null out-pointer; a non-null one is the caller's.
        unsafe { crate::out(e, code) }.map_err(|e| Err::new(HCCL_E_PTR, e.msg))
    })
}

#[no_mangle]
pub extern "C" fn HcclGetErrorString(code: i32) -> *const c_char {
    hccl_string(code).as_ptr()
}

fn collective(
    h: *mut c_void,
    stream: *mut c_void,
    kind: Kind,
    t: i32,
    count: u64,
    send: *const c_void,
    recv: *mut c_void,
) -> Result<(), Err> {
    let c = comm(h)?;
    let id = stream_of(&c, stream)?;
    let call = Collective {
        kind,
        dtype: dtype(t)?,
        count,
        send: send as u64,
        recv: recv as u64,
    };
    c.collective(id, call).map_err(err)?;
    c.queued.track(c.device(), id);
    Ok(())
}

#[no_mangle]
pub extern "C" fn HcclAllReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    t: i32,
    o: i32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclAllReduce", || {
        collective(h, stream, Kind::AllReduce(op(o)?), t, count, send, recv)
    })
}

#[no_mangle]
pub extern "C" fn HcclBroadcast(
    buf: *mut c_void,
    count: u64,
    t: i32,
    root: u32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclBroadcast", || {
        collective(
            h,
            stream,
            Kind::Broadcast {
                root: root as usize,
            },
            t,
            count,
            buf,
            buf,
        )
    })
}

#[no_mangle]
pub extern "C" fn HcclReduce(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    t: i32,
    o: i32,
    root: u32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclReduce", || {
        collective(
            h,
            stream,
            Kind::Reduce {
                op: op(o)?,
                root: root as usize,
            },
            t,
            count,
            send,
            recv,
        )
    })
}

#[no_mangle]
pub extern "C" fn HcclAllGather(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    t: i32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclAllGather", || {
        collective(h, stream, Kind::AllGather, t, count, send, recv)
    })
}

#[no_mangle]
pub extern "C" fn HcclReduceScatter(
    send: *mut c_void,
    recv: *mut c_void,
    count: u64,
    t: i32,
    o: i32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclReduceScatter", || {
        collective(h, stream, Kind::ReduceScatter(op(o)?), t, count, send, recv)
    })
}

#[no_mangle]
pub extern "C" fn HcclAlltoAll(
    send: *const c_void,
    send_count: u64,
    send_type: i32,
    recv: *const c_void,
    recv_count: u64,
    recv_type: i32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclAlltoAll", || {
        if send_count != recv_count || send_type != recv_type {
            return Err(Err::new(
                HCCL_E_PARA,
                "send and receive counts and types must agree",
            ));
        }
        collective(
            h,
            stream,
            Kind::AllToAll,
            send_type,
            send_count,
            send,
            recv as *mut c_void,
        )
    })
}

fn group(h: *mut c_void, stream: *mut c_void, calls: Vec<P2p>) -> Result<(), Err> {
    let c = comm(h)?;
    let id = stream_of(&c, stream)?;
    c.group(id, &calls).map_err(err)?;
    c.queued.track(c.device(), id);
    Ok(())
}

#[no_mangle]
pub extern "C" fn HcclSend(
    buf: *mut c_void,
    count: u64,
    t: i32,
    dest: u32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclSend", || {
        let call = P2p::Send {
            peer: dest as usize,
            addr: buf as u64,
            count,
            dtype: dtype(t)?,
        };
        group(h, stream, vec![call])
    })
}

#[no_mangle]
pub extern "C" fn HcclRecv(
    buf: *mut c_void,
    count: u64,
    t: i32,
    src: u32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclRecv", || {
        let call = P2p::Recv {
            peer: src as usize,
            addr: buf as u64,
            count,
            dtype: dtype(t)?,
        };
        group(h, stream, vec![call])
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclBatchSendRecv(
    items: *mut HcclSendRecvItem,
    n: u32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclBatchSendRecv", || {
        if items.is_null() && n > 0 {
            return Err(Err::new(HCCL_E_PTR, "NULL items"));
        }
        let list = if n == 0 {
            &[][..]
        } else {
            // SAFETY: non-null, `n` items (the caller's contract).
            unsafe { std::slice::from_raw_parts(items, n as usize) }
        };
        let calls = list
            .iter()
            .map(|i| {
                let (peer, addr, count, dtype) = (
                    i.remote_rank as usize,
                    i.buf as u64,
                    i.count,
                    dtype(i.data_type)?,
                );
                match i.send_recv_type {
                    0 => Ok(P2p::Send {
                        peer,
                        addr,
                        count,
                        dtype,
                    }),
                    1 => Ok(P2p::Recv {
                        peer,
                        addr,
                        count,
                        dtype,
                    }),
                    t => Err(Err::new(HCCL_E_PARA, format!("HcclSendRecvType {t}"))),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        group(h, stream, calls)
    })
}

#[no_mangle]
pub unsafe extern "C" fn HcclAlltoAllV(
    send: *const c_void,
    send_counts: *const c_void,
    sdispls: *const c_void,
    send_type: i32,
    recv: *const c_void,
    recv_counts: *const c_void,
    rdispls: *const c_void,
    recv_type: i32,
    h: *mut c_void,
    stream: *mut c_void,
) -> i32 {
    hccl("HcclAlltoAllV", || {
        let c = comm(h)?;
        if send_type != recv_type {
            return Err(Err::new(HCCL_E_PARA, "send and receive types must agree"));
        }
        let dt = dtype(send_type)?;
        let n = c.nranks();
        if [send_counts, sdispls, recv_counts, rdispls]
            .iter()
            .any(|p| p.is_null())
        {
            return Err(Err::new(HCCL_E_PTR, "NULL counts or displacements"));
        }
        // SAFETY: each is an array of `nranks` uint64_t (HCCL's contract), checked non-null.
        let arr =
            |p: *const c_void| unsafe { std::slice::from_raw_parts(p as *const u64, n) }.to_vec();
        let (sc, sd, rc, rd) = (
            arr(send_counts),
            arr(sdispls),
            arr(recv_counts),
            arr(rdispls),
        );
        let esize = dt.size() as u64;
        // Saturating: an absurd count or displacement gives an address or size outside every
        // allocation, which the core refuses (never an overflow).
        let at =
            |base: *const c_void, d: u64| (base as u64).saturating_add(d.saturating_mul(esize));
        let me = c.rank();
        let mut calls = Vec::new();
        for j in 0..n {
            if j == me {
                continue;
            }
            calls.push(P2p::Send {
                peer: j,
                addr: at(send, sd[j]),
                count: sc[j],
                dtype: dt,
            });
            calls.push(P2p::Recv {
                peer: j,
                addr: at(recv, rd[j]),
                count: rc[j],
                dtype: dt,
            });
        }
        if sc[me] != rc[me] {
            return Err(Err::new(
                HCCL_E_PARA,
                "this rank's send and receive counts to itself differ",
            ));
        }
        let id = stream_of(&c, stream)?;
        if sc[me] > 0 {
            let s = sim().map_err(|e| Err::new(HCCL_E_RUNTIME, e.msg))?;
            unihal_sim::gpu::ops::copy_d2d(
                s.face,
                at(recv, rd[me]),
                at(send, sd[me]),
                sc[me].saturating_mul(esize) as usize,
                id.0 as *mut c_void,
            )
            .map_err(|f| Err::new(HCCL_E_PARA, format!("{f:?}")))?;
        }
        c.group(id, &calls).map_err(err)?;
        c.queued.track(c.device(), id);
        Ok(())
    })
}
