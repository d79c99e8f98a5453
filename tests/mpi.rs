//! The collective suite and the benchmark SPMD under `mpirun`, one rank per process, with the
//! CPU backend's MPI engine (built with `--features mpi`). Fails, never skips, when `mpirun` is
//! missing: this target exists only to run under MPI.

use std::process::Command;

/// `mpirun` with the flags a root CI container needs.
fn mpirun(n: usize) -> Command {
    let launcher = std::env::var("UNIHAL_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut c = Command::new(launcher);
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-n",
        &n.to_string(),
    ])
    .arg(env!("CARGO_BIN_EXE_unihal"))
    .env("UNIHAL_CPU_CCL", "mpi")
    .env("UNIHAL_CCL_TIMEOUT", "60");
    c
}

fn run(mut c: Command) -> String {
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("cannot start mpirun ({e}); install openmpi-bin"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{c:?} failed:\n{text}");
    text
}

fn suite(n: usize) {
    let mut c = mpirun(n);
    c.args(["conformance", "--backend", "cpu", "--filter", "ccl."]);
    let text = run(c);
    assert!(
        text.contains(&format!("SPMD run: {n} ranks of MPI")),
        "not an MPI SPMD run:\n{text}"
    );
    let total = text
        .lines()
        .find(|l| l.starts_with("total:"))
        .unwrap_or_else(|| panic!("no summary:\n{text}"));
    assert!(total.ends_with("OK"), "{total}");
    assert!(total.contains(" 0 failed"), "{total}");
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
}

#[test]
fn collective_suite_on_two_ranks() {
    suite(2);
}

#[test]
fn collective_suite_on_three_ranks() {
    suite(3);
}

#[test]
fn bench_all_reduce_on_three_ranks_is_correct_and_compares_with_mpi() {
    let mut c = mpirun(3);
    c.args([
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
    ]);
    let text = run(c);
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.split_whitespace().count() == 13)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "1K..1M by 8:\n{text}");
    for r in &rows {
        assert_eq!((r[8], r[12]), ("0", "0"), "#wrong in {r:?}");
        let (algbw, busbw): (f64, f64) = (r[6].parse().unwrap(), r[7].parse().unwrap());
        // all_reduce's busbw factor 2(n-1)/n with n = 3 (two decimals printed).
        assert!(
            (busbw - algbw * 4.0 / 3.0).abs() <= 0.011,
            "busbw {busbw} vs algbw {algbw}"
        );
    }
    assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    assert!(
        text.contains("vs direct MPI_Allreduce"),
        "no comparison:\n{text}"
    );
}
