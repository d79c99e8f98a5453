//! Graph-private pools through the CPU backend's own stream capture: a capture that allocates,
//! frees and allocates again reuses its blocks; after `end_capture` no request on any stream
//! gets a block of the pool while the graph lives (its replays write there); destroying the graph
//! releases the segments the capture made with `alloc_async` (graph memory, unusable after the
//! capture: they never join the general cache), while segments reserved before the capture
//! join it; a capture's `alloc_async` segment never serves another capture sharing its pool; a
//! Global capture gets its segments without the capture-unsafe `Device::alloc` and stays valid.

use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, CachingAllocator, GraphPoolId};
use unihal_hal::{Backend, Buffer, CaptureMode, CaptureStatus, FillValue, Stream};

const MIB: u64 = 1 << 20;

fn setup() -> (CachingAllocator, Arc<dyn Stream>, Arc<dyn Stream>) {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let other = dev.create_stream().unwrap();
    (
        CachingAllocator::new(dev, AllocatorConfig::default()).unwrap(),
        s,
        other,
    )
}

fn pool_ranges(a: &CachingAllocator) -> Vec<(u64, u64)> {
    a.snapshot()
        .iter()
        .filter(|g| g.graph_pool.is_some())
        .map(|g| (g.address, g.address + g.total_size))
        .collect()
}

fn inside(ranges: &[(u64, u64)], b: &Buffer) -> bool {
    let (lo, hi) = (b.device_addr(), b.device_addr() + b.len());
    ranges.iter().any(|&(s, e)| lo < e && s < hi)
}

fn bytes(s: &Arc<dyn Stream>, b: &Buffer) -> Vec<u8> {
    let mut out = vec![0u8; b.len() as usize];
    s.read(b, 0, &mut out).unwrap();
    out
}

#[test]
fn a_capture_allocates_from_its_pool_and_the_graph_keeps_it() {
    let (a, s, other) = setup();
    // A general-cache segment, so that `other` needs no device allocation during the capture
    // (a Global capture refuses `Device::alloc` from any thread).
    drop(a.alloc(&other, 4096).unwrap());
    let reserved_before = a.stats().reserved_bytes.all.current;

    s.begin_capture(CaptureMode::Global).unwrap();
    let CaptureStatus::Active(c) = s.capture_status() else {
        panic!("not capturing")
    };
    let x = a.alloc(&s, 4096).unwrap();
    let x_addr = x.device_addr();
    s.fill(&x, 0, 4096, FillValue::U8(7)).unwrap();
    drop(x);
    // Reuse inside the capture: the captured fill is ordered before the capture's next work.
    let y = a.alloc(&s, 4096).unwrap();
    assert_eq!(
        y.device_addr(),
        x_addr,
        "the capture did not reuse its block"
    );
    s.fill(&y, 0, 4096, FillValue::U8(9)).unwrap();
    let out = a.alloc(&s, 4096).unwrap();
    s.copy_d2d(&y, 0, &out, 0, 4096).unwrap();
    drop(y);
    let big = a.alloc(&s, 30 * MIB as usize).unwrap();
    s.fill(&big, 0, 30 * MIB, FillValue::U8(5)).unwrap();
    drop(big);
    // Another stream during the capture: the general cache serves it, never the pool.
    let o = a.alloc(&other, 4096).unwrap();
    assert!(!inside(&pool_ranges(&a), &o));
    drop(o);
    assert_eq!(a.graph_pool_of(c), Some(GraphPoolId(c.get(), 0)));
    let graph = s.end_capture().expect("the capture stayed valid");

    let st = a.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.graph_pool_segment.current, 2);
    assert_eq!(st.graph_pool_reserved_bytes.current, 2 * MIB + 30 * MIB);
    assert_eq!(st.graph_pool_allocated_bytes.current, 4096);
    assert_eq!(
        st.reserved_bytes.all.current,
        reserved_before + 32 * MIB,
        "the pool's segments count as reserved"
    );

    s.launch_graph(&graph).unwrap();
    s.synchronize().unwrap();
    assert!(bytes(&s, &out).iter().all(|&b| b == 9));

    // While the graph lives, requests on any stream never get its pool's blocks, and replays
    // leave their bytes alone.
    let ranges = pool_ranges(&a);
    let mut held = Vec::new();
    for (i, len) in [512u64, 4096, 100_000, MIB, 3 * MIB, 30 * MIB]
        .into_iter()
        .enumerate()
    {
        for st in [&s, &other] {
            let b = a.alloc(st, len as usize).unwrap();
            assert!(
                !inside(&ranges, &b),
                "a live graph's block served {len} bytes"
            );
            st.fill(&b, 0, len, FillValue::U8(100 + i as u8)).unwrap();
            held.push((st.clone(), b, 100 + i as u8));
        }
    }
    drop(out);
    s.launch_graph(&graph).unwrap();
    s.launch_graph(&graph).unwrap();
    s.synchronize().unwrap();
    other.synchronize().unwrap();
    for (st, b, v) in &held {
        assert!(
            bytes(st, b).iter().all(|x| x == v),
            "a replay wrote a live block"
        );
    }
    drop(held);
    s.synchronize().unwrap();
    other.synchronize().unwrap();
    a.empty_cache();
    assert_eq!(
        a.stats().graph_pools.current,
        1,
        "empty_cache took a live graph's pool"
    );
    assert_eq!(a.stats().reserved_bytes.all.current, 32 * MIB);

    // The graph destroyed: the capture's segments (graph memory from `alloc_async`) are
    // released, never cached.
    let frees_before = a.stats().num_device_free;
    drop(graph);
    let st = a.stats();
    assert_eq!(st.graph_pools.current, 0);
    assert_eq!(st.graph_pool_segment.current, 0);
    assert_eq!(st.graph_pool_reserved_bytes.current, 0);
    assert_eq!(
        st.reserved_bytes.all.current, 0,
        "the capture's segments were cached"
    );
    assert_eq!(st.segment.all.current, 0);
    assert_eq!(st.num_device_free, frees_before + 2);
    assert!(a.snapshot().is_empty());
    let z = a.alloc(&other, 4096).unwrap();
    assert_eq!(
        a.stats().num_device_alloc,
        st.num_device_alloc + 1,
        "a request outside the capture was served without a new segment"
    );
    s.fill(&z, 0, 4096, FillValue::U8(3)).unwrap();
    s.synchronize().unwrap();
    assert!(bytes(&s, &z).iter().all(|&b| b == 3));
    drop(z);
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}

#[test]
fn an_invalidated_capture_gives_its_pool_back() {
    let (a, s, _other) = setup();
    s.begin_capture(CaptureMode::Global).unwrap();
    let x = a.alloc(&s, 4096).unwrap();
    s.fill(&x, 0, 4096, FillValue::U8(1)).unwrap();
    drop(x);
    // Illegal while capturing: invalidates the capture.
    assert!(s.synchronize().is_err());
    assert!(matches!(s.capture_status(), CaptureStatus::Invalidated(_)));
    assert!(s.end_capture().is_err());
    let st = a.stats();
    assert_eq!(
        st.graph_pools.current, 0,
        "the failed capture's pool stayed"
    );
    assert_eq!(
        st.reserved_bytes.all.current, 0,
        "the failed capture's segment was cached"
    );
    assert_eq!(st.graph_pool_reserved_bytes.current, 0);
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}

#[test]
fn captures_share_a_pool_handle() {
    let (a, s, _other) = setup();
    let pool = a.graph_pool_handle();
    let mut graphs = Vec::new();
    let mut segments: Vec<Vec<(u64, u64)>> = Vec::new();
    for i in 0..2u8 {
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        a.capture_into(&s, &pool).unwrap();
        let before = pool_ranges(&a);
        let x = a.alloc(&s, 4096).unwrap();
        // Capture 0's segment is graph memory of capture 0: capture 1 never gets a block of
        // it, even an idle one.
        assert!(
            !inside(&before, &x),
            "capture {i} got another capture's block"
        );
        s.fill(&x, 0, 4096, FillValue::U8(i)).unwrap();
        drop(x);
        // Capture 0's segment and its free rest stay for capture 0 alone.
        let y = a.alloc(&s, MIB as usize).unwrap();
        assert!(
            !inside(&before, &y),
            "capture {i} got another capture's block"
        );
        drop(y);
        segments.push(pool_ranges(&a));
        graphs.push(s.end_capture().unwrap());
    }
    let st = a.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.graph_pool_segment.current, 2, "one segment per capture");
    assert_eq!(st.reserved_bytes.all.current, 4 * MIB);
    drop(graphs);
    let st = a.stats();
    assert_eq!(st.graph_pools.current, 1, "the handle keeps the pool");
    // The captures are over and their graphs gone: their segments are released, though the
    // handle keeps the pool (no capture could use them again).
    assert_eq!(st.graph_pool_segment.current, 0);
    assert_eq!(st.reserved_bytes.all.current, 0);
    drop(pool);
    let st = a.stats();
    assert_eq!(st.graph_pools.current, 0);
    assert_eq!(st.reserved_bytes.all.current, 0);
}

#[test]
fn reserved_segments_are_shared_and_join_the_cache() {
    let (a, s, other) = setup();
    let pool = a.graph_pool_handle();
    a.reserve_graph_pool(&pool, 4096).unwrap();
    let reserved = pool_ranges(&a);
    assert_eq!(reserved.len(), 1);
    let mut graphs = Vec::new();
    for i in 0..2u8 {
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        a.capture_into(&s, &pool).unwrap();
        let x = a.alloc(&s, 4096).unwrap();
        assert!(
            inside(&reserved, &x),
            "capture {i} did not use the reserved segment"
        );
        s.fill(&x, 0, 4096, FillValue::U8(i)).unwrap();
        drop(x);
        graphs.push(s.end_capture().unwrap());
    }
    let st = a.stats();
    assert_eq!(st.graph_pool_segment.current, 1);
    assert_eq!(st.num_device_alloc, 1);
    drop(graphs);
    drop(pool);
    let st = a.stats();
    assert_eq!(st.graph_pools.current, 0);
    assert_eq!(
        st.reserved_bytes.all.current,
        2 * MIB,
        "the reserved segment was not cached"
    );
    let z = a.alloc(&other, 4096).unwrap();
    assert!(inside(&reserved, &z), "the general cache did not serve it");
    assert_eq!(a.stats().num_device_alloc, 1);
    drop(z);
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
}
