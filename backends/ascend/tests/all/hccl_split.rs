//! Splitting HCCL communicators on the simulated CANN stack (four simulated NPUs). HCCL has no
//! split; the engine emulates it (two all-gathers on the parent, then `HcclCommInitRootInfo`
//! per color): ranks placed by (key, old rank) as on every engine, each child reduces among its
//! own ranks, a rank without a color joins nothing, children split again and are destroyed when
//! dropped, and failures are errors within the bounds (an aborted parent, a rank that never
//! calls, a leader without a root info, a child's own timeout). The timing tests run one at a
//! time.

use crate::support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::*;
use unihal_hal::{Backend, CommConfig, Communicator, DType, HalError, ReduceOp, Stream};

const T: Duration = Duration::from_secs(20);

/// HCCL's `HCCL_E_PTR`: what the simulated HCCL answers for a destroyed communicator.
const E_PTR: i32 = 2;

fn backend() -> Arc<unihal_ascend::AscendBackend> {
    // The simulated HCCL's own limit: far beyond every bound below.
    simulated(&[("UNIHAL_SIM_WATCHDOG_MS", "60000")])
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: Mutex<()> = Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

type Split = unihal_hal::Result<Option<Arc<dyn Communicator>>>;

/// Every rank of `comms` splits with `ask(old rank)`, each from a thread of its own.
fn split_all(
    comms: &[Arc<dyn Communicator>],
    config: &CommConfig,
    ask: impl Fn(usize) -> (Option<u32>, i32) + Sync,
) -> Vec<Split> {
    each(comms, |c, _| {
        let (color, key) = ask(c.rank());
        c.split(color, key, config)
    })
}

/// An all-reduce (sum, 5 × i32) of `v` on `c`, read back.
fn sum(c: &Arc<dyn Communicator>, s: &Arc<dyn Stream>, v: f64) -> unihal_hal::Result<Vec<f64>> {
    let b = upload(c.device(), s, DType::I32, &[v; 5]);
    c.all_reduce(&b, &b, 5, DType::I32, ReduceOp::Sum, s)?;
    s.synchronize()?;
    Ok(download(s, DType::I32, &b))
}

fn children(results: Vec<Split>) -> Vec<Arc<dyn Communicator>> {
    results
        .into_iter()
        .map(|r| r.unwrap().expect("a communicator"))
        .collect()
}

#[test]
fn parity_split_with_reversed_keys_reduces_within_each_color() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 4, T);
    assert!(b.collectives().unwrap().capabilities().split);
    let kids = children(split_all(&comms, &CommConfig::default(), |r| {
        (Some((r % 2) as u32), -(r as i32))
    }));
    // Keys reverse the order: color 0 is (old 2, old 0), color 1 is (old 3, old 1).
    let places: Vec<(usize, usize)> = kids.iter().map(|k| (k.rank(), k.size())).collect();
    assert_eq!(places, vec![(1, 2), (1, 2), (0, 2), (0, 2)]);
    for (k, c) in kids.iter().zip(&comms) {
        assert_eq!(
            k.device().id(),
            c.device().id(),
            "the child stays on its device"
        );
    }
    // Each child all-reduces among its own color (old rank + 1 from each).
    let old: Vec<usize> = vec![0, 1, 2, 3];
    let got = std::thread::scope(|sc| {
        let hs: Vec<_> = kids
            .iter()
            .zip(&old)
            .map(|(k, &r)| {
                sc.spawn(move || {
                    let s = k.device().create_stream().unwrap();
                    sum(k, &s, r as f64 + 1.0).unwrap()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (r, v) in got.iter().enumerate() {
        let want = if r % 2 == 0 { 1.0 + 3.0 } else { 2.0 + 4.0 };
        assert_eq!(v, &vec![want; 5], "old rank {r}");
    }
    // The parent goes on.
    for v in each(&comms, |c, s| sum(c, s, 1.0).unwrap()) {
        assert_eq!(v, vec![4.0; 5]);
    }
    // Dropping the children destroys their HCCL communicators, not the parent's.
    let handles: Vec<usize> = kids.iter().map(native).collect();
    assert!(handles.iter().all(|&h| h != 0));
    drop(kids);
    for h in handles {
        assert!(
            eventually(Duration::from_secs(5), || sim::rank_size(h) == Err(E_PTR)),
            "child {h:#x} not destroyed"
        );
    }
    for c in &comms {
        assert_eq!(sim::rank_size(native(c)), Ok(4));
    }
}

#[test]
fn no_color_joins_nothing_and_every_color_value_is_taken() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 4, T);
    // Old rank 3 opts out; 0 and 1 share a color and a key (then old rank orders them); 2 is
    // alone in the largest color (no C int limit in the emulation).
    let got = split_all(&comms, &CommConfig::default(), |r| match r {
        3 => (None, 0),
        2 => (Some(u32::MAX), 9),
        _ => (Some(5), 1),
    });
    let mut got = got.into_iter();
    let (k0, k1, k2) = (
        got.next().unwrap().unwrap().unwrap(),
        got.next().unwrap().unwrap().unwrap(),
        got.next().unwrap().unwrap().unwrap(),
    );
    assert!(
        got.next().unwrap().unwrap().is_none(),
        "old rank 3 opted out"
    );
    assert_eq!(
        [
            (k0.rank(), k0.size()),
            (k1.rank(), k1.size()),
            (k2.rank(), k2.size())
        ],
        [(0, 2), (1, 2), (0, 1)]
    );
    let pair = [k0, k1];
    for v in each(&pair, |k, s| sum(k, s, 10.0 + k.rank() as f64).unwrap()) {
        assert_eq!(v, vec![21.0; 5]);
    }
    let lone = [k2];
    assert_eq!(each(&lone, |k, s| sum(k, s, 7.0).unwrap()), [vec![7.0; 5]]);
    // Nobody with a color: nobody gets a communicator (the root infos' exchange is left out).
    for r in split_all(&comms, &CommConfig::default(), |_| (None, 0)) {
        assert!(r.unwrap().is_none());
    }
    for v in each(&comms, |c, s| sum(c, s, 1.0).unwrap()) {
        assert_eq!(v, vec![4.0; 5]);
    }
}

#[test]
fn a_child_splits_again() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 4, T);
    // One color, keys reversing the order, then halves of the child.
    let kids = children(split_all(&comms, &CommConfig::default(), |r| {
        (Some(0), -(r as i32))
    }));
    let ranks_of: Vec<usize> = kids.iter().map(|k| k.rank()).collect();
    assert_eq!(ranks_of, vec![3, 2, 1, 0]);
    let grandkids = children(split_all(&kids, &CommConfig::default(), |r| {
        (Some((r / 2) as u32), r as i32)
    }));
    // kids' ranks 0,1 are old 3,2; 2,3 are old 1,0.
    let places: Vec<(usize, usize)> = grandkids.iter().map(|g| (g.rank(), g.size())).collect();
    assert_eq!(places, vec![(1, 2), (0, 2), (1, 2), (0, 2)]);
    let sums = each(&grandkids, |g, s| {
        let old = g.device().id().ordinal;
        sum(g, s, old as f64).unwrap()
    });
    assert_eq!(
        sums,
        vec![vec![1.0; 5], vec![1.0; 5], vec![5.0; 5], vec![5.0; 5]]
    );
}

#[test]
fn an_aborted_or_failed_parent_refuses_to_split() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 2, T);
    comms[0].abort();
    let t0 = Instant::now();
    for r in split_all(&comms, &CommConfig::default(), |r| (Some(0), r as i32)) {
        assert!(
            matches!(r, Err(HalError::Aborted { .. })),
            "{:?}",
            r.map(|c| c.is_some())
        );
    }
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    // A failure HCCL reported is sticky: the split returns it.
    let comms = ranks(&b, 2, T);
    sim::fail("HcclGetCommAsyncError", 1, 4);
    let e = comms[0].async_error().expect("the injected error");
    sim::clear();
    let got = comms[0].split(Some(0), 0, &CommConfig::default());
    assert_eq!(got.map(|c| c.is_some()), Err(e));
}

#[test]
fn a_rank_that_never_splits_fails_the_others_within_the_parent_timeout() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let limit = Duration::from_millis(300);
    let comms = ranks(&b, 3, limit);
    let t0 = Instant::now();
    let results = each(&comms, |c, _| {
        if c.rank() == 2 {
            return (None, Duration::ZERO); // never calls
        }
        let r = c.split(Some(0), 0, &CommConfig::default());
        (Some(r.map(|c| c.is_some())), t0.elapsed())
    });
    for (r, (res, el)) in results.iter().enumerate().take(2) {
        assert!(
            matches!(
                res,
                Some(Err(HalError::Timeout { .. } | HalError::Aborted { .. }))
            ),
            "rank {r}: {res:?}"
        );
        assert!(
            *el < limit + Duration::from_millis(1500),
            "rank {r}: {el:?}"
        );
    }
    // The parent failed for every rank, the one that never called included.
    for c in &comms {
        assert!(c.async_error().is_some(), "rank {}", c.rank());
    }
}

#[test]
fn a_leader_without_a_root_info_fails_its_color_only() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let comms = ranks(&b, 4, T);
    // Parity colors, keys in old-rank order: old 0 leads color 0, old 1 leads color 1.
    let results = each(&comms, |c, _| {
        let r = c.rank();
        if r == 0 {
            sim::fail("HcclGetRootInfo", 1, 4);
        }
        let got = c.split(Some((r % 2) as u32), r as i32, &CommConfig::default());
        sim::clear();
        match got {
            Ok(Some(k)) => Ok((k.rank(), k.size())),
            Ok(None) => panic!("rank {r}: no communicator"),
            Err(e) => Err(e),
        }
    });
    let mut results = results.into_iter();
    match results.next().unwrap() {
        Err(HalError::Vendor {
            library,
            call,
            code: 4,
            ..
        }) => assert_eq!(
            (library.as_str(), call.as_str()),
            ("HCCL", "HcclGetRootInfo")
        ),
        other => panic!("the leader: {other:?}"),
    }
    let (r1, r2, r3) = (
        results.next().unwrap(),
        results.next().unwrap(),
        results.next().unwrap(),
    );
    match r2 {
        Err(HalError::Aborted { what }) => assert!(what.contains("rank 0"), "{what}"),
        other => panic!("old rank 2: {other:?}"),
    }
    assert_eq!(r1.unwrap(), (0, 2));
    assert_eq!(r3.unwrap(), (1, 2));
    // The parent was not failed by it.
    for c in &comms {
        assert!(c.async_error().is_none(), "rank {}", c.rank());
    }
    for v in each(&comms, |c, s| sum(c, s, 1.0).unwrap()) {
        assert_eq!(v, vec![4.0; 5]);
    }
}

#[test]
fn a_child_times_out_at_its_own_timeout_or_the_parents() {
    if crate::own_process() {
        return;
    }
    let _g = serial();
    let b = backend();
    let short = Duration::from_millis(300);
    // The child's config gives the timeout; then a child without one inherits its parent's.
    for (parent, config) in [
        (
            T,
            CommConfig {
                timeout: Some(short),
            },
        ),
        (short, CommConfig::default()),
    ] {
        let comms = ranks(&b, 2, parent);
        let kids = children(split_all(&comms, &config, |r| (Some(0), r as i32)));
        let t0 = Instant::now();
        let results = each(&kids, |k, s| {
            if k.rank() == 1 {
                return Ok(()); // never calls
            }
            sum(k, s, 1.0).map(drop)
        });
        let el = t0.elapsed();
        assert!(
            matches!(results[0], Err(HalError::Timeout { .. })),
            "{:?}",
            results[0]
        );
        assert!(el < short + Duration::from_millis(1500), "{el:?}");
        // The child's failure is its own: the parent goes on.
        for v in each(&comms, |c, s| sum(c, s, 1.0).unwrap()) {
            assert_eq!(v, vec![2.0; 5]);
        }
    }
}
