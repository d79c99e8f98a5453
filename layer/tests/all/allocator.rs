//! The layer follows the caching allocator: a block handed out again after its earlier work
//! completed is a new life (no finding when another stream uses it, none for a `free_async` of
//! the earlier block), in error mode too; but a block handed out at once to the stream whose
//! queued work still uses it must be ordered after that work before another stream touches it.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::{Backend, Device, FillValue, Stream};
use unihal_layer::{wrap, FindingKind, LayerBackend, Mode};

struct Setup {
    v: Arc<LayerBackend>,
    alloc: CachingAllocator,
    a: Arc<dyn Stream>,
    b: Arc<dyn Stream>,
}

fn setup(mode: Mode) -> Setup {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap();
    let v = wrap(Arc::new(unihal_cpu::CpuBackend::with_config(cfg)), mode);
    let dev: Arc<dyn Device> = v.open(0).unwrap();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let alloc = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    Setup { v, alloc, a, b }
}

/// Waits until the allocator has every block back (the queued work released its keeps), without
/// any synchronisation the layer could see.
fn until_idle(alloc: &CachingAllocator) {
    let t0 = Instant::now();
    let busy = |a: &CachingAllocator| {
        a.stats().active_bytes.all.current != 0
            || a.snapshot()
                .iter()
                .any(|s| s.blocks.iter().any(|b| !b.pending_uses_on.is_empty()))
    };
    while busy(alloc) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the work never completed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_block_reused_on_another_stream_after_its_work_completed_is_silent_in_error_mode() {
    let s = setup(Mode::Error);
    let x = s.alloc.alloc(&s.a, 4096).unwrap();
    let addr = x.device_addr();
    s.a.fill(&x, 0, 4096, FillValue::U8(1)).unwrap();
    drop(x);
    until_idle(&s.alloc);
    let y = s.alloc.alloc(&s.b, 4096).unwrap();
    assert_eq!(y.device_addr(), addr, "the block is reused");
    s.b.fill(&y, 0, 4096, FillValue::U8(2))
        .expect("the reused block's first use was refused");
    s.b.synchronize().unwrap();
    let found = s.v.take_findings();
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_block_handed_out_after_a_free_async_of_the_earlier_one_is_no_use_after_free() {
    let s = setup(Mode::Error);
    let x = s.alloc.alloc(&s.a, 4096).unwrap();
    let addr = x.device_addr();
    s.a.free_async(&x).unwrap();
    drop(x);
    until_idle(&s.alloc);
    let y = s.alloc.alloc(&s.b, 4096).unwrap();
    assert_eq!(y.device_addr(), addr, "the block is reused");
    s.b.fill(&y, 0, 4096, FillValue::U8(2))
        .expect("the reused block's use was refused as a use after free");
    s.b.synchronize().unwrap();
    let found = s.v.take_findings();
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_block_reused_at_once_by_the_stream_whose_work_still_uses_it_must_be_ordered_after_it() {
    let s = setup(Mode::Report);
    let (tx, rx) = mpsc::channel::<()>();
    s.a.host_callback(Box::new(move || {
        let _ = rx.recv();
    }))
    .unwrap();
    let x = s.alloc.alloc(&s.a, 4096).unwrap();
    let addr = x.device_addr();
    s.a.fill(&x, 0, 4096, FillValue::U8(1)).unwrap();
    drop(x);
    let y = s.alloc.alloc(&s.a, 4096).unwrap();
    assert_eq!(
        y.device_addr(),
        addr,
        "the same stream reuses the block at once"
    );
    // Handed to stream b with nothing ordering it after a's queued fill of the old block.
    s.b.fill(&y, 0, 4096, FillValue::U8(2)).unwrap();
    drop(tx);
    s.a.synchronize().unwrap();
    s.b.synchronize().unwrap();
    let kinds: Vec<FindingKind> = s.v.take_findings().iter().map(|f| f.kind).collect();
    assert_eq!(kinds, [FindingKind::UnorderedAccess]);
}
