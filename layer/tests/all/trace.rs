//! The timeline (`UNIHAL_TRACE`): a run on two CPU devices (copies, a matmul, a record on one
//! stream waited for on another, an all-reduce, the caching allocator) is written as a document
//! that passes the Trace Event Format check, with the tracks, arrows and counters it should
//! hold; and the check refuses what a viewer would draw wrongly.

use serde_json::{json, Value};
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::{Backend, DType, Device, EventFlags, OpCall, ReduceOp, TensorView};
use unihal_layer::trace::{check::check, summary::summarize, Trace};
use unihal_layer::{wrap_with, Mode, Observers};

fn traced_run(path: &std::path::Path, validate: Option<Mode>) -> Value {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("2"), Some("64M"), Some("1")).unwrap();
    let trace = Trace::new(path);
    assert!(trace.record_counters(), "only this test records counters");
    let b = wrap_with(
        Arc::new(unihal_cpu::CpuBackend::with_config(cfg)),
        Observers {
            validate,
            trace: Some(trace.clone()),
        },
    );
    let devs: Vec<Arc<dyn Device>> = (0..2).map(|i| b.open(i).unwrap()).collect();
    let comms = b
        .collectives()
        .unwrap()
        .init_all(&devs, &Default::default())
        .unwrap();
    let n = 64u64;
    // Both ranks enqueue before either waits: the all-reduce completes once both arrived.
    let mut held = Vec::new();
    for (d, comm) in devs.iter().zip(&comms) {
        let (s, side) = (d.create_stream().unwrap(), d.create_stream().unwrap());
        let alloc = CachingAllocator::new(d.clone(), AllocatorConfig::default()).unwrap();
        let bytes = (n * n * 4) as usize;
        let (x, y) = (
            alloc.alloc(&s, bytes).unwrap(),
            alloc.alloc(&s, bytes).unwrap(),
        );
        let ones: Vec<u8> = (0..n * n).flat_map(|_| 1f32.to_le_bytes()).collect();
        s.write(&x, 0, &ones).unwrap();
        let v = |b| TensorView::contiguous(b, DType::F32, &[n, n]);
        s.run_op(&OpCall::matmul(v(&x), v(&x), v(&y), 1.0, 0.0))
            .unwrap();
        let ev = d.create_event(EventFlags::default()).unwrap();
        s.record_event(&ev).unwrap();
        side.wait_event(&ev).unwrap();
        comm.all_reduce(&y, &y, n * n, DType::F32, ReduceOp::Sum, &side)
            .unwrap();
        held.push((s, side, x, y, alloc));
    }
    for (s, side, x, y, alloc) in held {
        side.synchronize().unwrap();
        s.synchronize().unwrap();
        drop((x, y, alloc));
    }
    trace.write().unwrap();
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn events<'a>(doc: &'a Value, ph: &str) -> Vec<&'a Value> {
    doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == ph)
        .collect()
}

fn two_device_run_is_a_valid_timeline(validate: Option<Mode>) {
    let dir = std::env::temp_dir().join(format!("unihal-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let doc = traced_run(&dir.join("run.json"), validate);
    let ok = check(&doc).unwrap_or_else(|e| {
        let shown: Vec<_> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] != "M" && e["ph"] != "C")
            .map(|e| {
                format!(
                    "{} {} {} {} {} {}",
                    e["ph"], e["pid"], e["tid"], e["name"], e["ts"], e["dur"]
                )
            })
            .collect();
        panic!("the trace breaks the format:\n{e:#?}\n{shown:#?}")
    });
    assert_eq!(ok.processes, 2, "one process per device: {ok:?}");
    // Per device: two stream tracks and the host thread's.
    assert!(ok.tracks >= 6, "{ok:?}");
    let slices = events(&doc, "X");
    let cat = |c: &str| slices.iter().filter(|e| e["cat"] == c).count();
    assert_eq!(cat("op"), 2, "one matmul per device");
    assert_eq!(cat("collective"), 2);
    assert!(cat("copy") >= 2 && cat("event") == 4 && cat("host") >= 8);
    let mm = slices.iter().find(|e| e["cat"] == "op").unwrap();
    assert_eq!(mm["args"]["FLOPs"], json!(2 * 64 * 64 * 64), "{mm}");
    assert_eq!(
        mm["args"]["operands"],
        "f32[64, 64], f32[64, 64], f32[64, 64]"
    );
    let ar = slices.iter().find(|e| e["cat"] == "collective").unwrap();
    assert_eq!(ar["args"]["bytes"], json!(64 * 64 * 4));
    assert_eq!(ar["args"]["ranks"], json!(2));
    assert!(ar["args"]["GB/s"].as_f64().unwrap() > 0.0, "{ar}");
    // The device spans of a stream are in order, the all-reduce after the wait it follows.
    let flows = (events(&doc, "s"), events(&doc, "f"));
    assert_eq!(
        (flows.0.len(), flows.1.len()),
        (2, 2),
        "a record and a wait per device"
    );
    for f in &flows.1 {
        assert_eq!(f["bp"], "e");
        let s = flows.0.iter().find(|s| s["id"] == f["id"]).unwrap();
        assert_ne!(s["tid"], f["tid"], "the arrow runs between the two streams");
        assert!(s["ts"].as_f64() <= f["ts"].as_f64());
    }
    let counters = events(&doc, "C");
    assert!(
        counters
            .iter()
            .any(|c| c["args"]["allocated"].as_i64() == Some(2 * 64 * 64 * 4)),
        "the allocator's bytes as a counter: {counters:?}"
    );
    let summary = summarize(&doc, 5).unwrap();
    assert_eq!(summary.devices.len(), 2);
    for d in &summary.devices {
        assert!(d.comm_share > 0.0 && d.comm_share <= 1.0, "{d:?}");
        assert!(d.exposed_comm_share <= d.comm_share + 1e-9, "{d:?}");
        assert!(d.top_ops.iter().any(|o| o.name == "matmul"), "{d:?}");
    }
    let text = summary.to_string();
    assert!(text.contains("communication:"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_two_device_run_is_a_valid_timeline_with_tracks_arrows_and_counters() {
    two_device_run_is_a_valid_timeline(None);
}

#[test]
fn tracing_and_validating_at_once_changes_neither() {
    // Counters go to the first trace that asks; this test's trace is the second in the process
    // when both run in one binary, so it runs its own checks without the counter.
    let dir = std::env::temp_dir().join(format!("unihal-trace-v-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap();
    let trace = Trace::new(dir.join("v.json"));
    let b = wrap_with(
        Arc::new(unihal_cpu::CpuBackend::with_config(cfg)),
        Observers {
            validate: Some(Mode::Error),
            trace: Some(trace.clone()),
        },
    );
    let d = b.open(0).unwrap();
    let (s1, s2) = (d.create_stream().unwrap(), d.create_stream().unwrap());
    let x = d.alloc(256).unwrap();
    s1.fill(&x, 0, 256, unihal_hal::FillValue::U8(7)).unwrap();
    // Unordered: validation refuses it in error mode, and the trace shows no span for it.
    assert!(s2.fill(&x, 0, 256, unihal_hal::FillValue::U8(8)).is_err());
    s1.synchronize().unwrap();
    let doc = trace.document();
    check(&doc).unwrap();
    let fills = events(&doc, "X")
        .into_iter()
        .filter(|e| e["cat"] == "fill")
        .count();
    assert_eq!(fills, 1, "the refused fill has no device span");
    assert_eq!(b.findings().len(), 1);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_check_refuses_what_a_viewer_draws_wrongly() {
    let x = |ts: f64, dur: f64| json!({"ph": "X", "pid": 1, "tid": 1, "ts": ts, "dur": dur, "name": "a"});
    let ok = json!({"traceEvents": [x(0.0, 10.0), x(2.0, 3.0), x(10.0, 1.0)]});
    assert_eq!(check(&ok).unwrap().slices, 3);
    let bad = [
        (
            json!({"traceEvents": [x(0.0, 10.0), x(5.0, 10.0)]}),
            "without nesting",
        ),
        (
            json!({"traceEvents": [{"ph": "X", "pid": 1, "tid": 1, "ts": 0, "name": "a"}]}),
            "dur",
        ),
        (
            json!({"traceEvents": [x(0.0, 5.0), {"ph": "f", "bp": "e", "id": 3, "pid": 1, "tid": 1, "ts": 1, "name": "e", "cat": "e"}]}),
            "no earlier start",
        ),
        (
            json!({"traceEvents": [{"ph": "s", "id": 3, "pid": 1, "tid": 1, "ts": 1, "name": "e", "cat": "e"}]}),
            "lies in no slice",
        ),
        (
            json!({"traceEvents": [{"ph": "C", "pid": 1, "tid": 0, "ts": 1, "name": "m", "args": {"a": "x"}}]}),
            "numbers",
        ),
        (
            json!({"traceEvents": [{"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {}}]}),
            "args.name",
        ),
        (
            json!({"traceEvents": [{"ph": "B", "pid": 1, "tid": 0, "ts": 1, "name": "b"}]}),
            "never ended",
        ),
        (json!({"events": []}), "traceEvents"),
    ];
    for (doc, why) in bad {
        let e = check(&doc).expect_err(why).join("\n");
        assert!(e.contains(why), "{why}: {e}");
    }
}

#[test]
fn a_full_trace_drops_later_events_and_says_how_many() {
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("64M"), Some("1")).unwrap();
    let trace = Trace::with_max_events(std::env::temp_dir().join("unused.json"), 50);
    let b = wrap_with(
        Arc::new(unihal_cpu::CpuBackend::with_config(cfg)),
        Observers {
            validate: None,
            trace: Some(trace.clone()),
        },
    );
    let d = b.open(0).unwrap();
    let s = d.create_stream().unwrap();
    let x = d.alloc(64).unwrap();
    for _ in 0..100 {
        s.fill(&x, 0, 64, unihal_hal::FillValue::U8(1)).unwrap();
    }
    s.synchronize().unwrap();
    let doc = trace.document();
    let ok = check(&doc).unwrap();
    assert!(ok.slices <= 50, "{ok:?}");
    let dropped = doc["otherData"]["dropped_events"].as_u64().unwrap();
    assert!(
        dropped >= 150,
        "100 fills make 200 slices and the calls' host spans: {dropped}"
    );
}
