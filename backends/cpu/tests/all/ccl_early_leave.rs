//! A rank that leaves a collective early (its barrier timed out, or the communicator was aborted)
//! must not free what its peers still read or write. Each test drops the leaving rank's last
//! buffer handles right after the enqueue (the API allows it: queued work keeps them), makes that
//! rank's part of the work small and its peer's large (fresh, unfaulted destination pages), and
//! fails the round while the peer still copies. Before the fix the leaving rank freed its buffers
//! at once and the peer faulted (SIGSEGV; AddressSanitizer reports the read).
#![cfg(not(loom))] // the loom build compiles only the protocols loom checks

use std::sync::Arc;
use std::time::Duration;
use unihal_cpu::{CpuBackend, CpuConfig};
use unihal_hal::{
    Backend, Buffer, CommConfig, Communicator, DType, FillValue, HalError, ReduceOp, Stream,
};

/// Elements per rank: large enough that the peer's copy outlasts the short timeout.
const COUNT: u64 = 24 << 20;

struct Rank {
    comm: Arc<dyn Communicator>,
    stream: Arc<dyn Stream>,
}

fn ranks(timeout: Duration) -> (CpuBackend, Vec<Rank>) {
    let backend =
        CpuBackend::with_config(CpuConfig::from_values(Some("2"), Some("4G"), Some("1")).unwrap());
    let devs: Vec<_> = (0..2).map(|i| backend.open(i).unwrap()).collect();
    let comms = backend
        .collectives()
        .unwrap()
        .init_all(
            &devs,
            &CommConfig {
                timeout: Some(timeout),
            },
        )
        .unwrap();
    let ranks = comms
        .into_iter()
        .zip(&devs)
        .map(|(comm, d)| Rank {
            comm,
            stream: d.create_stream().unwrap(),
        })
        .collect();
    (backend, ranks)
}

/// A buffer of `bytes` on the rank's device; pre-touched when `warm`, so the leaving rank's own
/// copies are fast and it reaches its barrier long before its peer.
fn buffer(r: &Rank, bytes: u64, warm: bool) -> Buffer {
    let b = r.comm.device().alloc(bytes as usize).unwrap();
    if warm {
        r.stream.fill(&b, 0, bytes, FillValue::U8(1)).unwrap();
        r.stream.synchronize().unwrap();
    }
    b
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Broadcast,
    Reduce,
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
}

/// Enqueues `op` on both ranks (rank 1 leaves early), drops rank 1's buffers, then fails the
/// round by `abort` (or lets the short timeout expire) and checks both ranks end with a typed
/// error or success, and nothing crashed.
fn leave_early(op: Op, abort: bool) {
    let (_backend, rk) = ranks(Duration::from_millis(if abort { 30_000 } else { 10 }));
    let n = 2u64;
    let esz = 4u64;
    let (send_len, recv_len) = match op {
        Op::Broadcast | Op::Reduce | Op::AllReduce => (COUNT * esz, COUNT * esz),
        Op::AllGather => (COUNT * esz, n * COUNT * esz),
        Op::ReduceScatter => (n * COUNT * esz, COUNT * esz),
        Op::AllToAll => (n * COUNT * esz, n * COUNT * esz),
    };
    // Every buffer first, so that both ranks arrive within the short timeout.
    let mut bufs: Vec<(Buffer, Buffer)> = rk
        .iter()
        .enumerate()
        .map(|(i, r)| (buffer(r, send_len, true), buffer(r, recv_len, i == 1)))
        .collect();
    for (r, (send, recv)) in rk.iter().zip(&bufs) {
        let (c, s) = (&r.comm, &r.stream);
        match op {
            Op::Broadcast => c.broadcast(recv, recv, COUNT, DType::F32, 1, s),
            Op::Reduce => c.reduce(send, recv, COUNT, DType::F32, ReduceOp::Sum, 1, s),
            Op::AllReduce => c.all_reduce(send, recv, COUNT, DType::F32, ReduceOp::Sum, s),
            Op::AllGather => c.all_gather(send, recv, COUNT, DType::F32, s),
            Op::ReduceScatter => c.reduce_scatter(send, recv, COUNT, DType::F32, ReduceOp::Sum, s),
            Op::AllToAll => c.all_to_all(send, recv, COUNT, DType::F32, s),
        }
        .unwrap();
    }
    // Rank 1's handles drop here: only its queued operation keeps the memory.
    bufs.truncate(1);
    if abort {
        std::thread::sleep(Duration::from_millis(5));
        rk[1].comm.abort();
    }
    for (i, r) in rk.iter().enumerate() {
        match r.stream.synchronize() {
            Ok(()) | Err(HalError::Timeout { .. }) | Err(HalError::Aborted { .. }) => {}
            Err(e) => panic!("{op:?}: rank {i} ended with {e}"),
        }
    }
    drop(bufs);
}

#[test]
fn broadcast_root_leaving_early_keeps_its_buffer() {
    leave_early(Op::Broadcast, false);
    leave_early(Op::Broadcast, true);
}

#[test]
fn reduce_root_leaving_early_keeps_its_buffers() {
    leave_early(Op::Reduce, false);
    leave_early(Op::Reduce, true);
}

#[test]
fn all_reduce_rank_leaving_early_keeps_its_buffers() {
    leave_early(Op::AllReduce, false);
    leave_early(Op::AllReduce, true);
}

#[test]
fn all_gather_rank_leaving_early_keeps_its_buffers() {
    leave_early(Op::AllGather, false);
    leave_early(Op::AllGather, true);
}

#[test]
fn reduce_scatter_rank_leaving_early_keeps_its_buffers() {
    leave_early(Op::ReduceScatter, false);
    leave_early(Op::ReduceScatter, true);
}

#[test]
fn all_to_all_rank_leaving_early_keeps_its_buffers() {
    leave_early(Op::AllToAll, false);
    leave_early(Op::AllToAll, true);
}

/// Point-to-point groups: the sender drops its buffer after enqueue and aborts; sends are eager
/// copies, so the receiver never reads the sender's memory. No crash, typed errors only.
#[test]
fn p2p_sender_dropping_and_aborting_is_safe() {
    let (_backend, rk) = ranks(Duration::from_millis(30_000));
    let bytes = COUNT * 4;
    let dst = buffer(&rk[0], bytes, false);
    {
        let src = buffer(&rk[1], bytes, true);
        rk[1]
            .comm
            .send(&src, COUNT, DType::F32, 0, &rk[1].stream)
            .unwrap();
    }
    rk[0]
        .comm
        .recv(&dst, COUNT, DType::F32, 1, &rk[0].stream)
        .unwrap();
    rk[1].comm.abort();
    for r in &rk {
        match r.stream.synchronize() {
            Ok(()) | Err(HalError::Aborted { .. }) => {}
            Err(e) => panic!("p2p after abort: {e}"),
        }
    }
}
