//! One rank of a gloo communicator: the arrival handshake, the operations (validated at
//! enqueue, run on the stream's worker through the shim) and abort.

use super::conv::{self, ErrBuf};
use super::ffi;
use super::Rendezvous;
use crate::ccl::{arrival_token as token, checked_stream, not_in_place, rank_arg, Addr};
use crate::stream::{cpu_addr, CpuStream};
use parking_lot::Mutex;
use std::any::Any;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use unihal_hal::ccl::{check_send_recv, checked_bytes, P2pParts};
use unihal_hal::host_reduce::divide;
use unihal_hal::{
    Buffer, CclCaps, CollectiveOp, CommConfig, Communicator, DType, Device, GroupCall, HalError,
    Invalid, ReduceOp, Result, Stream,
};

/// Slot prefixes of the engine's own messages (gloo's collectives use 0x01..=0x08).
const SLOT_ARRIVE: u64 = 0xE1 << 56;
const SLOT_P2P: u64 = 0xE2 << 56;

/// A connected gloo context and the rank's failure state. Shared by the rank and its queued
/// operations; the context is freed when the last of them is gone.
pub(crate) struct Link {
    ctx: *mut c_void,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) timeout: Duration,
    /// Where this communicator's ranks met (its splits meet under it).
    pub(crate) rendezvous: Rendezvous,
    error: Mutex<Option<HalError>>,
    aborted: AtomicBool,
    /// The number of the next message to and from each peer.
    sent: Mutex<Vec<u64>>,
    received: Mutex<Vec<u64>>,
}

// SAFETY: the gloo context serves concurrent operations in distinct slots (gloo's TCP pairs lock
// their state per call): the stream's operations run on its worker, a split on the calling
// thread, each in slots of its own (tags from the operation's number, `tag_of`; the handshake's
// and point-to-point slot spaces); `uh_gloo_close` is safe from any thread for the same reason.
unsafe impl Send for Link {}
// SAFETY: as above.
unsafe impl Sync for Link {}

impl Drop for Link {
    fn drop(&mut self) {
        // SAFETY: the context came from uh_gloo_connect and no operation uses it any more (each
        // holds the link).
        unsafe { ffi::uh_gloo_free(self.ctx) }
    }
}

impl Link {
    pub(crate) fn new(
        ctx: *mut c_void,
        rank: usize,
        size: usize,
        timeout: Duration,
        rendezvous: Rendezvous,
    ) -> Arc<Link> {
        Arc::new(Link {
            ctx,
            rank,
            size,
            timeout,
            rendezvous,
            error: Mutex::new(None),
            aborted: AtomicBool::new(false),
            sent: Mutex::new(vec![0; size]),
            received: Mutex::new(vec![0; size]),
        })
    }

    /// The timeout in gloo's milliseconds (gloo adds it to `steady_clock::now()`).
    fn ms(&self) -> i64 {
        unihal_hal::deadline::clock_millis(self.timeout)
    }

    fn fail(&self, e: &HalError) {
        let mut g = self.error.lock();
        if g.is_none() {
            *g = Some(e.clone());
            let (r, n) = (self.rank, self.size);
            unihal_hal::ccl::log_failed(format_args!("rank {r} of {n} (gloo)"), e);
        }
    }

    fn sticky(&self) -> Option<HalError> {
        self.error.lock().clone()
    }

    /// Meets every other rank before an operation: each sends each a token naming it, so that a
    /// rank that never comes is a `Timeout` naming it, and mismatched calls are an
    /// `InvalidArgument` instead of undefined behaviour inside gloo.
    fn arrive(&self, seq: u64, what: &str) -> Result<()> {
        if self.size == 1 {
            return Ok(());
        }
        let token = token(seq, what);
        let mut tokens = vec![0u64; self.size];
        let mut arrived = vec![0u8; self.size];
        let mut err = ErrBuf::new();
        // SAFETY: `tokens` and `arrived` hold `size` entries; the shim aborts every pending
        // receive before returning, so nothing writes into them afterwards.
        let rc = unsafe {
            ffi::uh_gloo_exchange(
                self.ctx,
                token,
                SLOT_ARRIVE | seq,
                self.ms(),
                tokens.as_mut_ptr(),
                arrived.as_mut_ptr(),
                err.ptr(),
                err.0.len(),
            )
        };
        if rc == ffi::TIMEOUT {
            let missing: Vec<usize> = (0..self.size).filter(|&r| arrived[r] == 0).collect();
            return Err(HalError::Timeout {
                what: format!(
                    "{what} (collective #{seq}) on rank {}: waiting for the other ranks; ranks \
                     {missing:?} never arrived",
                    self.rank
                ),
                millis: unihal_hal::deadline::millis(self.timeout),
            });
        }
        if rc == ffi::IO {
            let missing: Vec<usize> = (0..self.size).filter(|&r| arrived[r] == 0).collect();
            return Err(HalError::Aborted {
                what: format!(
                    "{what} (collective #{seq}) on rank {}: ranks {missing:?} left before \
                     arriving (their connections broke: the communicator was aborted or \
                     destroyed there, or the process died)",
                    self.rank
                ),
            });
        }
        conv::check(rc, what, &err, self.ms())?;
        if let Some(r) = (0..self.size).find(|&r| tokens[r] != token) {
            return Err(HalError::invalid(
                "call",
                Invalid::Other(format!(
                    "{what} (collective #{seq}): rank {r} called a different operation (or other \
                     arguments) at this point"
                )),
            ));
        }
        Ok(())
    }

    /// Runs one shim call with an error buffer, as `what`.
    fn call(&self, what: &str, f: impl FnOnce(*mut c_void, &mut ErrBuf) -> i32) -> Result<()> {
        let mut err = ErrBuf::new();
        let rc = f(self.ctx, &mut err);
        conv::check(rc, what, &err, self.ms())
    }
}

/// The tag of gloo's collective for operation `seq`: taken from the operation's number, which
/// every rank assigns in issue order, never from the order operations happen to run in (a split
/// runs on the calling thread while the stream's operations run on its worker).
fn tag_of(seq: u64) -> u32 {
    seq as u32
}

/// `src` itself when it is `dst` or disjoint from it; else a copy (gloo reads its input while
/// writing its output).
///
/// # Safety
/// Both ranges are valid for reads.
unsafe fn unaliased(src: Addr, src_len: u64, dst: Addr, dst_len: u64) -> (Addr, Option<Vec<u8>>) {
    let overlap = src.0 < dst.0 + dst_len && dst.0 < src.0 + src_len;
    if !overlap || src.0 == dst.0 || src_len == 0 {
        return (src, None);
    }
    let copy = std::slice::from_raw_parts(src.0 as *const u8, src_len as usize).to_vec();
    (Addr(copy.as_ptr() as u64), Some(copy))
}

/// One rank. Thread safety: any thread; operations of one communicator must be issued in the same
/// order on every rank and must not run concurrently from two streams (as with NCCL).
pub struct GlooComm {
    link: Arc<Link>,
    device: Arc<dyn Device>,
    caps: Arc<CclCaps>,
    seq: AtomicU64,
    splits: AtomicU64,
}

impl GlooComm {
    pub(crate) fn new(link: Arc<Link>, device: Arc<dyn Device>, caps: Arc<CclCaps>) -> GlooComm {
        GlooComm {
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
    /// messages match by themselves). On failure the error is sticky. The buffers in `keep` live
    /// until the operation is over; the shim has ended every transfer into them by then, even a
    /// failed one.
    fn submit(
        &self,
        s: &CpuStream,
        what: Option<String>,
        keep: Vec<Buffer>,
        body: impl FnOnce(&Link, u32) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        s.refuse_in_capture("a gloo collective or send/receive")?;
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        let link = self.link.clone();
        s.submit_once(move |err| {
            let _keep = keep;
            if err.is_some() {
                return Ok(());
            }
            if let Some(e) = link.sticky() {
                return Err(e);
            }
            let r = match &what {
                Some(w) => link.arrive(seq, w).and_then(|()| body(&link, tag_of(seq))),
                None => body(&link, tag_of(seq)),
            };
            if let Err(e) = &r {
                link.fail(e);
            }
            r
        })
    }

    /// A reduction on the worker: all_reduce (`root` None) or reduce to `root`.
    #[allow(clippy::too_many_arguments)]
    fn reduction(
        &self,
        op_kind: CollectiveOp,
        send: &Buffer,
        recv: &Buffer,
        count: u64,
        dtype: DType,
        op: ReduceOp,
        root: Option<usize>,
        stream: &Arc<dyn Stream>,
    ) -> Result<()> {
        let s = self.check((op_kind, dtype, Some(op)), stream)?;
        if let Some(r) = root {
            rank_arg("root", r, self.link.size)?;
        }
        let bytes = checked_bytes("count", count, 1, dtype)?;
        let writes = root.is_none_or(|r| r == self.link.rank);
        let sa = self.addr(send, "send", bytes)?;
        let ra = self.addr(recv, "recv", if writes { bytes } else { 0 })?;
        if writes {
            check_send_recv(send, bytes, recv, bytes, (0, 0))?;
        }
        if count == 0 {
            return Ok(());
        }
        let what = match root {
            None => format!("all_reduce {count} {dtype} {op}"),
            Some(r) => format!("reduce {count} {dtype} {op} root {r}"),
        };
        let red = conv::reduction(dtype, op);
        let esz = dtype.size();
        let name = what.clone();
        self.submit(
            s,
            Some(what),
            vec![send.clone(), recv.clone()],
            move |l, tag| {
                // A non-root's reduce output is scratch (gloo writes partial results into it).
                let mut scratch = Vec::new();
                let out = if writes {
                    ra
                } else {
                    scratch.resize(bytes as usize, 0u8);
                    Addr(scratch.as_mut_ptr() as u64)
                };
                // SAFETY: the ranges were checked at enqueue and the operation holds the buffers; a
                // partially overlapping input is copied; `red` is 'static.
                unsafe {
                    let (src, _copy) = unaliased(sa, bytes, out, bytes);
                    let input = src.or_null_if(out);
                    l.call(&name, |ctx, err| match root {
                        None => ffi::uh_gloo_allreduce(
                            ctx,
                            input,
                            out.ptr(),
                            count as usize,
                            esz,
                            conv::reduce_cb,
                            (red as *const conv::Reduction).cast(),
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        ),
                        Some(r) => ffi::uh_gloo_reduce(
                            ctx,
                            input,
                            out.ptr(),
                            count as usize,
                            esz,
                            conv::reduce_cb,
                            (red as *const conv::Reduction).cast(),
                            r as i32,
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        ),
                    })?;
                    if writes && op == ReduceOp::Avg {
                        divide(dtype, out.ptr().cast(), count as usize, l.size);
                    }
                }
                Ok(())
            },
        )
    }

    /// Checks and enqueues a group of sends and receives. The k-th message from rank a to rank b
    /// travels in slot k of the pair, so messages match in the order each side issued them.
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
            plan.push((self.addr(buf, "buf", bytes)?, bytes, peer, recv));
            keep.push(buf.clone());
        }
        let Some(s) = s else { return Ok(()) };
        self.submit(s, None, keep, move |l, _| {
            // Messages to this rank itself are copies (gloo has no connection to itself): the
            // k-th send to self fills the k-th receive from self of the group.
            let mine = |recv: bool| plan.iter().filter(move |p| p.2 == l.rank && p.3 == recv);
            if mine(false).count() != mine(true).count() {
                return Err(HalError::invalid(
                    "peer",
                    Invalid::Other(format!(
                        "a group on rank {} with {} sends to itself and {} receives from itself",
                        l.rank,
                        mine(false).count(),
                        mine(true).count()
                    )),
                ));
            }
            for (snd, rcv) in mine(false).zip(mine(true)) {
                if snd.1 != rcv.1 {
                    return Err(HalError::invalid(
                        "count",
                        Invalid::Value {
                            value: format!(
                                "{} bytes received by rank {} from itself",
                                rcv.1, l.rank
                            ),
                            accepted: format!("the {} bytes it sent itself", snd.1),
                        },
                    ));
                }
                // SAFETY: both ranges were checked at enqueue and are held by the operation;
                // `copy` allows them to overlap.
                unsafe {
                    std::ptr::copy(snd.0 .0 as *const u8, rcv.0 .0 as *mut u8, snd.1 as usize)
                };
            }
            let plan: Vec<_> = plan.iter().filter(|p| p.2 != l.rank).copied().collect();
            let mut ops = Vec::with_capacity(plan.len());
            {
                let (mut sent, mut received) = (l.sent.lock(), l.received.lock());
                for &(a, bytes, peer, recv) in &plan {
                    let k = if recv {
                        &mut received[peer]
                    } else {
                        &mut sent[peer]
                    };
                    ops.push(ffi::P2p {
                        ptr: a.ptr(),
                        bytes: bytes as usize,
                        peer: peer as i32,
                        recv: recv as i32,
                        slot: SLOT_P2P | *k,
                    });
                    *k += 1;
                }
            }
            let mut done = vec![0u8; ops.len()];
            let mut err = ErrBuf::new();
            // SAFETY: every range was checked at enqueue and is held by the operation; the shim
            // aborts every pending transfer before returning.
            let rc = unsafe {
                ffi::uh_gloo_p2p(
                    l.ctx,
                    ops.as_ptr(),
                    ops.len(),
                    l.ms(),
                    done.as_mut_ptr(),
                    err.ptr(),
                    err.0.len(),
                )
            };
            if rc == ffi::TIMEOUT {
                let missing: Vec<usize> = plan
                    .iter()
                    .zip(&done)
                    .filter(|(_, &d)| d == 0)
                    .map(|(p, _)| p.2)
                    .collect();
                return Err(HalError::Timeout {
                    what: format!(
                        "send/recv group of {} calls on rank {}: ranks {missing:?} never arrived",
                        plan.len(),
                        l.rank
                    ),
                    millis: unihal_hal::deadline::millis(l.timeout),
                });
            }
            conv::check(rc, "send/recv group", &err, l.ms())
        })
    }
}

impl Communicator for GlooComm {
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
        self.reduction(
            CollectiveOp::AllReduce,
            send,
            recv,
            count,
            dtype,
            op,
            None,
            stream,
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
        if count == 0 {
            return Ok(());
        }
        let what = format!("broadcast {count} {dtype} root {root}");
        let name = what.clone();
        self.submit(
            s,
            Some(what),
            vec![send.clone(), recv.clone()],
            move |l, tag| {
                // SAFETY: the ranges were checked at enqueue and the operation holds the buffers;
                // `copy` allows the root's send and recv to overlap.
                unsafe {
                    if me_root && sa.0 != ra.0 {
                        std::ptr::copy(sa.0 as *const u8, ra.0 as *mut u8, bytes as usize);
                    }
                    l.call(&name, |ctx, err| {
                        ffi::uh_gloo_broadcast(
                            ctx,
                            std::ptr::null(),
                            ra.ptr(),
                            bytes as usize,
                            root as i32,
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        )
                    })
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
        self.reduction(
            CollectiveOp::Reduce,
            send,
            recv,
            count,
            dtype,
            op,
            Some(root),
            stream,
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
        let mine = self.link.rank as u64 * bytes;
        check_send_recv(send, bytes, recv, total, (0, mine))?;
        if count == 0 {
            return Ok(());
        }
        let what = format!("all_gather {count} {dtype}");
        let name = what.clone();
        self.submit(
            s,
            Some(what),
            vec![send.clone(), recv.clone()],
            move |l, tag| {
                // SAFETY: as in all_reduce; this rank's part is placed first, then gathered in place.
                unsafe {
                    let slot = Addr(ra.0 + mine);
                    if sa.0 != slot.0 {
                        std::ptr::copy(sa.0 as *const u8, slot.0 as *mut u8, bytes as usize);
                    }
                    l.call(&name, |ctx, err| {
                        ffi::uh_gloo_allgather(
                            ctx,
                            std::ptr::null(),
                            ra.ptr(),
                            bytes as usize,
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        )
                    })
                }
            },
        )
    }

    /// All-reduce of every rank's whole input into a scratch buffer, then this rank's part:
    /// gloo has no reduce-scatter of its own (PyTorch's gloo group does the same).
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
        let mine = self.link.rank as u64 * bytes;
        check_send_recv(send, total, recv, bytes, (mine, 0))?;
        if count == 0 {
            return Ok(());
        }
        let what = format!("reduce_scatter {count} {dtype} {op}");
        let name = what.clone();
        let red = conv::reduction(dtype, op);
        let n = count.saturating_mul(self.link.size as u64) as usize;
        self.submit(
            s,
            Some(what),
            vec![send.clone(), recv.clone()],
            move |l, tag| {
                let mut scratch = vec![0u8; total as usize];
                // SAFETY: the ranges were checked at enqueue and the operation holds the buffers;
                // the reduction runs into the scratch buffer, which holds `total` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        sa.0 as *const u8,
                        scratch.as_mut_ptr(),
                        total as usize,
                    );
                    l.call(&name, |ctx, err| {
                        ffi::uh_gloo_allreduce(
                            ctx,
                            std::ptr::null(),
                            scratch.as_mut_ptr().cast(),
                            n,
                            dtype.size(),
                            conv::reduce_cb,
                            (red as *const conv::Reduction).cast(),
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        )
                    })?;
                    let part = scratch.as_mut_ptr().add(mine as usize);
                    if op == ReduceOp::Avg {
                        divide(dtype, part, count as usize, l.size);
                    }
                    std::ptr::copy(part, ra.0 as *mut u8, bytes as usize);
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
        if count == 0 {
            return Ok(());
        }
        let what = format!("all_to_all {count} {dtype}");
        let name = what.clone();
        self.submit(
            s,
            Some(what),
            vec![send.clone(), recv.clone()],
            move |l, tag| {
                // SAFETY: both ranges hold size * count elements, checked at enqueue, held by the
                // operation, and of distinct allocations.
                unsafe {
                    l.call(&name, |ctx, err| {
                        ffi::uh_gloo_alltoall(
                            ctx,
                            sa.ptr(),
                            ra.ptr(),
                            bytes as usize,
                            tag,
                            l.ms(),
                            err.ptr(),
                            err.0.len(),
                        )
                    })
                }
            },
        )
    }

    fn group(&self, calls: &[GroupCall], stream: &Arc<dyn Stream>) -> Result<()> {
        self.p2p(calls, stream)
    }

    /// Every rank tells every other its `(color, key)` over this communicator (an all-gather,
    /// behind the arrival handshake), then the members of each color meet under this
    /// communicator's rendezvous and connect a new gloo context.
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
        let no = self.splits.fetch_add(1, Ordering::SeqCst);
        let l = &self.link;
        let what = format!("split #{no}");
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        l.arrive(seq, &what).inspect_err(|e| l.fail(e))?;
        let mut asks = vec![0u8; 16 * l.size];
        let mine = {
            let c = color.map_or(u64::MAX, u64::from);
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&c.to_le_bytes());
            b[8..].copy_from_slice(&(key as i64).to_le_bytes());
            b
        };
        asks[16 * l.rank..16 * l.rank + 16].copy_from_slice(&mine);
        let tag = tag_of(seq);
        l.call(&what, |ctx, err| {
            // SAFETY: `asks` holds 16 bytes per rank.
            unsafe {
                ffi::uh_gloo_allgather(
                    ctx,
                    std::ptr::null(),
                    asks.as_mut_ptr().cast(),
                    16,
                    tag,
                    l.ms(),
                    err.ptr(),
                    err.0.len(),
                )
            }
        })
        .inspect_err(|e| l.fail(e))?;
        let places: Vec<(Option<u32>, i32)> = asks
            .chunks_exact(16)
            .map(|c| {
                let col = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
                let k = i64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
                ((col != u64::MAX).then_some(col as u32), k as i32)
            })
            .collect();
        let Some((rank, size)) = unihal_hal::ccl::split_place(&places, l.rank) else {
            return Ok(None);
        };
        let sub = l
            .rendezvous
            .child(&format!("split{no}/color{}", color.unwrap_or_default()));
        let link = super::connect(sub, rank, size, timeout)?;
        Ok(Some(Arc::new(GlooComm::new(
            link,
            self.device.clone(),
            self.caps.clone(),
        ))))
    }

    /// Marks the communicator aborted and closes its connections: an operation waiting here ends
    /// at once, and so do the peers' (their connections to this rank break).
    fn abort(&self) {
        unihal_hal::ccl::log_aborted(self);
        let l = &self.link;
        l.fail(&HalError::Aborted {
            what: format!("communicator aborted by rank {}", l.rank),
        });
        if !l.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: the context is live (the link holds it); closing is safe from any thread.
            unsafe { ffi::uh_gloo_close(l.ctx) }
        }
    }

    fn async_error(&self) -> Option<HalError> {
        self.link.sticky()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
