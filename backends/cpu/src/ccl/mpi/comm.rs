//! One rank of an MPI communicator: the arrival handshake, the waits with deadline and abort, and
//! the operations (validated at enqueue, run on the stream's worker).

use super::{conv, ffi};
use crate::ccl::{arrival_token as token, checked_stream, not_in_place, rank_arg, Addr};
use crate::stream::{cpu_addr, CpuStream};
use parking_lot::Mutex;
use std::any::Any;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::ccl::{check_send_recv, checked_bytes, P2pParts};
use unihal_hal::host_reduce::{divide, reduce};
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Invalid, ReduceOp, Result, Stream,
};

/// Tags: data of send/recv on the data communicator; arrival tokens of stream operations, of
/// splits, and abort notices on the control communicator.
const TAG_DATA: i32 = 1;
const TAG_ARRIVE: i32 = 2;
const TAG_SPLIT: i32 = 3;
const TAG_ABORT: i32 = 4;

/// Busy polls before a wait yields its core between polls, then polls that yield before it sleeps.
const SPIN_POLLS: u32 = 2000;
const YIELD_POLLS: u32 = 2000;

/// A wait probes for abort notices (and checks its deadline) once per this many polls.
const ABORT_PROBE_EVERY: u32 = 8;

/// All-reduces whose arrival messages carry the data (one message each way per peer, reduced
/// here in rank order) up to this many bytes sent per rank (count × dtype size × (ranks - 1));
/// larger ones run the handshake and then `MPI_Allreduce`. Small, since Open MPI sends messages
/// up to 256 bytes inline: longer point-to-point exchanges measured slower than its collective
/// (docs/BENCHMARKS.md).
const FUSED_MAX_BYTES: u64 = 256;

/// An MPI communicator pair (data and control) and the rank's failure state. Shared by the rank
/// and its queued operations.
pub(crate) struct Link {
    data: ffi::Comm,
    ctrl: ffi::Comm,
    rank: usize,
    size: usize,
    timeout: Duration,
    error: Mutex<Option<HalError>>,
    aborted: AtomicBool,
    /// Set once MPI may still touch memory of a request given up on (timeout, abort): the
    /// communicators are then never freed, and the operation's buffers are leaked.
    leaked: AtomicBool,
}

/// A request being waited for.
struct Pending {
    req: ffi::MPI_Request,
    peer: usize,
    recv: bool,
    done: bool,
    status: ffi::MPI_Status,
}

/// A zeroed status, for MPI to write.
fn new_status() -> ffi::MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers; all zeroes is a valid value.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

impl Pending {
    fn new(peer: usize, recv: bool) -> Pending {
        Pending {
            // SAFETY: MPI_Request is a plain C handle (a pointer in Open MPI); the null value is
            // overwritten by the Isend/Irecv that posts it before any use.
            req: unsafe { MaybeUninit::zeroed().assume_init() },
            peer,
            recv,
            done: false,
            status: new_status(),
        }
    }
}

impl Link {
    /// Duplicates `parent` into a new data and control communicator.
    pub(crate) fn dup(parent: ffi::Comm, timeout: Duration) -> Result<Arc<Link>> {
        let mut data = MaybeUninit::uninit();
        conv::check(
            // SAFETY: `parent` is a live communicator; MPI_Comm_dup writes the new handle.
            unsafe { ffi::MPI_Comm_dup(parent.0, data.as_mut_ptr()) },
            "MPI_Comm_dup",
        )?;
        // SAFETY: written by the successful call above.
        Link::adopt(ffi::Comm(unsafe { data.assume_init() }), timeout)
    }

    /// Takes ownership of `data` (a new communicator) and makes its control twin.
    fn adopt(data: ffi::Comm, timeout: Duration) -> Result<Arc<Link>> {
        let (mut rank, mut size, mut ctrl) = (0, 0, MaybeUninit::uninit());
        // SAFETY: `data` is a live communicator owned by this link; the outputs are written by
        // the calls.
        unsafe {
            ffi::MPI_Comm_set_errhandler(data.0, ffi::RSMPI_ERRORS_RETURN);
            conv::check(ffi::MPI_Comm_rank(data.0, &mut rank), "MPI_Comm_rank")?;
            conv::check(ffi::MPI_Comm_size(data.0, &mut size), "MPI_Comm_size")?;
            conv::check(ffi::MPI_Comm_dup(data.0, ctrl.as_mut_ptr()), "MPI_Comm_dup")?;
        }
        Ok(Arc::new(Link {
            data,
            // SAFETY: written by the successful MPI_Comm_dup.
            ctrl: ffi::Comm(unsafe { ctrl.assume_init() }),
            rank: rank as usize,
            size: size as usize,
            timeout,
            error: Mutex::new(None),
            aborted: AtomicBool::new(false),
            leaked: AtomicBool::new(false),
        }))
    }

    fn fail(&self, e: &HalError) {
        let mut g = self.error.lock();
        if g.is_none() {
            *g = Some(e.clone());
            let (r, n) = (self.rank, self.size);
            unihal_hal::ccl::log_failed(format_args!("rank {r} of {n} (MPI)"), e);
        }
    }

    fn sticky(&self) -> Option<HalError> {
        self.error.lock().clone()
    }

    /// The abort error once this rank or a peer (notice on the control communicator) aborted.
    fn poll_abort(&self) -> Option<HalError> {
        if !self.aborted.load(Ordering::Acquire) {
            let mut flag = 0;
            let mut status = new_status();
            // SAFETY: the control communicator is live; flag and status are written by the call.
            let rc = unsafe {
                ffi::MPI_Iprobe(
                    ffi::RSMPI_ANY_SOURCE,
                    TAG_ABORT,
                    self.ctrl.0,
                    &mut flag,
                    &mut status,
                )
            };
            if rc != 0 || flag == 0 {
                return None;
            }
            self.aborted.store(true, Ordering::Release);
            self.leaked.store(true, Ordering::Release);
            self.fail(&HalError::Aborted {
                what: format!("communicator aborted by rank {}", status.MPI_SOURCE),
            });
        }
        Some(self.sticky().unwrap_or(HalError::Aborted {
            what: "communicator aborted".into(),
        }))
    }

    /// Waits for every request, giving up at the deadline or on abort: then receives are
    /// cancelled, requests are freed and the link is marked leaked (the caller leaks buffers). A
    /// receive that a longer message truncated is an `InvalidArgument` naming the sender (it
    /// called something else here); `what` names the operation in errors.
    fn wait(&self, reqs: &mut [Pending], what: &dyn Fn() -> String) -> Result<()> {
        let deadline = unihal_hal::deadline::after(self.timeout);
        let mut polls = 0u32;
        loop {
            let mut all = true;
            let mut failed = None;
            for p in reqs.iter_mut().filter(|p| !p.done) {
                let mut flag = 0;
                // SAFETY: the request was posted and not completed; status is written by MPI.
                let rc = unsafe { ffi::MPI_Test(&mut p.req, &mut flag, &mut p.status) };
                if rc != 0 {
                    // MPI has completed (and freed) the failed request.
                    p.done = true;
                    failed = Some((rc, p.peer, p.recv));
                    break;
                }
                if flag != 0 {
                    p.done = true;
                } else {
                    all = false;
                }
            }
            if let Some((rc, peer, recv)) = failed {
                self.give_up(reqs);
                let mut class = rc;
                // SAFETY: plain integers; the class is written by the call.
                unsafe { ffi::MPI_Error_class(rc, &mut class) };
                if recv && class == ffi::MPI_ERR_TRUNCATE as i32 {
                    return Err(mismatch(
                        &what(),
                        peer,
                        "its message is longer than this rank's",
                    ));
                }
                return conv::check(rc, "MPI_Test");
            }
            if all {
                return Ok(());
            }
            // The abort notice is probed every few polls (each probe also runs MPI's progress).
            if polls % ABORT_PROBE_EVERY == 0 {
                if let Some(e) = self.poll_abort() {
                    self.give_up(reqs);
                    return Err(e);
                }
                if Instant::now() >= deadline {
                    let missing: Vec<usize> = reqs
                        .iter()
                        .filter(|p| p.recv && !p.done)
                        .map(|p| p.peer)
                        .collect();
                    self.give_up(reqs);
                    return Err(HalError::Timeout {
                        what: format!(
                            "{}: waiting for the other ranks; ranks {missing:?} never arrived",
                            what()
                        ),
                        millis: unihal_hal::deadline::millis(self.timeout),
                    });
                }
            }
            polls = polls.wrapping_add(1);
            if polls < SPIN_POLLS {
                std::hint::spin_loop();
            } else if polls < SPIN_POLLS + YIELD_POLLS {
                // A peer sharing this core runs now rather than after a sleep.
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    fn give_up(&self, reqs: &mut [Pending]) {
        self.leaked.store(true, Ordering::Release);
        for p in reqs.iter_mut().filter(|p| !p.done) {
            // SAFETY: the request is active; a cancelled or freed request is never used again.
            unsafe {
                if p.recv {
                    ffi::MPI_Cancel(&mut p.req);
                }
                ffi::MPI_Request_free(&mut p.req);
            }
            p.done = true;
        }
    }

    /// Meets every other rank: each sends each a token for this operation and waits for theirs.
    fn arrive(&self, tag: i32, token: u64, what: &dyn Fn() -> String) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        self.exchange(tag, token, &[], what).map(drop)
    }

    /// The arrival handshake with `data` riding along: sends every other rank one message, this
    /// operation's `token` followed by `data`, and receives theirs, each of the same length. On
    /// success returns the messages as `size` slots of `1 + data.len().div_ceil(8)` words each
    /// (slot `j` is rank `j`'s, this rank's own slot holds its own message), so a small collective
    /// is one message each way instead of a handshake and then MPI's collective.
    ///
    /// # Errors
    /// `Timeout` naming the ranks that never arrived; `Aborted`; `InvalidArgument` when a rank
    /// sent another token or another length (a different operation or other arguments).
    fn exchange(
        &self,
        tag: i32,
        token: u64,
        data: &[u8],
        what: &dyn Fn() -> String,
    ) -> Result<Vec<u64>> {
        let words = 1 + data.len().div_ceil(8);
        let len = 8 + data.len();
        let n = conv::count(len as u64, "an arrival message of bytes")?;
        let mut slots = vec![0u64; words * self.size];
        let own = self.rank * words;
        slots[own] = token;
        // SAFETY: the slot holds `words - 1 >= data.len() / 8` words after the token; a byte copy
        // into a u64 buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                slots[own + 1..].as_mut_ptr().cast::<u8>(),
                data.len(),
            );
        }
        // The buffers MPI reads and writes, moved to the heap as one allocation whose address
        // does not change (leaked with the requests if the wait gives up).
        let mut slots = slots.into_boxed_slice();
        let base = slots.as_mut_ptr();
        let mut reqs = Vec::with_capacity(2 * self.size);
        for j in (0..self.size).filter(|&j| j != self.rank) {
            let mut p = Pending::new(j, true);
            // SAFETY: slot j (`len` bytes) lives until the wait ends or is leaked with the
            // request; no other request writes it.
            let rc = unsafe {
                ffi::MPI_Irecv(
                    base.add(j * words).cast(),
                    n,
                    conv::bytes(),
                    j as i32,
                    tag,
                    self.ctrl.0,
                    &mut p.req,
                )
            };
            if rc != 0 {
                self.give_up(&mut reqs);
                std::mem::forget(slots);
                return conv::check(rc, "MPI_Irecv").map(|()| Vec::new());
            }
            reqs.push(p);
            let mut p = Pending::new(j, false);
            // SAFETY: the own slot lives as above and is only read while requests are pending.
            let rc = unsafe {
                ffi::MPI_Isend(
                    base.add(own).cast::<std::ffi::c_void>(),
                    n,
                    conv::bytes(),
                    j as i32,
                    tag,
                    self.ctrl.0,
                    &mut p.req,
                )
            };
            if rc != 0 {
                self.give_up(&mut reqs);
                std::mem::forget(slots);
                return conv::check(rc, "MPI_Isend").map(|()| Vec::new());
            }
            reqs.push(p);
        }
        if let Err(e) = self.wait(&mut reqs, what) {
            std::mem::forget(slots);
            return Err(e);
        }
        for p in reqs.iter().filter(|p| p.recv) {
            let mut got = 0;
            conv::check(
                // SAFETY: the status was written by the completed MPI_Test.
                unsafe { ffi::MPI_Get_count(&p.status, conv::bytes(), &mut got) },
                "MPI_Get_count",
            )?;
            if got != n {
                return Err(mismatch(
                    &what(),
                    p.peer,
                    "its message is shorter than this rank's",
                ));
            }
            if slots[p.peer * words] != token {
                return Err(mismatch(&what(), p.peer, "another token"));
            }
        }
        Ok(slots.into_vec())
    }
}

/// The error of a rank whose arrival message does not match this rank's.
fn mismatch(what: &str, peer: usize, how: &str) -> HalError {
    HalError::invalid(
        "call",
        Invalid::Other(format!(
            "{what}: rank {peer} called a different operation (or other arguments) at this point \
             ({how})"
        )),
    )
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) {
            return;
        }
        let mut done = 0;
        // SAFETY: the handles are owned by this link and no request on them is pending (none was
        // given up on); MPI must still be initialised to free them.
        unsafe {
            if ffi::MPI_Finalized(&mut done) == 0 && done == 0 {
                ffi::MPI_Comm_free(&mut self.ctrl.0);
                ffi::MPI_Comm_free(&mut self.data.0);
            }
        }
    }
}

/// `src` itself, or a copy of it when it overlaps `dst` (MPI forbids aliased send and receive
/// buffers; unihal's in-place forms alias them).
///
/// # Safety
/// Both ranges are valid for reads.
unsafe fn unaliased(src: Addr, src_len: u64, dst: Addr, dst_len: u64) -> (Addr, Option<Vec<u8>>) {
    let overlap = src.0 < dst.0 + dst_len && dst.0 < src.0 + src_len;
    if !overlap || src_len == 0 {
        return (src, None);
    }
    let copy = std::slice::from_raw_parts(src.0 as *const u8, src_len as usize).to_vec();
    (Addr(copy.as_ptr() as u64), Some(copy))
}

/// One rank. Thread safety: any thread; operations of one communicator must be issued in the same
/// order on every rank and must not run concurrently from two streams (as with NCCL).
pub struct MpiComm {
    link: Arc<Link>,
    device: Arc<dyn Device>,
    caps: Arc<CclCaps>,
    seq: AtomicU64,
    splits: AtomicU64,
}

impl MpiComm {
    pub(crate) fn new(link: Arc<Link>, device: Arc<dyn Device>, caps: Arc<CclCaps>) -> MpiComm {
        MpiComm {
            link,
            device,
            caps,
            seq: AtomicU64::new(0),
            splits: AtomicU64::new(0),
        }
    }

    fn check<'s>(
        &self,
        spec: (CollectiveOp, DType, Option<ReduceOp>),
        stream: &'s Arc<dyn Stream>,
    ) -> Result<&'s CpuStream> {
        checked_stream(&self.device, &self.caps, self.link.sticky(), spec, stream)
    }

    fn addr(&self, b: &Buffer, arg: &'static str, len: u64) -> Result<Addr> {
        Ok(Addr(cpu_addr(b, arg, self.device.id(), 0, len)? as u64))
    }

    /// Enqueues `body` behind an arrival handshake for `what` (none for point-to-point, whose
    /// messages match by themselves). On failure the error is sticky, and the buffers are leaked
    /// when MPI may still touch them.
    fn submit(
        &self,
        s: &CpuStream,
        what: Option<String>,
        keep: Vec<Buffer>,
        body: impl FnOnce(&Link) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        self.submit_meeting(s, what, keep, move |l, meet| {
            if let Some((token, label)) = meet {
                l.arrive(TAG_ARRIVE, token, label)?;
            }
            body(l)
        })
    }

    /// As [`MpiComm::submit`], with the arrival left to `body`: for a collective (`what` given)
    /// it gets the operation's token and its label for errors, and must meet the other ranks
    /// before MPI's collective (or in its place, [`Link::exchange`]).
    fn submit_meeting(
        &self,
        s: &CpuStream,
        what: Option<String>,
        keep: Vec<Buffer>,
        body: impl FnOnce(&Link, Option<(u64, &dyn Fn() -> String)>) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        s.refuse_in_capture("an MPI collective or send/receive")?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let link = self.link.clone();
        s.submit_once(move |err| {
            if err.is_some() {
                return Ok(());
            }
            let r = match &what {
                Some(w) => body(
                    &link,
                    Some((token(seq, w), &|| format!("{w} (collective #{seq})"))),
                ),
                None => body(&link, None),
            };
            if let Err(e) = &r {
                link.fail(e);
                if link.leaked.load(Ordering::Acquire) {
                    std::mem::forget(keep);
                }
            }
            r
        })
    }

    /// Checks and enqueues a group of sends and receives on the data communicator.
    fn p2p(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        let mut plan = Vec::with_capacity(calls.len());
        let mut keep = Vec::with_capacity(calls.len());
        let mut s = None;
        for c in calls {
            let P2pParts {
                buf,
                count,
                dtype,
                peer,
                recv,
            } = c.parts();
            s = Some(self.check((CollectiveOp::SendRecv, dtype, None), stream)?);
            rank_arg("peer", peer, self.link.size)?;
            let bytes = checked_bytes("count", count, 1, dtype)?;
            let n = conv::count(bytes, "a message of bytes")?;
            plan.push((self.addr(buf, "buf", bytes)?, n, peer, recv));
            keep.push(buf.clone());
        }
        let Some(s) = s else { return Ok(()) };
        self.submit(s, None, keep, move |l| {
            let mut reqs = Vec::with_capacity(plan.len());
            for &(a, n, peer, recv) in &plan {
                let mut p = Pending::new(peer, recv);
                // SAFETY: the ranges were checked at enqueue and the operation holds the buffers
                // (leaked if the wait gives up).
                let rc = unsafe {
                    if recv {
                        ffi::MPI_Irecv(
                            a.ptr(),
                            n,
                            conv::bytes(),
                            peer as i32,
                            TAG_DATA,
                            l.data.0,
                            &mut p.req,
                        )
                    } else {
                        ffi::MPI_Isend(
                            a.ptr(),
                            n,
                            conv::bytes(),
                            peer as i32,
                            TAG_DATA,
                            l.data.0,
                            &mut p.req,
                        )
                    }
                };
                if rc != 0 {
                    l.give_up(&mut reqs);
                    conv::check(rc, if recv { "MPI_Irecv" } else { "MPI_Isend" })?;
                }
                reqs.push(p);
            }
            l.wait(&mut reqs, &|| {
                format!("send/recv group of {} calls on rank {}", plan.len(), l.rank)
            })?;
            for (p, &(_, n, peer, _)) in reqs.iter().zip(&plan).filter(|(p, _)| p.recv) {
                let mut got = 0;
                conv::check(
                    // SAFETY: the status was written by the completed MPI_Test.
                    unsafe { ffi::MPI_Get_count(&p.status, conv::bytes(), &mut got) },
                    "MPI_Get_count",
                )?;
                if got != n {
                    return Err(HalError::invalid(
                        "count",
                        Invalid::Value {
                            value: format!("{n} bytes expected by rank {}", l.rank),
                            accepted: format!("the {got} bytes rank {peer} sent"),
                        },
                    ));
                }
            }
            Ok(())
        })
    }
}

impl Communicator for MpiComm {
    fn rank(&self) -> usize {
        self.link.rank
    }
    fn size(&self) -> usize {
        self.link.size
    }
    fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    fn all_reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::AllReduce, dtype, Some(op)), stream)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let (sa, ra) = (
            self.addr(send, "send", bytes)?,
            self.addr(recv, "recv", bytes)?,
        );
        check_send_recv(send, bytes, recv, bytes, (0, 0))?;
        let n = conv::count(count, "all_reduce")?;
        if count == 0 {
            return Ok(());
        }
        let ranks = self.link.size as u64;
        let fused = ranks > 1 && bytes.saturating_mul(ranks - 1) <= FUSED_MAX_BYTES;
        self.submit_meeting(
            s,
            Some(format!("all_reduce {count} {dtype} {op}")),
            vec![send.clone(), recv.clone()],
            move |l, meet| {
                let (token, label) = meet.expect("a collective meets its peers");
                if fused {
                    // SAFETY: the send range holds `bytes` bytes, checked at enqueue and held by
                    // the operation; it is copied into the message before anything is written.
                    let own =
                        unsafe { std::slice::from_raw_parts(sa.0 as *const u8, bytes as usize) };
                    let slots = l.exchange(TAG_ARRIVE, token, own, label)?;
                    let words = slots.len() / l.size;
                    let srcs: Vec<*const u8> = (0..l.size)
                        .map(|j| slots[j * words + 1..].as_ptr().cast())
                        .collect();
                    // SAFETY: every source is a message slot of `count` elements (the token
                    // checked every length), the destination the receive range; ranks combine
                    // in rank order, so every rank computes the same result.
                    unsafe { reduce(dtype, op, &srcs, ra.0 as *mut u8, count as usize) };
                    return Ok(());
                }
                l.arrive(TAG_ARRIVE, token, label)?;
                let (dt, mop) = (conv::datatype(dtype).expect("claimed dtype"), conv::op(op));
                // SAFETY: both ranges hold `count` elements, checked at enqueue and held by the
                // operation; the source is unaliased from the destination.
                unsafe {
                    let (src, _copy) = unaliased(sa, bytes, ra, bytes);
                    conv::check(
                        ffi::MPI_Allreduce(src.ptr(), ra.ptr(), n, dt, mop, l.data.0),
                        "MPI_Allreduce",
                    )?;
                    if op == ReduceOp::Avg {
                        divide(dtype, ra.ptr().cast(), count as usize, l.size);
                    }
                }
                Ok(())
            },
        )
    }

    fn broadcast(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::Broadcast, dtype, None), stream)?;
        rank_arg("root", root, self.link.size)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let me_root = self.link.rank == root;
        let sa = self.addr(send, "send", if me_root { bytes } else { 0 })?;
        let ra = self.addr(recv, "recv", bytes)?;
        if me_root {
            check_send_recv(send, bytes, recv, bytes, (0, 0))?;
        }
        let n = conv::count(bytes, "broadcast of bytes")?;
        if count == 0 {
            return Ok(());
        }
        self.submit(
            s,
            Some(format!("broadcast {count} {dtype} root {root}")),
            vec![send.clone(), recv.clone()],
            move |l| {
                // SAFETY: the ranges were checked at enqueue and the operation holds the buffers;
                // `copy` allows the root's send and recv to overlap.
                unsafe {
                    if me_root && sa.0 != ra.0 {
                        std::ptr::copy(sa.0 as *const u8, ra.0 as *mut u8, bytes as usize);
                    }
                    conv::check(
                        ffi::MPI_Bcast(ra.ptr(), n, conv::bytes(), root as i32, l.data.0),
                        "MPI_Bcast",
                    )
                }
            },
        )
    }

    fn reduce(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: usize,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::Reduce, dtype, Some(op)), stream)?;
        rank_arg("root", root, self.link.size)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let me_root = self.link.rank == root;
        let sa = self.addr(send, "send", bytes)?;
        let ra = self.addr(recv, "recv", if me_root { bytes } else { 0 })?;
        if me_root {
            check_send_recv(send, bytes, recv, bytes, (0, 0))?;
        }
        let n = conv::count(count, "reduce")?;
        if count == 0 {
            return Ok(());
        }
        self.submit(
            s,
            Some(format!("reduce {count} {dtype} {op} root {root}")),
            vec![send.clone(), recv.clone()],
            move |l| {
                let (dt, mop) = (conv::datatype(dtype).expect("claimed dtype"), conv::op(op));
                // SAFETY: as in all_reduce; only the root's recv is written.
                unsafe {
                    let recv_len = if me_root { bytes } else { 0 };
                    let (src, _copy) = unaliased(sa, bytes, ra, recv_len);
                    conv::check(
                        ffi::MPI_Reduce(src.ptr(), ra.ptr(), n, dt, mop, root as i32, l.data.0),
                        "MPI_Reduce",
                    )?;
                    if me_root && op == ReduceOp::Avg {
                        divide(dtype, ra.ptr().cast(), count as usize, l.size);
                    }
                }
                Ok(())
            },
        )
    }

    fn all_gather(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::AllGather, dtype, None), stream)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let total = checked_bytes("count", count, self.link.size as u64, dtype)?;
        let (sa, ra) = (
            self.addr(send, "send", bytes)?,
            self.addr(recv, "recv", total)?,
        );
        check_send_recv(send, bytes, recv, total, (0, self.link.rank as u64 * bytes))?;
        conv::count(total, "all_gather of bytes")?;
        let per = bytes as i32;
        if count == 0 {
            return Ok(());
        }
        self.submit(
            s,
            Some(format!("all_gather {count} {dtype}")),
            vec![send.clone(), recv.clone()],
            move |l| {
                // SAFETY: as in all_reduce.
                unsafe {
                    let (src, _copy) = unaliased(sa, bytes, ra, total);
                    conv::check(
                        ffi::MPI_Allgather(
                            src.ptr(),
                            per,
                            conv::bytes(),
                            ra.ptr(),
                            per,
                            conv::bytes(),
                            l.data.0,
                        ),
                        "MPI_Allgather",
                    )
                }
            },
        )
    }

    fn reduce_scatter(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::ReduceScatter, dtype, Some(op)), stream)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let total = checked_bytes("count", count, self.link.size as u64, dtype)?;
        let (sa, ra) = (
            self.addr(send, "send", total)?,
            self.addr(recv, "recv", bytes)?,
        );
        check_send_recv(send, total, recv, bytes, (self.link.rank as u64 * bytes, 0))?;
        conv::count(
            count.saturating_mul(self.link.size as u64),
            "reduce_scatter",
        )?;
        let n = count as i32;
        if count == 0 {
            return Ok(());
        }
        self.submit(
            s,
            Some(format!("reduce_scatter {count} {dtype} {op}")),
            vec![send.clone(), recv.clone()],
            move |l| {
                let (dt, mop) = (conv::datatype(dtype).expect("claimed dtype"), conv::op(op));
                // SAFETY: as in all_reduce.
                unsafe {
                    let (src, _copy) = unaliased(sa, total, ra, bytes);
                    conv::check(
                        ffi::MPI_Reduce_scatter_block(src.ptr(), ra.ptr(), n, dt, mop, l.data.0),
                        "MPI_Reduce_scatter_block",
                    )?;
                    if op == ReduceOp::Avg {
                        divide(dtype, ra.ptr().cast(), count as usize, l.size);
                    }
                }
                Ok(())
            },
        )
    }

    fn all_to_all(
        &self,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((CollectiveOp::AllToAll, dtype, None), stream)?;
        not_in_place(send, recv)?;
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let total = checked_bytes("count", count, self.link.size as u64, dtype)?;
        let (sa, ra) = (
            self.addr(send, "send", total)?,
            self.addr(recv, "recv", total)?,
        );
        conv::count(total, "all_to_all of bytes")?;
        let per = bytes as i32;
        if count == 0 {
            return Ok(());
        }
        self.submit(
            s,
            Some(format!("all_to_all {count} {dtype}")),
            vec![send.clone(), recv.clone()],
            move |l| {
                // SAFETY: both ranges hold size * count elements, checked at enqueue, held by the
                // operation, and of distinct allocations.
                unsafe {
                    conv::check(
                        ffi::MPI_Alltoall(
                            sa.ptr(),
                            per,
                            conv::bytes(),
                            ra.ptr(),
                            per,
                            conv::bytes(),
                            l.data.0,
                        ),
                        "MPI_Alltoall",
                    )
                }
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        self.p2p(calls, stream)
    }

    fn split(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        // Checked before any exchange with the other ranks.
        let timeout = unihal_hal::ccl::timeout_or(config, self.link.timeout)?;
        if let Some(e) = self.link.sticky() {
            return Err(e);
        }
        let mpi_color = match color {
            None => {
                // SAFETY: a constant set up by the MPI library.
                unsafe { ffi::RSMPI_UNDEFINED }
            }
            Some(c) => i32::try_from(c).map_err(|_| {
                HalError::invalid(
                    "color",
                    Invalid::Value {
                        value: c.to_string(),
                        accepted: format!("0..={} (MPI colors are C ints)", i32::MAX),
                    },
                )
            })?,
        };
        let no = self.splits.fetch_add(1, Ordering::SeqCst);
        let what = format!("split #{no}");
        self.link
            .arrive(TAG_SPLIT, token(no, "split"), &|| what.clone())
            .inspect_err(|e| self.link.fail(e))?;
        let mut child = MaybeUninit::uninit();
        conv::check(
            // SAFETY: every rank has arrived at this split; the handle is written by the call.
            unsafe { ffi::MPI_Comm_split(self.link.data.0, mpi_color, key, child.as_mut_ptr()) },
            "MPI_Comm_split",
        )?;
        if color.is_none() {
            return Ok(None);
        }
        // SAFETY: written by the successful MPI_Comm_split; a member of a color gets a live handle.
        let link = Link::adopt(ffi::Comm(unsafe { child.assume_init() }), timeout)?;
        Ok(Some(Arc::new(MpiComm::new(
            link,
            self.device.clone(),
            self.caps.clone(),
        ))))
    }

    fn abort(&self) {
        unihal_hal::ccl::log_aborted(self);
        let l = &self.link;
        l.fail(&HalError::Aborted {
            what: format!("communicator aborted by rank {}", l.rank),
        });
        if l.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        l.leaked.store(true, Ordering::Release);
        static NOTICE: u8 = 1;
        for j in (0..l.size).filter(|&j| j != l.rank) {
            let mut p = Pending::new(j, false);
            // SAFETY: the notice is a static byte; the request is freed at once (the send
            // completes in the background).
            unsafe {
                if ffi::MPI_Isend(
                    (&NOTICE as *const u8).cast(),
                    1,
                    conv::bytes(),
                    j as i32,
                    TAG_ABORT,
                    l.ctrl.0,
                    &mut p.req,
                ) == 0
                {
                    ffi::MPI_Request_free(&mut p.req);
                }
            }
        }
    }

    fn async_error(&self) -> Option<HalError> {
        self.link.poll_abort();
        self.link.sticky()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
