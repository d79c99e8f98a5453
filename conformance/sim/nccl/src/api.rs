//! The entry points of the NCCL API (`nccl*`, also what RCCL exports): version, unique ids, communicator init (one rank per call,
//! or all at once), the collectives, point-to-point calls, groups, asynchronous errors, abort and
//! destroy, and `ncclCommSplit` (blocking, outside groups). Ranks are threads of this process (or one thread driving several devices through a
//! group), each on its own simulated device; collectives are queued on the simulated driver's
//! streams (see `unihal_sim::ccl`). Nothing hangs: communicator init and synchronisation fail
//! after `UNIHAL_SIM_WATCHDOG_MS` when peers never come.
//!
//! `ncclCommDestroy` and `ncclCommFinalize` wait for the communicator's queued operations, as
//! NCCL's do (bounded here by the watchdog); `ncclCommAbort` ends them without waiting.
//!
//! Errors come back as `ncclResult_t` codes ([`crate::conv`]) with a message for
//! `ncclGetLastError`. Not simulated: a split inside a group, non-blocking communicators
//! (`ncclCommInitRankConfig`), user-defined reductions and FP8 types.

use crate::conv::*;
use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use unihal_sim::ccl::{fresh_id, Collective, Comm, CommError, Kind, P2p, Queued, Registry};
use unihal_sim::fault;
use unihal_sim::gpu::GpuFace as Sim;
use unihal_sim::{SimError, StreamId};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    pub internal: [c_char; 128],
}

/// Marks ids made by this simulator (the first 16 bytes).
const ID_MAGIC: &[u8; 16] = b"unihal-sim-nccl\0";

/// A communicator handle's target.
struct NcclComm {
    comm: Comm,
    ordinal: usize,
    /// Calls inside this communicator now (more than one at a time is a violation: NCCL
    /// communicators are not thread-safe).
    users: AtomicUsize,
    /// This communicator's queued operations (`ncclCommDestroy` waits for them, as NCCL does).
    queued: Queued,
}

impl NcclComm {
    fn track(&self, s: &Sim, stream: StreamId) {
        self.queued.track(&s.devices[self.ordinal], stream);
    }

    fn drain(&self, s: &Sim) {
        self.queued.drain(&s.devices[self.ordinal]);
    }

    fn forget(&self, s: &Sim) {
        self.queued.forget(&s.devices[self.ordinal]);
    }
}

/// One call inside a communicator: marks it in use until dropped.
struct Using(Arc<NcclComm>);

impl std::ops::Deref for Using {
    type Target = NcclComm;
    fn deref(&self) -> &NcclComm {
        &self.0
    }
}

impl Drop for Using {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Globals {
    registry: Registry,
    comms: Mutex<HashMap<usize, Arc<NcclComm>>>,
    /// Handles released by `ncclCommAbort` or `ncclCommDestroy` (a later use is a violation).
    dead: Mutex<HashSet<usize>>,
    next: Mutex<usize>,
}

fn globals() -> &'static Globals {
    static G: OnceLock<Globals> = OnceLock::new();
    G.get_or_init(|| Globals {
        registry: Registry::new(),
        comms: Mutex::new(HashMap::new()),
        dead: Mutex::new(HashSet::new()),
        next: Mutex::new(0x7c00_0000),
    })
}

/// A failed call: its code and the message `ncclGetLastError` returns.
struct Fail(i32, String);

impl From<SimError> for Fail {
    fn from(e: SimError) -> Fail {
        Fail(code(&e), e.to_string())
    }
}

fn invalid(msg: impl Into<String>) -> Fail {
    Fail(NCCL_INVALID_ARGUMENT, msg.into())
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Runs entry point `name`: an injected failure ([`unihal_sim::fault`]) returns its code
/// instead; a call from a host function is refused (and recorded as a violation: the runtime
/// forbids it, here the device is locked); panics never cross the C boundary; failures record
/// their message.
fn nccl(name: &str, f: impl FnOnce() -> Result<(), Fail>) -> c_int {
    if unihal_sim::gpu::in_host_fn() {
        fault::violation(format!("{name} called from inside a host function"));
        return NCCL_INVALID_USAGE;
    }
    if let Some(code) = fault::injected(name) {
        return code;
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(Fail(NCCL_INTERNAL_ERROR, "panic in the simulator".into())));
    match r {
        Ok(()) => NCCL_SUCCESS,
        Err(Fail(code, msg)) => {
            set_last(&msg);
            code
        }
    }
}

/// Sets what `ncclGetLastError` returns on this thread.
fn set_last(msg: &str) {
    let msg = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = msg);
}

/// The process's GPU face (the library initialises the runtime itself, as NCCL does).
fn started() -> Result<&'static Sim, Fail> {
    unihal_sim::gpu::global()
        .map_err(|e| Fail(NCCL_UNHANDLED_CUDA_ERROR, format!("runtime error: {e}")))
}

/// The calling thread's device, as `cudaGetDevice` gives it (device 0 without a context).
fn current_ordinal(s: &Sim) -> usize {
    s.current().unwrap_or(0)
}

/// How long every call on a communicator holds it (`UNIHAL_SIM_NCCL_CALL_US`, default 0): a
/// test setting that widens the windows in which unserialised uses of one communicator overlap,
/// so that they are detected.
fn call_time() -> std::time::Duration {
    static T: OnceLock<std::time::Duration> = OnceLock::new();
    *T.get_or_init(|| {
        let us = std::env::var("UNIHAL_SIM_NCCL_CALL_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        std::time::Duration::from_micros(us)
    })
}

/// The communicator behind handle `h`, in use by `call` until the result is dropped. A handle
/// already aborted or destroyed, and a second call inside one communicator at the same time, are
/// violations (undefined behaviour with NCCL): recorded, the first refused with
/// `ncclInvalidArgument`.
fn comm(h: *mut c_void, call: &str) -> Result<Using, Fail> {
    let g = globals();
    let found = g.comms.lock().get(&(h as usize)).cloned();
    let Some(k) = found else {
        if g.dead.lock().contains(&(h as usize)) {
            fault::violation(format!(
                "{call} on communicator {h:?} after ncclCommAbort/ncclCommDestroy released it"
            ));
        }
        return Err(invalid(format!(
            "communicator {h:?} is not a live communicator"
        )));
    };
    if k.users.fetch_add(1, Ordering::SeqCst) > 0 {
        fault::violation(format!(
            "{call} on communicator {h:?} while another thread is inside a call on it (NCCL \
             communicators are not thread-safe)"
        ));
    }
    let using = Using(k);
    let t = call_time();
    if !t.is_zero() {
        std::thread::sleep(t);
    }
    Ok(using)
}

/// Releases handle `h` (abort or destroy): later uses are violations.
fn release(h: *mut c_void) {
    let g = globals();
    g.comms.lock().remove(&(h as usize));
    g.dead.lock().insert(h as usize);
}

/// Writes `v` through an out-pointer (a null one is an invalid argument).
///
/// # Safety
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Result<(), Fail> {
    if p.is_null() {
        return Err(invalid(format!("{what} is null")));
    }
    // SAFETY: non-null; the caller's contract.
    unsafe { p.write(v) };
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> c_int {
    // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
    nccl("ncclGetVersion", || unsafe {
        put(version, version_code(), "version")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut ncclUniqueId) -> c_int {
    nccl("ncclGetUniqueId", || {
        let mut v = ncclUniqueId { internal: [0; 128] };
        let bytes: Vec<u8> = ID_MAGIC.iter().chain(&fresh_id()).copied().collect();
        for (d, b) in v.internal.iter_mut().zip(bytes) {
            *d = b as c_char;
        }
        // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { put(id, v, "uniqueId") }
    })
}

#[no_mangle]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    error_string(result).as_ptr()
}

#[no_mangle]
pub extern "C" fn ncclGetLastError(_comm: *mut c_void) -> *const c_char {
    // The pointer stays valid until this thread's next failing call.
    LAST.with(|l| l.borrow().as_ptr())
}

/// One rank's init: join the communicator named by `id` from device `ordinal`.
fn init_rank(
    s: &Sim,
    id: &[u8; 32],
    nranks: c_int,
    rank: c_int,
    ordinal: usize,
) -> Result<usize, Fail> {
    let (Ok(n), Ok(r)) = (usize::try_from(nranks), usize::try_from(rank)) else {
        return Err(invalid(format!("rank {rank} of {nranks}")));
    };
    let device = s.devices[ordinal].clone();
    let comm = globals().registry.init_rank(id, n, r, device, s.watchdog)?;
    Ok(register(comm, ordinal))
}

/// A new handle for `comm`.
fn register(comm: Comm, ordinal: usize) -> usize {
    let g = globals();
    let h = {
        let mut next = g.next.lock();
        *next += 16;
        *next
    };
    g.comms.lock().insert(
        h,
        Arc::new(NcclComm {
            comm,
            ordinal,
            users: AtomicUsize::new(0),
            queued: Queued::default(),
        }),
    );
    h
}

fn id_bytes(id: &ncclUniqueId) -> Result<[u8; 32], Fail> {
    let mut b = [0u8; 32];
    for (d, s) in b.iter_mut().zip(id.internal) {
        *d = s as u8;
    }
    if &b[..16] != ID_MAGIC {
        return Err(invalid(
            "uniqueId was not made by ncclGetUniqueId of this library",
        ));
    }
    Ok(b)
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    out: *mut *mut c_void,
    nranks: c_int,
    id: ncclUniqueId,
    rank: c_int,
) -> c_int {
    nccl("ncclCommInitRank", || {
        let s = started()?;
        if out.is_null() {
            return Err(invalid("comm is null"));
        }
        let key = id_bytes(&id)?;
        let ordinal = current_ordinal(s);
        let init = PendingInit {
            out: out as usize,
            key,
            nranks,
            rank,
            ordinal,
        };
        if in_group() {
            GROUP.with(|g| g.borrow_mut().inits.push(init));
            return Ok(());
        }
        init.run(s)
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommInitAll(
    comms: *mut *mut c_void,
    ndev: c_int,
    devlist: *const c_int,
) -> c_int {
    nccl("ncclCommInitAll", || {
        let s = started()?;
        if comms.is_null() || ndev <= 0 {
            return Err(invalid(format!("comms {comms:?}, ndev {ndev}")));
        }
        let key: Vec<u8> = ID_MAGIC.iter().chain(&fresh_id()).copied().collect();
        let key: [u8; 32] = key.try_into().expect("16 + 16 bytes");
        let mut inits = Vec::with_capacity(ndev as usize);
        for i in 0..ndev as usize {
            let ordinal = if devlist.is_null() {
                i as c_int
            } else {
                // SAFETY: the caller passes `ndev` device numbers.
                unsafe { *devlist.add(i) }
            };
            let ordinal = usize::try_from(ordinal)
                .ok()
                .filter(|&o| o < s.devices.len())
                .ok_or_else(|| invalid(format!("device {ordinal} does not exist")))?;
            inits.push(PendingInit {
                // SAFETY: the caller passes room for `ndev` communicators.
                out: unsafe { comms.add(i) } as usize,
                key,
                nranks: ndev,
                rank: i as c_int,
                ordinal,
            });
        }
        run_inits(s, inits)
    })
}

/// Finalize flushes a communicator's work: it waits for its queued operations.
#[no_mangle]
pub extern "C" fn ncclCommFinalize(c: *mut c_void) -> c_int {
    nccl("ncclCommFinalize", || {
        comm(c, "ncclCommFinalize")?.drain(started()?);
        Ok(())
    })
}

/// Waits for the communicator's queued operations, as NCCL's does (so a destroy with an operation
/// whose peer never comes waits, here up to `UNIHAL_SIM_WATCHDOG_MS`, where NCCL would hang),
/// then releases the handle.
#[no_mangle]
pub extern "C" fn ncclCommDestroy(c: *mut c_void) -> c_int {
    nccl("ncclCommDestroy", || {
        let k = comm(c, "ncclCommDestroy")?;
        k.drain(started()?);
        release(c);
        Ok(())
    })
}

/// Ends the communicator's operations (they fail) without waiting, and releases the handle.
#[no_mangle]
pub extern "C" fn ncclCommAbort(c: *mut c_void) -> c_int {
    nccl("ncclCommAbort", || {
        let k = comm(c, "ncclCommAbort")?;
        k.comm.abort();
        k.forget(started()?);
        release(c);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(c: *mut c_void, err: *mut c_int) -> c_int {
    nccl("ncclCommGetAsyncError", || {
        let k = comm(c, "ncclCommGetAsyncError")?;
        let error = k.comm.error();
        if let Some(CommError::PeerExited { message, .. }) = &error {
            // What ncclGetLastError then says, as NCCL's last warning names the lost peer.
            set_last(message);
        }
        let code = error.map_or(NCCL_SUCCESS, |e| async_code(&e));
        // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
        unsafe { put(err, code, "asyncError") }
    })
}

/// `ncclCommSplit`: blocking, outside groups (a split inside a group is not simulated); the
/// configuration, if any, is not read (the child is a blocking communicator like its parent).
#[no_mangle]
pub unsafe extern "C" fn ncclCommSplit(
    c: *mut c_void,
    color: c_int,
    key: c_int,
    out: *mut *mut c_void,
    _config: *mut c_void,
) -> c_int {
    nccl("ncclCommSplit", || {
        let s = started()?;
        let parent = comm(c, "ncclCommSplit")?;
        if out.is_null() {
            return Err(invalid("newcomm is null"));
        }
        let color = match color {
            NCCL_SPLIT_NOCOLOR => None,
            c if c >= 0 => Some(c as u32),
            c => return Err(invalid(format!("color {c}"))),
        };
        if in_group() {
            return Err(Fail(
                NCCL_INVALID_USAGE,
                "ncclCommSplit inside a group is not simulated".into(),
            ));
        }
        let child = parent
            .comm
            .split(&globals().registry, color, key, s.watchdog)?;
        let h = child.map_or(0, |comm| register(comm, parent.ordinal));
        // SAFETY: checked non-null above; the caller keeps it valid.
        unsafe { out.write(h as *mut c_void) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCount(c: *mut c_void, n: *mut c_int) -> c_int {
    // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
    nccl("ncclCommCount", || unsafe {
        put(n, comm(c, "ncclCommCount")?.comm.nranks() as c_int, "count")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommCuDevice(c: *mut c_void, d: *mut c_int) -> c_int {
    // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
    nccl("ncclCommCuDevice", || unsafe {
        put(d, comm(c, "ncclCommCuDevice")?.ordinal as c_int, "device")
    })
}

#[no_mangle]
pub unsafe extern "C" fn ncclCommUserRank(c: *mut c_void, r: *mut c_int) -> c_int {
    // SAFETY: `put` refuses a null out-pointer; a non-null one is the caller's, valid for the write.
    nccl("ncclCommUserRank", || unsafe {
        put(r, comm(c, "ncclCommUserRank")?.comm.rank() as c_int, "rank")
    })
}

/// An init queued in a group (run at `ncclGroupEnd`, all ranks at once).
struct PendingInit {
    out: usize,
    key: [u8; 32],
    nranks: c_int,
    rank: c_int,
    ordinal: usize,
}

impl PendingInit {
    fn run(&self, s: &Sim) -> Result<(), Fail> {
        let h = init_rank(s, &self.key, self.nranks, self.rank, self.ordinal)?;
        // SAFETY: checked non-null when the call was made; the caller keeps it valid.
        unsafe { (self.out as *mut *mut c_void).write(h as *mut c_void) };
        Ok(())
    }
}

/// Runs several inits concurrently (one thread each), as a group does; the first error wins.
fn run_inits(s: &'static Sim, inits: Vec<PendingInit>) -> Result<(), Fail> {
    std::thread::scope(|scope| {
        let joins: Vec<_> = inits
            .iter()
            .map(|i| scope.spawn(move || i.run(s)))
            .collect();
        joins
            .into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(Fail(NCCL_INTERNAL_ERROR, "init panicked".into())))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .collect()
    })
}

/// Operations queued by the calling thread between `ncclGroupStart` and `ncclGroupEnd`.
#[derive(Default)]
struct Group {
    depth: u32,
    inits: Vec<PendingInit>,
    ops: Vec<(Arc<NcclComm>, StreamId, Op)>,
}

enum Op {
    Coll(Collective),
    P2p(P2p),
}

fn in_group() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

#[no_mangle]
pub extern "C" fn ncclGroupStart() -> c_int {
    nccl("ncclGroupStart", || {
        GROUP.with(|g| g.borrow_mut().depth += 1);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> c_int {
    nccl("ncclGroupEnd", || {
        let (inits, ops) = GROUP.with(|g| {
            let mut g = g.borrow_mut();
            if g.depth == 0 {
                return Err(Fail(
                    NCCL_INVALID_USAGE,
                    "ncclGroupEnd without ncclGroupStart".into(),
                ));
            }
            g.depth -= 1;
            Ok(if g.depth == 0 {
                (std::mem::take(&mut g.inits), std::mem::take(&mut g.ops))
            } else {
                (Vec::new(), Vec::new())
            })
        })?;
        let s = started()?;
        if !inits.is_empty() {
            run_inits(s, inits)?;
        }
        // Collectives in call order; the sends and receives of each (communicator, stream) as
        // one operation, so they may pair up in any order without deadlock.
        let mut p2p: Vec<(Arc<NcclComm>, StreamId, Vec<P2p>)> = Vec::new();
        let mut first: Result<(), Fail> = Ok(());
        for (k, stream, op) in ops {
            match op {
                Op::Coll(call) => match k.comm.collective(stream, call) {
                    Ok(()) => k.track(s, stream),
                    Err(e) => first = first.and(Err(e.into())),
                },
                Op::P2p(call) => {
                    match p2p
                        .iter_mut()
                        .find(|(c, s, _)| Arc::ptr_eq(c, &k) && *s == stream)
                    {
                        Some((_, _, calls)) => calls.push(call),
                        None => p2p.push((k, stream, vec![call])),
                    }
                }
            }
        }
        for (k, stream, calls) in p2p {
            match k.comm.group(stream, &calls) {
                Ok(()) => k.track(s, stream),
                Err(e) => first = first.and(Err(e.into())),
            }
        }
        first
    })
}

/// The stream a communicator's operation runs on: the comm's device must own it; the null
/// stream is that device's default stream.
fn comm_stream(s: &Sim, k: &NcclComm, stream: *mut c_void) -> Result<StreamId, Fail> {
    if stream.is_null() {
        return Ok(s.default_streams[k.ordinal]);
    }
    let dev = s
        .owner(stream as u64)
        .ok_or_else(|| invalid(format!("stream {stream:?} is not a stream")))?;
    if dev.ordinal() as usize != k.ordinal {
        return Err(invalid(format!(
            "stream {stream:?} belongs to device {}, the communicator to device {}",
            dev.ordinal(),
            k.ordinal
        )));
    }
    Ok(StreamId(stream as u64))
}

/// Queues (or, in a group, collects) one operation.
fn submit(c: *mut c_void, stream: *mut c_void, op: Op) -> Result<(), Fail> {
    let s = started()?;
    let k = comm(c, "an NCCL operation")?;
    let stream = comm_stream(s, &k, stream)?;
    if in_group() {
        GROUP.with(|g| g.borrow_mut().ops.push((k.0.clone(), stream, op)));
        return Ok(());
    }
    match op {
        Op::Coll(call) => k.comm.collective(stream, call)?,
        Op::P2p(call) => k.comm.group(stream, &[call])?,
    }
    k.track(s, stream);
    Ok(())
}

fn collective(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> Result<(), Fail> {
    let dtype = crate::conv::dtype(dtype)
        .ok_or_else(|| invalid(format!("datatype {dtype} is not supported")))?;
    // Null or foreign buffers fail the range check of the ranks that use them.
    let call = Collective {
        kind,
        dtype,
        count: count as u64,
        send: send as u64,
        recv: recv as u64,
    };
    submit(c, stream, Op::Coll(call))
}

fn op(v: c_int) -> Result<unihal_hal::ReduceOp, Fail> {
    reduce_op(v).ok_or_else(|| invalid(format!("reduction {v} is not supported")))
}

fn root(v: c_int) -> Result<usize, Fail> {
    usize::try_from(v).map_err(|_| invalid(format!("root {v}")))
}

#[no_mangle]
pub extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    red: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclAllReduce", || {
        collective(
            Kind::AllReduce(op(red)?),
            send,
            recv,
            count,
            dtype,
            c,
            stream,
        )
    })
}

#[no_mangle]
pub extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    r: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclBroadcast", || {
        let kind = Kind::Broadcast { root: root(r)? };
        collective(kind, send, recv, count, dtype, c, stream)
    })
}

#[no_mangle]
pub extern "C" fn ncclBcast(
    buff: *mut c_void,
    count: usize,
    dtype: c_int,
    r: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    ncclBroadcast(buff, buff, count, dtype, r, c, stream)
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    red: c_int,
    r: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclReduce", || {
        let kind = Kind::Reduce {
            op: op(red)?,
            root: root(r)?,
        };
        // Only the root's receive buffer is written (others may pass null).
        collective(kind, send, recv, count, dtype, c, stream)
    })
}

#[no_mangle]
pub extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclAllGather", || {
        collective(Kind::AllGather, send, recv, count, dtype, c, stream)
    })
}

#[no_mangle]
pub extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    red: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclReduceScatter", || {
        let kind = Kind::ReduceScatter(op(red)?);
        collective(kind, send, recv, count, dtype, c, stream)
    })
}

/// NVIDIA's all-to-all (NCCL >= 2.28.3 spells it `ncclAlltoAll`).
#[no_mangle]
pub extern "C" fn ncclAlltoAll(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclAlltoAll", || {
        collective(Kind::AllToAll, send, recv, count, dtype, c, stream)
    })
}

/// RCCL's spelling of all-to-all (`ncclAllToAll`), so the RCCL instance of a backend's engine
/// runs on this library too (its calls counted and failed under this name).
#[no_mangle]
pub extern "C" fn ncclAllToAll(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclAllToAll", || {
        collective(Kind::AllToAll, send, recv, count, dtype, c, stream)
    })
}

fn p2p(
    send: bool,
    buf: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> Result<(), Fail> {
    let dtype = crate::conv::dtype(dtype)
        .ok_or_else(|| invalid(format!("datatype {dtype} is not supported")))?;
    let peer = usize::try_from(peer).map_err(|_| invalid(format!("peer {peer}")))?;
    if count > 0 && buf.is_null() {
        return Err(invalid("buffer is null"));
    }
    let (addr, count) = (buf as u64, count as u64);
    let call = if send {
        P2p::Send {
            peer,
            addr,
            count,
            dtype,
        }
    } else {
        P2p::Recv {
            peer,
            addr,
            count,
            dtype,
        }
    };
    submit(c, stream, Op::P2p(call))
}

#[no_mangle]
pub extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclSend", || {
        p2p(true, send as *mut c_void, count, dtype, peer, c, stream)
    })
}

#[no_mangle]
pub extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    c: *mut c_void,
    stream: *mut c_void,
) -> c_int {
    nccl("ncclRecv", || {
        p2p(false, recv, count, dtype, peer, c, stream)
    })
}
