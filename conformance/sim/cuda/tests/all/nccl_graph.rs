//! Collectives captured into graphs (NCCL >= 2.9 allows it): each replay runs them, and a replay
//! takes its collective sequence number when it is launched, so ranks that launch their graphs
//! and call collectives directly in the same order match.

use crate::support;

use std::ffi::c_void;
use std::ptr::null_mut;
use support::*;
use unihal_sim_cuda::driver::*;
use unihal_sim_cuda::nccl::*;

fn cu(r: i32) {
    assert_eq!(r, 0, "CUresult {r}");
}

#[test]
fn captured_all_reduce_runs_at_every_replay_in_launch_order() {
    if crate::own_process() {
        return;
    }
    let _serial = serial();
    let out = on_ranks(2, |r, comm| {
        let x = upload(&[(r + 1) as f32; 4]);
        let y = upload(&[(10 * (r + 1)) as f32; 4]);
        let mut s = null_mut();
        // SAFETY: the simulated C API with out-pointers to locals and handles made here.
        unsafe {
            cu(cuStreamCreate(&mut s, 0));
            // Thread-local: the other rank's thread is not affected by this capture.
            cu(cuStreamBeginCapture_v2(s, 1));
            ok(ncclAllReduce(
                x as *const c_void,
                x as *mut c_void,
                4,
                F32,
                SUM,
                comm,
                s,
            ));
            let mut g = null_mut();
            cu(cuStreamEndCapture(s, &mut g));
            let mut n = 0usize;
            cu(cuGraphGetNodes(g, null_mut(), &mut n));
            assert_eq!(n, 1);
            let mut e = null_mut();
            cu(cuGraphInstantiateWithFlags(&mut e, g, 0));
            // Replay, a direct collective, replay: three rounds, matched in this order.
            cu(cuGraphLaunch(e, s));
            ok(ncclAllReduce(
                y as *const c_void,
                y as *mut c_void,
                4,
                F32,
                SUM,
                comm,
                s,
            ));
            cu(cuGraphLaunch(e, s));
            cu(cuStreamSynchronize(s));
            cu(cuGraphExecDestroy(e));
            cu(cuGraphDestroy(g));
            cu(cuStreamDestroy_v2(s));
        }
        (download::<f32>(x, 4), download::<f32>(y, 4))
    });
    for (x, y) in out {
        assert_eq!(x, vec![6.0; 4], "(1 + 2) then (3 + 3)");
        assert_eq!(y, vec![30.0; 4]);
    }
}
