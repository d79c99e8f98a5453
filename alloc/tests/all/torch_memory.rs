//! PyTorch's own memory tools read unihal's allocator: `torch.cuda.memory_summary` over its
//! statistics (every key of torch's `memory_stats()` is there, `MemoryStats::to_map`, and the table
//! shows unihal's numbers), and `python -m torch.cuda._memory_viz stats` (its `segsum`) and `trace`
//! over its pickled snapshot (`CachingAllocator::torch_snapshot`): segments, blocks and the
//! recorded history in torch's layout. Python comes from `UNIHAL_TORCH_PYTHON`; without PyTorch the
//! test says so and passes, unless `UNIHAL_TEST_TORCH=1` (set by `.ci/run`, which installs the
//! pinned PyTorch): then it fails.

use std::process::{Command, Stdio};
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::Backend;

const MIB: usize = 1 << 20;
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_memory.py");

fn python() -> Option<String> {
    let python = std::env::var("UNIHAL_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let required = std::env::var("UNIHAL_TEST_TORCH").as_deref() == Ok("1");
    let ok = Command::new(&python)
        .args(["-c", "import torch.cuda.memory"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !required,
            "UNIHAL_TEST_TORCH=1 but {python} cannot import torch"
        );
        eprintln!("SKIPPED: {python} cannot import torch; set UNIHAL_TORCH_PYTHON, and UNIHAL_TEST_TORCH=1 to require it");
        return None;
    }
    Some(python)
}

/// The summary row `name` (its four columns: current, peak, allocated, freed).
fn row<'a>(summary: &'a str, name: &str) -> Vec<&'a str> {
    let line = summary
        .lines()
        .find(|l| l.trim_start_matches('|').trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no row {name:?} in\n{summary}"));
    line.split('|')
        .skip(2)
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

#[test]
fn torch_memory_summary_formats_unihal_statistics() {
    let Some(python) = python() else { return };
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let conf = AllocatorConfig::parse("max_split_size_mb:32").unwrap();
    let a = CachingAllocator::new(dev, conf).unwrap();
    let small = a.alloc(&s, 3000).unwrap();
    let big = a.alloc(&s, 40 * MIB).unwrap();
    let gone = a.alloc(&s, 8192).unwrap();
    drop(gone);
    let stats = a.stats().to_map();
    let path =
        std::env::temp_dir().join(format!("unihal-memory-stats-{}.json", std::process::id()));
    std::fs::write(&path, serde_json::to_string(&stats).unwrap()).unwrap();
    let out = Command::new(python)
        .args([SCRIPT, "summary"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let summary = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{summary}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Two live allocations, three made; one oversize allocation and segment (40 MiB >= 32 MiB).
    assert_eq!(row(&summary, "Allocations"), ["2", "3", "3", "1"]);
    assert_eq!(row(&summary, "Oversize allocations"), ["1", "1", "1", "0"]);
    assert_eq!(row(&summary, "Oversize GPU segments"), ["1", "1", "1", "0"]);
    assert_eq!(row(&summary, "GPU reserved segments")[0], "2");
    // unihal's own table (`MemoryStats::summary`) has torch's rows and cells, line for line
    // from the column heads on; only the vendor's words differ.
    let ours = a.stats().summary("cpu:0");
    let body = |t: &str| -> Vec<(String, String)> {
        t.lines()
            .skip_while(|l| !l.contains("Metric"))
            .filter(|l| !l.is_empty())
            .map(|l| {
                let mut cells = l.trim_matches('|').splitn(2, '|');
                let label = cells.next().unwrap_or("").trim();
                let label = label.replace("GPU reserved", "Reserved");
                let label = label.replace("Oversize GPU", "Oversize");
                (label, cells.next().unwrap_or("").to_owned())
            })
            .collect()
    };
    assert_eq!(
        body(&ours),
        body(&summary),
        "ours:\n{ours}\ntorch's:\n{summary}"
    );
    assert!(
        ours.contains("unihal memory summary, device cpu:0"),
        "{ours}"
    );
    drop((small, big));
}

#[test]
fn torch_memory_viz_reads_unihal_snapshot_and_history() {
    let Some(python) = python() else { return };
    let cfg = unihal_cpu::CpuConfig::from_values(Some("1"), Some("256M"), Some("1")).unwrap();
    let dev = unihal_cpu::CpuBackend::with_config(cfg).open(0).unwrap();
    let s = dev.create_stream().unwrap();
    let a = CachingAllocator::new(dev, AllocatorConfig::default()).unwrap();
    a.record_history(true);
    let keep = a.alloc(&s, 3000).unwrap();
    let big = a.alloc(&s, 30 * MIB).unwrap();
    let gone = a.alloc(&s, 5000).unwrap();
    drop(gone);
    drop(big);
    s.synchronize().unwrap();
    a.empty_cache();
    let events = a.take_history();
    a.record_history(true);
    let again = a.alloc(&s, 100).unwrap();
    let path = std::env::temp_dir().join(format!("unihal-snapshot-{}.pickle", std::process::id()));
    std::fs::write(&path, a.torch_snapshot(0)).unwrap();
    let out = Command::new(python)
        .args([SCRIPT, "snapshot"])
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&path);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One 2 MiB small segment holds both live blocks (3000 and 100 bytes, rounded to 3072 and
    // 512): segsum's accounting (free + allocated == reserved) holds, or it raises.
    // (`_memory_viz stats` is torch's `segsum`.)
    assert!(
        text.contains("== _memory_viz stats\nSummary of segments"),
        "{text}"
    );
    assert!(text.contains("segments: 1\n"), "{text}");
    assert!(text.contains("total_reserved: 2.0MiB"), "{text}");
    assert!(text.contains("total_allocated: 3.0KiB"), "{text}");
    // The trace since the second `record_history`: one hand-out, named by torch.
    assert!(text.contains("1 entries"), "{text}");
    assert!(text.contains("a = seg_0[3072:100.0B]"), "{text}");
    // The first recording, in torch's actions: the large segment came and went.
    let actions: Vec<&str> = events
        .iter()
        .map(|e| match e {
            unihal_alloc::TraceEvent::Alloc { .. } => "alloc",
            unihal_alloc::TraceEvent::FreeRequested { .. } => "free_requested",
            unihal_alloc::TraceEvent::FreeCompleted { .. } => "free_completed",
            unihal_alloc::TraceEvent::SegmentAlloc { .. } => "segment_alloc",
            unihal_alloc::TraceEvent::SegmentFree { .. } => "segment_free",
            unihal_alloc::TraceEvent::Oom { .. } => "oom",
        })
        .collect();
    assert_eq!(
        actions,
        [
            "segment_alloc",
            "alloc",
            "segment_alloc",
            "alloc",
            "alloc",
            "free_requested",
            "free_completed",
            "free_requested",
            "free_completed",
            "segment_free",
        ]
    );
    drop((keep, again));
}
