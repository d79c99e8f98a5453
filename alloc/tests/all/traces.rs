//! The allocator's statistics against hand-computed traces on the CPU backend: splitting,
//! coalescing, stream-ordered reuse (at once on the stream whose work still uses a block, on
//! other streams only after that work completed), several streams, out-of-memory retry, the
//! memory fraction and `empty_cache`.

use std::sync::mpsc;
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, BlockState, CachingAllocator, MemoryStats};
use unihal_hal::{Backend, Device, FillValue, HalError, Stream};

const MIB: u64 = 1 << 20;

fn device(memory: &str) -> Arc<dyn Device> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some(memory), Some("1")).unwrap();
    unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap()
}

fn setup(memory: &str) -> (CachingAllocator, Arc<dyn Stream>) {
    let dev = device(memory);
    let s = dev.create_stream().unwrap();
    (
        CachingAllocator::new(dev, AllocatorConfig::default()).unwrap(),
        s,
    )
}

/// (current, peak) of the `all` statistics that the traces check.
fn cur(s: &MemoryStats) -> [u64; 7] {
    [
        s.allocation.all.current,
        s.allocated_bytes.all.current,
        s.reserved_bytes.all.current,
        s.active_bytes.all.current,
        s.inactive_split.all.current,
        s.inactive_split_bytes.all.current,
        s.requested_bytes.all.current,
    ]
}

/// Blocks a stream until the returned sender is dropped or sent to.
fn hold(s: &Arc<dyn Stream>) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    s.host_callback(Box::new(move || {
        let _ = rx.recv();
    }))
    .unwrap();
    tx
}

#[test]
fn a_small_block_splits_its_segment_and_coalesces_back() {
    let (a, s) = setup("64M");
    let x = a.alloc(&s, 1000).unwrap();
    assert_eq!(x.len(), 1000);
    let st = a.stats();
    // 1000 -> 1024 bytes from a 2 MiB small segment; the rest is an inactive split block.
    assert_eq!(cur(&st), [1, 1024, 2 * MIB, 1024, 1, 2 * MIB - 1024, 1000]);
    assert_eq!(st.segment.small_pool.current, 1);
    assert_eq!(st.reserved_bytes.large_pool.current, 0);
    let addr = x.device_addr();
    drop(x);
    let st = a.stats();
    assert_eq!(cur(&st), [0, 0, 2 * MIB, 0, 0, 0, 0]);
    assert_eq!(st.allocated_bytes.all.peak, 1024);
    assert_eq!(st.allocated_bytes.all.allocated, 1024);
    assert_eq!(st.allocated_bytes.all.freed, 1024);
    let snap = a.snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(snap[0].blocks.len(), 1, "coalesced: {snap:?}");
    assert_eq!(snap[0].blocks[0].state, BlockState::Inactive);
    // A cache hit: same address, no device call.
    let y = a.alloc(&s, 512).unwrap();
    assert_eq!(y.device_addr(), addr);
    assert_eq!(a.stats().num_device_alloc, 1);
}

#[test]
fn freeing_the_middle_block_leaves_inactive_split_memory_until_neighbours_go() {
    let (a, s) = setup("64M");
    let x = a.alloc(&s, 4096).unwrap();
    let y = a.alloc(&s, 8192).unwrap();
    let z = a.alloc(&s, 512).unwrap();
    assert_eq!(y.device_addr(), x.device_addr() + 4096);
    assert_eq!(z.device_addr(), y.device_addr() + 8192);
    let rest = 2 * MIB - 4096 - 8192 - 512;
    assert_eq!(cur(&a.stats()), [3, 12800, 2 * MIB, 12800, 1, rest, 12800]);
    drop(y);
    assert_eq!(
        cur(&a.stats()),
        [2, 4608, 2 * MIB, 4608, 2, rest + 8192, 4608]
    );
    drop(x); // merges with y's block
    assert_eq!(
        cur(&a.stats()),
        [1, 512, 2 * MIB, 512, 2, rest + 12288, 512]
    );
    assert_eq!(a.snapshot()[0].blocks.len(), 3);
    drop(z); // everything merges into one block
    assert_eq!(cur(&a.stats()), [0, 0, 2 * MIB, 0, 0, 0, 0]);
    assert_eq!(a.snapshot()[0].blocks.len(), 1);
    let st = a.stats();
    assert_eq!(st.allocation.all.peak, 3);
    assert_eq!(st.allocation.all.allocated, 3);
    assert_eq!(st.allocation.all.freed, 3);
}

#[test]
fn large_requests_use_large_segments_and_split_only_more_than_a_mib() {
    let (a, s) = setup("256M");
    let x = a.alloc(&s, 3 * MIB as usize).unwrap();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.large_pool.current, 20 * MIB);
    assert_eq!(st.inactive_split_bytes.large_pool.current, 17 * MIB);
    // 16.5 MiB from the 17 MiB rest: 0.5 MiB is not worth a split, the block is taken whole.
    let y = a.alloc(&s, (16 * MIB + MIB / 2) as usize).unwrap();
    let st = a.stats();
    assert_eq!(st.allocated_bytes.large_pool.current, 20 * MIB);
    assert_eq!(st.requested_bytes.large_pool.current, 19 * MIB + MIB / 2);
    assert_eq!(st.inactive_split.large_pool.current, 0);
    assert_eq!(st.segment.large_pool.current, 1);
    // 12 MiB: a segment of its own size rounded to 2 MiB.
    let z = a.alloc(&s, (11 * MIB + 1) as usize).unwrap();
    assert_eq!(a.stats().reserved_bytes.large_pool.current, 32 * MIB);
    drop((x, y, z));
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.current, 0);
    assert_eq!(st.reserved_bytes.all.current, 32 * MIB);
    a.empty_cache();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.all.current, 0);
    assert_eq!((st.num_device_alloc, st.num_device_free), (2, 2));
    let m = a.device().memory_info().unwrap();
    assert_eq!(m.free, m.total, "segments returned to the device");
}

#[test]
fn a_block_dropped_with_work_queued_serves_its_stream_at_once_and_others_after_completion() {
    let (a, s) = setup("64M");
    let t = a.device().create_stream().unwrap();
    let x = a.alloc(&s, 4096).unwrap();
    let addr = x.device_addr();
    let release = hold(&s);
    s.fill(&x, 0, 4096, FillValue::U8(7)).unwrap();
    drop(x);
    let st = a.stats();
    // Freed by its caller: not allocated, not active (cached for s), inactive split.
    assert_eq!(cur(&st)[..4], [0, 0, 2 * MIB, 0]);
    let snap = a.snapshot();
    assert_eq!(snap[0].blocks[0].pending_uses_on, vec![s.stream_id().get()]);
    // Another stream never gets it while s's fill is queued.
    let on_t = a.alloc(&t, 4096).unwrap();
    assert_ne!(on_t.device_addr(), addr);
    // s does: its new work runs after the fill.
    let again = a.alloc(&s, 4096).unwrap();
    assert_eq!(again.device_addr(), addr);
    drop(again);
    let on_t2 = a.alloc(&t, 4096).unwrap();
    assert_ne!(on_t2.device_addr(), addr, "still fenced to s");
    drop(release);
    s.synchronize().unwrap();
    // The fill completed: the block serves every stream (and merged back).
    let on_t3 = a.alloc(&t, 4096).unwrap();
    assert_eq!(on_t3.device_addr(), addr);
    assert!(a.snapshot()[0]
        .blocks
        .iter()
        .all(|b| b.pending_uses_on.is_empty()));
    drop((on_t, on_t2));
}

#[test]
fn a_block_used_on_two_streams_waits_for_both() {
    let (a, s) = setup("64M");
    let t = a.device().create_stream().unwrap();
    let x = a.alloc(&s, 4096).unwrap();
    let addr = x.device_addr();
    let (rs, rt) = (hold(&s), hold(&t));
    s.fill(&x, 0, 2048, FillValue::U8(1)).unwrap();
    t.fill(&x, 2048, 2048, FillValue::U8(2)).unwrap();
    drop(x);
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.current, 0);
    assert_eq!(st.active_bytes.all.current, 4096, "pending free is active");
    assert_eq!(
        a.snapshot()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    for st in [&s, &t] {
        assert_ne!(a.alloc(st, 4096).unwrap().device_addr(), addr);
    }
    drop(rs);
    s.synchronize().unwrap();
    assert_ne!(a.alloc(&s, 4096).unwrap().device_addr(), addr);
    drop(rt);
    t.synchronize().unwrap();
    assert_eq!(a.stats().active_bytes.all.current, 0);
    assert_eq!(a.alloc(&s, 4096).unwrap().device_addr(), addr);
}

#[test]
fn out_of_memory_releases_the_cache_retries_then_reports() {
    let (a, s) = setup("64M");
    let x = a.alloc(&s, 30 * MIB as usize).unwrap();
    drop(x); // 30 MiB cached
             // 40 MiB does not fit next to the cached 30: released, retried, served.
    let y = a.alloc(&s, 40 * MIB as usize).unwrap();
    let st = a.stats();
    assert_eq!((st.num_alloc_retries, st.num_ooms), (1, 0));
    assert_eq!((st.num_device_alloc, st.num_device_free), (2, 1));
    assert_eq!(st.reserved_bytes.all.current, 40 * MIB);
    // Another 40 MiB cannot be served at all.
    let e = a.alloc(&s, 40 * MIB as usize).unwrap_err();
    let st = a.stats();
    assert_eq!((st.num_alloc_retries, st.num_ooms), (2, 1));
    let HalError::AllocatorOutOfMemory(r) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(r.requested, 40 * MIB);
    assert_eq!(r.allocated, 40 * MIB);
    assert_eq!(r.reserved, 40 * MIB);
    assert_eq!(r.free, 24 * MIB);
    assert_eq!(r.total, 64 * MIB);
    assert_eq!(r.largest_free_block, 0);
    assert_eq!(r.limit, None);
    assert!(e.is_out_of_memory());
    assert!(
        e.to_string().contains("tried to allocate 41943040 bytes"),
        "{e}"
    );
    drop(y);
}

#[test]
fn a_much_larger_cached_block_is_split_only_when_the_device_is_full() {
    let (a, s) = setup("60M");
    drop(a.alloc(&s, 40 * MIB as usize).unwrap()); // 40 MiB cached
                                                   // 12 MiB: the 40 MiB block is left for requests of its size; a 12 MiB segment is made.
    let x = a.alloc(&s, 12 * MIB as usize).unwrap();
    let st = a.stats();
    assert_eq!(st.reserved_bytes.all.current, 52 * MIB);
    assert_eq!(st.num_device_alloc, 2);
    // Another 12 MiB does not fit the device (8 MiB free): the cached 40 MiB block serves it,
    // split, without releasing the cache.
    let y = a.alloc(&s, 12 * MIB as usize).unwrap();
    let st = a.stats();
    assert_eq!((st.num_device_alloc, st.num_alloc_retries), (2, 0));
    assert_eq!(st.inactive_split_bytes.all.current, 28 * MIB);
    drop((x, y));
}

#[test]
fn the_memory_fraction_limits_what_is_reserved() {
    let (a, s) = setup("64M");
    a.set_memory_fraction(0.5).unwrap();
    assert!(a.set_memory_fraction(0.0).is_err());
    assert!(a.set_memory_fraction(1.5).is_err());
    let x = a.alloc(&s, 20 * MIB as usize).unwrap();
    let e = a.alloc(&s, 20 * MIB as usize).unwrap_err();
    let HalError::AllocatorOutOfMemory(r) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(r.limit, Some(32 * MIB));
    assert_eq!(r.reserved, 20 * MIB);
    assert!(r.free >= 44 * MIB, "the device itself had room: {r:?}");
    assert_eq!(a.stats().num_ooms, 1);
    // The limit, not the device, refused it.
    assert_eq!(a.stats().num_oom_rejections, 1);
    drop(x);
    // Cached 20 MiB are released for a request the limit allows only without them.
    let y = a.alloc(&s, 30 * MIB as usize).unwrap();
    assert_eq!(a.stats().reserved_bytes.all.current, 30 * MIB);
    drop(y);
}

#[test]
fn peaks_reset_to_current() {
    let (a, s) = setup("64M");
    let x = a.alloc(&s, 8192).unwrap();
    let y = a.alloc(&s, 8192).unwrap();
    drop(y);
    assert_eq!(a.stats().allocated_bytes.all.peak, 16384);
    a.reset_peak_stats();
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.peak, 8192);
    assert_eq!(st.reserved_bytes.all.peak, 2 * MIB);
    a.reset_accumulated_stats();
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.freed, 0);
    assert_eq!(st.num_device_alloc, 0);
    let m = st.to_map();
    assert_eq!(m["allocated_bytes.all.current"], 8192);
    assert_eq!(m["reserved_bytes.small_pool.peak"], 2 * MIB as i64);
    assert_eq!(m["num_alloc_retries"], 0);
    // Every key of torch 2.15's `memory_stats()`: 9 statistics x 3 pools x 4 values, the two
    // oversize statistics x 4, six counts and `max_split_size` (-1: unset, as torch reports it);
    // and unihal's four graph-pool statistics x 4.
    assert_eq!(m.len(), 9 * 3 * 4 + 2 * 4 + 6 + 1 + 4 * 4);
    assert_eq!(m["graph_pools.current"], 0);
    assert_eq!(m["max_split_size"], -1);
    for k in [
        "oversize_allocations.peak",
        "oversize_segments.freed",
        "num_sync_all_streams",
    ] {
        assert_eq!(m[k], 0, "{k}");
    }
    drop(x);
}

#[test]
fn blocks_are_ordinary_buffers_checked_by_the_backend() {
    let (a, s) = setup("64M");
    let x = a.alloc(&s, 100).unwrap();
    s.write(&x, 0, &[9u8; 100]).unwrap();
    let mut out = [0u8; 100];
    s.read(&x, 0, &mut out).unwrap();
    assert_eq!(out, [9u8; 100]);
    // The view is what was asked for, not the rounded block.
    assert!(matches!(
        s.fill(&x, 0, 101, FillValue::U8(0)),
        Err(HalError::InvalidArgument { .. })
    ));
    // A stream-ordered free works on a block and frees only the block.
    let y = a.alloc(&s, 100).unwrap();
    s.free_async(&x).unwrap();
    assert!(s.fill(&x, 0, 1, FillValue::U8(0)).is_err());
    s.fill(&y, 0, 100, FillValue::U8(1)).unwrap();
    s.synchronize().unwrap();
    drop(x);
    assert_eq!(a.stats().allocation.all.current, 1);
    // Zero bytes: an empty buffer outside the statistics.
    let e = a.alloc(&s, 0).unwrap();
    assert!(e.is_empty());
    assert_eq!(a.stats().allocation.all.current, 1);
    // A stream of another device is refused.
    let other = device("8M").create_stream().unwrap();
    assert!(matches!(
        a.alloc(&other, 8),
        Err(HalError::InvalidArgument { .. })
    ));
}

#[test]
fn threads_allocating_and_freeing_leave_nothing_allocated() {
    let (a, _) = setup("256M");
    let a = Arc::new(a);
    let hs: Vec<_> = (0..4)
        .map(|k| {
            let a = a.clone();
            std::thread::spawn(move || {
                let s = a.device().create_stream().unwrap();
                let mut live = Vec::new();
                for i in 0..2000usize {
                    let len = 1 + (i * 7919 + k * 104729) % (3 << 20);
                    live.push(a.alloc(&s, len).unwrap());
                    if i % 3 != 0 {
                        live.swap_remove((i * 31) % live.len());
                    }
                    if live.len() > 8 {
                        live.clear();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let st = a.stats();
    assert_eq!(st.allocated_bytes.all.current, 0);
    assert_eq!(st.active_bytes.all.current, 0);
    assert_eq!(st.allocation.all.allocated, 8000);
    a.empty_cache();
    assert_eq!(a.stats().reserved_bytes.all.current, 0);
    assert_eq!(a.stats().inactive_split.all.current, 0);
}

#[test]
fn dropping_the_allocator_returns_its_segments_once_their_blocks_go() {
    let (a, s) = setup("64M");
    let dev = a.device().clone();
    let x = a.alloc(&s, 4 * MIB as usize).unwrap();
    drop(a.alloc(&s, 12 * MIB as usize).unwrap());
    drop(a);
    let m = dev.memory_info().unwrap();
    assert_eq!(
        m.total - m.free,
        20 * MIB,
        "the cached 12 MiB went; x's segment stays"
    );
    s.write(&x, 0, &[1u8; 64]).unwrap();
    drop(x);
    let m = dev.memory_info().unwrap();
    assert_eq!(m.free, m.total, "x's segment went with x");
}

#[test]
fn the_configuration_parses_pytorch_keys_and_refuses_the_rest() {
    let c =
        AllocatorConfig::parse("max_split_size_mb:64, memory_fraction:0.5,thrifty:false").unwrap();
    assert_eq!(c.max_split_size, Some(64 * MIB));
    assert_eq!(c.memory_fraction, Some(0.5));
    assert!(!c.thrifty);
    assert_eq!(
        AllocatorConfig::parse("").unwrap(),
        AllocatorConfig::default()
    );
    assert!(AllocatorConfig::default().thrifty);
    for bad in [
        "max_split_size_mb:1",
        "memory_fraction:0",
        "memory_fraction:2",
        "thrifty:maybe",
        "garbage_collection_threshold:0.6",
        "max_split_size_mb",
    ] {
        assert!(
            matches!(
                AllocatorConfig::parse(bad),
                Err(HalError::InvalidArgument { .. })
            ),
            "{bad}"
        );
    }
}

#[test]
fn pytorchs_rule_splits_a_much_larger_cached_block() {
    let dev = device("64M");
    let s = dev.create_stream().unwrap();
    let cfg = AllocatorConfig {
        thrifty: false,
        ..AllocatorConfig::default()
    };
    let a = CachingAllocator::new(dev, cfg).unwrap();
    drop(a.alloc(&s, 40 * MIB as usize).unwrap());
    let x = a.alloc(&s, 12 * MIB as usize).unwrap();
    assert_eq!(
        a.stats().num_device_alloc,
        1,
        "served from the cached 40 MiB"
    );
    drop(x);
}

#[test]
fn blocks_and_segments_of_max_split_size_or_more_are_oversize() {
    let dev = device("256M");
    let s = dev.create_stream().unwrap();
    let cfg = AllocatorConfig::parse("max_split_size_mb:32").unwrap();
    let a = CachingAllocator::new(dev, cfg).unwrap();
    let small = a.alloc(&s, 4 * MIB as usize).unwrap();
    let big = a.alloc(&s, 40 * MIB as usize).unwrap();
    let st = a.stats();
    assert_eq!(st.max_split_size, Some(32 * MIB));
    assert_eq!(st.to_map()["max_split_size"], (32 * MIB) as i64);
    // Only the 40 MiB block and its segment are at least 32 MiB.
    assert_eq!(
        (
            st.oversize_allocations.current,
            st.oversize_segments.current
        ),
        (1, 1)
    );
    drop(big);
    let st = a.stats();
    // Freed, cached: the allocation is gone, the segment stays reserved.
    assert_eq!(st.oversize_allocations.current, 0);
    assert_eq!(st.oversize_allocations.peak, 1);
    assert_eq!(st.oversize_segments.current, 1);
    s.synchronize().unwrap();
    a.empty_cache();
    let st = a.stats();
    assert_eq!(st.oversize_segments.current, 0);
    assert_eq!(st.oversize_segments.freed, 1);
    a.reset_accumulated_stats();
    a.reset_peak_stats();
    let st = a.stats();
    assert_eq!(
        (st.oversize_segments.peak, st.oversize_segments.freed),
        (0, 0)
    );
    drop(small);
}
