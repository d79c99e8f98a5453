//! The CUDA backend's graph choices on the simulated driver (deferred mode), beyond the
//! conformance cases (`graph.*`): native caps naming what is not captured; a host callback
//! refused inside a capture without invalidating it; stream-ordered allocation captured as memory
//! nodes the graph owns (used only in its capture, freed in every replay, one executable at a
//! time); the backend's own
//! frees (a buffer dropped while a global capture is active) never invalidate it; capture errors
//! of device- and event-wide calls name the capture; a stream dropped while capturing ends its
//! capture; a graph keeps what its work uses after its stream is gone; a captured all-reduce
//! replays, each replay tracked by the engine as an eager call is (`graph_replay_watchdog.rs`:
//! a replay whose peer never replays times out).

use crate::support;

use std::sync::Arc;
use std::time::Duration;
use support::two_ranks;
use unihal_hal::{
    CaptureMode, CaptureStatus, DType, Device, EventFlags, FillValue, GraphSupport, HalError,
    Invalid, ReduceOp, Stream,
};

fn capture_of<T: std::fmt::Debug>(r: unihal_hal::Result<T>) -> Option<unihal_hal::CaptureId> {
    match r {
        Err(HalError::InvalidArgument {
            reason: Invalid::Capture { capture, .. },
            ..
        }) => capture,
        other => panic!("expected Invalid::Capture, got {other:?}"),
    }
}

fn active(s: &Arc<dyn Stream>) -> unihal_hal::CaptureId {
    match s.capture_status() {
        CaptureStatus::Active(c) => c,
        other => panic!("not capturing: {other:?}"),
    }
}

fn byte(s: &Arc<dyn Stream>, b: &unihal_hal::Buffer) -> u8 {
    let mut out = [0u8; 1];
    s.read(b, 0, &mut out).unwrap();
    out[0]
}

#[test]
fn graphs_on_the_simulated_driver() {
    if crate::own_process() {
        return;
    }
    let (_backend, [d0, d1], comms) = two_ranks(&[("UNIHAL_SIM_MODE", "deferred")]);
    let caps = &d0.capabilities().optional.graphs;
    assert_eq!(caps.support, GraphSupport::Native, "{}", caps.note);
    assert!(caps.copies && caps.fills && caps.kernels && caps.collectives);
    assert!(!caps.host_callbacks && caps.stream_alloc, "{caps:?}");

    host_callback_refused(&d0);
    memory_nodes(&d0);
    own_frees_never_invalidate(&d0);
    device_and_event_errors_name_the_capture(&d0);
    dropped_capturing_stream(&d0);
    captured_all_reduce(&[d0, d1], &comms);
}

/// Stream-ordered allocation in a capture: memory nodes owned by the graph.
fn memory_nodes(d: &Arc<dyn Device>) {
    let s = d.create_stream().unwrap();
    let other = d.create_stream().unwrap();
    let out = d.alloc(64).unwrap();
    let gone = d.alloc(64).unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let c = active(&s);
    // Freed in the capture: an allocation and a free node.
    let t = s.alloc_async(64).unwrap();
    s.fill(&t, 0, 64, FillValue::U8(3)).unwrap();
    // Not freed in the capture: the end adds its free node.
    let u = s.alloc_async(64).unwrap();
    s.copy_d2d(&t, 0, &u, 0, 64).unwrap();
    s.copy_d2d(&u, 0, &out, 0, 64).unwrap();
    s.free_async(&t).unwrap();
    // Outside the capture, a graph allocation is refused (its memory exists only in replays).
    assert_eq!(capture_of(other.fill(&u, 0, 64, FillValue::U8(1))), Some(c));
    // An ordinary buffer freed in the capture: kept by the graph, unusable now.
    s.free_async(&gone).unwrap();
    assert!(other.fill(&gone, 0, 64, FillValue::U8(1)).is_err());
    assert_eq!(s.capture_status(), CaptureStatus::Active(c));
    let g = s.end_capture().unwrap();
    drop(gone);
    // Every handle of a graph allocation is unusable once its capture ended.
    assert!(s.fill(&u, 0, 64, FillValue::U8(1)).is_err());
    // One executable at a time for a graph with memory nodes, said as such.
    match g.instantiate() {
        Err(HalError::Unsupported { what }) => assert!(what.contains("memory nodes"), "{what}"),
        other => panic!("a second executable: {other:?}"),
    }
    // Every launch succeeds: no allocation escapes a replay.
    for _ in 0..3 {
        s.write(&out, 0, &[0u8; 64]).unwrap();
        s.launch_graph(&g).unwrap();
        other.launch_graph(&g).unwrap();
        other.synchronize().unwrap();
        assert_eq!(byte(&s, &out), 3);
    }
    drop((t, u, g));
    s.synchronize().unwrap();
}

fn host_callback_refused(d: &Arc<dyn Device>) {
    let s = d.create_stream().unwrap();
    let b = d.alloc(64).unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let c = active(&s);
    assert_eq!(capture_of(s.host_callback(Box::new(|| {}))), Some(c));
    // Refused by the backend, not by the driver: the capture stays valid and ends.
    assert_eq!(s.capture_status(), CaptureStatus::Active(c));
    s.fill(&b, 0, 64, FillValue::U8(9)).unwrap();
    let g = s.end_capture().unwrap();
    assert_eq!(g.node_count(), 1);
    s.launch_graph(&g).unwrap();
    s.synchronize().unwrap();
    assert_eq!(byte(&s, &b), 9);
    // Outside the capture, the host callback runs.
    let (tx, rx) = std::sync::mpsc::channel();
    s.host_callback(Box::new(move || tx.send(()).unwrap()))
        .unwrap();
    s.synchronize().unwrap();
    rx.recv_timeout(Duration::from_secs(5)).unwrap();
}

fn own_frees_never_invalidate(d: &Arc<dyn Device>) {
    let s = d.create_stream().unwrap();
    let h = d.alloc_host(64).unwrap();
    let b = d.alloc(64).unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let c = active(&s);
    // Freed by the backend while a global capture is active (cuMemFree and cuMemFreeHost are
    // capture-unsafe): under a relaxed thread mode, so the capture goes on; so is the backend's
    // own allocation.
    drop(h);
    drop(b);
    let scratch = d.alloc_internal_probe();
    // The next enqueue runs any release deferred meanwhile.
    s.fill(&scratch, 0, 64, FillValue::U8(0)).unwrap();
    assert_eq!(s.capture_status(), CaptureStatus::Active(c));
    s.end_capture().unwrap();
    // The user's Device::alloc is not exchanged: refused under a global capture, which it
    // invalidates.
    s.begin_capture(CaptureMode::Global).unwrap();
    let c = active(&s);
    assert_eq!(capture_of(d.alloc(64)), Some(c));
    assert_eq!(s.capture_status(), CaptureStatus::Invalidated(c));
    assert_eq!(capture_of(s.end_capture()), Some(c));
}

/// What lets these tests reach the backend's own allocation (not in the HAL).
trait Probe {
    fn alloc_internal_probe(&self) -> unihal_hal::Buffer;
}

impl Probe for Arc<dyn Device> {
    fn alloc_internal_probe(&self) -> unihal_hal::Buffer {
        self.as_any()
            .downcast_ref::<unihal_cuda::CudaDevice>()
            .expect("a CUDA device")
            .alloc_internal(64)
            .expect("the backend's own allocation is never refused by a capture")
    }
}

fn device_and_event_errors_name_the_capture(d: &Arc<dyn Device>) {
    let s = d.create_stream().unwrap();
    let b = d.alloc(64).unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let c = active(&s);
    s.fill(&b, 0, 64, FillValue::U8(1)).unwrap();
    assert_eq!(capture_of(d.synchronize()), Some(c));
    assert!(capture_of(s.end_capture()) == Some(c));
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    let c = active(&s);
    let e = d.create_event(EventFlags::default()).unwrap();
    s.record_event(&e).unwrap();
    assert_eq!(capture_of(e.query()), Some(c));
    assert_eq!(capture_of(s.end_capture()), Some(c));
    assert_eq!(s.capture_status(), CaptureStatus::None);
}

fn dropped_capturing_stream(d: &Arc<dyn Device>) {
    let b = d.alloc(64).unwrap();
    {
        let s = d.create_stream().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        s.fill(&b, 0, 64, FillValue::U8(4)).unwrap();
    }
    // The capture ended with the stream: the device synchronises and allocates again.
    d.synchronize().unwrap();
    let s = d.create_stream().unwrap();
    s.fill(&b, 0, 64, FillValue::U8(6)).unwrap();
    assert_eq!(
        byte(&s, &b),
        6,
        "the dropped stream's captured fill never ran"
    );
    // A graph outlives its stream and keeps what its work uses.
    let g = {
        let s = d.create_stream().unwrap();
        let tmp = d.alloc(64).unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        s.fill(&tmp, 0, 64, FillValue::U8(8)).unwrap();
        s.copy_d2d(&tmp, 0, &b, 0, 64).unwrap();
        s.end_capture().unwrap()
    };
    s.launch_graph(&g).unwrap();
    s.launch_graph(&g.instantiate().unwrap()).unwrap();
    assert_eq!(byte(&s, &b), 8);
    drop(g);
    d.synchronize().unwrap();
}

fn captured_all_reduce(devs: &[Arc<dyn Device>; 2], comms: &[Arc<dyn unihal_hal::Communicator>]) {
    let n = 256u64;
    let work: Vec<_> = devs
        .iter()
        .zip(comms)
        .map(|(d, c)| {
            let s = d.create_stream().unwrap();
            let (send, recv) = (
                d.alloc(4 * n as usize).unwrap(),
                d.alloc(4 * n as usize).unwrap(),
            );
            (d.clone(), c.clone(), s, send, recv)
        })
        .collect();
    let handles: Vec<_> = work
        .into_iter()
        .enumerate()
        .map(|(rank, (_d, comm, s, send, recv))| {
            std::thread::spawn(move || {
                s.begin_capture(CaptureMode::ThreadLocal).unwrap();
                comm.all_reduce(&send, &recv, n, DType::F32, ReduceOp::Sum, &s)
                    .unwrap();
                let g = s.end_capture().unwrap();
                for k in 1..=2u32 {
                    let v = (rank as f32 + 1.0) * k as f32;
                    let bytes: Vec<u8> = (0..n).flat_map(|_| v.to_le_bytes()).collect();
                    s.write(&send, 0, &bytes).unwrap();
                    s.launch_graph(&g).unwrap();
                    let mut out = vec![0u8; 4 * n as usize];
                    s.read(&recv, 0, &mut out).unwrap();
                    let got = f32::from_le_bytes(out[..4].try_into().unwrap());
                    assert_eq!(got, 3.0 * k as f32, "rank {rank}, replay {k}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Each replay was tracked and completed: the communicator is healthy.
    for c in comms {
        assert!(c.async_error().is_none(), "{:?}", c.async_error());
    }
}
