//! The CPU backend's gloo engine (built with `--features gloo`) one rank per process, the
//! processes started as a launcher starts them (rank 0 serves the c10d store): the collective
//! suite SPMD on 2 and 3 processes, the benchmark, and dead-rank trials. Fails, never skips: this
//! target exists only where gloo is installed.

#[path = "support/launch.rs"]
mod launch;

use launch::Job;
use std::time::{Duration, Instant};

fn dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("unihal-gloo-{name}-{}", std::process::id()))
}

fn suite(n: usize) {
    let d = dir(&format!("suite{n}"));
    let job = Job::start(
        &d,
        n,
        env!("CARGO_BIN_EXE_unihal"),
        &["conformance", "--backend", "cpu", "--filter", "ccl."],
        &[("UNIHAL_CCL_TIMEOUT", "60")],
    );
    let (ok, text) = job.wait();
    assert!(ok.iter().all(|&o| o), "a rank failed:\n{text}");
    assert!(
        text.contains(&format!("SPMD run: {n} ranks of gloo")),
        "not a gloo SPMD run:\n{text}"
    );
    let total = text
        .lines()
        .find(|l| l.starts_with("total:"))
        .unwrap_or_else(|| panic!("no summary:\n{text}"));
    assert!(
        total.ends_with("OK") && total.contains(" 0 failed"),
        "{total}"
    );
    let passed: usize = total
        .split(", ")
        .find_map(|p| p.strip_suffix(" passed"))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // Every op x dtype up to n ranks, the all-to-all-v, split and failure cases.
    assert!(passed >= 100, "only {passed} cases ran: {total}");
    for r in 1..n {
        assert!(
            text.contains(&format!("rank {r}: {passed} passed, 0 failed")),
            "rank {r} disagrees:\n{text}"
        );
    }
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn collective_suite_on_two_processes() {
    suite(2);
}

#[test]
fn collective_suite_on_three_processes() {
    suite(3);
}

#[test]
fn bench_all_reduce_on_three_processes_is_correct() {
    let d = dir("bench");
    let job = Job::start(
        &d,
        3,
        env!("CARGO_BIN_EXE_unihal"),
        &[
            "bench",
            "all_reduce",
            "-b",
            "1K",
            "-e",
            "1M",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
        ],
        &[("UNIHAL_CCL_TIMEOUT", "60")],
    );
    let (ok, text) = job.wait();
    assert!(ok.iter().all(|&o| o), "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.split_whitespace().count() == 13)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "1K..1M by 8:\n{text}");
    for r in &rows {
        assert_eq!((r[8], r[12]), ("0", "0"), "#wrong in {r:?}");
    }
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    let _ = std::fs::remove_dir_all(d);
}

/// Dead ranks on gloo: rank 1 of a two-process all-reduce benchmark gets SIGKILL at a random
/// point once both ranks run. Rank 0 must fail within its collective timeout (5 s here) and exit
/// non-zero, no survivor left waiting in a collective: mostly at once, its connection to rank 1
/// broken (`Aborted`, naming rank 1 when it dies between operations); at its timeout when
/// gloo's data phase misses the broken connection (a send posted to a pair that just failed
/// waits for its deadline in this gloo). 20 trials.
#[test]
fn a_killed_rank_fails_the_survivor_within_its_timeout() {
    const TRIALS: usize = 20;
    const TIMEOUT: Duration = Duration::from_secs(5);
    const BOUND: Duration = Duration::from_secs(5 + 10);
    let mut prompt = 0;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut slowest = Duration::ZERO;
    let started = Instant::now();
    for trial in 0..TRIALS {
        let d = dir(&format!("kill{trial}"));
        let mut job = Job::start(
            &d,
            2,
            env!("CARGO_BIN_EXE_unihal"),
            &[
                "bench",
                "all_reduce",
                "-b",
                "1K",
                "-e",
                "64K",
                "-f",
                "2",
                "-n",
                "100000",
                "-w",
                "1",
            ],
            &[("UNIHAL_CCL_TIMEOUT", "5")],
        );
        // Both ranks are in the benchmark once rank 0 printed its table's header (the world is formed).
        let t0 = Instant::now();
        while !job.log(0).contains("#wrong") {
            assert!(
                t0.elapsed() < BOUND,
                "trial {trial}: the job never started:\n{}",
                job.log(0)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(seed % 700));
        let killed = Instant::now();
        job.children[1].kill().unwrap();
        let _ = job.children[1].wait();
        let status = loop {
            if let Some(st) = job.children[0].try_wait().unwrap() {
                break st;
            }
            if killed.elapsed() > BOUND {
                let _ = job.children[0].kill();
                panic!(
                    "trial {trial}: rank 0 still runs {BOUND:?} after rank 1 was killed: a hang\n{}",
                    job.log(0)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = killed.elapsed();
        slowest = slowest.max(took);
        let text = job.log(0);
        assert!(
            !status.success(),
            "trial {trial}: rank 0 succeeded without rank 1:\n{text}"
        );
        let gone = text.contains("connection broke") || text.contains("ranks [1] left");
        assert!(
            gone || text.contains("timed out after 5000 ms"),
            "trial {trial}: rank 0's error says neither that its peer is gone nor a timeout:\n{text}"
        );
        if gone && took < TIMEOUT {
            prompt += 1;
        }
        let _ = std::fs::remove_dir_all(d);
    }
    eprintln!(
        "gloo dead ranks: {TRIALS} trials, rank 0 failed every time, {prompt} at once (its peer gone), the others at its timeout; slowest {:.0} ms after the kill; {:.1} s",
        slowest.as_secs_f64() * 1e3,
        started.elapsed().as_secs_f64()
    );
}
