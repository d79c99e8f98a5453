//! Every setting a user types is honoured or refused, never ignored: each silently accepted value
//! once found is refused here by the real binary, with a message naming the variable, the value
//! and what is accepted; README.md's table is the settings table; every `UNIHAL_*` name in the
//! sources is in it.

use std::process::Command;

fn unihal(args: &[&str], var: &str, value: &str) -> (bool, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_unihal"))
        .args(args)
        .env_remove("UNIHAL_BACKENDS")
        .env(var, value)
        .output()
        .expect("the unihal binary runs");
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), t)
}

#[test]
fn bad_settings_are_refused_naming_the_variable_the_value_and_what_is_accepted() {
    let cases: &[(&str, &str, &str)] = &[
        ("UNIHAL_LOG", "nonsense", "INFO"),
        ("UNIHAL_LOG_SUBSYS", "INIT,NET", "BOOTSTRAP"),
        ("UNIHAL_CPU_ISA", "avx9000", "levels this CPU runs"),
        ("UNIHAL_CPU_CCL", "nccl", "inprocess, mpi or gloo"),
        ("UNIHAL_CCL_TIMEOUT", "abc", "at least 0.001"),
        ("UNIHAL_CCL_TIMEOUT", "-1", "at least 0.001"),
        // Once a zero timeout, accepted.
        ("UNIHAL_CCL_TIMEOUT", "1e-300", "at least 0.001"),
        ("UNIHAL_CPU_DEVICES", "abc", "an integer in 1..=64"),
        ("UNIHAL_CPU_MATMUL", "blas", "gemm or dialect"),
        ("UNIHAL_VALIDATE", "maybe", "error"),
        ("UNIHAL_TRACE_MAX_EVENTS", "0", "an integer of 1 or more"),
        ("UNIHAL_BACKENDS", "cpu,tpu", "tpu"),
        ("UNIHAL_PROGRESS", "sometimes", "plain"),
    ];
    for (var, value, accepted) in cases {
        let (ok, t) = unihal(&["devices", "--backend", "cpu"], var, value);
        assert!(!ok, "{var}={value} was accepted:\n{t}");
        assert!(
            t.contains(&format!("{var}=\"{value}\"")) && t.contains(accepted),
            "{var}={value}: the message does not name the variable, value and accepted values:\n{t}"
        );
    }
}

/// A collective timeout longer than the clock holds is no timeout: once `Instant::now() + t`
/// panicked on the first collective (or at communicator creation).
#[test]
fn a_timeout_longer_than_the_clock_holds_is_no_timeout() {
    for value in ["1e19", "1e300"] {
        let (ok, t) = unihal(
            &[
                "bench",
                "all_reduce",
                "--backend",
                "cpu",
                "-g",
                "2",
                "-b",
                "64",
                "-e",
                "64",
            ],
            "UNIHAL_CCL_TIMEOUT",
            value,
        );
        assert!(ok, "UNIHAL_CCL_TIMEOUT={value}:\n{t}");
        assert!(
            t.contains("# Out of bounds values : 0 OK"),
            "UNIHAL_CCL_TIMEOUT={value}:\n{t}"
        );
    }
}

#[test]
fn an_avx512_the_cpu_lacks_is_refused() {
    let has = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains("avx512bw"));
    let (ok, t) = unihal(&["devices", "--backend", "cpu"], "UNIHAL_CPU_ISA", "avx512");
    assert_eq!(ok, has, "{t}");
    if !has {
        assert!(t.contains("lacks it"), "{t}");
    }
}

#[test]
fn bad_command_line_numbers_are_refused_naming_the_flag() {
    for (flag, value) in [
        ("--timeout-s", "-1"),
        ("--timeout-s", "nan"),
        ("--timeout-s", "0"),
        ("--timeout-s", "1e-300"),
        ("--max-devices", "0"),
    ] {
        let arg = format!("{flag}={value}");
        let (ok, t) = unihal(
            &["conformance", "--backend", "cpu", &arg],
            "UNIHAL_LOG",
            "WARN",
        );
        assert!(!ok, "{arg} was accepted:\n{t}");
        assert!(t.contains(flag) && t.contains(value), "{arg}:\n{t}");
    }
}

#[test]
fn a_misspelt_variable_is_warned_about_with_a_suggestion() {
    // Spelt in two pieces, so that the scan below does not take it for a variable of ours.
    let (ok, t) = unihal(
        &["devices", "--backend", "cpu"],
        concat!("UNIHAL_", "CPU_DEVICE"),
        "2",
    );
    assert!(ok, "{t}");
    assert!(
        t.contains(concat!(
            "UNIHAL_",
            "CPU_DEVICE is not a unihal variable (did you mean UNIHAL_CPU_DEVICES?)"
        )),
        "{t}"
    );
}

#[test]
fn readme_lists_every_user_setting() {
    let readme = include_str!("../../README.md");
    let table = unihal::settings::markdown_table();
    assert!(
        readme.contains(&table),
        "README.md's table of variables differs from unihal::settings::SETTINGS; put this there:\n{table}"
    );
}

/// Every `"UNIHAL_…"` literal in the sources (tests included) is a row of the settings table.
#[test]
fn every_variable_in_the_sources_is_in_the_table() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "node_modules") {
                    stack.push(p);
                }
                continue;
            }
            if !name.ends_with(".rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for (i, _) in text.match_indices("\"UNIHAL_") {
                let var: String = text[i + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if var.len() > "UNIHAL_".len()
                    && !var.ends_with('_')
                    && unihal::settings::lookup(&var).is_none()
                {
                    missing.push(format!(
                        "{var} ({})",
                        p.strip_prefix(root).unwrap().display()
                    ));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "not in unihal::settings::SETTINGS: {missing:#?}"
    );
}
