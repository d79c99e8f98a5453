//! Dead-rank trials (`unihal_conformance::dead_rank`) on every in-process collective engine this
//! machine can run: the CPU backend's, NCCL (CUDA) and RCCL (HIP) through the simulated NCCL
//! API, and HCCL through the simulated CANN stack. 50 trials each, a 300 ms communicator timeout,
//! a 1.5 s margin. (The MPI engine's ranks are processes; Open MPI 4 ends the whole job when one
//! dies: README, "Under MPI".)

#[path = "support/simulated.rs"]
#[allow(dead_code)] // no quiesce here
mod simulated;

use std::sync::Arc;
use unihal::Backend;
use unihal_conformance::dead_rank::{dead_rank_trials, DeadRankOptions};

/// One engine at a time: the trials time their errors.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(name: &str, backend: Arc<dyn Backend>) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let r = dead_rank_trials(&backend, &DeadRankOptions::default())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    eprintln!("dead ranks on {name}: {r}");
    assert_eq!(r.trials, 50);
}

#[test]
fn dead_ranks_on_the_cpu_engine() {
    run("cpu (in-process engine)", simulated::cpu());
}

#[test]
fn dead_ranks_on_nccl_over_the_simulated_driver() {
    run("cuda (simulated NCCL)", simulated::cuda());
}

#[test]
fn dead_ranks_on_rccl_over_the_simulated_runtime() {
    run("hip (simulated RCCL)", simulated::hip());
}

#[test]
fn dead_ranks_on_hccl_over_the_simulated_cann_stack() {
    run("ascend (simulated HCCL)", simulated::ascend());
}
