//! PyTorch's `torch.cuda.memory_summary` reads unihal's allocator statistics: every key of
//! torch's `memory_stats()` is there (`MemoryStats::to_map`), and the table shows unihal's
//! numbers. Python comes from `UNIHAL_TORCH_PYTHON`; without PyTorch the test says so and passes,
//! unless `UNIHAL_TEST_TORCH=1` (set by `.ci/run`, which installs the pinned PyTorch): then it
//! fails.

use std::process::{Command, Stdio};
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::Backend;

const MIB: usize = 1 << 20;

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
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/torch_memory.py");
    let out = Command::new(python)
        .arg(script)
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
    drop((small, big));
}
