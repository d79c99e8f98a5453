//! The GPT on a GPU or NPU backend with one rank per process, as users launch it: the backend of
//! `UNIHAL_GPT_BACKEND` (cuda, hip or ascend, its libraries — simulated in CI — named by the
//! environment, at least 2 devices per process) through its own collective library (NCCL, RCCL,
//! HCCL). Two processes under the real torchrun (`UNIHAL_TORCHRUN`, meeting through its agent's
//! store) and under the real `mpirun` (the unique id over MPI's world) train as two devices of one
//! process do; a rank killed with SIGKILL mid-training ends the survivor with its error long
//! before the collective timeout, naming the dead rank and its process where the library can say
//! it (NCCL's and RCCL's `ncclGetLastError`; HCCL only reports a remote error). Fails, never skips, when the backend,
//! torchrun or mpirun is missing: CI runs this target once per backend.

#[allow(dead_code)]
#[path = "../../../tests/support/launch.rs"]
mod launch;

use gpt::{Corpus, TrainConfig};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const STEPS: usize = 6;
/// The collective timeout of every run: a survivor must end long before it.
const TIMEOUT_S: u64 = 60;

fn backend() -> String {
    std::env::var("UNIHAL_GPT_BACKEND").expect(
        "UNIHAL_GPT_BACKEND names the backend (cuda, hip or ascend) with its libraries in the \
         environment",
    )
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "unihal-gpt-vendor-{}-{name}-{}",
        backend(),
        std::process::id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn gpt_args(steps: usize, json: &Path) -> Vec<String> {
    let steps = steps.to_string();
    let b = backend();
    [
        "--backend",
        &b,
        "--steps",
        &steps,
        "--sample",
        "0",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([json.display().to_string()])
    .collect()
}

fn run(mut c: Command, what: &str) -> (bool, String) {
    let out = c
        .env("UNIHAL_CCL_TIMEOUT", TIMEOUT_S.to_string())
        .env("UNIHAL_LOG", "INFO")
        .output()
        .unwrap_or_else(|e| panic!("cannot start {what} ({e})"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Rank 0's losses against two devices of this process on the same backend (1e-5 relative: the
/// collectives reduce in rank order in both, so they agree to the bit in practice).
fn check_against_in_process(json: &Path, text: &str, launcher: &str) {
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(json).unwrap_or_else(|e| panic!("no report ({e}):\n{text}")),
    )
    .unwrap();
    assert_eq!(report["ranks"], 2, "{text}");
    let got: Vec<f32> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().unwrap() as f32)
        .collect();
    assert_eq!(got.len(), STEPS, "{text}");
    let cfg = TrainConfig {
        steps: STEPS,
        ..TrainConfig::default()
    };
    let b = unihal::registry().get(&backend()).unwrap();
    let local = gpt::train_devices(&*b, 2, &Corpus::documentation(), &cfg, &|_| {})
        .unwrap_or_else(|e| panic!("two devices of {} in one process: {e}", backend()))
        .losses();
    for (i, (a, b)) in local.iter().zip(&got).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {i}: {launcher} {b}, in process {a}\n{text}"
        );
    }
    eprintln!(
        "{} under {launcher}: {STEPS} losses equal to two in-process devices (last {})",
        backend(),
        got[STEPS - 1]
    );
}

/// Both ranks say which communicator they made, on which library, across processes.
fn check_logs(text: &str, launcher: &str) {
    for rank in 0..2 {
        let want = format!("[{rank}] unihal INFO BOOTSTRAP launcher {launcher}: rank {rank} of 2");
        assert!(text.contains(&want), "no line with {want:?}:\n{text}");
        let want = format!(
            "[{rank}] unihal INFO COLL communicator rank {rank} of 2 on {}:",
            backend()
        );
        assert!(text.contains(&want), "no line with {want:?}:\n{text}");
    }
}

#[test]
fn two_torchrun_processes_match_two_in_process_devices() {
    let d = dir("torchrun");
    let json = d.join("report.json");
    let exe = std::env::var("UNIHAL_TORCHRUN").unwrap_or_else(|_| "torchrun".into());
    let mut c = Command::new(exe);
    c.args(["--nproc_per_node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_gpt"))
        .args(gpt_args(STEPS, &json))
        .env("OMP_NUM_THREADS", "1");
    let (ok, text) = run(c, "torchrun (install PyTorch 2.15.0, set UNIHAL_TORCHRUN)");
    assert!(ok, "torchrun failed:\n{text}");
    check_logs(&text, "Torchrun");
    check_against_in_process(&json, &text, "torchrun");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn two_mpirun_processes_match_two_in_process_devices() {
    let d = dir("mpirun");
    let json = d.join("report.json");
    let exe = std::env::var("UNIHAL_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut c = Command::new(exe);
    c.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(env!("CARGO_BIN_EXE_gpt"))
        .args(gpt_args(STEPS, &json));
    let (ok, text) = run(c, "mpirun (install openmpi-bin)");
    assert!(ok, "mpirun failed:\n{text}");
    check_logs(&text, "OpenMpi");
    check_against_in_process(&json, &text, "mpirun");
    let _ = std::fs::remove_dir_all(d);
}

/// Two ranks started as a launcher starts them (rank 0 serves the store); rank 1 is killed once
/// rank 0 has trained a step, so rank 0 is inside or about to enter a collective that needs it.
#[test]
fn a_rank_killed_mid_training_ends_the_survivor_with_its_error() {
    let d = dir("killed");
    let json = d.join("report.json");
    let args = gpt_args(10_000, &json);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let timeout = TIMEOUT_S.to_string();
    let mut job = launch::Job::start(
        &d,
        2,
        env!("CARGO_BIN_EXE_gpt"),
        &args,
        &[("UNIHAL_CCL_TIMEOUT", &timeout), ("UNIHAL_LOG", "INFO")],
    );
    let start = Instant::now();
    while !job.log(0).lines().any(|l| l.starts_with("step")) {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "rank 0 never trained a step:\n{}",
            job.log(0)
        );
        assert!(
            job.children
                .iter_mut()
                .all(|c| c.try_wait().unwrap().is_none()),
            "a rank ended before training a step:\n{}\n{}",
            job.log(0),
            job.log(1)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = job.children[1].id();
    job.children[1].kill().unwrap();
    job.children[1].wait().unwrap();
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = job.children[0].try_wait().unwrap() {
            break s;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(TIMEOUT_S),
            "the survivor still runs {TIMEOUT_S} s after its peer was killed:\n{}",
            job.log(0)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = killed.elapsed();
    let log = job.log(0);
    assert!(!status.success(), "the survivor succeeded:\n{log}");
    // NCCL and RCCL name the lost peer through ncclGetLastError; HCCL's API has no such call, so
    // its engine can say only that a peer failed (HCCL_E_REMOTE).
    let named = if backend() == "ascend" {
        "HCCL_E_REMOTE".to_string()
    } else {
        format!("remote error: remote process exited: rank 1 (process {pid})")
    };
    assert!(
        log.lines()
            .any(|l| l.starts_with("gpt:") && l.contains(&named)),
        "the survivor's error does not say {named:?}:\n{log}"
    );
    eprintln!(
        "{}: rank 1 (process {pid}) killed; rank 0 ended {took:?} later ({status}) with:\n{}",
        backend(),
        log.lines()
            .filter(|l| l.contains("rror") || l.contains("remote"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        took < Duration::from_secs(TIMEOUT_S / 2),
        "the survivor took {took:?} (timeout {TIMEOUT_S} s):\n{log}"
    );
    let _ = std::fs::remove_dir_all(d);
}
