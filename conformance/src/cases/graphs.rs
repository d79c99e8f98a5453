//! `graph.*`: stream capture and graph replay (see `unihal_hal::graph`). The rules every backend
//! that captures must keep, whether natively (CUDA, HIP graphs) or emulated (the CPU backend):
//! captured work does not run until a replay, and each replay sees the buffers' contents of its
//! own time; calls that would wait for or observe captured work fail naming the capture and
//! invalidate it; the three capture modes refuse a capture-unsafe `Device::alloc` from the threads
//! the vendors name; streams join by an event and must rejoin; replays of one graph are ordered,
//! separate instantiations are not; a graph outlives its stream and keeps its buffers.

use crate::blocker::Blocker;
use crate::case::{CaptureKind, Case, CaseResult, Ctx, Failure, Need};
use crate::cases::ccl::on_ranks;
use crate::{ensure, ensure_eq};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{
    Buffer, CaptureId, CaptureMode, CaptureStatus, CollectiveOp, CommConfig, DType, EventFlags,
    FillValue, HalError, Invalid, OpCall, OpId, ReduceOp, Stream, TensorView,
};

const ANY: Need = Need::Capture(CaptureKind::Any);
const FILLS: Need = Need::Capture(CaptureKind::Fills);
const COPIES: Need = Need::Capture(CaptureKind::Copies);

pub fn cases() -> Vec<Case> {
    // Cases that hold a stream to make order observable.
    const HOLD: [Need; 4] = [
        Need::StreamHold,
        Need::ConcurrentKernels,
        Need::Capture(CaptureKind::Copies),
        Need::Capture(CaptureKind::Fills),
    ];
    vec![
        Case::new("graph.caps.consistent", caps_consistent),
        Case::new("graph.replay.current_contents", current_contents).needs(&[COPIES, FILLS]),
        Case::new("graph.replay.ops_accumulate", ops_accumulate).needs(&[
            Need::Capture(CaptureKind::Ops),
            Need::Op(OpId::Add, DType::F32),
        ]),
        Case::new("graph.illegal.stream_synchronize", |c| {
            illegal(c, |s, _| s.synchronize())
        })
        .needs(&[FILLS]),
        Case::new("graph.illegal.stream_query", |c| {
            illegal(c, |s, _| s.query().map(drop))
        })
        .needs(&[FILLS]),
        Case::new("graph.illegal.device_synchronize", |c| {
            illegal(c, |s, _| s.device().synchronize())
        })
        .needs(&[FILLS]),
        Case::new("graph.illegal.blocking_read", |c| {
            illegal(c, |s, b| s.read(b, 0, &mut [0u8; 64]))
        })
        .needs(&[FILLS, COPIES]),
        Case::new("graph.illegal.event_synchronize", |c| {
            illegal(c, |s, _| {
                let e = s.device().create_event(EventFlags::default())?;
                s.record_event(&e)?;
                e.synchronize()
            })
        })
        .needs(&[FILLS]),
        Case::new("graph.illegal.event_query", |c| {
            illegal(c, |s, _| {
                let e = s.device().create_event(EventFlags::default())?;
                s.record_event(&e)?;
                e.query().map(drop)
            })
        })
        .needs(&[FILLS]),
        Case::new("graph.mode.global", |c| mode(c, CaptureMode::Global)).needs(&[ANY]),
        Case::new("graph.mode.thread_local", |c| {
            mode(c, CaptureMode::ThreadLocal)
        })
        .needs(&[ANY]),
        Case::new("graph.mode.relaxed", |c| mode(c, CaptureMode::Relaxed)).needs(&[ANY]),
        Case::new("graph.state.begin_twice", begin_twice).needs(&[ANY]),
        Case::new("graph.state.refused_work_keeps_the_capture", refused_keeps).needs(&[
            ANY,
            FILLS,
            Need::HostCallbacks,
        ]),
        Case::new("graph.state.end_without_begin", end_without_begin).needs(&[ANY]),
        Case::new("graph.state.end_on_joined_stream", end_on_joined).needs(&[FILLS]),
        Case::new("graph.streams.fork_join", fork_join).needs(&[FILLS, COPIES]),
        Case::new("graph.streams.unjoined", unjoined).needs(&[FILLS]),
        Case::new("graph.streams.outside_event", outside_event).needs(&[FILLS]),
        Case::new("graph.launch.ordered_across_streams", ordered).needs(&HOLD),
        Case::new("graph.launch.instantiations_independent", independent).needs(&HOLD),
        Case::new("graph.launch.wrong_device", wrong_device).needs(&[FILLS, Need::Devices(2)]),
        Case::new("graph.lifetime.outlives_stream", outlives_stream).needs(&[FILLS]),
        Case::new("graph.lifetime.keeps_buffers", keeps_buffers).needs(&[FILLS, COPIES]),
        Case::new("graph.capture.stream_alloc", stream_alloc).needs(&[
            Need::StreamOrderedAlloc,
            Need::Capture(CaptureKind::StreamAlloc),
            FILLS,
            COPIES,
        ]),
        Case::new("graph.capture.all_reduce", all_reduce).needs(&[
            Need::Ranks(2),
            Need::Capture(CaptureKind::Collectives),
            Need::Collective(CollectiveOp::AllReduce, DType::F32),
            COPIES,
        ]),
    ]
}

/// The capture `s` is in, failing the case when it is not capturing.
fn active(s: &Arc<dyn Stream>) -> Result<CaptureId, Failure> {
    match s.capture_status() {
        CaptureStatus::Active(c) => Ok(c),
        other => Err(Failure::new(format!(
            "a capturing stream reports {other:?}, not Active"
        ))),
    }
}

/// Expects `r` to be the `Invalid::Capture` refusal naming capture `c` (or, with `None`, any
/// capture refusal).
fn expect_capture<T: std::fmt::Debug>(
    r: unihal_hal::Result<T>,
    c: Option<CaptureId>,
    what: &str,
) -> CaseResult {
    match r {
        Err(HalError::InvalidArgument {
            reason: Invalid::Capture { capture, .. },
            ..
        }) if c.is_none() || capture == c => Ok(()),
        other => Err(Failure::new(format!(
            "{what}: expected InvalidArgument with Invalid::Capture naming {c:?}, got {other:?}"
        ))),
    }
}

/// After an illegal call: the stream reports the capture invalidated, its end fails naming it,
/// the stream has left capture and runs work again.
fn expect_invalidated(ctx: &Ctx, s: &Arc<dyn Stream>, c: CaptureId) -> CaseResult {
    ensure_eq!(
        s.capture_status(),
        CaptureStatus::Invalidated(c),
        "status after an illegal call"
    );
    expect_capture(
        s.end_capture(),
        Some(c),
        "end_capture of an invalidated capture",
    )?;
    ensure_eq!(s.capture_status(), CaptureStatus::None, "status after end");
    usable(ctx, s)
}

/// The stream runs work (a fill, read back).
fn usable(ctx: &Ctx, s: &Arc<dyn Stream>) -> CaseResult {
    let b = ctx.device.alloc(64)?;
    s.fill(&b, 0, 64, FillValue::U8(0x5A))?;
    s.synchronize()?;
    let mut out = [0u8; 64];
    s.read(&b, 0, &mut out)?;
    ensure!(
        out.iter().all(|&x| x == 0x5A),
        "the stream does not run work after its capture ended"
    );
    Ok(())
}

fn bytes(ctx: &Ctx, b: &Buffer, v: u8) -> CaseResult {
    let got = ctx.download(b)?;
    if let Some(i) = got.iter().position(|&x| x != v) {
        return Err(Failure::new(format!(
            "byte {i} is {:#x}, expected {v:#x}",
            got[i]
        )));
    }
    Ok(())
}

fn caps_consistent(ctx: &Ctx) -> CaseResult {
    let g = ctx.device.capabilities().optional.graphs.clone();
    let s = ctx.stream()?;
    if !g.available() {
        // No capture: begin says so, and the stream never reports one.
        match s.begin_capture(CaptureMode::Global) {
            Err(HalError::Unsupported { .. }) => {}
            other => {
                return Err(Failure::new(format!(
                    "graphs are unsupported in the capabilities, but begin_capture gave {other:?}"
                )))
            }
        }
        ensure_eq!(s.capture_status(), CaptureStatus::None, "status");
        ensure!(
            !g.note.is_empty(),
            "unsupported graphs must say why in GraphCaps::note"
        );
        return Ok(());
    }
    // An empty capture makes an empty graph that launches.
    s.begin_capture(CaptureMode::Global)?;
    let c = active(&s)?;
    let graph = s.end_capture()?;
    ensure_eq!(graph.capture_id(), c, "the graph's capture");
    ensure_eq!(graph.device_id(), ctx.device.id(), "the graph's device");
    ensure_eq!(graph.node_count(), 0, "nodes of an empty capture");
    ensure_eq!(s.capture_status(), CaptureStatus::None, "status after end");
    s.launch_graph(&graph)?;
    s.synchronize()?;
    Ok(())
}

fn current_contents(ctx: &Ctx) -> CaseResult {
    let n = 4096;
    let (a, b, c) = (
        ctx.upload(&[1u8; 4096])?,
        ctx.upload(&[0u8; 4096])?,
        ctx.upload(&[0u8; 4096])?,
    );
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    s.copy_d2d(&a, 0, &b, 0, n)?;
    s.fill(&c, 0, n, FillValue::U8(7))?;
    let graph = s.end_capture()?;
    ensure!(
        graph.node_count() >= 2,
        "{} nodes for 2 operations",
        graph.node_count()
    );
    // Nothing ran at capture.
    bytes(ctx, &b, 0)?;
    bytes(ctx, &c, 0)?;
    for v in [3u8, 9, 200] {
        ctx.stream()?.write(&a, 0, &[v; 4096])?;
        s.launch_graph(&graph)?;
        s.synchronize()?;
        bytes(ctx, &b, v)
            .map_err(|f| Failure::new(format!("replay with a = {v}: {}", f.message)))?;
        bytes(ctx, &c, 7)?;
    }
    Ok(())
}

fn f32s(ctx: &Ctx, b: &Buffer) -> Result<Vec<f32>, Failure> {
    Ok(ctx
        .download(b)?
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect())
}

fn upload_f32(ctx: &Ctx, v: &[f32]) -> unihal_hal::Result<Buffer> {
    let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    ctx.upload(&raw)
}

fn ops_accumulate(ctx: &Ctx) -> CaseResult {
    let n = 1000;
    let x = upload_f32(ctx, &vec![1.0; n])?;
    let y = upload_f32(ctx, &vec![0.5; n])?;
    let (xv, yv) = (
        TensorView::contiguous(&x, DType::F32, &[n as u64]),
        TensorView::contiguous(&y, DType::F32, &[n as u64]),
    );
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    s.run_op(&OpCall::binary(OpId::Add, xv.clone(), yv, xv))?;
    let graph = s.end_capture()?;
    ensure!(
        f32s(ctx, &x)?.iter().all(|&v| v == 1.0),
        "the op ran at capture"
    );
    for _ in 0..3 {
        s.launch_graph(&graph)?;
    }
    s.synchronize()?;
    let got = f32s(ctx, &x)?;
    ensure!(
        got.iter().all(|&v| v == 2.5),
        "three replays of x += 0.5 from 1 gave {:?}…",
        &got[..4]
    );
    Ok(())
}

/// Begins a capture, records a fill, runs `call` (illegal while capturing): it must fail naming
/// the capture, and invalidate it.
fn illegal(
    ctx: &Ctx,
    call: impl FnOnce(&Arc<dyn Stream>, &Buffer) -> unihal_hal::Result<()>,
) -> CaseResult {
    let b = ctx.device.alloc(64)?;
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    let c = active(&s)?;
    s.fill(&b, 0, 64, FillValue::U8(1))?;
    expect_capture(call(&s, &b), Some(c), "the illegal call")?;
    expect_invalidated(ctx, &s, c)
}

/// `Device::alloc` (capture-unsafe) from the capturing thread and from another thread, under a
/// capture in `mode`: refused by Global from both, by ThreadLocal from the capturing thread only,
/// by Relaxed from neither.
fn mode(ctx: &Ctx, mode: CaptureMode) -> CaseResult {
    let s = ctx.stream()?;
    s.begin_capture(mode)?;
    let c = active(&s)?;
    let dev = ctx.device.clone();
    let other = std::thread::spawn(move || dev.alloc(256).map(drop))
        .join()
        .map_err(|_| Failure::new("the allocating thread panicked"))?;
    match mode {
        CaptureMode::Global => {
            expect_capture(
                other,
                Some(c),
                "Device::alloc on another thread, global capture",
            )?;
            return expect_invalidated(ctx, &s, c);
        }
        CaptureMode::ThreadLocal | CaptureMode::Relaxed => {
            other.map_err(|e| {
                Failure::new(format!(
                    "Device::alloc on another thread during a {mode:?} capture: {e}"
                ))
            })?;
        }
    }
    let mine = ctx.device.alloc(256).map(drop);
    if mode == CaptureMode::ThreadLocal {
        expect_capture(
            mine,
            Some(c),
            "Device::alloc on the capturing thread, thread-local",
        )?;
        return expect_invalidated(ctx, &s, c);
    }
    mine.map_err(|e| Failure::new(format!("Device::alloc during a relaxed capture: {e}")))?;
    let g = s.end_capture()?;
    s.launch_graph(&g)?;
    s.synchronize()?;
    Ok(())
}

fn begin_twice(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    let c = active(&s)?;
    expect_capture(
        s.begin_capture(CaptureMode::Global),
        Some(c),
        "a second begin",
    )?;
    // Whether the vendor invalidates here or not, the stream leaves capture at the end.
    let _ = s.end_capture();
    ensure_eq!(s.capture_status(), CaptureStatus::None, "status after end");
    usable(ctx, &s)
}

/// Work the device cannot capture (a host callback where `GraphCaps::host_callbacks` is false)
/// is refused without recording anything, and the capture stays valid; where it captures them,
/// the callback runs once per replay.
fn refused_keeps(ctx: &Ctx) -> CaseResult {
    let captures = ctx.device.capabilities().optional.graphs.host_callbacks;
    let b = ctx.upload(&[0u8; 64])?;
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    let c = active(&s)?;
    let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r2 = ran.clone();
    let r = s.host_callback(Box::new(move || {
        r2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    match (&r, captures) {
        (Ok(()), true) => {}
        (Err(HalError::Unsupported { .. }), false) => {}
        (
            Err(HalError::InvalidArgument {
                reason: Invalid::Capture { .. },
                ..
            }),
            false,
        ) => {}
        _ => {
            return Err(Failure::new(format!(
                "a host callback in a capture (graphs.host_callbacks = {captures}): {r:?}"
            )))
        }
    }
    ensure_eq!(
        s.capture_status(),
        CaptureStatus::Active(c),
        "status after the refusal"
    );
    s.fill(&b, 0, 64, FillValue::U8(9))?;
    let graph = s.end_capture()?;
    s.launch_graph(&graph)?;
    s.synchronize()?;
    bytes(ctx, &b, 9)?;
    let runs = ran.load(std::sync::atomic::Ordering::SeqCst);
    ensure_eq!(
        runs,
        usize::from(captures),
        "callback runs after one replay"
    );
    Ok(())
}

fn end_without_begin(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    expect_capture(s.end_capture(), None, "end_capture without a capture")?;
    usable(ctx, &s)
}

/// Makes `side` join `origin`'s capture through an event.
fn join(ctx: &Ctx, origin: &Arc<dyn Stream>, side: &Arc<dyn Stream>) -> CaseResult {
    let e = ctx.device.create_event(EventFlags::default())?;
    origin.record_event(&e)?;
    side.wait_event(&e)?;
    Ok(())
}

fn end_on_joined(ctx: &Ctx) -> CaseResult {
    let (s0, s1) = (ctx.stream()?, ctx.stream()?);
    let b = ctx.device.alloc(64)?;
    s0.begin_capture(CaptureMode::Global)?;
    let c = active(&s0)?;
    join(ctx, &s0, &s1)?;
    ensure_eq!(
        s1.capture_status(),
        CaptureStatus::Active(c),
        "the joined stream's status"
    );
    s1.fill(&b, 0, 64, FillValue::U8(3))?;
    expect_capture(s1.end_capture(), Some(c), "end_capture on a joined stream")?;
    // The origin ends it (the vendors invalidate on the wrong end; either way both streams leave).
    let _ = s0.end_capture();
    ensure_eq!(s0.capture_status(), CaptureStatus::None, "origin after end");
    ensure_eq!(
        s1.capture_status(),
        CaptureStatus::None,
        "joined stream after end"
    );
    usable(ctx, &s0)?;
    usable(ctx, &s1)
}

fn fork_join(ctx: &Ctx) -> CaseResult {
    let n = 2048;
    let (a, b, c) = (
        ctx.upload(&[0u8; 2048])?,
        ctx.upload(&[0u8; 2048])?,
        ctx.upload(&[0u8; 2048])?,
    );
    let (s0, s1) = (ctx.stream()?, ctx.stream()?);
    s0.begin_capture(CaptureMode::Global)?;
    let cap = active(&s0)?;
    s0.fill(&a, 0, n, FillValue::U8(0x11))?;
    join(ctx, &s0, &s1)?;
    ensure_eq!(
        s1.capture_status(),
        CaptureStatus::Active(cap),
        "the joined stream's status"
    );
    s1.copy_d2d(&a, 0, &c, 0, n)?; // after the fill of a (the join)
    s0.fill(&b, 0, n, FillValue::U8(0x22))?; // concurrent with the copy
    let back = ctx.device.create_event(EventFlags::default())?;
    s1.record_event(&back)?;
    s0.wait_event(&back)?;
    let graph = s0.end_capture()?;
    ensure_eq!(
        s1.capture_status(),
        CaptureStatus::None,
        "the joined stream after end"
    );
    bytes(ctx, &c, 0)?;
    let s2 = ctx.stream()?;
    s2.launch_graph(&graph)?;
    s2.synchronize()?;
    bytes(ctx, &a, 0x11)?;
    bytes(ctx, &b, 0x22)?;
    bytes(ctx, &c, 0x11)
        .map_err(|f| Failure::new(format!("the joined stream's copy: {}", f.message)))?;
    usable(ctx, &s1)
}

fn unjoined(ctx: &Ctx) -> CaseResult {
    let (s0, s1) = (ctx.stream()?, ctx.stream()?);
    let b = ctx.device.alloc(64)?;
    s0.begin_capture(CaptureMode::Global)?;
    let c = active(&s0)?;
    join(ctx, &s0, &s1)?;
    s1.fill(&b, 0, 64, FillValue::U8(3))?;
    expect_capture(
        s0.end_capture(),
        Some(c),
        "end_capture with a stream not rejoined",
    )?;
    ensure_eq!(s0.capture_status(), CaptureStatus::None, "origin after end");
    ensure_eq!(
        s1.capture_status(),
        CaptureStatus::None,
        "joined stream after end"
    );
    usable(ctx, &s0)?;
    usable(ctx, &s1)
}

fn outside_event(ctx: &Ctx) -> CaseResult {
    let (s0, s1) = (ctx.stream()?, ctx.stream()?);
    let b = ctx.device.alloc(64)?;
    let e = ctx.device.create_event(EventFlags::default())?;
    s1.fill(&b, 0, 64, FillValue::U8(3))?;
    s1.record_event(&e)?;
    s1.synchronize()?;
    s0.begin_capture(CaptureMode::Global)?;
    let c = active(&s0)?;
    expect_capture(
        s0.wait_event(&e),
        Some(c),
        "waiting on an event recorded outside the capture",
    )?;
    expect_invalidated(ctx, &s0, c)
}

/// A graph whose second replay gives another result than the first: `c = b; b = a`.
fn shift_graph(ctx: &Ctx) -> Result<(Arc<dyn unihal_hal::Graph>, [Buffer; 3]), Failure> {
    let n = 1024;
    let (a, b, c) = (
        ctx.upload(&[1u8; 1024])?,
        ctx.upload(&[2u8; 1024])?,
        ctx.upload(&[0u8; 1024])?,
    );
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    s.copy_d2d(&b, 0, &c, 0, n)?;
    s.copy_d2d(&a, 0, &b, 0, n)?;
    Ok((s.end_capture()?, [a, b, c]))
}

fn ordered(ctx: &Ctx) -> CaseResult {
    let (graph, [_a, b, c]) = shift_graph(ctx)?;
    let d = ctx.upload(&[0u8; 1024])?;
    let (sa, sb) = (ctx.stream()?, ctx.stream()?);
    let mut hold = Blocker::new(ctx, &sa)?;
    sa.launch_graph(&graph)?;
    sb.launch_graph(&graph)?;
    // What the replay on B left in c: 1 after the replay on A (c = b = a), 2 before it.
    sb.copy_d2d(&c, 0, &d, 0, 1024)?;
    std::thread::sleep(Duration::from_millis(50));
    let done = sb.query()?;
    hold.release()?;
    sa.synchronize()?;
    sb.synchronize()?;
    ensure!(
        !done,
        "a replay on stream B finished while the earlier replay of the same graph on stream A was \
         held: replays of one graph must run in launch order"
    );
    // First replay: c = 2, b = 1; second: c = 1, b = 1.
    bytes(ctx, &c, 1)?;
    bytes(ctx, &b, 1)?;
    bytes(ctx, &d, 1).map_err(|f| {
        Failure::new(format!(
            "the replay on stream B ran before the one launched earlier on A: {}",
            f.message
        ))
    })
}

fn independent(ctx: &Ctx) -> CaseResult {
    let (graph, _bufs) = shift_graph(ctx)?;
    let second = graph.instantiate()?;
    ensure_eq!(
        second.capture_id(),
        graph.capture_id(),
        "an instantiation's capture"
    );
    let (sa, sb) = (ctx.stream()?, ctx.stream()?);
    let mut hold = Blocker::new(ctx, &sa)?;
    let t0 = Instant::now();
    sa.launch_graph(&graph)?;
    sb.launch_graph(&second)?;
    let r = sb.synchronize();
    let waited = t0.elapsed();
    hold.release()?;
    sa.synchronize()?;
    r?;
    ensure!(
        waited < Duration::from_millis(crate::blocker::BLOCK_TIMEOUT_MS as u64 / 2),
        "a replay of a second instantiation waited {waited:?} for a held replay of the first: \
         separate instantiations are independent"
    );
    Ok(())
}

fn wrong_device(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let b = ctx.device.alloc(64)?;
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    s.fill(&b, 0, 64, FillValue::U8(1))?;
    let graph = s.end_capture()?;
    let s2 = other.create_stream()?;
    match s2.launch_graph(&graph) {
        Err(HalError::InvalidArgument {
            reason: Invalid::WrongDevice { .. },
            ..
        }) => Ok(()),
        other => Err(Failure::new(format!(
            "a graph launched on another device's stream: expected WrongDevice, got {other:?}"
        ))),
    }
}

fn outlives_stream(ctx: &Ctx) -> CaseResult {
    let b = ctx.upload(&[0u8; 512])?;
    let graph = {
        let s = ctx.stream()?;
        s.begin_capture(CaptureMode::Global)?;
        s.fill(&b, 0, 512, FillValue::U8(0x77))?;
        s.end_capture()?
    };
    let s2 = ctx.stream()?;
    s2.launch_graph(&graph)?;
    s2.synchronize()?;
    bytes(ctx, &b, 0x77)
}

fn keeps_buffers(ctx: &Ctx) -> CaseResult {
    let out = ctx.upload(&[0u8; 1024])?;
    let s = ctx.stream()?;
    let graph = {
        // Filled before the capture: only the graph's copy reads it.
        let a = ctx.upload(&[0x3C; 1024])?;
        s.begin_capture(CaptureMode::Global)?;
        s.copy_d2d(&a, 0, &out, 0, 1024)?;
        s.end_capture()?
        // The caller's handle of `a` is gone: the graph keeps the memory.
    };
    // New allocations must not be handed `a`'s memory while the graph uses it.
    let others: Vec<Buffer> = (0..4)
        .map(|_| ctx.device.alloc(1024))
        .collect::<Result<_, _>>()?;
    for o in &others {
        s.fill(o, 0, 1024, FillValue::U8(0xEE))?;
    }
    s.launch_graph(&graph)?;
    s.synchronize()?;
    bytes(ctx, &out, 0x3C)?;
    for o in &others {
        bytes(ctx, o, 0xEE)?;
    }
    Ok(())
}

fn stream_alloc(ctx: &Ctx) -> CaseResult {
    let out = ctx.upload(&[0u8; 256])?;
    let s = ctx.stream()?;
    s.begin_capture(CaptureMode::Global)?;
    // `t` is freed by the capture; `u` is not (the graph frees it, as CUDA's memory nodes).
    let (t, u) = (s.alloc_async(128)?, s.alloc_async(128)?);
    s.fill(&t, 0, 128, FillValue::U8(5))?;
    s.fill(&u, 0, 128, FillValue::U8(6))?;
    s.copy_d2d(&t, 0, &out, 0, 128)?;
    s.copy_d2d(&u, 0, &out, 128, 128)?;
    s.free_async(&t)?;
    let graph = s.end_capture()?;
    // The allocations are the graph's: no other work may use them once the capture ended
    // (refused as freed, or as the capture's, naming it).
    for (name, b) in [("freed in the capture", &t), ("not freed in it", &u)] {
        match s.fill(b, 0, 128, FillValue::U8(1)) {
            Err(HalError::InvalidArgument {
                reason: Invalid::FreeEnqueued { .. },
                ..
            }) => {}
            Err(HalError::InvalidArgument {
                reason: Invalid::Capture { capture, .. },
                ..
            }) if capture == Some(graph.capture_id()) => {}
            other => {
                return Err(Failure::new(format!(
                    "a capture's allocation ({name}) used after the capture ended: expected \
                     FreeEnqueued or Invalid::Capture naming the capture, got {other:?}"
                )))
            }
        }
    }
    drop((t, u));
    bytes(ctx, &out, 0)?;
    for _ in 0..2 {
        s.launch_graph(&graph)?;
        s.synchronize()?;
        let got = ctx.download(&out)?;
        ensure!(
            got[..128].iter().all(|&x| x == 5) && got[128..].iter().all(|&x| x == 6),
            "a replay's graph allocations gave {:?}…{:?}",
            &got[..4],
            &got[128..132]
        );
        ctx.stream()?.write(&out, 0, &[0u8; 256])?;
    }
    Ok(())
}

fn all_reduce(ctx: &Ctx) -> CaseResult {
    let n = 1024usize;
    let config = CommConfig {
        timeout: Some(Duration::from_secs(20)),
    };
    on_ranks(ctx, 2, &config, |r| {
        let send = r.device.alloc(n * 4)?;
        let recv = r.device.alloc(n * 4)?;
        // Thread-local: the other rank's thread may still allocate while this one captures.
        r.stream.begin_capture(CaptureMode::ThreadLocal)?;
        r.comm
            .all_reduce(&send, &recv, n as u64, DType::F32, ReduceOp::Sum, &r.stream)?;
        let graph = r.stream.end_capture()?;
        let rank = r.comm.rank() as f32;
        for k in 1..=3 {
            let v: Vec<u8> = std::iter::repeat_n(((rank + 1.0) * k as f32).to_le_bytes(), n)
                .flatten()
                .collect();
            r.stream.write(&send, 0, &v)?;
            r.stream.launch_graph(&graph)?;
            let mut out = vec![0u8; n * 4];
            r.stream.read(&recv, 0, &mut out)?;
            let want = 3.0 * k as f32;
            let got = f32::from_le_bytes(out[..4].try_into().expect("4 bytes"));
            ensure!(
                out.chunks(4).all(|c| c == want.to_le_bytes()),
                "replay {k}: all-reduce gave {got}, expected {want}"
            );
        }
        Ok(())
    })
}
