//! Launches that cannot give a correct world fail at start, naming the fix, in every build:
//! ranks in two processes on the in-process engine, and an `mpirun` launch on a build without
//! the MPI engine. The processes get the variables their launcher gives (torchrun's, Open MPI's).

#[path = "../../../../tests/support/launch.rs"]
mod launch;

use launch::Job;
use std::time::{Duration, Instant};

fn dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("unihal-gpt-launch-{name}-{}", std::process::id()))
}

const ARGS: &[&str] = &["--backend", "cpu", "--steps", "2", "--sample", "0"];

#[test]
fn two_processes_on_the_in_process_engine_fail_at_once_naming_the_engines_that_cross() {
    let d = dir("inprocess");
    let t0 = Instant::now();
    let job = Job::start(
        &d,
        2,
        env!("CARGO_BIN_EXE_gpt"),
        ARGS,
        &[
            ("UNIHAL_CPU_CCL", "inprocess"),
            ("UNIHAL_CCL_TIMEOUT", "300"),
        ],
    );
    let (ok, text) = job.wait();
    assert!(ok.iter().all(|o| !o), "a rank trained alone:\n{text}");
    assert!(
        t0.elapsed() < Duration::from_secs(30),
        "refused after {:?} (the collective timeout is 300 s):\n{text}",
        t0.elapsed()
    );
    for r in 0..2 {
        let other = 1 - r;
        assert!(
            text.contains(&format!("rank {other} runs in another process")),
            "rank {r} does not name rank {other}'s process:\n{text}"
        );
    }
    assert!(
        text.contains("UNIHAL_CPU_CCL=gloo") && text.contains("mpirun"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn an_mpirun_launch_on_a_build_without_mpi_says_so() {
    if cfg!(feature = "mpi") {
        // This build has the MPI engine: the launch is honoured (tests/mpi.rs).
        return;
    }
    let d = dir("mpirun");
    std::fs::create_dir_all(&d).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gpt"))
        .args(ARGS)
        // What Open MPI 4.1.4's mpirun -n 2 gives rank 1 (launch/tests/launches).
        .env("OMPI_COMM_WORLD_RANK", "1")
        .env("OMPI_COMM_WORLD_SIZE", "2")
        .env("OMPI_COMM_WORLD_LOCAL_RANK", "1")
        .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
        .env_remove("UNIHAL_CPU_CCL")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("started by mpirun") && text.contains("--features mpi"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(d);
}
