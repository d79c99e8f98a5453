//! In-process ranks of the simulator core: collectives and point-to-point groups move the right
//! data in deferred mode whether each rank has its own thread or one thread drives them all;
//! misuse (a missing rank, a mismatch, an ungrouped exchange, two ranks on one device) fails with
//! its error instead of hanging; abort finishes the aborting rank only.

use std::sync::Arc;
use std::time::Duration;
use unihal_hal::{DType, ReduceOp};
use unihal_sim::ccl::{fresh_id, Collective, Comm, CommError, Kind, P2p, Registry};
use unihal_sim::{Device, Mode, SimError, StreamId};

const MB: u64 = 1 << 20;
const LONG: Duration = Duration::from_secs(20);
const SHORT: Duration = Duration::from_millis(300);

struct Rank {
    comm: Comm,
    stream: StreamId,
}

/// `n` ranks on `n` deferred devices with the given watchdog, joined from one thread each.
fn ranks(n: usize, watchdog: Duration) -> Vec<Rank> {
    ranks_in(n, watchdog, Mode::Deferred)
}

/// As [`ranks`], the devices in `mode`.
fn ranks_in(n: usize, watchdog: Duration, mode: Mode) -> Vec<Rank> {
    let registry = Arc::new(Registry::new());
    let id = fresh_id();
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let registry = registry.clone();
            std::thread::spawn(move || {
                let d = Arc::new(
                    Device::new(64 * MB, mode)
                        .with_ordinal(r as u32)
                        .with_watchdog(watchdog),
                );
                let stream = d.create_stream().unwrap();
                let comm = registry.init_rank(&id, n, r, d, LONG).unwrap();
                Rank { comm, stream }
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn upload(r: &Rank, data: &[i32]) -> u64 {
    let d = r.comm.device();
    let a = d.alloc((data.len() * 4).max(4) as u64).unwrap();
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    d.write(a, &bytes).unwrap();
    a
}

fn download(r: &Rank, addr: u64, n: usize) -> Vec<i32> {
    let mut bytes = vec![0u8; n * 4];
    r.comm.device().read(addr, &mut bytes).unwrap();
    bytes
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn call(kind: Kind, count: u64, send: u64, recv: u64) -> Collective {
    Collective {
        kind,
        dtype: DType::I32,
        count,
        send,
        recv,
    }
}

#[test]
fn every_collective_moves_the_right_data_with_a_thread_per_rank() {
    if crate::own_process() {
        return;
    }
    let n = 3;
    let rs = Arc::new(ranks(n, LONG));
    let c = 5usize;
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let rs = rs.clone();
            std::thread::spawn(move || {
                let me = &rs[r];
                // Rank r's value at i (a block layout for the n*c-element inputs).
                let v = |i: usize| (100 * r + i) as i32;
                let one: Vec<i32> = (0..c).map(v).collect();
                let all: Vec<i32> = (0..n * c).map(v).collect();
                let (s1, sa) = (upload(me, &one), upload(me, &all));
                let out: Vec<u64> = (0..6).map(|_| upload(me, &vec![-1; n * c])).collect();
                let kinds = [
                    (Kind::AllReduce(ReduceOp::Sum), s1),
                    (Kind::Broadcast { root: 1 }, s1),
                    (
                        Kind::Reduce {
                            op: ReduceOp::Max,
                            root: 2,
                        },
                        s1,
                    ),
                    (Kind::AllGather, s1),
                    (Kind::ReduceScatter(ReduceOp::Sum), sa),
                    (Kind::AllToAll, sa),
                ];
                for ((kind, send), &recv) in kinds.into_iter().zip(&out) {
                    me.comm
                        .collective(me.stream, call(kind, c as u64, send, recv))
                        .unwrap();
                }
                me.comm.device().stream_synchronize(me.stream).unwrap();
                out.iter()
                    .map(|&a| download(me, a, n * c))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let got: Vec<Vec<Vec<i32>>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let v = |r: usize, i: usize| (100 * r + i) as i32;
    for (r, outs) in got.iter().enumerate() {
        let rest = |k: usize| vec![-1; n * c - k];
        let sum: Vec<i32> = (0..c).map(|i| (0..n).map(|j| v(j, i)).sum()).collect();
        assert_eq!(outs[0], [sum.clone(), rest(c)].concat(), "all_reduce r{r}");
        let bcast: Vec<i32> = (0..c).map(|i| v(1, i)).collect();
        assert_eq!(outs[1], [bcast, rest(c)].concat(), "broadcast r{r}");
        let reduce = if r == 2 {
            [(0..c).map(|i| v(2, i)).collect::<Vec<_>>(), rest(c)].concat()
        } else {
            vec![-1; n * c]
        };
        assert_eq!(outs[2], reduce, "reduce r{r}");
        let gather: Vec<i32> = (0..n).flat_map(|j| (0..c).map(move |i| v(j, i))).collect();
        assert_eq!(outs[3], gather, "all_gather r{r}");
        let scatter: Vec<i32> = (0..c)
            .map(|i| (0..n).map(|j| v(j, r * c + i)).sum())
            .collect();
        assert_eq!(outs[4], [scatter, rest(c)].concat(), "reduce_scatter r{r}");
        let a2a: Vec<i32> = (0..n)
            .flat_map(|j| (0..c).map(move |i| v(j, r * c + i)))
            .collect();
        assert_eq!(outs[5], a2a, "all_to_all r{r}");
    }
}

#[test]
fn one_thread_drives_every_rank_and_only_dependencies_run() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(4, LONG);
    let bufs: Vec<u64> = rs
        .iter()
        .enumerate()
        .map(|(r, me)| upload(me, &[r as i32 + 1; 8]))
        .collect();
    for (me, &b) in rs.iter().zip(&bufs) {
        // In place, as NCCL allows.
        let c = call(Kind::AllReduce(ReduceOp::Sum), 8, b, b);
        me.comm.collective(me.stream, c).unwrap();
    }
    // Synchronising rank 0 runs the peers' streams up to their part (a GPU would run them
    // by itself); nothing else is needed.
    rs[0]
        .comm
        .device()
        .stream_synchronize(rs[0].stream)
        .unwrap();
    for (me, &b) in rs.iter().zip(&bufs) {
        assert_eq!(download(me, b, 8), vec![10; 8]);
    }
}

#[test]
fn grouped_sends_and_receives_form_a_ring_and_self_sends_work() {
    if crate::own_process() {
        return;
    }
    let n = 3;
    let rs = ranks(n, LONG);
    let mut recvs = Vec::new();
    for (r, me) in rs.iter().enumerate() {
        let send = upload(me, &[r as i32; 4]);
        let recv = upload(me, &[-1; 4]);
        let self_recv = upload(me, &[-1; 4]);
        let d = DType::I32;
        let calls = [
            P2p::Recv {
                peer: (r + n - 1) % n,
                addr: recv,
                count: 4,
                dtype: d,
            },
            P2p::Send {
                peer: (r + 1) % n,
                addr: send,
                count: 4,
                dtype: d,
            },
            P2p::Send {
                peer: r,
                addr: send,
                count: 4,
                dtype: d,
            },
            P2p::Recv {
                peer: r,
                addr: self_recv,
                count: 4,
                dtype: d,
            },
        ];
        me.comm.group(me.stream, &calls).unwrap();
        recvs.push((recv, self_recv));
    }
    for (r, (me, &(recv, self_recv))) in rs.iter().zip(&recvs).enumerate().rev() {
        me.comm.device().stream_synchronize(me.stream).unwrap();
        assert_eq!(download(me, recv, 4), vec![((r + n - 1) % n) as i32; 4]);
        assert_eq!(download(me, self_recv, 4), vec![r as i32; 4]);
    }
}

#[test]
fn a_rank_that_never_calls_times_out_instead_of_hanging() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(2, SHORT);
    let b = upload(&rs[0], &[1; 4]);
    let c = call(Kind::AllReduce(ReduceOp::Sum), 4, b, b);
    rs[0].comm.collective(rs[0].stream, c).unwrap();
    let e = rs[0].comm.device().stream_synchronize(rs[0].stream);
    match e {
        Err(SimError::Timeout(m)) => assert!(m.contains("rank 1 never called it"), "{m}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // Sticky on the device; the communicator reports the failure to every rank.
    assert!(matches!(
        rs[0].comm.device().sticky(),
        Some(SimError::Timeout(_))
    ));
    assert!(matches!(
        rs[1].comm.error(),
        Some(CommError::Failed(SimError::Timeout(_)))
    ));
}

#[test]
fn ungrouped_send_then_receive_both_ways_deadlocks_into_a_timeout() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(2, SHORT);
    for (r, me) in rs.iter().enumerate() {
        let peer = 1 - r;
        let (s, d) = (upload(me, &[r as i32; 4]), upload(me, &[0; 4]));
        let send = P2p::Send {
            peer,
            addr: s,
            count: 4,
            dtype: DType::I32,
        };
        let recv = P2p::Recv {
            peer,
            addr: d,
            count: 4,
            dtype: DType::I32,
        };
        me.comm.group(me.stream, &[send]).unwrap();
        me.comm.group(me.stream, &[recv]).unwrap();
    }
    let e = rs[0].comm.device().stream_synchronize(rs[0].stream);
    assert!(matches!(e, Err(SimError::Timeout(_))), "{e:?}");
}

#[test]
fn mismatched_collectives_fail_every_rank() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(2, LONG);
    for (r, me) in rs.iter().enumerate() {
        let b = upload(me, &[1; 8]);
        let c = call(Kind::AllReduce(ReduceOp::Sum), 4 + r as u64, b, b);
        me.comm.collective(me.stream, c).unwrap();
    }
    for me in &rs {
        let e = me.comm.device().stream_synchronize(me.stream);
        match e {
            Err(SimError::LaunchFailed(m)) => assert!(m.contains("mismatch"), "{m}"),
            other => panic!("expected a mismatch failure, got {other:?}"),
        }
    }
}

#[test]
fn abort_finishes_the_aborting_rank_and_peers_see_it() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(2, SHORT);
    let bufs: Vec<u64> = rs.iter().map(|me| upload(me, &[5; 4])).collect();
    let c = call(Kind::AllReduce(ReduceOp::Sum), 4, bufs[0], bufs[0]);
    rs[0].comm.collective(rs[0].stream, c).unwrap();
    rs[0].comm.abort();
    // The aborted rank's queued collective finishes without data; later calls are refused.
    rs[0]
        .comm
        .device()
        .stream_synchronize(rs[0].stream)
        .unwrap();
    assert_eq!(download(&rs[0], bufs[0], 4), vec![5; 4]);
    assert!(matches!(
        rs[0].comm.collective(rs[0].stream, c),
        Err(SimError::InvalidUsage(_))
    ));
    assert_eq!(rs[0].comm.error(), Some(CommError::Aborted));
    assert_eq!(rs[1].comm.error(), Some(CommError::PeerAborted(0)));
    // The peer's collective cannot finish: like NCCL's it waits, here until the watchdog.
    let c1 = call(Kind::AllReduce(ReduceOp::Sum), 4, bufs[1], bufs[1]);
    rs[1].comm.collective(rs[1].stream, c1).unwrap();
    let e = rs[1].comm.device().stream_synchronize(rs[1].stream);
    assert!(matches!(e, Err(SimError::Timeout(_))), "{e:?}");
}

#[test]
fn a_round_an_aborted_rank_had_joined_never_runs() {
    if crate::own_process() {
        return;
    }
    // Eager devices: rank 0's collective posts its part at once, then waits for rank 1.
    let rs = ranks_in(2, SHORT, Mode::Eager);
    let bufs: Vec<u64> = rs.iter().map(|me| upload(me, &[5; 4])).collect();
    let c0 = call(Kind::AllReduce(ReduceOp::Sum), 4, bufs[0], bufs[0]);
    rs[0].comm.collective(rs[0].stream, c0).unwrap();
    rs[0].comm.abort();
    let d0 = rs[0].comm.device();
    d0.stream_synchronize(rs[0].stream).unwrap();
    // Its operation is over: its memory may go (the backend frees it when the stream is done).
    d0.free(bufs[0]).unwrap();
    // The peer's matching call must not complete the round (that would read freed memory): it
    // waits until the watchdog, as after any abort.
    let c1 = call(Kind::AllReduce(ReduceOp::Sum), 4, bufs[1], bufs[1]);
    rs[1].comm.collective(rs[1].stream, c1).unwrap();
    let e = rs[1].comm.device().stream_synchronize(rs[1].stream);
    assert!(
        matches!(e, Err(SimError::Timeout(_))),
        "the round ran: {e:?}"
    );
}

#[test]
fn queued_collectives_keep_their_buffers_and_queries_do_not_block() {
    if crate::own_process() {
        return;
    }
    let rs = ranks(2, LONG);
    let me = &rs[0];
    let d = me.comm.device();
    let b = upload(me, &[1; 4]);
    me.comm
        .collective(me.stream, call(Kind::AllReduce(ReduceOp::Sum), 4, b, b))
        .unwrap();
    assert_eq!(d.free(b), Err(SimError::FreeInFlight(b)));
    let e = d.create_event().unwrap();
    d.record(e, me.stream).unwrap();
    assert_eq!(d.query(e), Err(SimError::NotReady), "rank 1 has not called");
    // A buffer outside every allocation is refused when queued.
    let bad = call(Kind::AllReduce(ReduceOp::Sum), 4, b + 8, b);
    assert!(matches!(
        me.comm.collective(me.stream, bad),
        Err(SimError::InvalidValue(_))
    ));
    let peer = &rs[1];
    let pb = upload(peer, &[2; 4]);
    peer.comm
        .collective(peer.stream, call(Kind::AllReduce(ReduceOp::Sum), 4, pb, pb))
        .unwrap();
    // Polling finishes by itself once the peer has queued its part.
    while d.query(e) == Err(SimError::NotReady) {
        std::thread::yield_now();
    }
    assert_eq!(download(me, b, 4), vec![3; 4]);
    d.free(b).unwrap();
}

#[test]
fn init_refuses_shared_devices_and_times_out_on_absent_ranks() {
    if crate::own_process() {
        return;
    }
    let registry = Arc::new(Registry::new());
    let d = Arc::new(Device::new(MB, Mode::Deferred));
    let id = fresh_id();
    let joins: Vec<_> = (0..2)
        .map(|r| {
            let (registry, d) = (registry.clone(), d.clone());
            std::thread::spawn(move || registry.init_rank(&id, 2, r, d, LONG).err())
        })
        .collect();
    for j in joins {
        assert!(
            matches!(j.join().unwrap(), Some(SimError::InvalidUsage(m)) if m.contains("same device"))
        );
    }
    let lonely = registry.init_rank(&fresh_id(), 3, 0, d.clone(), SHORT);
    match lonely.err() {
        Some(SimError::Timeout(m)) => assert!(m.contains("ranks 1, 2 never joined"), "{m}"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(matches!(
        registry.init_rank(&fresh_id(), 2, 2, d, SHORT),
        Err(SimError::InvalidValue(_))
    ));
}

#[test]
fn split_forms_communicators_by_color_ordered_by_key_and_times_out_on_absent_ranks() {
    if crate::own_process() {
        return;
    }
    let n = 4;
    let rs = Arc::new(ranks(n, LONG));
    let registry = Arc::new(Registry::new());
    let threads: Vec<_> = (0..n)
        .map(|r| {
            let (rs, registry) = (rs.clone(), registry.clone());
            std::thread::spawn(move || {
                let me = &rs[r];
                // Rank 3 joins nothing; ranks 0 and 2 form color 0 in reverse order (keys -r);
                // rank 1 is alone in color 1.
                let color = match r {
                    3 => None,
                    _ => Some((r % 2) as u32),
                };
                let child = me.comm.split(&registry, color, -(r as i32), LONG).unwrap();
                let Some(child) = child else {
                    assert_eq!(r, 3);
                    return;
                };
                let want = match r {
                    0 => (1, 2),
                    2 => (0, 2),
                    _ => (0, 1),
                };
                assert_eq!((child.rank(), child.nranks()), want, "rank {r}");
                let a = upload(me, &[r as i32 + 1; 4]);
                child
                    .collective(me.stream, call(Kind::AllReduce(ReduceOp::Sum), 4, a, a))
                    .unwrap();
                child.device().stream_synchronize(me.stream).unwrap();
                let sum = if r % 2 == 0 { 1 + 3 } else { 2 };
                assert_eq!(download(me, a, 4), vec![sum; 4], "rank {r}");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // A second split where rank 1 never calls: the others time out naming it.
    let threads: Vec<_> = [0usize, 2, 3]
        .into_iter()
        .map(|r| {
            let (rs, registry) = (rs.clone(), registry.clone());
            std::thread::spawn(
                move || match rs[r].comm.split(&registry, Some(0), 0, SHORT) {
                    Err(SimError::Timeout(what)) => assert!(what.contains('1'), "{what}"),
                    other => panic!("rank {r}: {:?}", other.map(|c| c.is_some())),
                },
            )
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}
