//! A rank that fails ends a data-parallel run with its own error, promptly: the failing rank
//! aborts the communicators, so the others, waiting in the gradient all-reduce for it, fail at once
//! (with `Aborted`, which is not the error reported) instead of waiting for the collective timeout.
//!
//! The failure is deterministic and on rank 0 only: a corrupt token in the held-out text, which
//! only rank 0 evaluates (before its first step), makes its embedding lookup fault.

use crate::support;

use gpt::{Corpus, TrainConfig};
use std::time::{Duration, Instant};
use unihal::Backend;

fn failing_rank_ends_the_run(b: &dyn Backend) {
    let mut corpus = Corpus::documentation();
    corpus.heldout[5] = 1_000_000; // far outside the vocabulary
    let cfg = TrainConfig {
        steps: 5,
        ..TrainConfig::default()
    };
    let t = Instant::now();
    let err = match gpt::train_devices(b, 2, &corpus, &cfg, &|_| {}) {
        Ok(_) => panic!(
            "{}: a run with a corrupt held-out token succeeded",
            b.name()
        ),
        Err(e) => e,
    };
    let took = t.elapsed();
    eprintln!("{}: failed in {took:?}: {err}", b.name());
    assert!(
        took < Duration::from_secs(60),
        "{}: the run took {took:?} to fail (the collective timeout is 300 s): {err}",
        b.name()
    );
    assert!(
        !err.is_aborted(),
        "{}: the reported error is the abort it caused: {err}",
        b.name()
    );
}

#[test]
fn failing_rank_ends_the_run_on_cpu() {
    // A device fault poisons the process's context on a GPU (and on the simulated runtimes):
    // the other tests of the binary must not share it.
    if crate::own_process() {
        return;
    }
    failing_rank_ends_the_run(&*support::cpu());
}

#[test]
fn failing_rank_ends_the_run_on_backend_under_test() {
    // A device fault poisons the process's context on a GPU (and on the simulated runtimes):
    // the other tests of the binary must not share it.
    if crate::own_process() {
        return;
    }
    failing_rank_ends_the_run(&*support::backend_under_test());
}
