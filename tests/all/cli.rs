//! End-to-end tests of the `unihal` binary: device listing, the conformance command, its reports,
//! isolation and its watchdog.

use std::process::{Command, Output};

fn unihal(args: &[&str], devices: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_unihal"))
        .args(args)
        .env("UNIHAL_CPU_DEVICES", devices)
        .env_remove("UNIHAL_BACKENDS")
        .output()
        .expect("the unihal binary runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn devices_json_lists_the_cpu_backend() {
    let o = unihal(&["devices", "--json"], "3");
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // Everything the text shows: the plugins too.
    assert!(v["plugins"]["attempts"].is_array(), "{v}");
    let cpu = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "cpu")
        .unwrap();
    assert_eq!(cpu["available"], true);
    assert_eq!(cpu["devices"].as_array().unwrap().len(), 3);
    assert_eq!(
        cpu["devices"][2]["capabilities"]["optional"]["peer_devices"],
        serde_json::json!([0, 1])
    );
    // The collective engine and what it runs.
    assert!(
        cpu["collectives"]["engine"]
            .as_str()
            .is_some_and(|e| e.starts_with("unihal-cpu in-process")),
        "{}",
        cpu["collectives"]
    );
    assert!(cpu["collectives"]["ops"]["all_reduce"].is_array());
}

#[test]
fn devices_reports_a_bad_configuration_as_unavailable() {
    let o = unihal(&["devices"], "zero");
    // No backend is available here then: the command fails.
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("Unavailable") && t.contains("UNIHAL_CPU_DEVICES"),
        "{t}"
    );
}

#[test]
fn conformance_writes_reports_that_agree_with_the_summary() {
    let dir = std::env::temp_dir().join(format!("unihal-cli-report-{}", std::process::id()));
    let o = unihal(
        &[
            "conformance",
            "--filter",
            "memory.copy",
            "--report",
            dir.to_str().unwrap(),
        ],
        "2",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("conformance.json")).unwrap())
            .unwrap();
    let targets = json["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    let n = targets[0]["results"].as_array().unwrap().len();
    assert!(n >= 5);
    assert!(
        t.contains(&format!(
            "total: {} cases, {} passed, 0 failed, 0 skipped",
            2 * n,
            2 * n
        )),
        "{t}"
    );
    let xml = std::fs::read_to_string(dir.join("conformance.xml")).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 2 * n);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_devices_are_skips_with_reasons() {
    let o = unihal(
        &["conformance", "--filter", "events.wait.cross_device"],
        "1",
    );
    let t = text(&o);
    assert!(
        t.contains("skipped cpu:0 events.wait.cross_device: needs 2 devices, backend has 1"),
        "{t}"
    );
    assert!(t.contains("1 cases, 0 passed, 0 failed, 1 skipped"), "{t}");
}

#[test]
fn isolated_cases_pass_and_a_hang_is_killed_by_the_watchdog() {
    let o = unihal(
        &[
            "conformance",
            "--isolate",
            "--max-devices",
            "1",
            "--filter",
            "streams.query",
        ],
        "2",
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("(isolated mode)"));
    // A 10 ms limit on a case that holds its stream for longer: the child's watchdog must fire.
    let o = unihal(
        &[
            "conformance",
            "--isolate",
            "--max-devices",
            "1",
            "--timeout-s",
            "0.01",
            "--filter",
            "events.elapsed.measures_work",
        ],
        "2",
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("watchdog"), "{t}");
}

#[test]
fn unknown_backends_and_empty_filters_are_errors() {
    let o = unihal(&["conformance", "--backend", "nope"], "1");
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("not registered"), "{}", text(&o));
    let o = unihal(&["conformance", "--filter", "no.such.case"], "1");
    assert_eq!(o.status.code(), Some(2));
}

/// The ids a report ran, in order.
fn report_ids(dir: &std::path::Path) -> Vec<String> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("conformance.json")).unwrap())
            .unwrap();
    json["targets"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn conformance_partitions_run_every_selected_case_once() {
    let base = std::env::temp_dir().join(format!("unihal-cli-partition-{}", std::process::id()));
    let run = |name: &str, extra: &[&str]| {
        let dir = base.join(name);
        let mut args = vec!["conformance", "--filter", "memory.", "--report"];
        args.push(dir.to_str().unwrap());
        args.extend_from_slice(extra);
        let o = unihal(&args, "1");
        assert!(o.status.success(), "{}", text(&o));
        report_ids(&dir)
    };
    let all = run("all", &[]);
    let shares: Vec<Vec<String>> = (1..=3)
        .map(|k| run(&format!("{k}"), &["--partition", &format!("{k}/3")]))
        .collect();
    assert!(shares.iter().all(|s| !s.is_empty() && s.len() < all.len()));
    let mut joined: Vec<String> = shares.concat();
    joined.sort();
    let mut expected = all.clone();
    expected.sort();
    assert_eq!(
        joined, expected,
        "the shares together are not the whole selection, once"
    );
    // Each id in the share its position deals it to.
    for (i, id) in all.iter().enumerate() {
        assert!(
            shares[i % 3].contains(id),
            "{id} (position {i}) not in share {}",
            i % 3 + 1
        );
    }
    for bad in ["0/2", "3/2", "1", "a/b"] {
        let o = unihal(&["conformance", "--partition", bad], "1");
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        assert!(
            text(&o).contains("is not a share K/N"),
            "{bad}: {}",
            text(&o)
        );
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// Parses nccl-tests-style rows: (size, count, type, redop, root, [time, algbw, busbw, wrong] x2).
fn bench_rows(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn bench_prints_nccl_tests_output_with_its_busbw_factors() {
    for (op, factor) in [
        ("all_reduce", 2.0 * 2.0 / 3.0),
        ("all_gather", 2.0 / 3.0),
        ("broadcast", 1.0),
    ] {
        let o = unihal(
            &[
                "bench", op, "-g", "3", "-b", "1K", "-e", "64K", "-f", "4", "-n", "2", "-w", "1",
            ],
            "3",
        );
        let t = text(&o);
        assert!(o.status.success(), "{t}");
        assert!(t.contains("# Out of bounds values : 0 OK"), "{t}");
        assert!(t.contains("# Avg bus bandwidth"), "{t}");
        let rows = bench_rows(&String::from_utf8_lossy(&o.stdout));
        assert_eq!(rows.len(), 4, "{t}"); // 1K, 4K, 16K, 64K
        for r in &rows {
            assert_eq!(r.len(), 13, "{r:?}");
            assert_eq!(r[2], "float");
            for base in [5, 9] {
                let (algbw, busbw): (f64, f64) =
                    (r[base + 1].parse().unwrap(), r[base + 2].parse().unwrap());
                assert!(
                    (busbw - algbw * factor).abs() <= 0.011 + 0.01 * busbw,
                    "{op}: busbw {busbw} vs algbw {algbw} x {factor}"
                );
                assert_eq!(r[base + 3], "0", "{op}: #wrong in {r:?}");
            }
        }
        // all_gather's per-rank count rounds down to 16 bytes (nccl-tests' all_gather.cu,
        // AllGatherGetCollByteCount): 1024 / 4 / 3 = 85 floats, 84 per rank, 1008 bytes.
        assert_eq!(rows[0][0], if op == "all_gather" { "1008" } else { "1024" });
        assert_eq!(rows[0][1], if op == "all_gather" { "84" } else { "256" });
    }
}

#[test]
fn bench_refuses_what_it_cannot_honour_and_states_the_step_it_uses() {
    for (args, flag) in [
        (vec!["-g", "8", "-b", "1K", "-e", "1K"], "`-g/--ngpus`"),
        (vec!["-n", "0", "-b", "1K", "-e", "1K"], "`-n/--iters`"),
        (vec!["-b", "64K", "-e", "1K"], "`-b/--minbytes`"),
        // -f 1 steps by -i bytes (nccl-tests), so a step of 0 bytes would never end.
        (
            vec!["-b", "1K", "-e", "4K", "-f", "1", "-i", "0"],
            "`-i/--stepbytes`",
        ),
        // Hostile sizes: one buffer cannot hold them (u64::MAX wrapped to 0 bytes before).
        (
            vec!["-b", "4", "-e", "18446744073709551615", "-g", "2"],
            "`-e/--maxbytes`",
        ),
        (
            vec!["-b", "4", "-e", "9000000000G", "-g", "2"],
            "`-e/--maxbytes`",
        ),
    ] {
        let mut all = vec!["bench", "all_reduce", "--backend", "cpu"];
        all.extend(args);
        let o = unihal(&all, "4");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {t}");
        assert!(t.contains(flag), "{all:?}: {t}");
        assert!(
            bench_rows(&String::from_utf8_lossy(&o.stdout)).is_empty(),
            "{t}"
        );
    }
    // One size: the header states nccl-tests' step (1 MiB by bytes, -f 1), and the run ends.
    let o = unihal(
        &[
            "bench",
            "broadcast",
            "-b",
            "1K",
            "-e",
            "1K",
            "-f",
            "1",
            "-n",
            "1",
            "-w",
            "0",
        ],
        "2",
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("step: 1048576(bytes)") && t.contains("# backend cpu "),
        "{t}"
    );
    assert_eq!(
        bench_rows(&String::from_utf8_lossy(&o.stdout)).len(),
        1,
        "{t}"
    );
}

#[test]
fn conformance_list_prints_the_case_ids_containing_the_text_and_their_count() {
    let o = unihal(&["conformance", "--list", "memory.copy."], "2");
    assert!(o.status.success(), "{}", text(&o));
    let ids: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(ids.len() > 3, "{ids:?}");
    assert!(ids.iter().all(|id| id.contains("memory.copy.")), "{ids:?}");
    assert!(ids.contains(&"memory.copy.d2d".to_string()), "{ids:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(&format!("{} of ", ids.len())) && err.contains("containing \"memory.copy.\""),
        "{err}"
    );
    // Without a text: every case; a text nothing contains is an error.
    let all = unihal(&["conformance", "--list"], "2");
    assert!(all.status.success());
    assert!(String::from_utf8_lossy(&all.stdout).lines().count() > ids.len());
    assert_eq!(
        unihal(&["conformance", "--list", "no.such.case"], "2")
            .status
            .code(),
        Some(2)
    );
}

/// Compiles the minimal C plugin (plugin/tests/c) under the backend name `name`.
fn c_plugin_named(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("unihal-cli-plugins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("lib{name}_plugin.so"));
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=c11", "-O2", "-shared", "-fPIC", "-pthread", "-I"])
        .arg(root.join("plugin/abi/include"))
        .arg(format!("-DUH_TEST_NAME=\"{name}\""))
        .arg("-o")
        .arg(&out)
        .arg(root.join("plugin/tests/c/minimal_plugin.c"))
        .output()
        .unwrap_or_else(|e| panic!("the C compiler {cc} does not run: {e}"));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    out
}

#[test]
fn a_refused_plugin_is_named_instead_of_testing_a_built_in_backend_or_saying_not_registered() {
    // A plugin named after the built-in CPU backend, without UNIHAL_PLUGIN_REPLACE: refused, and
    // `--backend cpu` must not test the built-in backend in its place.
    let lib = c_plugin_named("cpu");
    let run = |path: &std::path::Path, backend: &str| {
        Command::new(env!("CARGO_BIN_EXE_unihal"))
            .args([
                "conformance",
                "--backend",
                backend,
                "--filter",
                "memory.alloc.sizes",
            ])
            .env("UNIHAL_PLUGIN_PATH", path)
            .env_remove("UNIHAL_PLUGIN_REPLACE")
            .env_remove("UNIHAL_BACKENDS")
            .output()
            .unwrap()
    };
    let o = run(&lib, "cpu");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("would test the built-in backend, not the plugin")
            && t.contains(&lib.display().to_string())
            && t.contains("UNIHAL_PLUGIN_REPLACE=cpu"),
        "{t}"
    );
    // A file that is no plugin: `--backend` names its refusal, not only "not registered".
    let bad = lib.with_file_name("libmychip_plugin.so");
    std::fs::write(&bad, b"not a library").unwrap();
    let o = run(&bad, "mychip");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(
        t.contains("\"mychip\" is not registered") && t.contains(&bad.display().to_string()),
        "{t}"
    );
    // With the user's consent the plugin is the backend tested.
    let o = Command::new(env!("CARGO_BIN_EXE_unihal"))
        .args([
            "conformance",
            "--backend",
            "cpu",
            "--filter",
            "memory.alloc.sizes",
        ])
        .env("UNIHAL_PLUGIN_PATH", &lib)
        .env("UNIHAL_PLUGIN_REPLACE", "cpu")
        .env("UNIHAL_LOG", "INFO")
        .env_remove("UNIHAL_BACKENDS")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("0.1.0-minimal-c (plugin "), "{t}");
    // The load is logged: logging is set up before the registry loads the plugins.
    assert!(
        t.contains("] unihal INFO PLUGIN loaded plugin ") && t.contains(&lib.display().to_string()),
        "{t}"
    );
}

/// One line per library (found at PATH with its version, or not found with the variable to
/// set); `-v` lists every name tried, each once; the asked backend unavailable fails the command.
#[test]
fn devices_says_each_library_once_and_fails_when_the_asked_backend_is_unavailable() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_unihal"))
            .args(args)
            .env_remove("UNIHAL_ASCEND_LIB")
            .env_remove("UNIHAL_ACL_LIB")
            .env_remove("UNIHAL_BACKENDS")
            .output()
            .unwrap()
    };
    let o = run(&["devices", "--backend", "ascend"]);
    let t = text(&o);
    if t.contains("ascend 0.1.0 — Available") {
        return; // a machine with CANN installed: nothing is missing to report
    }
    assert!(!o.status.success(), "{t}");
    assert!(t.contains("a backend asked for is unavailable"), "{t}");
    assert!(
        t.contains("ascend 0.1.0 — Unavailable (see its libraries)"),
        "{t}"
    );
    let line = t
        .lines()
        .find(|l| l.contains("ACL runtime NOT FOUND"))
        .unwrap_or_else(|| panic!("{t}"));
    assert!(line.contains("set UNIHAL_ACL_LIB"), "{line}");
    let n: usize = line
        .split([',', ';'])
        .find_map(|p| p.trim().strip_suffix(" names tried")?.parse().ok())
        .unwrap_or_else(|| panic!("no count of names tried: {line}"));
    // Without -v the names are not listed; with it, each once.
    assert_eq!(t.matches("libascendcl.so").count(), 0, "{t}");
    let o = run(&["devices", "--backend", "ascend", "-v"]);
    let t = text(&o);
    let tried: Vec<&str> = t
        .lines()
        .filter(|l| l.trim_start().starts_with("tried "))
        .collect();
    assert_eq!(tried.len(), n, "{t}");
    let mut unique = tried.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), tried.len(), "a name tried twice: {t}");
    for l in &tried {
        // dlerror's message repeats the name: it is said once.
        let name = l
            .trim_start()
            .trim_start_matches("tried ")
            .split(": ")
            .next()
            .unwrap();
        assert_eq!(l.matches(name).count(), 1, "{l}");
    }
    let o = unihal(&["devices", "--backend", "cpu"], "2");
    assert!(o.status.success(), "{}", text(&o));
}

/// Each virtual CPU device has its share of the host's memory, not all of it.
#[test]
fn virtual_cpu_devices_share_the_host_memory() {
    let total = |devices: &str| {
        let o = unihal(&["devices", "--json", "--backend", "cpu"], devices);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["backends"][0]["devices"][0]["memory"]["total"]
            .as_u64()
            .unwrap()
    };
    let (one, four) = (total("1"), total("4"));
    assert!(
        four * 4 <= one && four * 4 + 4 > one,
        "1 device {one}, 4 devices {four} each"
    );
}

/// The conformance run shows progress on stderr (plain lines when stderr is not a terminal, a
/// final line per device), never on stdout; `UNIHAL_PROGRESS=0` turns it off.
#[test]
fn conformance_shows_progress_on_stderr_only() {
    let run = |progress: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_unihal"));
        c.args(["conformance", "--backend", "cpu", "--filter", "memory.copy"])
            .env("UNIHAL_CPU_DEVICES", "2")
            .env_remove("UNIHAL_BACKENDS")
            .env_remove("UNIHAL_PROGRESS");
        if let Some(p) = progress {
            c.env("UNIHAL_PROGRESS", p);
        }
        c.output().unwrap()
    };
    let o = run(None);
    assert!(o.status.success(), "{}", text(&o));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    for dev in ["cpu:0", "cpu:1"] {
        let last = err
            .lines()
            .rfind(|l| l.starts_with(&format!("unihal conformance: {dev} ")))
            .unwrap_or_else(|| panic!("no progress line for {dev}:\n{err}"));
        assert!(
            last.ends_with(", done") && last.contains(" 0 failed"),
            "{last}"
        );
        let (done, total) = last
            .split_whitespace()
            .nth(3)
            .and_then(|f| f.split_once('/'))
            .unwrap_or_else(|| panic!("{last}"));
        assert_eq!(done, total, "{last}");
    }
    assert!(
        !out.contains("unihal conformance:"),
        "progress on stdout:\n{out}"
    );
    let o = run(Some("0"));
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("unihal conformance:"),
        "{}",
        text(&o)
    );
}

/// At INFO a communicator's abort and its first failure are logged (COLL), as NCCL's lines
/// say; a process without a launcher prints `[-]` for its rank.
#[test]
fn aborts_and_timeouts_are_logged() {
    let o = Command::new(env!("CARGO_BIN_EXE_unihal"))
        .args([
            "conformance",
            "--backend",
            "cpu",
            "--filter",
            "ccl.failure",
            "--max-devices",
            "1",
        ])
        .env("UNIHAL_CPU_DEVICES", "3")
        .env("UNIHAL_LOG", "INFO")
        .env_remove("UNIHAL_BACKENDS")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for want in [
        "[-] unihal INFO COLL communicator rank 1 of 2 on cpu:1 aborted",
        "[-] unihal WARN COLL communicator of 2 ranks (in-process) failed: aborted",
        "[-] unihal WARN COLL communicator of 3 ranks (in-process) failed: timed out after 300 ms",
    ] {
        assert!(t.contains(want), "no line with {want:?}:\n{t}");
    }
}
