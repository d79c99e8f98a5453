//! The simulated NCCL through its C entry points, ranks as threads on distinct simulated devices
//! (deferred mode): collectives and grouped point-to-point move the right data, one thread can
//! drive every rank through a group, and misuse returns NCCL's codes: duplicate GPUs, bad
//! arguments, dead handles, abort. (A rank that never comes poisons a device, so that test has
//! its own process: `nccl_timeout.rs`.)

use crate::support;

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use support::*;
use unihal_sim_cuda::driver::*;
use unihal_sim_cuda::nccl::*;
use unihal_sim_cuda::nccl_conv::*;

#[test]
fn version_ids_and_error_strings() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    init();
    let mut v = 0;
    // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
    unsafe { ok(ncclGetVersion(&mut v)) };
    assert_eq!(v, 23007);
    let (a, b) = (unique_id(), unique_id());
    assert_ne!(a.internal, b.internal, "ids are unique");
    // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
    let s = unsafe { CStr::from_ptr(ncclGetErrorString(NCCL_INVALID_USAGE)) };
    assert!(s.to_str().unwrap().contains("invalid usage"));
    assert_eq!(ncclGroupEnd(), NCCL_INVALID_USAGE, "end without start");
    let mut foreign = unique_id();
    foreign.internal[0] = 0;
    let mut comm = null_mut();
    // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
    unsafe {
        assert_eq!(
            ncclCommInitRank(&mut comm, 1, foreign, 0),
            NCCL_INVALID_ARGUMENT
        )
    };
    assert!(last().contains("ncclGetUniqueId"), "{}", last());
}

#[test]
fn ranks_as_threads_reduce_and_gather() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    let out = on_ranks(2, |r, comm| {
        let mut q = [0; 3];
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe {
            ok(ncclCommCount(comm, &mut q[0]));
            ok(ncclCommCuDevice(comm, &mut q[1]));
            ok(ncclCommUserRank(comm, &mut q[2]));
        }
        assert_eq!(q, [2, r, r]);
        let x: Vec<f32> = (0..1000).map(|i| (i + 1000 * r) as f32).collect();
        let (send, sum, avg, gathered) = (
            upload(&x),
            upload(&[0f32; 1000]),
            upload(&[0f32; 1000]),
            upload(&[0f32; 2000]),
        );
        let mut s = null_mut();
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe { assert_eq!(cuStreamCreate(&mut s, 0), 0) };
        let (sp, rp) = (send as *const c_void, sum as *mut c_void);
        ok(ncclAllReduce(sp, rp, 1000, F32, SUM, comm, s));
        ok(ncclAllReduce(
            sp,
            avg as *mut c_void,
            1000,
            F32,
            AVG,
            comm,
            s,
        ));
        ok(ncclAllGather(
            sp,
            gathered as *mut c_void,
            1000,
            F32,
            comm,
            s,
        ));
        let mut err = -1;
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe { ok(ncclCommGetAsyncError(comm, &mut err)) };
        assert_eq!(err, NCCL_SUCCESS);
        assert_eq!(cuStreamSynchronize(s), 0);
        (
            download::<f32>(sum, 1000),
            download::<f32>(avg, 1000),
            download::<f32>(gathered, 2000),
        )
    });
    for (sum, avg, gathered) in out {
        assert!(sum
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (2 * i + 1000) as f32));
        assert!(avg
            .iter()
            .enumerate()
            .all(|(i, &v)| v == (2 * i + 1000) as f32 / 2.0));
        assert!(gathered.iter().enumerate().all(|(i, &v)| v == i as f32));
    }
}

#[test]
fn grouped_send_and_receive_exchange_between_threads() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    let out = on_ranks(2, |r, comm| {
        let peer = 1 - r;
        let (send, recv) = (upload(&[r * 10 + 1; 64]), upload(&[0i32; 64]));
        ok(ncclGroupStart());
        ok(ncclSend(
            send as *const c_void,
            64,
            I32,
            peer,
            comm,
            null_mut(),
        ));
        ok(ncclRecv(
            recv as *mut c_void,
            64,
            I32,
            peer,
            comm,
            null_mut(),
        ));
        ok(ncclGroupEnd());
        assert_eq!(cuCtxSynchronize(), 0);
        download::<i32>(recv, 64)
    });
    assert_eq!(out[0], vec![11; 64]);
    assert_eq!(out[1], vec![1; 64]);
}

#[test]
fn one_thread_drives_every_device_through_init_all_and_a_group() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    init();
    std::thread::spawn(|| {
        let mut comms = [null_mut(); 2];
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe { ok(ncclCommInitAll(comms.as_mut_ptr(), 2, std::ptr::null())) };
        let mut bufs = Vec::new();
        for d in 0..2 {
            set_device(d);
            bufs.push(upload(&[d + 1; 16]));
        }
        ok(ncclGroupStart());
        for (d, &b) in bufs.iter().enumerate() {
            let p = b as *mut c_void;
            ok(ncclAllReduce(p, p, 16, I32, SUM, comms[d], null_mut()));
        }
        ok(ncclGroupEnd());
        for (d, &b) in bufs.iter().enumerate() {
            set_device(d as i32);
            assert_eq!(cuCtxSynchronize(), 0);
            assert_eq!(download::<i32>(b, 16), vec![3; 16]);
        }
        for c in comms {
            ok(ncclCommDestroy(c));
        }
    })
    .join()
    .unwrap();
}

#[test]
fn misuse_returns_nccl_codes() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    on_ranks(2, |r, comm| {
        let b = upload(&[1f32; 8]) as *mut c_void;
        assert_eq!(
            ncclAllReduce(b, b, 8, 42, SUM, comm, null_mut()),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllReduce(b, b, 8, F32, 99, comm, null_mut()),
            NCCL_INVALID_ARGUMENT
        );
        assert_eq!(
            ncclAllReduce(b, b, 9999, F32, SUM, comm, null_mut()),
            NCCL_INVALID_ARGUMENT,
            "buffer too small"
        );
        assert_eq!(
            ncclBroadcast(b, b, 8, F32, 5, comm, null_mut()),
            NCCL_INVALID_ARGUMENT,
            "root out of range"
        );
        assert_eq!(
            ncclSend(b, 8, F32, 7, comm, null_mut()),
            NCCL_INVALID_ARGUMENT,
            "peer out of range"
        );
        // A stream of the other device.
        set_device(1 - r);
        let mut other = null_mut();
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe { assert_eq!(cuStreamCreate(&mut other, 0), 0) };
        set_device(r);
        assert_eq!(
            ncclAllReduce(b, b, 8, F32, SUM, comm, other),
            NCCL_INVALID_ARGUMENT
        );
        assert!(last().contains("belongs to device"), "{}", last());
        // Refused calls were not queued: a matched pair still works.
        ok(ncclAllReduce(b, b, 8, F32, SUM, comm, null_mut()));
        assert_eq!(cuCtxSynchronize(), 0);
        assert_eq!(download::<f32>(b as u64, 8), vec![2.0; 8]);
    });
    let dead = 0x1234 as *mut c_void;
    let mut n = 0;
    // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
    unsafe { assert_eq!(ncclCommCount(dead, &mut n), NCCL_INVALID_ARGUMENT) };
}

#[test]
fn two_ranks_on_one_device_are_invalid_usage() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    init();
    let id = unique_id();
    let joins: Vec<_> = (0..2)
        .map(|r| {
            std::thread::spawn(move || {
                set_device(0);
                let mut comm = null_mut();
                // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
                unsafe { ncclCommInitRank(&mut comm, 2, id, r) }
            })
        })
        .collect();
    for j in joins {
        assert_eq!(j.join().unwrap(), NCCL_INVALID_USAGE);
    }
}

#[test]
fn abort_finishes_the_aborting_rank_and_peers_see_a_remote_error() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    let errs = ranks_then(2, false, |r, comm| {
        let b = upload(&[1f32; 4]) as *mut c_void;
        if r == 0 {
            ok(ncclAllReduce(b, b, 4, F32, SUM, comm, null_mut()));
            ok(ncclCommAbort(comm));
            assert_eq!(cuCtxSynchronize(), 0, "the aborted rank's work finishes");
            let mut n = 0;
            // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
            unsafe { assert_eq!(ncclCommCount(comm, &mut n), NCCL_INVALID_ARGUMENT) };
            NCCL_SUCCESS
        } else {
            let mut err = NCCL_SUCCESS;
            for _ in 0..1000 {
                // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
                unsafe { ok(ncclCommGetAsyncError(comm, &mut err)) };
                if err != NCCL_SUCCESS {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            ok(ncclCommAbort(comm));
            err
        }
    });
    assert_eq!(errs[1], NCCL_REMOTE_ERROR);
}

#[test]
fn split_orders_by_key_and_nocolor_gets_no_communicator() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    let out = on_ranks(2, |r, comm| {
        let (mut child, mut none) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a call of the simulated C API with out-pointers to live locals and handles this test made.
        unsafe {
            // Keys reverse the order; then a split in which rank 1 joins nothing.
            ok(ncclCommSplit(comm, 0, -r, &mut child, std::ptr::null_mut()));
            let color = if r == 0 { 3 } else { NCCL_SPLIT_NOCOLOR };
            ok(ncclCommSplit(
                comm,
                color,
                0,
                &mut none,
                std::ptr::null_mut(),
            ));
            let mut bad = std::ptr::null_mut();
            assert_eq!(
                ncclCommSplit(comm, -5, 0, &mut bad, std::ptr::null_mut()),
                NCCL_INVALID_ARGUMENT,
                "a negative color other than NCCL_SPLIT_NOCOLOR"
            );
            let (mut rank, mut count) = (-1, -1);
            ok(ncclCommUserRank(child, &mut rank));
            ok(ncclCommCount(child, &mut count));
            let b = upload(&[r as f32 + 1.0; 4]);
            ok(ncclAllReduce(
                b as *const c_void,
                b as *mut c_void,
                4,
                F32,
                SUM,
                child,
                std::ptr::null_mut(),
            ));
            let sum = download::<f32>(b, 4);
            let alone = if none.is_null() {
                None
            } else {
                let mut n = 0;
                ok(ncclCommCount(none, &mut n));
                ok(ncclCommDestroy(none));
                Some(n)
            };
            ok(ncclCommDestroy(child));
            (rank, count, sum, alone)
        }
    });
    assert_eq!(out[0].0, 1, "rank 0 has the larger key");
    assert_eq!(out[1].0, 0);
    assert!(out.iter().all(|o| o.1 == 2 && o.2 == vec![3.0; 4]));
    assert_eq!((out[0].3, out[1].3), (Some(1), None));
}
