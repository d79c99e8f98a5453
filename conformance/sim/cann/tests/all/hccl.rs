//! The simulated HCCL: ranks on threads, each on its own simulated NPU.

use crate::support;

use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::hccl::*;
use unihal_sim_cann::runtime::*;

#[test]
fn all_reduce_on_four_ranks() {
    if crate::own_process() {
        return;
    }
    init();
    assert_eq!(std::mem::size_of::<HcclRootInfo>(), 4108);
    let id = std::sync::Arc::new(root());
    let out = ranks(4, move |r| {
        let mut comm = null_mut();
        assert_eq!(
            // SAFETY: live pointers.
            unsafe { HcclCommInitRootInfo(4, &*id, r, &mut comm) },
            0,
            "{}",
            msg()
        );
        let buf = dev(&[r as f32 + 1.0; 16]);
        assert_eq!(
            HcclAllReduce(buf, buf, 16, HCCL_FP32, HCCL_SUM, comm, null_mut()),
            0,
            "{}",
            msg()
        );
        ok(aclrtSynchronizeStream(null_mut()));
        let v = host::<f32>(buf, 16);
        let mut e = -1;
        // SAFETY: a live out-pointer.
        unsafe { assert_eq!(HcclGetCommAsyncError(comm, &mut e), 0) };
        assert_eq!(e, 0);
        assert_eq!(HcclCommDestroy(comm), 0);
        v
    });
    for v in out {
        assert_eq!(v, vec![10f32; 16]);
    }
    assert_eq!(
        HcclAllReduce(
            null_mut(),
            null_mut(),
            1,
            HCCL_FP32,
            4,
            null_mut(),
            null_mut()
        ),
        1,
        "HCCL has no average"
    );
    assert_eq!(
        HcclAllReduce(
            null_mut(),
            null_mut(),
            1,
            HCCL_FP32,
            HCCL_SUM,
            null_mut(),
            null_mut()
        ),
        2,
        "no comm"
    );
}

#[test]
fn a_missing_rank_times_out() {
    if crate::own_process() {
        return;
    }
    init();
    let id = std::sync::Arc::new(root());
    let r = ranks(1, move |r| {
        let mut comm = null_mut();
        // SAFETY: live pointers.
        let code = unsafe { HcclCommInitRootInfo(2, &*id, r, &mut comm) };
        (code, msg())
    });
    assert_eq!(r[0].0, 9, "HCCL_E_TIMEOUT");
    assert!(r[0].1.contains("never joined"), "{}", r[0].1);
}

#[test]
fn every_collective_and_point_to_point_call() {
    if crate::own_process() {
        return;
    }
    init();
    let id = std::sync::Arc::new(root());
    let n = 4u32;
    ranks(n, move |r| {
        let mut comm = null_mut();
        assert_eq!(
            // SAFETY: live pointers.
            unsafe { HcclCommInitRootInfo(n, &*id, r, &mut comm) },
            0,
            "{}",
            msg()
        );
        let (mut size, mut rank) = (0u32, 0u32);
        // SAFETY: live out-pointers.
        unsafe {
            assert_eq!(HcclGetRankSize(comm, &mut size), 0);
            assert_eq!(HcclGetRankId(comm, &mut rank), 0);
        }
        assert_eq!((size, rank), (n, r));
        let f = r as f32;
        // Broadcast in place from rank 2.
        let b = dev(&[f; 4]);
        assert_eq!(
            HcclBroadcast(b, 4, HCCL_FP32, 2, comm, null_mut()),
            0,
            "{}",
            msg()
        );
        // Reduce (max) to rank 1.
        let (rs, rr) = (dev(&[f; 2]), dev(&[-1f32; 2]));
        assert_eq!(HcclReduce(rs, rr, 2, HCCL_FP32, 2, 1, comm, null_mut()), 0);
        // All-gather and reduce-scatter (sum).
        let (gs, gr) = (dev(&[f; 2]), dev(&[0f32; 8]));
        assert_eq!(HcclAllGather(gs, gr, 2, HCCL_FP32, comm, null_mut()), 0);
        let (ss, sr) = (dev(&[1f32; 8]), dev(&[0f32; 2]));
        assert_eq!(
            HcclReduceScatter(ss, sr, 2, HCCL_FP32, HCCL_SUM, comm, null_mut()),
            0
        );
        // All-to-all: block j of rank r is 10 r + j.
        let blocks: Vec<f32> = (0..n).map(|j| (10 * r + j) as f32).collect();
        let (a, ar) = (dev(&blocks), dev(&[0f32; 4]));
        assert_eq!(
            HcclAlltoAll(a, 1, HCCL_FP32, ar, 1, HCCL_FP32, comm, null_mut()),
            0
        );
        // All-to-all-v: rank r sends j + 1 elements to rank j.
        let sc: Vec<u64> = (0..n as u64).map(|j| j + 1).collect();
        let sd: Vec<u64> = sc
            .iter()
            .scan(0, |acc, &c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        let rc: Vec<u64> = vec![r as u64 + 1; n as usize];
        let rd: Vec<u64> = (0..n as u64).map(|j| j * (r as u64 + 1)).collect();
        let vsend = dev(&[f; 10]);
        let vrecv = dev(&vec![-1f32; (n * (r + 1)) as usize]);
        assert_eq!(
            // SAFETY: arrays of `n` counts and displacements.
            unsafe {
                HcclAlltoAllV(
                    vsend,
                    sc.as_ptr().cast(),
                    sd.as_ptr().cast(),
                    HCCL_FP32,
                    vrecv,
                    rc.as_ptr().cast(),
                    rd.as_ptr().cast(),
                    HCCL_FP32,
                    comm,
                    null_mut(),
                )
            },
            0,
            "{}",
            msg()
        );
        // A ring of sends and receives as one batch, then a plain send/recv pair.
        let (ps, pr) = (dev(&[f; 3]), dev(&[0f32; 3]));
        let mut items = [
            HcclSendRecvItem {
                send_recv_type: 0,
                buf: ps,
                count: 3,
                data_type: HCCL_FP32,
                remote_rank: (r + 1) % n,
            },
            HcclSendRecvItem {
                send_recv_type: 1,
                buf: pr,
                count: 3,
                data_type: HCCL_FP32,
                remote_rank: (r + n - 1) % n,
            },
        ];
        assert_eq!(
            // SAFETY: two items.
            unsafe { HcclBatchSendRecv(items.as_mut_ptr(), 2, comm, null_mut()) },
            0,
            "{}",
            msg()
        );
        let x = dev(&[0f32; 2]);
        if r == 0 {
            let src = dev(&[5f32, 6.0]);
            assert_eq!(HcclSend(src, 2, HCCL_FP32, 3, comm, null_mut()), 0);
        } else if r == 3 {
            assert_eq!(HcclRecv(x, 2, HCCL_FP32, 0, comm, null_mut()), 0);
        }
        ok(aclrtSynchronizeStream(null_mut()));
        assert_eq!(host::<f32>(b, 4), vec![2f32; 4]);
        if r == 1 {
            assert_eq!(host::<f32>(rr, 2), vec![3f32; 2]);
        }
        assert_eq!(host::<f32>(gr, 8), vec![0., 0., 1., 1., 2., 2., 3., 3.]);
        assert_eq!(host::<f32>(sr, 2), vec![4f32; 2]);
        assert_eq!(
            host::<f32>(ar, 4),
            (0..n).map(|j| (10 * j + r) as f32).collect::<Vec<_>>()
        );
        let got = host::<f32>(vrecv, (n * (r + 1)) as usize);
        let want: Vec<f32> = (0..n)
            .flat_map(|j| std::iter::repeat_n(j as f32, r as usize + 1))
            .collect();
        assert_eq!(got, want);
        assert_eq!(host::<f32>(pr, 3), vec![((r + n - 1) % n) as f32; 3]);
        if r == 3 {
            assert_eq!(host::<f32>(x, 2), [5.0, 6.0]);
        }
        assert_eq!(HcclCommDestroy(comm), 0);
        assert_eq!(HcclCommDestroy(comm), 2, "destroyed twice");
    });
}
