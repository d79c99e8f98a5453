//! The simulated HCCL: ranks on threads, each on its own simulated NPU.

mod support;

use std::ptr::null_mut;
use support::*;
use unihal_sim_cann::hccl::*;
use unihal_sim_cann::runtime::*;

const HCCL_FP32: i32 = 4;
const HCCL_SUM: i32 = 0;

fn root() -> HcclRootInfo {
    let mut r = HcclRootInfo {
        internal: [0; ROOT_INFO_BYTES],
    };
    // SAFETY: a live out-pointer.
    assert_eq!(unsafe { HcclGetRootInfo(&mut r) }, 0);
    r
}

/// Runs `f(rank)` on `n` threads, each with device `rank` current; returns their results.
fn ranks<T: Send + 'static>(
    n: u32,
    f: impl Fn(u32) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let hs: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || {
                init();
                ok(aclrtSetDevice(r as i32));
                f(r)
            })
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn all_reduce_on_four_ranks() {
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
