//! Two processes under `mpirun` on the CPU backend's MPI engine (built with `--features mpi`) train
//! as two devices of one process do, to 1e-5 relative per step. Fails, never skips, when `mpirun`
//! is missing: this target exists only to run under MPI.

use gpt::{Corpus, TrainConfig};
use std::process::Command;

/// Two GPT processes under `mpirun -n 2` with `engine` (`UNIHAL_CPU_CCL`) against two
/// in-process devices, to 1e-5 relative per step.
fn mpirun_matches_in_process(engine: &str) {
    let dir = std::env::temp_dir().join(format!("unihal-gpt-mpi-{engine}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let launcher = std::env::var("UNIHAL_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let out = Command::new(launcher)
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
        .arg(env!("CARGO_BIN_EXE_gpt"))
        .args([
            "--backend",
            "cpu",
            "--steps",
            "10",
            "--sample",
            "0",
            "--json",
        ])
        .arg(&json)
        .env("UNIHAL_CPU_CCL", engine)
        .env("UNIHAL_CCL_TIMEOUT", "60")
        .env("UNIHAL_LOG", "INFO")
        .output()
        .unwrap_or_else(|e| panic!("cannot start mpirun ({e}); install openmpi-bin"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "mpirun failed:\n{text}");
    // NCCL_DEBUG=INFO's lines: every rank says how it started and which communicator it made.
    for rank in 0..2 {
        for want in [
            format!("[{rank}] unihal INFO BOOTSTRAP launcher OpenMpi: rank {rank} of 2"),
            format!("[{rank}] unihal INFO COLL communicator rank {rank} of 2 on cpu:"),
        ] {
            assert!(text.contains(&want), "no line with {want:?}:\n{text}");
        }
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["ranks"], 2, "{text}");
    let mpi: Vec<f32> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["loss"].as_f64().unwrap() as f32)
        .collect();
    let cfg = TrainConfig {
        steps: 10,
        ..TrainConfig::default()
    };
    let backend = unihal::registry().get("cpu").unwrap();
    let local = gpt::train_devices(&*backend, 2, &Corpus::documentation(), &cfg, &|_| {})
        .unwrap()
        .losses();
    for (i, (a, b)) in local.iter().zip(&mpi).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs(),
            "step {i}: mpirun ({engine}) {b}, in process {a}\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_mpi_processes_match_two_in_process_devices() {
    mpirun_matches_in_process("mpi");
}

/// An engine that needs a unique id (gloo here; NCCL, RCCL, HCCL alike) under `mpirun`, which
/// names no store: the bootstrap hands rank 0's id to the others over MPI's world.
#[cfg(feature = "gloo")]
#[test]
fn under_mpirun_an_id_engine_gets_its_id_over_mpi() {
    mpirun_matches_in_process("gloo");
}

/// The MPI engine under torchrun's variables (no mpirun): each process is an MPI world of one
/// (Open MPI's singleton). Before this check both trained alone and exited 0; now both refuse at
/// start, naming the fix.
#[test]
fn the_mpi_engine_under_torchrun_refuses_a_world_of_one() {
    #[path = "../../../tests/support/launch.rs"]
    mod launch;
    let d = std::env::temp_dir().join(format!("unihal-gpt-mpi-torchrun-{}", std::process::id()));
    let job = launch::Job::start(
        &d,
        2,
        env!("CARGO_BIN_EXE_gpt"),
        &["--backend", "cpu", "--steps", "2", "--sample", "0"],
        &[
            ("UNIHAL_CPU_CCL", "mpi"),
            // Open MPI refuses root unless told (a CI container runs as root).
            ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
            ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ],
    );
    let (ok, text) = job.wait();
    assert!(ok.iter().all(|o| !o), "a rank trained alone:\n{text}");
    assert_eq!(
        text.matches("started 2 processes, but the world of MPI")
            .count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("UNIHAL_CPU_CCL=gloo") && text.contains("mpirun -n 2"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(d);
}
