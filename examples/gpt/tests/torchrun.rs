//! The GPT under PyTorch's own launcher: two processes under the real torchrun (PyTorch 2.15.0,
//! `UNIHAL_TORCHRUN`) on the CPU backend's gloo engine (built with `--features gloo`), meeting
//! through torchrun's agent store, train as two devices of one process do; a torchrun restart
//! (a rank killed once, `--max-restarts 1`) completes with the same losses; the in-process
//! engine under torchrun is refused at start, its message in torchrun's failure summary. Fails,
//! never skips, when torchrun is missing: this target exists only where PyTorch is installed.

use gpt::{Corpus, TrainConfig};
use std::path::{Path, PathBuf};
use std::process::Command;

const STEPS: usize = 6;

fn torchrun() -> Command {
    let exe = std::env::var("UNIHAL_TORCHRUN").unwrap_or_else(|_| "torchrun".into());
    let mut c = Command::new(exe);
    c.env("UNIHAL_CCL_TIMEOUT", "60")
        // torchrun's agent warns about OMP_NUM_THREADS; the ranks need no more than it sets.
        .env("OMP_NUM_THREADS", "1");
    c
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("unihal-gpt-torchrun-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(mut c: Command) -> (bool, String) {
    let out = c.output().unwrap_or_else(|e| {
        panic!("cannot start torchrun ({e}); install PyTorch 2.15.0 and set UNIHAL_TORCHRUN")
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn gpt_args(json: &Path) -> Vec<String> {
    [
        "--backend",
        "cpu",
        "--steps",
        &STEPS.to_string(),
        "--sample",
        "0",
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([json.display().to_string()])
    .collect()
}

/// The losses of rank 0's report, checked against two in-process devices (1e-5 relative).
fn check_against_in_process(json: &Path, text: &str) {
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
    let backend = unihal::registry().get("cpu").unwrap();
    let local = gpt::train_devices(&*backend, 2, &Corpus::documentation(), &cfg, &|_| {})
        .unwrap()
        .losses();
    for (i, (a, b)) in local.iter().zip(&got).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {i}: torchrun {b}, in process {a}\n{text}"
        );
    }
}

/// Also the logs, as NCCL_DEBUG=INFO with NCCL_DEBUG_FILE: each process writes its own file
/// (`%h`, `%p`), whose lines carry `host:pid:tid [rank]` and say how the process met the others
/// (launcher, store) and which communicator it made.
#[test]
fn two_torchrun_processes_on_gloo_match_two_in_process_devices() {
    let d = dir("plain");
    let json = d.join("report.json");
    let mut c = torchrun();
    c.args(["--nproc_per_node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_gpt"))
        .args(gpt_args(&json))
        .env("UNIHAL_LOG", "INFO")
        .env("UNIHAL_LOG_FILE", d.join("unihal.%h.%p.log"));
    let (ok, text) = run(c);
    assert!(ok, "torchrun failed:\n{text}");
    check_against_in_process(&json, &text);
    let mut logs: Vec<(String, String)> = std::fs::read_dir(&d)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.ends_with(".log").then(|| {
                (
                    name.clone(),
                    std::fs::read_to_string(d.join(&name)).unwrap(),
                )
            })
        })
        .collect();
    logs.sort();
    assert_eq!(logs.len(), 2, "one log file per process: {logs:?}");
    let mut ranks = Vec::new();
    for (name, log) in &logs {
        let pid = name.rsplit('.').nth(1).unwrap();
        let rank = if log.contains("] unihal INFO BOOTSTRAP launcher Torchrun: rank 0 of 2") {
            0
        } else {
            1
        };
        ranks.push(rank);
        let prefix = format!(":{pid}:");
        let bootstrap =
            format!("[{rank}] unihal INFO BOOTSTRAP launcher Torchrun: rank {rank} of 2");
        let store = format!("[{rank}] unihal INFO BOOTSTRAP store ");
        let comm = format!("[{rank}] unihal INFO COLL communicator rank {rank} of 2 on cpu:");
        for want in [&bootstrap, &store, &comm] {
            let line = log.lines().find(|l| l.contains(want.as_str()));
            let line = line.unwrap_or_else(|| panic!("{name}: no line with {want:?}:\n{log}"));
            assert!(
                line.split(' ').next().unwrap().contains(&prefix),
                "{name}: {line}"
            );
        }
        assert!(log.contains("engine gloo"), "{name}:\n{log}");
    }
    ranks.sort();
    assert_eq!(ranks, [0, 1], "{logs:?}");
    let _ = std::fs::remove_dir_all(d);
}

/// torchrun's other rendezvous set-ups: `--standalone`, the c10d rendezvous backend at an
/// endpoint, an explicit `--master_port` (each once refused with "Address already in use" when
/// rank 0 bound the port itself).
#[test]
fn every_torchrun_rendezvous_setup_trains_the_same() {
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
            .to_string()
    };
    let setups: Vec<Vec<String>> = vec![
        vec!["--standalone".into()],
        vec![
            "--rdzv-backend".into(),
            "c10d".into(),
            "--rdzv-endpoint".into(),
            format!("localhost:{}", port()),
        ],
        vec!["--master_port".into(), port()],
    ];
    for setup in setups {
        let d = dir("setup");
        let json = d.join("report.json");
        let mut c = torchrun();
        c.args(["--nproc_per_node", "2"])
            .args(&setup)
            .arg("--no-python")
            .arg(env!("CARGO_BIN_EXE_gpt"))
            .args(gpt_args(&json));
        let (ok, text) = run(c);
        assert!(ok, "torchrun {setup:?} failed:\n{text}");
        check_against_in_process(&json, &text);
        let _ = std::fs::remove_dir_all(d);
    }
}

/// Rank 1 of attempt 0 is killed (SIGKILL) once the ranks have trained a step; torchrun stops rank 0,
/// restarts both (`TORCHELASTIC_RESTART_COUNT=1`), and the new attempt meets under
/// `/worker/attempt_1` of the agent's store, never reading attempt 0's id.
#[test]
fn a_torchrun_restart_after_a_killed_rank_completes() {
    let d = dir("restart");
    let json = d.join("report.json");
    let wrapper = d.join("rank.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n\
             # Attempt 0: rank 0 logs to a file; rank 1 is killed once rank 0 trained a step.\n\
             if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then\n\
             \x20 if [ \"$RANK\" = 0 ]; then exec \"{gpt}\" \"$@\" > \"{log}\" 2>&1; fi\n\
             \x20 \"{gpt}\" \"$@\" & pid=$!\n\
             \x20 n=0; until grep -q '^step' \"{log}\" 2>/dev/null || [ $n -gt 1200 ]; do sleep 0.05; n=$((n+1)); done\n\
             \x20 kill -9 $pid\n\
             \x20 exit 137\n\
             fi\n\
             exec \"{gpt}\" \"$@\"\n",
            gpt = env!("CARGO_BIN_EXE_gpt"),
            log = d.join("attempt0-rank0.log").display()
        ),
    )
    .unwrap();
    let mut c = Command::new("chmod");
    assert!(c.arg("+x").arg(&wrapper).status().unwrap().success());
    let mut c = torchrun();
    c.args([
        "--nproc_per_node",
        "2",
        "--max-restarts",
        "1",
        "--no-python",
    ])
    .arg(&wrapper)
    .args(gpt_args(&json));
    let (ok, text) = run(c);
    assert!(ok, "torchrun failed:\n{text}");
    let first = std::fs::read_to_string(d.join("attempt0-rank0.log")).unwrap_or_default();
    assert!(
        first.lines().any(|l| l.starts_with("step")),
        "attempt 0 never trained a step:\n{first}\n{text}"
    );
    assert!(
        text.contains("Restarting") || text.contains("restart"),
        "torchrun did not restart the workers:\n{text}"
    );
    check_against_in_process(&json, &text);
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn the_in_process_engine_under_torchrun_is_refused_at_start() {
    let d = dir("inprocess");
    let mut c = torchrun();
    c.args(["--nproc_per_node", "2", "--no-python"])
        .arg(env!("CARGO_BIN_EXE_gpt"))
        .args(gpt_args(&d.join("report.json")))
        .env("UNIHAL_CPU_CCL", "inprocess");
    let t0 = std::time::Instant::now();
    let (ok, text) = run(c);
    assert!(
        !ok,
        "torchrun succeeded with the in-process engine:\n{text}"
    );
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(30),
        "refused only after {:?}:\n{text}",
        t0.elapsed()
    );
    // torchrun's failure summary carries the rank's error (its error file).
    assert!(
        text.contains("error_file") && text.contains("runs in another process"),
        "{text}"
    );
    assert!(
        text.contains("UNIHAL_CPU_CCL=gloo"),
        "the message names the fix:\n{text}"
    );
    let _ = std::fs::remove_dir_all(d);
}
