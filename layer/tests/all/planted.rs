//! Planted mistakes the validation layer must report (and their ordered twins it must not), on
//! the CPU backend: the layer's model does not depend on timing, so each verdict is exact.

use std::sync::Arc;
use unihal_hal::{
    Backend, Buffer, CommConfig, DType, Device, EventFlags, FillValue, HalError, OpCall, ReduceOp,
    Scalar, Stream, TensorView,
};
use unihal_layer::{wrap, FindingKind, LayerBackend, Mode};

fn layer(mode: Mode) -> Arc<LayerBackend> {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("2"), Some("256M"), Some("1")).unwrap();
    wrap(Arc::new(unihal_cpu::CpuBackend::with_config(cfg)), mode)
}

struct Setup {
    v: Arc<LayerBackend>,
    dev: Arc<dyn Device>,
    a: Arc<dyn Stream>,
    b: Arc<dyn Stream>,
    buf: Buffer,
    out: Buffer,
}

fn setup(mode: Mode) -> Setup {
    let v = layer(mode);
    let dev = v.open(0).unwrap();
    let (a, b) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let (buf, out) = (dev.alloc(4096).unwrap(), dev.alloc(4096).unwrap());
    Setup {
        v,
        dev,
        a,
        b,
        buf,
        out,
    }
}

fn kinds(v: &LayerBackend) -> Vec<FindingKind> {
    v.take_findings().iter().map(|f| f.kind).collect()
}

#[test]
fn a_missing_event_wait_is_reported_with_both_call_sites() {
    let s = setup(Mode::Report);
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(7)).unwrap();
    let first = line!() - 1;
    s.b.copy_d2d(&s.buf, 0, &s.out, 0, 4096).unwrap();
    let second = line!() - 1;
    s.dev.synchronize().unwrap();
    let found = s.v.take_findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    let f = &found[0];
    assert_eq!(f.kind, FindingKind::UnorderedAccess);
    assert_eq!((f.site.file(), f.site.line()), (file!(), second), "{f}");
    let earlier = f.earlier.expect("the earlier call site");
    assert_eq!((earlier.file(), earlier.line()), (file!(), first), "{f}");
    assert!(
        f.message.contains("copy_d2d (src)") && f.message.contains("fill (dst)"),
        "{f}"
    );
}

#[test]
fn an_event_wait_a_synchronisation_or_a_completed_query_orders_the_streams() {
    let s = setup(Mode::Report);
    let ev = s.dev.create_event(EventFlags::default()).unwrap();
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(1)).unwrap();
    s.a.record_event(&ev).unwrap();
    s.b.wait_event(&ev).unwrap();
    s.b.copy_d2d(&s.buf, 0, &s.out, 0, 4096).unwrap();
    // Written by a, then read by b after the wait: a's next write must be ordered after b's read.
    s.b.synchronize().unwrap();
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(2)).unwrap();
    s.a.synchronize().unwrap();
    s.b.copy_d2d(&s.buf, 0, &s.out, 0, 4096).unwrap();
    s.b.synchronize().unwrap();
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(3)).unwrap();
    ev.synchronize().unwrap(); // a stale record: covers nothing of the fill above
    while !s.a.query().unwrap() {}
    s.b.copy_d2d(&s.buf, 0, &s.out, 0, 4096).unwrap();
    s.dev.synchronize().unwrap();
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(4)).unwrap();
    assert_eq!(kinds(&s.v), vec![]);
}

#[test]
fn a_write_after_another_streams_read_is_reported() {
    let s = setup(Mode::Report);
    s.a.copy_d2d(&s.buf, 0, &s.out, 0, 1024).unwrap();
    s.b.fill(&s.buf, 512, 512, FillValue::U8(9)).unwrap();
    // Disjoint bytes of the same allocation are no conflict.
    s.b.fill(&s.buf, 2048, 512, FillValue::U8(9)).unwrap();
    s.dev.synchronize().unwrap();
    let found = s.v.take_findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].message.contains("writes bytes") && found[0].message.contains("copy_d2d (src)")
    );
}

#[test]
fn a_host_map_without_synchronisation_is_reported_even_when_the_map_succeeds() {
    let s = setup(Mode::Report);
    let h = s.dev.alloc_host(4096).unwrap();
    s.a.copy_d2h(&s.buf, 0, &h, 0, 4096).unwrap();
    // The planted mistake: wait for the copy by polling the buffer, not by a synchronisation.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let map = loop {
        match h.map() {
            Ok(m) => break m,
            Err(_) if std::time::Instant::now() < deadline => std::thread::yield_now(),
            Err(e) => panic!("the copy never completed: {e}"),
        }
    };
    drop(map);
    assert_eq!(kinds(&s.v), vec![FindingKind::UnorderedHostMap]);
    // Its ordered twin.
    s.a.copy_d2h(&s.buf, 0, &h, 0, 4096).unwrap();
    s.a.synchronize().unwrap();
    drop(h.map().unwrap());
    // A host callback runs after the copy: mapping inside it is ordered.
    s.a.copy_d2h(&s.buf, 0, &h, 0, 4096).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let hc = h.clone();
    s.a.host_callback(Box::new(move || {
        let _ = tx.send(hc.map().is_ok());
    }))
    .unwrap();
    assert!(rx.recv().unwrap());
    s.a.synchronize().unwrap();
    assert_eq!(kinds(&s.v), vec![]);
}

#[test]
fn use_after_free_async_through_another_handle_is_reported() {
    let s = setup(Mode::Report);
    // SAFETY: the alias covers `buf`'s own 4096 bytes and keeps `buf` alive as its owner.
    let alias = unsafe {
        s.dev
            .import_memory(s.buf.device_addr(), 4096, Box::new(s.buf.clone()))
            .unwrap()
    };
    s.a.free_async(&s.buf).unwrap();
    s.a.fill(&alias, 0, 64, FillValue::U8(1)).unwrap();
    s.a.synchronize().unwrap();
    assert_eq!(kinds(&s.v), vec![FindingKind::UseAfterFreeAsync]);
    // A new allocation over the same memory starts a new history.
    drop(alias);
}

#[test]
fn an_event_the_layer_did_not_make_is_reported() {
    let s = setup(Mode::Report);
    let raw = s.v.inner().open(0).unwrap();
    let ev = raw.create_event(EventFlags::default()).unwrap();
    // The CPU backend accepts an event of its own kind: the ordering it carries is invisible.
    s.a.record_event(&ev).unwrap();
    s.b.wait_event(&ev).unwrap();
    assert_eq!(
        kinds(&s.v),
        vec![FindingKind::ForeignHandle, FindingKind::ForeignHandle]
    );
}

/// In error mode too: the backend judges a handle the layer did not make first (one it made
/// itself, unwrapped, it accepts, and the layer reports it; an accepted call cannot be refused
/// after the fact).
#[test]
fn an_event_the_layer_did_not_make_is_reported_in_error_mode_once_the_backend_accepts_it() {
    let s = setup(Mode::Error);
    let raw = s.v.inner().open(0).unwrap();
    let ev = raw.create_event(EventFlags::default()).unwrap();
    s.a.record_event(&ev).unwrap();
    s.a.synchronize().unwrap();
    assert_eq!(kinds(&s.v), vec![FindingKind::ForeignHandle]);
}

#[test]
fn collectives_and_library_ops_are_tracked() {
    let v = layer(Mode::Report);
    let devs: Vec<Arc<dyn Device>> = (0..2).map(|i| v.open(i).unwrap()).collect();
    let comms = v
        .collectives()
        .unwrap()
        .init_all(&devs, &CommConfig::default())
        .unwrap();
    let streams: Vec<Arc<dyn Stream>> = devs.iter().map(|d| d.create_stream().unwrap()).collect();
    let other = devs[0].create_stream().unwrap();
    let bufs: Vec<Buffer> = devs.iter().map(|d| d.alloc(64).unwrap()).collect();
    std::thread::scope(|sc| {
        for r in 0..2 {
            let (c, st, b) = (&comms[r], &streams[r], &bufs[r]);
            sc.spawn(move || {
                c.all_reduce(b, b, 16, DType::F32, ReduceOp::Sum, st)
                    .unwrap()
            });
        }
    });
    // Rank 0's result read on another stream without a wait.
    let out = devs[0].alloc(64).unwrap();
    other.copy_d2d(&bufs[0], 0, &out, 0, 64).unwrap();
    for s in &streams {
        s.synchronize().unwrap();
    }
    other.synchronize().unwrap();
    let found = v.take_findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].message.contains("all_reduce (recv)"),
        "{}",
        found[0]
    );
    // A library op's output, read on another stream without a wait.
    let x = TensorView::contiguous(&out, DType::F32, &[16]);
    streams[0]
        .run_op(&OpCall::fill(x, Scalar::F64(1.0)))
        .unwrap();
    other.copy_d2d(&out, 0, &bufs[0], 0, 64).unwrap();
    other.synchronize().unwrap();
    streams[0].synchronize().unwrap();
    let found = v.take_findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].message.contains("fill (output)"), "{}", found[0]);
}

#[test]
fn error_mode_refuses_the_unordered_call_and_enqueues_nothing() {
    let s = setup(Mode::Error);
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(7)).unwrap();
    s.a.synchronize().unwrap();
    s.b.fill(&s.out, 0, 4096, FillValue::U8(1)).unwrap();
    s.a.fill(&s.buf, 0, 4096, FillValue::U8(8)).unwrap();
    let e = s.b.copy_d2d(&s.buf, 0, &s.out, 0, 4096).unwrap_err();
    assert!(
        matches!(
            &e,
            HalError::InvalidArgument {
                arg: "validation",
                ..
            }
        ),
        "{e}"
    );
    s.dev.synchronize().unwrap();
    let mut got = [0u8; 4];
    s.b.read(&s.out, 0, &mut got).unwrap();
    assert_eq!(got, [1; 4], "the refused copy ran");
    assert_eq!(s.v.take_findings().len(), 1);
}

#[test]
fn the_mode_variable_is_parsed_strictly() {
    assert_eq!(Mode::parse(None), Ok(None));
    assert_eq!(Mode::parse(Some("0")), Ok(None));
    assert_eq!(Mode::parse(Some("1")), Ok(Some(Mode::Report)));
    assert_eq!(Mode::parse(Some("error")), Ok(Some(Mode::Error)));
    assert!(Mode::parse(Some("yes please"))
        .unwrap_err()
        .contains("accepted values"));
}
