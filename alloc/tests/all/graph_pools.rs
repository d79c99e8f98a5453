//! Graph-private pools over a stand-in capture: a stream wrapper around a CPU stream that says it
//! is capturing and keeps the buffers of "captured" fills on the capture's stream identity
//! (`CaptureId::stream_id`) until its "graph" is dropped, as a backend's capture does. It tests
//! the allocator's side of the protocol on any build; `graph_capture.rs` runs the same rules
//! through the CPU backend's own capture.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use unihal_alloc::{AllocatorConfig, CachingAllocator, GraphPoolId};
use unihal_hal::{
    Backend, Buffer, CaptureId, CaptureStatus, Device, Event, FillValue, Function, HalError,
    HostBuffer, Invalid, Keep, KernelArgs, LaunchConfig, NativeHandle, Result, Stream, StreamId,
};

const MIB: u64 = 1 << 20;

/// A CPU stream that can pretend to capture.
struct Capturing {
    inner: Arc<dyn Stream>,
    status: Mutex<CaptureStatus>,
    /// What the "captured" work keeps (the graph's uses).
    captured: Mutex<Vec<Keep>>,
    alloc_async_calls: AtomicUsize,
}

/// The "graph": the uses its captured work keeps.
struct FakeGraph(#[allow(dead_code)] Vec<Keep>);

impl Capturing {
    fn new(inner: Arc<dyn Stream>) -> Arc<Capturing> {
        Arc::new(Capturing {
            inner,
            status: Mutex::new(CaptureStatus::None),
            captured: Mutex::new(Vec::new()),
            alloc_async_calls: AtomicUsize::new(0),
        })
    }

    fn begin(&self) -> CaptureId {
        let c = CaptureId::fresh();
        *self.status.lock().unwrap() = CaptureStatus::Active(c);
        c
    }

    fn end(&self) -> FakeGraph {
        *self.status.lock().unwrap() = CaptureStatus::None;
        FakeGraph(std::mem::take(&mut *self.captured.lock().unwrap()))
    }
}

impl Stream for Capturing {
    fn device(&self) -> &Arc<dyn Device> {
        self.inner.device()
    }
    fn stream_id(&self) -> StreamId {
        self.inner.stream_id()
    }
    fn copy_h2d(&self, s: &HostBuffer, so: u64, d: &Buffer, o: u64, n: u64) -> Result<()> {
        self.inner.copy_h2d(s, so, d, o, n)
    }
    fn copy_h2d_staged(&self, src: &[u8], dst: &Buffer, dst_offset: u64) -> Result<()> {
        self.inner.copy_h2d_staged(src, dst, dst_offset)
    }
    fn copy_d2h(&self, s: &Buffer, so: u64, d: &HostBuffer, o: u64, n: u64) -> Result<()> {
        self.inner.copy_d2h(s, so, d, o, n)
    }
    fn copy_d2d(&self, s: &Buffer, so: u64, d: &Buffer, o: u64, n: u64) -> Result<()> {
        self.inner.copy_d2d(s, so, d, o, n)
    }
    fn copy_peer(&self, s: &Buffer, so: u64, d: &Buffer, o: u64, n: u64) -> Result<()> {
        self.inner.copy_peer(s, so, d, o, n)
    }
    fn fill(&self, dst: &Buffer, offset: u64, len: u64, value: FillValue) -> Result<()> {
        match *self.status.lock().unwrap() {
            CaptureStatus::Active(c) => {
                // Recorded, not run: the graph keeps the buffer on the capture's identity.
                self.captured
                    .lock()
                    .unwrap()
                    .push(dst.use_on(c.stream_id()));
                Ok(())
            }
            _ => self.inner.fill(dst, offset, len, value),
        }
    }
    unsafe fn launch(&self, f: &Arc<dyn Function>, c: &LaunchConfig, a: &KernelArgs) -> Result<()> {
        // SAFETY: forwarded with the caller's promise.
        unsafe { self.inner.launch(f, c, a) }
    }
    fn host_callback(&self, f: Box<dyn FnOnce() + Send>) -> Result<()> {
        self.inner.host_callback(f)
    }
    fn record_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        self.inner.record_event(event)
    }
    fn wait_event(&self, event: &Arc<dyn Event>) -> Result<()> {
        self.inner.wait_event(event)
    }
    fn alloc_async(&self, len: usize) -> Result<Buffer> {
        self.alloc_async_calls.fetch_add(1, Ordering::Relaxed);
        self.inner.alloc_async(len)
    }
    fn free_async(&self, buffer: &Buffer) -> Result<()> {
        self.inner.free_async(buffer)
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn query(&self) -> Result<bool> {
        self.inner.query()
    }
    fn capture_status(&self) -> CaptureStatus {
        *self.status.lock().unwrap()
    }
    fn async_error(&self) -> Option<HalError> {
        self.inner.async_error()
    }
    fn native_handle(&self) -> NativeHandle {
        self.inner.native_handle()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

struct Setup {
    alloc: CachingAllocator,
    cap: Arc<Capturing>,
    /// The capturing stream as the allocator sees it.
    s: Arc<dyn Stream>,
    /// Another stream, never capturing.
    other: Arc<dyn Stream>,
}

fn setup() -> Setup {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let cap = Capturing::new(dev.create_stream().unwrap());
    let s: Arc<dyn Stream> = cap.clone();
    let other = dev.create_stream().unwrap();
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    Setup {
        alloc,
        cap,
        s,
        other,
    }
}

/// The ranges of graph-pool segments in the snapshot.
fn pool_ranges(a: &CachingAllocator) -> Vec<(u64, u64, GraphPoolId)> {
    a.snapshot()
        .iter()
        .filter_map(|g| {
            g.graph_pool
                .map(|p| (g.address, g.address + g.total_size, p))
        })
        .collect()
}

fn inside(ranges: &[(u64, u64, GraphPoolId)], b: &Buffer) -> bool {
    let a = b.device_addr();
    ranges.iter().any(|&(lo, hi, _)| lo <= a && a < hi)
}

#[test]
fn a_capture_reuses_its_own_freed_blocks_and_nothing_else_does() {
    let t = setup();
    // A block of the general cache, freed before the capture: the capture does not take it.
    let before = t.alloc.alloc(&t.s, 4096).unwrap();
    let general = before.device_addr();
    drop(before);

    let c = t.cap.begin();
    let x = t.alloc.alloc(&t.s, 4096).unwrap();
    assert_ne!(
        x.device_addr(),
        general,
        "a capture took a general-cache block"
    );
    assert_eq!(t.alloc.graph_pool_of(c), Some(GraphPoolId(c.get(), 0)));
    assert_eq!(t.cap.alloc_async_calls.load(Ordering::Relaxed), 1);
    t.s.fill(&x, 0, 4096, FillValue::U8(7)).unwrap();
    let x_addr = x.device_addr();
    drop(x);
    // Fenced to the capture: another stream's request does not get it ...
    let o = t.alloc.alloc(&t.other, 4096).unwrap();
    assert_ne!(o.device_addr(), x_addr);
    assert!(!inside(&pool_ranges(&t.alloc), &o));
    // ... the capture's next request does (its work is ordered after the captured fill).
    let y = t.alloc.alloc(&t.s, 4096).unwrap();
    assert_eq!(
        y.device_addr(),
        x_addr,
        "the capture did not reuse its freed block"
    );
    assert_eq!(t.cap.alloc_async_calls.load(Ordering::Relaxed), 1);
    t.s.fill(&y, 0, 4096, FillValue::U8(8)).unwrap();
    drop(y);
    drop(o);

    let graph = t.cap.end();
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.graph_pool_segment.current, 1);
    assert_eq!(st.graph_pool_reserved_bytes.current, 2 * MIB);
    assert_eq!(st.graph_pool_allocated_bytes.current, 0);
    // While the graph lives, no request on any stream gets a block of the pool.
    let ranges = pool_ranges(&t.alloc);
    assert_eq!(ranges.len(), 1);
    let mut held = Vec::new();
    for len in [512, 4096, 100_000, MIB, 3 * MIB] {
        for s in [&t.s, &t.other] {
            let b = t.alloc.alloc(s, len as usize).unwrap();
            assert!(
                !inside(&ranges, &b),
                "a block of the live graph's pool served {len} bytes"
            );
            held.push(b);
        }
    }
    drop(held);
    t.other.synchronize().unwrap();
    t.s.synchronize().unwrap();
    // `empty_cache` keeps the live graph's pool.
    t.alloc.empty_cache();
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.reserved_bytes.all.current, 2 * MIB);

    // The graph destroyed: the pool's segment, graph memory of the capture's `alloc_async`, is
    // released (never cached: its handle is unusable after the capture).
    let _ = x_addr;
    drop(graph);
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 0);
    assert_eq!(st.graph_pool_reserved_bytes.current, 0);
    assert_eq!(st.reserved_bytes.all.current, 0);
    assert!(pool_ranges(&t.alloc).is_empty());
    let z = t.alloc.alloc(&t.other, 4096).unwrap();
    assert_eq!(t.alloc.stats().num_device_alloc, st.num_device_alloc + 1);
    drop(z);
}

#[test]
fn an_idle_pool_stays_with_its_capture_until_the_capture_ends() {
    let t = setup();
    let c = t.cap.begin();
    let x = t.alloc.alloc(&t.s, 1000).unwrap();
    let addr = x.device_addr();
    drop(x); // no captured use: idle at once
    assert_eq!(
        t.alloc.stats().graph_pools.current,
        1,
        "released mid-capture"
    );
    let o = t.alloc.alloc(&t.other, 1000).unwrap();
    assert_ne!(o.device_addr(), addr);
    let y = t.alloc.alloc(&t.s, 1000).unwrap();
    assert_eq!(y.device_addr(), addr);
    drop(y);
    let graph = t.cap.end();
    assert!(t.alloc.graph_pool_of(c).is_some());
    // Idle, capture over, no graph use: back to the cache at the next call.
    assert_eq!(t.alloc.stats().graph_pools.current, 0);
    assert_eq!(t.alloc.graph_pool_of(c), None);
    drop((graph, o));
}

#[test]
fn a_block_the_graph_outputs_waits_for_its_handles_and_the_graph() {
    let t = setup();
    t.cap.begin();
    let out = t.alloc.alloc(&t.s, 3 * MIB as usize).unwrap();
    t.s.fill(&out, 0, 3 * MIB, FillValue::U8(1)).unwrap();
    let graph = t.cap.end();
    // The output used after the capture on a real stream, then dropped: the graph still uses it.
    t.other.fill(&out, 0, 16, FillValue::U8(2)).unwrap();
    let addr = out.device_addr();
    drop(out);
    t.other.synchronize().unwrap();
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.graph_pool_allocated_bytes.current, 0);
    let again = t.alloc.alloc(&t.other, 3 * MIB as usize).unwrap();
    assert_ne!(again.device_addr(), addr);
    let reserved = t.alloc.stats().reserved_bytes.all.current;
    drop(graph);
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 0);
    assert_eq!(
        st.reserved_bytes.all.current,
        reserved - 20 * MIB,
        "the graph's segment was not released"
    );
    drop(again);
}

#[test]
fn a_shared_pool_serves_several_captures_and_goes_when_its_handle_does() {
    let t = setup();
    let pool = t.alloc.graph_pool_handle();
    assert_eq!(pool.id(), GraphPoolId(0, 1));
    // Not capturing: refused.
    let e = t.alloc.capture_into(&t.s, &pool).unwrap_err();
    assert!(
        matches!(
            e,
            HalError::InvalidArgument {
                reason: Invalid::Capture { .. },
                ..
            }
        ),
        "{e}"
    );
    let c1 = t.cap.begin();
    t.alloc.capture_into(&t.s, &pool).unwrap();
    let a = t.alloc.alloc(&t.s, 4096).unwrap();
    t.s.fill(&a, 0, 4096, FillValue::U8(1)).unwrap();
    let a_addr = a.device_addr();
    let idle = t.alloc.alloc(&t.s, 4096).unwrap();
    let idle_addr = idle.device_addr();
    drop((a, idle));
    let g1 = t.cap.end();
    assert_eq!(t.alloc.graph_pool_of(c1), Some(pool.id()));

    let c2 = t.cap.begin();
    t.alloc.capture_into(&t.s, &pool).unwrap();
    // Capture 1's segment is its graph memory: capture 2 gets neither its idle block nor the
    // one graph 1 uses, but a segment of its own.
    let ranges1 = pool_ranges(&t.alloc);
    let b = t.alloc.alloc(&t.s, 4096).unwrap();
    assert_ne!(b.device_addr(), idle_addr);
    assert!(!inside(&ranges1, &b), "capture 2 got capture 1's block");
    let b2 = t.alloc.alloc(&t.s, 4096).unwrap();
    assert_ne!(b2.device_addr(), a_addr);
    assert!(!inside(&ranges1, &b2), "capture 2 got capture 1's block");
    assert_eq!(t.cap.alloc_async_calls.load(Ordering::Relaxed), 2);
    drop((b, b2));
    let g2 = t.cap.end();
    let pools = t.alloc.graph_pools();
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0].captures, vec![c1, c2]);
    assert_eq!(pools[0].handles, 1);

    // A capture that allocated from its own pool cannot move to another.
    t.cap.begin();
    let own = t.alloc.alloc(&t.s, 512).unwrap();
    assert!(t.alloc.capture_into(&t.s, &pool).is_err());
    drop(own);
    drop(t.cap.end());

    drop((g1, g2));
    // Idle, but the handle keeps it for captures to come; the captures' own segments, which no
    // capture to come may use, are released.
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 1);
    assert_eq!(st.graph_pool_segment.current, 0);
    assert_eq!(st.reserved_bytes.all.current, 0);
    let clone = pool.clone();
    drop(pool);
    assert_eq!(t.alloc.stats().graph_pools.current, 1);
    drop(clone);
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.current, 0);
    // The shared pool and the third capture's own.
    assert_eq!(st.graph_pools.allocated, 2);
    assert_eq!(st.graph_pool_segment.current, 0);
}

#[test]
fn a_reserved_pool_serves_its_capture_without_allocating() {
    let t = setup();
    let pool = t.alloc.graph_pool_handle();
    t.alloc.reserve_graph_pool(&pool, 1000).unwrap();
    t.alloc
        .reserve_graph_pool(&pool, 30 * MIB as usize)
        .unwrap();
    let st = t.alloc.stats();
    assert_eq!(st.graph_pool_segment.current, 2);
    assert_eq!(st.graph_pool_reserved_bytes.current, 2 * MIB + 30 * MIB);
    t.cap.begin();
    t.alloc.capture_into(&t.s, &pool).unwrap();
    let small = t.alloc.alloc(&t.s, 1000).unwrap();
    let large = t.alloc.alloc(&t.s, 30 * MIB as usize).unwrap();
    assert_eq!(t.cap.alloc_async_calls.load(Ordering::Relaxed), 0);
    assert_eq!(t.alloc.stats().num_device_alloc, st.num_device_alloc);
    drop((small, large));
    drop(t.cap.end());
    // Another allocator's pool is refused.
    let other = setup();
    assert!(other.alloc.reserve_graph_pool(&pool, 10).is_err());
}

#[test]
fn statistics_summary_and_torch_snapshot_show_graph_pools() {
    let t = setup();
    let plain = t.alloc.stats().summary("cpu:0");
    assert!(!plain.contains("Graph pools"), "{plain}");
    let c = t.cap.begin();
    let x = t.alloc.alloc(&t.s, 4096).unwrap();
    let m = t.alloc.stats().to_map();
    assert_eq!(m["graph_pools.current"], 1);
    assert_eq!(m["graph_pool_reserved_bytes.current"], 2 * MIB as i64);
    assert_eq!(m["graph_pool_allocated_bytes.current"], 4096);
    assert_eq!(m["graph_pool_segment.peak"], 1);
    let summary = t.alloc.stats().summary("cpu:0");
    assert!(summary.contains(" Graph pools "), "{summary}");
    assert!(summary.contains(" Graph pool reserved "), "{summary}");
    // The general segment and the pool's, with torch's `segment_pool_id`.
    let g = t.alloc.alloc(&t.other, 4096).unwrap();
    let snap = t.alloc.snapshot();
    let mut ids: Vec<_> = snap.iter().map(|s| s.graph_pool).collect();
    ids.sort();
    assert_eq!(ids, vec![None, Some(GraphPoolId(c.get(), 0))]);
    let v = unihal_alloc::torch::snapshot(0, &snap, &[], None);
    let unihal_alloc::torch::Value::Dict(top) = v else {
        panic!("not a dict")
    };
    let unihal_alloc::torch::Value::List(segs) = &top[0].1 else {
        panic!("no segments")
    };
    let mut pool_ids = Vec::new();
    for seg in segs {
        let unihal_alloc::torch::Value::Dict(e) = seg else {
            panic!()
        };
        let (_, id) = e.iter().find(|(k, _)| k == "segment_pool_id").unwrap();
        pool_ids.push(id.clone());
    }
    let pair = |a: u64, b: u64| {
        unihal_alloc::torch::Value::Pair(Box::new((
            unihal_alloc::torch::Value::Int(a.into()),
            unihal_alloc::torch::Value::Int(b.into()),
        )))
    };
    assert!(pool_ids.contains(&pair(0, 0)));
    assert!(pool_ids.contains(&pair(c.get(), 0)));
    drop((x, g));
    drop(t.cap.end());
    t.alloc.reset_peak_stats();
    let st = t.alloc.stats();
    assert_eq!(st.graph_pools.peak, 0);
    t.alloc.reset_accumulated_stats();
    assert_eq!(t.alloc.stats().graph_pools.allocated, 0);
}

#[test]
fn empty_cache_keeps_a_live_pool_and_frees_it_once_released() {
    let t = setup();
    t.cap.begin();
    let x = t.alloc.alloc(&t.s, 4096).unwrap();
    t.s.fill(&x, 0, 4096, FillValue::U8(3)).unwrap();
    drop(x);
    let graph = t.cap.end();
    t.alloc.empty_cache();
    let st = t.alloc.stats();
    assert_eq!(
        st.reserved_bytes.all.current,
        2 * MIB,
        "a live graph's pool was released"
    );
    drop(graph);
    t.alloc.empty_cache();
    let st = t.alloc.stats();
    assert_eq!(st.reserved_bytes.all.current, 0);
    assert_eq!(st.graph_pools.current, 0);
}
