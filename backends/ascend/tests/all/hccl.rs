//! The HCCL engine on the simulated CANN stack (four simulated NPUs): what it reports, every
//! collective with its results, point-to-point alone and grouped, communicators made from one
//! root info by threads, and misuse refused as on every engine. Failures (timeouts, abort,
//! asynchronous errors) are in `hccl_failures.rs` and `hccl_async.rs`.

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::*;
use unihal_hal::{
    Backend, CollectiveOp, CommConfig, Communicator, DType, GroupCall, HalError, Invalid, ReduceOp,
    Stream,
};

const T: Duration = Duration::from_secs(20);

fn backend() -> Arc<unihal_ascend::AscendBackend> {
    simulated(&[])
}

/// Element `i` of rank `r`: small integers, exact in every dtype and for every reduction
/// (multiples of the rank count for the average).
fn value(red: ReduceOp, n: usize, r: usize, i: usize) -> f64 {
    let k = ((i * 7 + r * 3) % 4) as f64;
    match red {
        ReduceOp::Avg => n as f64 * k,
        _ => k,
    }
}

fn reduced(red: ReduceOp, n: usize, i: usize) -> f64 {
    let v: Vec<f64> = (0..n).map(|r| value(red, n, r, i)).collect();
    match red {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Max => v.iter().cloned().fold(f64::MIN, f64::max),
        ReduceOp::Min => v.iter().cloned().fold(f64::MAX, f64::min),
        ReduceOp::Avg => v.iter().sum::<f64>() / n as f64,
    }
}

#[test]
fn engine_reports_hccl_and_what_it_runs() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let info = b.info();
    let line = info
        .libraries
        .iter()
        .find(|l| l.role == "collectives")
        .expect("a collectives line");
    assert_eq!(line.name, "HCCL");
    assert!(line.error.is_none(), "{line:?}");
    assert!(
        line.path
            .as_deref()
            .is_some_and(|p| p.ends_with("lib64/libhccl.so")),
        "{line:?}"
    );
    let caps = b.collectives().unwrap().capabilities().clone();
    assert!(caps.engine.starts_with("HCCL ("), "{}", caps.engine);
    assert!(caps.engine.contains("no abort"), "{}", caps.engine);
    // Split: emulated (hccl_split.rs).
    assert!(caps.groups && caps.split && !caps.survives_dead_rank);
    assert!(!caps.names_missing_ranks && caps.timeout_aborts_peers);
    // Average: emulated for the floats, absent for integers.
    for d in [DType::F32, DType::F16, DType::Bf16] {
        assert!(
            caps.supports(CollectiveOp::AllReduce, d, Some(ReduceOp::Avg)),
            "{d}"
        );
        assert_eq!(caps.accumulation[&d].emulated, vec![ReduceOp::Avg], "{d}");
        assert_eq!(caps.accumulation[&d].accumulate_in, d);
    }
    assert!(!caps.supports(CollectiveOp::AllReduce, DType::I32, Some(ReduceOp::Avg)));
    assert!(caps.supports(CollectiveOp::AllReduce, DType::I32, Some(ReduceOp::Prod)));
    // Reductions in HCCL's documented dtypes only; moves in every dtype HCCL has.
    assert!(!caps.supports(CollectiveOp::AllReduce, DType::I64, Some(ReduceOp::Sum)));
    assert!(!caps.supports(CollectiveOp::ReduceScatter, DType::F64, Some(ReduceOp::Max)));
    for op in [
        CollectiveOp::Broadcast,
        CollectiveOp::AllGather,
        CollectiveOp::AllToAll,
        CollectiveOp::SendRecv,
    ] {
        for d in [DType::I64, DType::F64, DType::U8, DType::Bf16] {
            assert!(caps.supports(op, d, None), "{} {d}", op.name());
        }
        assert!(!caps.supports(op, DType::Bool, None));
    }
}

#[test]
fn all_reduce_sum_avg_and_max_in_f32_and_f16() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let n = 4;
    let comms = ranks(&b, n, T);
    let count = 1037;
    each(&comms, |c, s| {
        let r = c.rank();
        for d in [DType::F32, DType::F16] {
            for red in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
                let vals: Vec<f64> = (0..count).map(|i| value(red, n, r, i)).collect();
                let want: Vec<f64> = (0..count).map(|i| reduced(red, n, i)).collect();
                // Out of place.
                let send = upload(c.device(), s, d, &vals);
                let recv = upload(c.device(), s, d, &vec![0.0; count]);
                c.all_reduce(&send, &recv, count as u64, d, red, s).unwrap();
                assert_eq!(download(s, d, &recv), want, "{d} {red} out of place");
                assert_eq!(download(s, d, &send), vals, "{d} {red}: send untouched");
                // In place.
                c.all_reduce(&send, &send, count as u64, d, red, s).unwrap();
                assert_eq!(download(s, d, &send), want, "{d} {red} in place");
            }
        }
    });
}

#[test]
fn broadcast_in_place_and_out_of_place() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let comms = ranks(&b, 3, T);
    let root = 1;
    each(&comms, |c, s| {
        let r = c.rank();
        let mine: Vec<f64> = (0..100).map(|i| (i + 1000 * r) as f64).collect();
        let roots: Vec<f64> = (0..100).map(|i| (i + 1000 * root) as f64).collect();
        // Out of place: the root's send is copied to its recv first.
        let send = upload(c.device(), s, DType::I32, &mine);
        let recv = upload(c.device(), s, DType::I32, &[-1.0; 100]);
        c.broadcast(&send, &recv, 100, DType::I32, root, s).unwrap();
        assert_eq!(download(s, DType::I32, &recv), roots, "out of place");
        assert_eq!(download(s, DType::I32, &send), mine, "send untouched");
        // In place.
        let buf = upload(c.device(), s, DType::F16, &mine[..50]);
        c.broadcast(&buf, &buf, 50, DType::F16, root, s).unwrap();
        assert_eq!(
            download(s, DType::F16, &buf),
            roots[..50].to_vec(),
            "in place"
        );
        // A zero count issues nothing.
        c.broadcast(&buf, &buf, 0, DType::F16, root, s).unwrap();
        s.synchronize().unwrap();
    });
}

#[test]
fn reduce_all_gather_and_reduce_scatter() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let n = 4;
    let comms = ranks(&b, n, T);
    each(&comms, |c, s| {
        let r = c.rank();
        let d = DType::F32;
        // Reduce (avg emulated on the root only) to root 2: the others' recv is untouched.
        let root = 2;
        let vals: Vec<f64> = (0..33).map(|i| value(ReduceOp::Avg, n, r, i)).collect();
        let send = upload(c.device(), s, d, &vals);
        let recv = upload(c.device(), s, d, &[7.0; 33]);
        c.reduce(&send, &recv, 33, d, ReduceOp::Avg, root, s)
            .unwrap();
        let want: Vec<f64> = if r == root {
            (0..33).map(|i| reduced(ReduceOp::Avg, n, i)).collect()
        } else {
            vec![7.0; 33]
        };
        assert_eq!(download(s, d, &recv), want, "reduce avg on rank {r}");
        // All-gather, in place (this rank's block of recv is its send).
        let all = upload(c.device(), s, d, &vec![0.0; 5 * n]);
        let mine: Vec<f64> = (0..5).map(|i| (10 * r + i) as f64).collect();
        s.write(&all, (5 * r * 4) as u64, &encode(d, &mine))
            .unwrap();
        let block = all.slice((5 * r * 4) as u64, 20).unwrap();
        c.all_gather(&block, &all, 5, d, s).unwrap();
        let want: Vec<f64> = (0..n)
            .flat_map(|q| (0..5).map(move |i| (10 * q + i) as f64))
            .collect();
        assert_eq!(download(s, d, &all), want, "all_gather in place");
        // Reduce-scatter of min, out of place, in bf16.
        let d = DType::Bf16;
        let vals: Vec<f64> = (0..3 * n).map(|i| value(ReduceOp::Min, n, r, i)).collect();
        let send = upload(c.device(), s, d, &vals);
        let recv = upload(c.device(), s, d, &[0.0; 3]);
        c.reduce_scatter(&send, &recv, 3, d, ReduceOp::Min, s)
            .unwrap();
        let want: Vec<f64> = (0..3)
            .map(|i| reduced(ReduceOp::Min, n, 3 * r + i))
            .collect();
        assert_eq!(download(s, d, &recv), want, "reduce_scatter min");
    });
}

#[test]
fn send_recv_alone_and_grouped() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let n = 4;
    let comms = ranks(&b, n, T);
    each(&comms, |c, s| {
        let r = c.rank();
        let d = DType::I64;
        let mine: Vec<f64> = (0..17).map(|i| (100 * r + i) as f64).collect();
        let of = |q: usize| -> Vec<f64> { (0..17).map(|i| (100 * q + i) as f64).collect() };
        // Pairs (0, 1) and (2, 3): even ranks send first, odd ranks receive first.
        let partner = r ^ 1;
        let send = upload(c.device(), s, d, &mine);
        let recv = upload(c.device(), s, d, &[0.0; 17]);
        if r % 2 == 0 {
            c.send(&send, 17, d, partner, s).unwrap();
            c.recv(&recv, 17, d, partner, s).unwrap();
        } else {
            c.recv(&recv, 17, d, partner, s).unwrap();
            c.send(&send, 17, d, partner, s).unwrap();
        }
        assert_eq!(download(s, d, &recv), of(partner), "pair");
        // A ring in one group: it would deadlock as separate blocking calls.
        let recv = upload(c.device(), s, d, &[0.0; 17]);
        c.group(
            &[
                GroupCall::Send {
                    buf: send.clone(),
                    count: 17,
                    dtype: d,
                    peer: (r + 1) % n,
                },
                GroupCall::Recv {
                    buf: recv.clone(),
                    count: 17,
                    dtype: d,
                    peer: (r + n - 1) % n,
                },
                // Nothing moves; both sides leave it out.
                GroupCall::Send {
                    buf: send.clone(),
                    count: 0,
                    dtype: d,
                    peer: (r + 2) % n,
                },
            ],
            s,
        )
        .unwrap();
        assert_eq!(download(s, d, &recv), of((r + n - 1) % n), "ring");
    });
}

#[test]
fn all_to_all_and_all_to_allv() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let n = 3;
    let comms = ranks(&b, n, T);
    each(&comms, |c, s| {
        let r = c.rank();
        let d = DType::U8;
        // Block j of rank r goes to rank j.
        let v = |src: usize, dst: usize, i: usize| (src * 30 + dst * 10 + i) as f64;
        let send: Vec<f64> = (0..n)
            .flat_map(|j| (0..4).map(move |i| v(r, j, i)))
            .collect();
        let sb = upload(c.device(), s, d, &send);
        let rb = upload(c.device(), s, d, &vec![0.0; 4 * n]);
        c.all_to_all(&sb, &rb, 4, d, s).unwrap();
        let want: Vec<f64> = (0..n)
            .flat_map(|j| (0..4).map(move |i| v(j, r, i)))
            .collect();
        assert_eq!(download(s, d, &rb), want, "all_to_all");
        // All-to-all-v: rank r sends j + 1 elements to rank j (0 to itself on rank 0).
        let count = |src: usize, dst: usize| {
            if src == 0 && dst == 0 {
                0
            } else {
                dst + 1 + src
            }
        };
        let sc: Vec<u64> = (0..n).map(|j| count(r, j) as u64).collect();
        let rc: Vec<u64> = (0..n).map(|j| count(j, r) as u64).collect();
        let displs = |c: &[u64]| -> Vec<u64> {
            c.iter()
                .scan(0, |at, &k| {
                    let d = *at;
                    *at += k;
                    Some(d)
                })
                .collect()
        };
        let (sd, rd) = (displs(&sc), displs(&rc));
        let send: Vec<f64> = (0..n)
            .flat_map(|j| (0..count(r, j)).map(move |i| v(r, j, i)))
            .collect();
        let sb = upload(c.device(), s, d, &send);
        let total: u64 = rc.iter().sum();
        let rb = upload(c.device(), s, d, &vec![0.0; total as usize]);
        c.all_to_allv(&sb, &sc, &sd, &rb, &rc, &rd, d, s).unwrap();
        let want: Vec<f64> = (0..n)
            .flat_map(|j| (0..count(j, r)).map(move |i| v(j, r, i)))
            .collect();
        assert_eq!(download(s, d, &rb), want, "all_to_allv");
    });
}

#[test]
fn init_rank_from_threads_with_one_root_info() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let ccl = b.collectives().unwrap();
    let id = ccl.unique_id().unwrap();
    assert_eq!(id.0.len(), 4108, "HCCL's root info");
    assert_ne!(ccl.unique_id().unwrap(), id);
    let n = 3;
    let devs = devices(&b, n);
    let cfg = CommConfig { timeout: Some(T) };
    let comms: Vec<Arc<dyn Communicator>> = std::thread::scope(|sc| {
        let hs: Vec<_> = devs
            .iter()
            .enumerate()
            .map(|(r, d)| {
                let (id, cfg) = (&id, &cfg);
                sc.spawn(move || ccl.init_rank(id, n, r, d, cfg).unwrap())
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, c) in comms.iter().enumerate() {
        assert_eq!((c.rank(), c.size()), (r, n));
        assert_eq!(c.device().id(), devs[r].id());
        assert_ne!(native(c), 0);
    }
    let sums = each(&comms, |c, s| {
        let buf = upload(c.device(), s, DType::I32, &[c.rank() as f64 + 1.0; 8]);
        c.all_reduce(&buf, &buf, 8, DType::I32, ReduceOp::Sum, s)
            .unwrap();
        download(s, DType::I32, &buf)
    });
    assert!(sums.iter().all(|v| v == &[6.0; 8]), "{sums:?}");
    // Ids of another engine's size and ranks out of range are refused at the call.
    let bad = unihal_hal::UniqueId(vec![0; 128]);
    match ccl.init_rank(&bad, 2, 0, &devs[0], &cfg) {
        Err(HalError::InvalidArgument { arg: "id", .. }) => {}
        other => panic!("a 128-byte id: {:?}", other.map(|c| c.rank())),
    }
    match ccl.init_rank(&id, 2, 2, &devs[0], &cfg) {
        Err(HalError::InvalidArgument { arg: "rank", .. }) => {}
        other => panic!("rank 2 of 2: {:?}", other.map(|c| c.rank())),
    }
}

#[test]
fn misuse_is_refused_at_the_call_as_on_every_engine() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let comms = ranks(&b, 2, T);
    each(&comms, |c, s| {
        let buf = c.device().alloc(64).unwrap();
        // A size whose bytes overflow: the shared check's own error.
        match c.all_reduce(&buf, &buf, u64::MAX / 2, DType::F32, ReduceOp::Sum, s) {
            Err(HalError::InvalidArgument {
                arg: "send",
                reason: Invalid::Value { accepted, .. },
            }) => assert_eq!(accepted, "a size that fits 64 bits"),
            other => panic!("overflowing count: {other:?}"),
        }
        // Out of range.
        match c.all_reduce(&buf, &buf, 17, DType::F32, ReduceOp::Sum, s) {
            Err(HalError::InvalidArgument {
                arg: "send",
                reason:
                    Invalid::OutOfRange {
                        len: 68, size: 64, ..
                    },
            }) => {}
            other => panic!("count past the buffer: {other:?}"),
        }
        // A partial overlap.
        let (lo, hi) = (buf.slice(0, 32).unwrap(), buf.slice(16, 32).unwrap());
        match c.all_reduce(&lo, &hi, 8, DType::F32, ReduceOp::Sum, s) {
            Err(HalError::InvalidArgument {
                arg: "recv",
                reason: Invalid::Overlap { .. },
            }) => {}
            other => panic!("overlap: {other:?}"),
        }
        match c.send(&buf, 4, DType::F32, 5, s) {
            Err(HalError::InvalidArgument {
                arg: "peer",
                reason: Invalid::Value { value, accepted },
            }) => assert_eq!((value.as_str(), accepted.as_str()), ("5", "0..2")),
            other => panic!("peer 5: {other:?}"),
        }
        // Outside the capabilities.
        for r in [
            c.all_reduce(&buf, &buf, 4, DType::I32, ReduceOp::Avg, s),
            c.all_reduce(&buf, &buf, 4, DType::I64, ReduceOp::Sum, s),
            c.all_reduce(&buf, &buf, 4, DType::Bool, ReduceOp::Sum, s),
        ] {
            assert!(matches!(r, Err(HalError::Unsupported { .. })), "{r:?}");
        }
        s.synchronize().unwrap();
        assert!(c.async_error().is_none(), "rejected calls left an error");
    });
}

#[test]
fn a_failing_async_error_query_is_an_error_not_health() {
    if crate::own_process() {
        return;
    }
    let b = backend();
    let comms = ranks(&b, 2, T);
    assert!(comms[0].async_error().is_none());
    // HcclGetCommAsyncError itself fails (HCCL_E_INTERNAL): its out-value means nothing.
    sim::fail("HcclGetCommAsyncError", 1, 4);
    let e = comms[0].async_error();
    sim::clear();
    match &e {
        Some(HalError::Vendor {
            library,
            call,
            code: 4,
            name,
            ..
        }) => {
            assert_eq!(
                (library.as_str(), call.as_str(), name.as_str()),
                ("HCCL", "HcclGetCommAsyncError", "HCCL_E_INTERNAL")
            );
        }
        other => panic!("{other:?}"),
    }
    // The communicator failed with it: sticky, and its peer stopped too.
    assert_eq!(comms[0].async_error(), e);
    assert!(matches!(
        comms[1].async_error(),
        Some(HalError::Aborted { .. })
    ));
    let s: Arc<dyn Stream> = comms[1].device().create_stream().unwrap();
    let buf = comms[1].device().alloc(16).unwrap();
    assert!(comms[1]
        .all_reduce(&buf, &buf, 4, DType::F32, ReduceOp::Sum, &s)
        .is_err());
}
