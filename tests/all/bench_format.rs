//! `unihal bench` against nccl-tests' own sources (NVIDIA/nccl-tests 2.19.6): per-rank counts,
//! the `-d all` / `-o all` / `-r -1` loops, refusals of the flags it cannot honour, the footer,
//! the JSON document of `-J`, and (under `mpirun`, feature `mpi`) every rank's "Using devices"
//! line. Each test runs the built binary on the in-process CPU backend.

use std::process::{Command, Output};

fn unihal(args: &[&str], devices: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_unihal"))
        .args(args)
        .env("UNIHAL_CPU_DEVICES", devices)
        .env_remove("UNIHAL_BACKENDS")
        .env_remove("NCCL_TESTS_MIN_BW")
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

/// The table's rows: (size, count, type, redop, root, [time, algbw, busbw, #wrong] x2).
fn rows(o: &Output) -> Vec<Vec<String>> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

/// A bench run on the CPU backend that must succeed; its rows.
fn bench_ok(args: &[&str], devices: &str) -> (Output, Vec<Vec<String>>) {
    let mut all = vec!["bench"];
    all.extend(args);
    all.extend(["--backend", "cpu", "-n", "2", "-w", "0"]);
    let o = unihal(&all, devices);
    assert!(o.status.success(), "{all:?}: {}", text(&o));
    let r = rows(&o);
    (o, r)
}

#[test]
fn count_is_per_rank_for_gathered_and_scattered_collectives() {
    // nccl-tests' *GetCollByteCount: all_gather, reduce_scatter and alltoall are called with
    // base = (count/nranks) rounded down to 16 bytes per rank, and print it as `count`; `size`
    // is the larger of the send and receive bytes. The others are called with the whole count.
    for (op, size, count) in [
        ("all_gather", "4096", "256"),
        ("reduce_scatter", "4096", "256"),
        ("alltoall", "4096", "256"),
        ("all_reduce", "4096", "1024"),
        ("broadcast", "4096", "1024"),
        ("reduce", "4096", "1024"),
        ("sendrecv", "4096", "1024"),
    ] {
        let (o, r) = bench_ok(&[op, "-g", "4", "-b", "4K", "-e", "4K"], "4");
        assert_eq!(r.len(), 1, "{}", text(&o));
        assert_eq!((r[0][0].as_str(), r[0][1].as_str()), (size, count), "{op}");
        assert_eq!(r[0][8], "0", "{op}: #wrong");
        assert_eq!(r[0][12], "0", "{op}: #wrong");
    }
    // 16-byte rounding: 1000 bytes of doubles over 3 ranks = 41 per rank, 40 after rounding.
    let (_, r) = bench_ok(
        &[
            "all_gather",
            "-g",
            "3",
            "-b",
            "1000",
            "-e",
            "1000",
            "-d",
            "double",
        ],
        "3",
    );
    assert_eq!((r[0][0].as_str(), r[0][1].as_str()), ("960", "40"));
}

#[test]
fn all_types_all_ops_and_every_root_produce_every_row() {
    // all_reduce.cu's AllReduceRunTest: every type, then every op, then every size.
    let (o, r) = bench_ok(
        &[
            "all_reduce",
            "-g",
            "2",
            "-b",
            "64",
            "-e",
            "128",
            "-f",
            "2",
            "-d",
            "all",
            "-o",
            "all",
        ],
        "2",
    );
    let types = [
        "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
        "bfloat16",
    ];
    let ops = ["sum", "prod", "max", "min", "avg"];
    let mut want = Vec::new();
    for t in types {
        for op in ops {
            for size in ["64", "128"] {
                want.push((size.to_string(), t.to_string(), op.to_string()));
            }
        }
    }
    let got: Vec<(String, String, String)> = r
        .iter()
        .map(|r| (r[0].clone(), r[2].clone(), r[3].clone()))
        .collect();
    assert_eq!(got, want, "{}", text(&o));
    assert!(
        r.iter().all(|r| r[8] == "0" && r[12] == "0"),
        "{}",
        text(&o)
    );
    // broadcast.cu: -r -1 runs every root in turn, and prints the root; no reduction.
    let (_, r) = bench_ok(
        &["broadcast", "-g", "3", "-b", "1K", "-e", "1K", "-r", "-1"],
        "3",
    );
    let roots: Vec<&str> = r.iter().map(|r| r[4].as_str()).collect();
    assert_eq!(roots, ["0", "1", "2"]);
    assert!(r.iter().all(|r| r[3] == "none"));
    // reduce.cu: types x ops x roots.
    let (_, r) = bench_ok(
        &[
            "reduce", "-g", "2", "-b", "1K", "-e", "1K", "-r", "-1", "-o", "all", "-d", "int32",
        ],
        "2",
    );
    assert_eq!(r.len(), 5 * 2);
    // all_gather.cu runs no reduction: -o all gives one row per size, redop none.
    let (_, r) = bench_ok(
        &["all_gather", "-g", "2", "-b", "1K", "-e", "1K", "-o", "all"],
        "2",
    );
    assert_eq!(r.len(), 1);
    assert_eq!((r[0][3].as_str(), r[0][4].as_str()), ("none", "-1"));
    // sendrecv.cu loops over the ops too and prints their names.
    let (_, r) = bench_ok(
        &["sendrecv", "-g", "2", "-b", "1K", "-e", "1K", "-o", "all"],
        "2",
    );
    let ops_got: Vec<&str> = r.iter().map(|r| r[3].as_str()).collect();
    assert_eq!(ops_got, ops);
}

#[test]
fn step_bytes_check_count_and_cputime_are_honoured() {
    // -f 1 (nccl-tests' default) adds -i bytes.
    let (o, r) = bench_ok(
        &["all_reduce", "-g", "2", "-b", "1K", "-e", "3K", "-i", "1K"],
        "2",
    );
    let sizes: Vec<&str> = r.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(sizes, ["1024", "2048", "3072"]);
    assert!(text(&o).contains("step: 1024(bytes)"), "{}", text(&o));
    // -c 0: no check, #wrong is N/A (util.cu's writeBenchmarkLineBody).
    let (o, r) = bench_ok(
        &[
            "all_reduce",
            "-g",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-c",
            "0",
            "-C",
            "1",
        ],
        "2",
    );
    assert_eq!((r[0][8].as_str(), r[0][12].as_str()), ("N/A", "N/A"));
    assert!(
        text(&o).contains(" cputime ") && text(&o).contains("validation: 0"),
        "{}",
        text(&o)
    );
    // -m, -z, -u, -N, -a, -T, -S: honoured, and the results stay right.
    let (o, r) = bench_ok(
        &[
            "all_gather",
            "-g",
            "3",
            "-b",
            "1K",
            "-e",
            "2K",
            "-f",
            "2",
            "-m",
            "3",
            "-z",
            "1",
            "-u",
            "3",
            "-N",
            "2",
            "-a",
            "3",
            "-T",
            "30",
            "-S",
            "1",
            "-c",
            "2",
        ],
        "3",
    );
    let t = text(&o);
    assert_eq!(r.len(), 4, "{t}"); // two sizes, two cycles
    assert!(
        r.iter()
            .all(|r| r.len() == 15 && r[8] == "0" && r[12] == "0"),
        "{t}"
    );
    assert!(
        t.contains("agg iters: 3") && t.contains("unalign: 3") && t.contains("# Blocking Enabled"),
        "{t}"
    );
}

#[test]
fn nccl_tests_flags_unihal_cannot_honour_are_refused_naming_the_flag_and_why() {
    for (args, flag, why) in [
        (&["-t", "2"][..], "`-t/--nthreads`", "one thread"),
        (&["--nthreads", "4"], "`-t/--nthreads`", "one thread"),
        (
            &["-G", "1"],
            "`-G/--cudagraph`",
            "not supported by unihal bench",
        ),
        (&["--cudagraph=5"], "`-G/--cudagraph`", "CUDA graphs"),
        (&["-R", "1"], "`-R/--local_register`", "not supported"),
        (&["-x", "1"], "`-x/--cta_policy`", "not supported"),
        (
            &["-D", "1"],
            "`-D/--device_implementation`",
            "not supported",
        ),
        (&["-V", "16"], "`-V/--device_cta_count`", "not supported"),
        (&["-M", "1"], "`-M/--memory`", "not supported"),
        (&["-I", "1"], "`-I/--per_iter_timing`", "not supported"),
        (&["-K", "2"], "`-K/--per_iter_skip`", "not supported"),
        (&["-y", "1"], "`-y/--stream_null`", "NULL stream"),
        (&["-p", "1"], "`-p/--parallel_init`", "not supported"),
        (&["-o", "mulsum"], "`-o/--op`", "premultiplied"),
        (
            &["-o", "nosuch"],
            "`-o/--op`",
            "sum, prod, max, min, avg, all",
        ),
        (&["-d", "f8e5m2"], "`-d/--datatype`", "no fp8"),
        (&["-d", "nosuch"], "`-d/--datatype`", "bfloat16"),
        (&["-z", "4"], "`-z/--blocking`", "wait"),
        (&["-a", "4"], "`-a/--average`", "maximum"),
        (&["-r", "-2"], "`-r/--root`", "-1"),
        (&["-r", "9"], "`-r/--root`", "below 2"),
        (&["-m", "0"], "`-m/--agg_iters`", "1 or more"),
        (&["-J", "out.csv"], "`-J/--output_file`", ".json"),
        (&["-b", "12Q"], "`-b/--minbytes`", "K, M or G"),
        (
            &["-b", "1K", "-e", "4K", "-i", "0"],
            "`-i/--stepbytes`",
            "1 or more",
        ),
    ] {
        let mut all = vec!["bench", "broadcast", "--backend", "cpu", "-g", "2"];
        all.extend(args);
        let o = unihal(&all, "2");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {t}");
        assert!(t.contains(flag) && t.contains(why), "{all:?}: {t}");
        assert!(!t.contains("unexpected argument"), "{all:?}: {t}");
        assert!(rows(&o).is_empty(), "{all:?}: {t}");
    }
}

#[test]
fn unknown_collectives_list_the_valid_ones() {
    for name in ["gather", "nosuch"] {
        let o = unihal(&["bench", name, "--backend", "cpu"], "2");
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{t}");
        for valid in [
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "broadcast",
            "reduce",
            "alltoall",
            "sendrecv",
        ] {
            assert!(t.contains(valid), "{name}: {t}");
        }
    }
    // nccl-tests' binary names are accepted.
    bench_ok(&["all_reduce_perf", "-g", "2", "-b", "1K", "-e", "1K"], "2");
}

#[test]
fn the_footer_lines_come_together_and_unihal_lines_follow_commented() {
    let (o, _) = bench_ok(
        &["all_reduce", "-g", "2", "-b", "1K", "-e", "4K", "-f", "2"],
        "2",
    );
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let lines: Vec<&str> = out.lines().collect();
    let oob = lines
        .iter()
        .position(|l| l.starts_with("# Out of bounds values : 0 OK"))
        .expect("the footer");
    // util.cu's writeResultFooter: "# %-20s : %g %s" right after the out-of-bounds line.
    assert!(
        lines[oob + 1].starts_with("# Avg bus bandwidth    : "),
        "{out}"
    );
    assert_eq!(lines[oob + 2], "#", "{out}");
    assert_eq!(
        lines[oob + 3],
        "# Collective test concluded: all_reduce_perf",
        "{out}"
    );
    // Everything after the footer is a comment (unihal's bytes-moved line among them) or the
    // final empty line.
    assert!(
        lines[oob..]
            .iter()
            .all(|l| l.is_empty() || l.starts_with('#')),
        "{out}"
    );
    assert!(
        lines[oob + 4..]
            .iter()
            .any(|l| l.starts_with("# Bytes moved by the algorithm")),
        "{out}"
    );
    // The table header as util.cu's writeResultHeader prints it.
    assert!(
        out.contains(
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n"
        ),
        "{out}"
    );
    assert!(
        out.contains("# Using devices\n#  Rank  0 Group  0 Pid "),
        "{out}"
    );
    assert!(out.contains("\n#  Rank  1 Group  0 Pid "), "{out}");
}

/// A JSON value that keeps the order of an object's keys (serde_json's map sorts them).
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Num(f64),
    Str(String),
    List(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn keys(&self) -> Vec<&str> {
        match self {
            J::Obj(kv) => kv.iter().map(|(k, _)| k.as_str()).collect(),
            other => panic!("not an object: {other:?}"),
        }
    }
    fn get(&self, key: &str) -> &J {
        match self {
            J::Obj(kv) => &kv.iter().find(|(k, _)| k == key).expect(key).1,
            other => panic!("not an object: {other:?}"),
        }
    }
    fn list(&self) -> &[J] {
        match self {
            J::List(v) => v,
            other => panic!("not a list: {other:?}"),
        }
    }
    fn num(&self) -> f64 {
        match self {
            J::Num(v) => *v,
            other => panic!("not a number: {other:?}"),
        }
    }
    fn str(&self) -> &str {
        match self {
            J::Str(v) => v,
            other => panic!("not a string: {other:?}"),
        }
    }
}

/// Parses `s` (checked against serde_json first), keeping key order.
fn parse(s: &str) -> J {
    serde_json::from_str::<serde_json::Value>(s).expect("valid JSON");
    fn value(b: &[u8], i: &mut usize) -> J {
        match b[*i] {
            b'{' => {
                *i += 1;
                let mut kv = Vec::new();
                while b[*i] != b'}' {
                    if b[*i] == b',' {
                        *i += 1;
                    }
                    let J::Str(k) = value(b, i) else {
                        panic!("key")
                    };
                    assert_eq!(b[*i], b':');
                    *i += 1;
                    kv.push((k, value(b, i)));
                }
                *i += 1;
                J::Obj(kv)
            }
            b'[' => {
                *i += 1;
                let mut v = Vec::new();
                while b[*i] != b']' {
                    if b[*i] == b',' {
                        *i += 1;
                    }
                    v.push(value(b, i));
                }
                *i += 1;
                J::List(v)
            }
            b'"' => {
                let start = *i;
                *i += 1;
                while b[*i] != b'"' {
                    *i += if b[*i] == b'\\' { 2 } else { 1 };
                }
                *i += 1;
                J::Str(serde_json::from_slice(&b[start..*i]).unwrap())
            }
            b'n' => {
                *i += 4;
                J::Null
            }
            _ => {
                let start = *i;
                while !matches!(b[*i], b',' | b'}' | b']') {
                    *i += 1;
                }
                J::Num(std::str::from_utf8(&b[start..*i]).unwrap().parse().unwrap())
            }
        }
    }
    let mut i = 0;
    value(s.trim().as_bytes(), &mut i)
}

#[test]
fn json_output_has_nccl_tests_layout_field_by_field() {
    let dir = std::env::temp_dir().join(format!("unihal-bench-json-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    let p = path.to_str().unwrap();
    let (o, r) = bench_ok(
        &[
            "reduce_scatter",
            "-g",
            "3",
            "-b",
            "1K",
            "-e",
            "2K",
            "-f",
            "2",
            "-J",
            p,
        ],
        "3",
    );
    let t = text(&o);
    assert!(t.contains(&format!("# Writing JSON output to {p}")), "{t}");
    let raw = std::fs::read_to_string(&path).unwrap();
    let d = parse(&raw);
    // util.cu, jsonOutputInit: version, start_time, args, env, nccl_version; writeDeviceReport:
    // config (devices inside it); writeResultHeader: results; writeResultFooter: out_of_bounds,
    // average_bus_bandwidth; writeErrors: errors; jsonOutputFinalize: end_time.
    assert_eq!(
        d.keys(),
        [
            "version",
            "start_time",
            "args",
            "env",
            "nccl_version",
            "config",
            "results",
            "out_of_bounds",
            "average_bus_bandwidth",
            "errors",
            "end_time"
        ],
        "{raw}"
    );
    assert_eq!(d.get("version").num(), 3.0); // JSON_FILE_VERSION
    for k in ["start_time", "end_time"] {
        // TIME_STRING_FORMAT "%Y-%m-%d %H:%M:%S"
        let s = d.get(k).str();
        assert_eq!(
            (s.len(), &s[4..5], &s[10..11], &s[13..14]),
            (19, "-", " ", ":"),
            "{s}"
        );
    }
    let args: Vec<&str> = d.get("args").list().iter().map(J::str).collect();
    assert_eq!(&args[1..4], ["bench", "reduce_scatter", "-g"]);
    assert!(d.get("env").list().iter().all(|e| e.str().contains('=')));
    d.get("nccl_version").num();
    // writeDeviceReport's config object; step_factor because -f is above 1; booleans are the
    // strings "true"/"false" (jsonBool).
    let c = d.get("config");
    assert_eq!(
        c.keys(),
        [
            "nthreads",
            "ngpus",
            "minimum_bytes",
            "maximum_bytes",
            "step_factor",
            "warmup_iters",
            "iterations",
            "aggregated_iterations",
            "validation",
            "graph",
            "blocking_collectives",
            "per_iter_timing",
            "per_iter_skip",
            "parallel_init",
            "devices"
        ]
    );
    assert_eq!(
        [
            c.get("nthreads").num(),
            c.get("ngpus").num(),
            c.get("minimum_bytes").num(),
            c.get("maximum_bytes").num(),
            c.get("step_factor").num(),
            c.get("warmup_iters").num(),
            c.get("iterations").num(),
            c.get("aggregated_iterations").num(),
            c.get("validation").num(),
            c.get("graph").num(),
            c.get("per_iter_skip").num(),
        ],
        [1.0, 3.0, 1024.0, 2048.0, 2.0, 0.0, 2.0, 1.0, 1.0, 0.0, 0.0]
    );
    assert_eq!(c.get("blocking_collectives").str(), "false");
    assert_eq!(c.get("per_iter_timing").str(), "false");
    assert_eq!(c.get("parallel_init").str(), "false");
    // jsonRankInfo: one object per rank.
    let devs = c.get("devices").list();
    assert_eq!(devs.len(), 3);
    for (i, dev) in devs.iter().enumerate() {
        assert_eq!(
            dev.keys(),
            [
                "rank",
                "group",
                "pid",
                "hostname",
                "device",
                "device_hex",
                "device_info"
            ]
        );
        assert_eq!(dev.get("rank").num(), i as f64);
        assert_eq!(dev.get("device").num(), i as f64);
        assert_eq!(dev.get("device_hex").str(), format!("cpu:{i}"));
        assert!(!dev.get("hostname").str().is_empty());
    }
    // writeBenchmarkLinePreamble / Body / Terminator: one object per row, as printed.
    let res = d.get("results").list();
    assert_eq!(res.len(), r.len());
    assert_eq!(res.len(), 2);
    for (row, j) in r.iter().zip(res) {
        assert_eq!(
            j.keys(),
            [
                "size",
                "count",
                "type",
                "redop",
                "root",
                "out_of_place",
                "in_place",
                "actual_iterations",
                "experiment_name"
            ]
        );
        assert_eq!(j.get("size").num().to_string(), row[0]);
        assert_eq!(j.get("count").num().to_string(), row[1]);
        assert_eq!(j.get("type").str(), "float");
        assert_eq!(j.get("redop").str(), "sum");
        // The root is the string sprintf("%6i") made.
        assert_eq!(j.get("root").str(), "    -1");
        assert_eq!(j.get("actual_iterations").num(), 2.0);
        assert_eq!(j.get("experiment_name").str(), "");
        for (k, base) in [("out_of_place", 5), ("in_place", 9)] {
            let pl = j.get(k);
            assert_eq!(pl.keys(), ["time", "alg_bw", "bus_bw", "nwrong"]);
            assert!(pl.get("time").num() > 0.0);
            let (alg, bus) = (pl.get("alg_bw").num(), pl.get("bus_bw").num());
            assert!((bus - alg * 2.0 / 3.0).abs() < 2e-6, "{alg} {bus}");
            assert_eq!(pl.get("nwrong").num(), 0.0);
            let printed: f64 = row[base + 1].parse().unwrap();
            assert!(
                (printed - alg).abs() <= 0.006 + 0.01 * alg,
                "{printed} vs {alg}"
            );
        }
    }
    // r/s rows: per-rank count 1024/4/3 = 85 floats → 84 (16-byte rounding).
    assert_eq!(res[0].get("count").num(), 84.0);
    assert_eq!(res[0].get("size").num(), 1008.0);
    let oob = d.get("out_of_bounds");
    assert_eq!(oob.keys(), ["count", "okay"]);
    assert_eq!(
        (oob.get("count").num(), oob.get("okay").str()),
        (0.0, "true")
    );
    let bw = d.get("average_bus_bandwidth");
    assert_eq!(bw.keys(), ["bandwidth", "okay"]);
    assert!(bw.get("bandwidth").num() > 0.0);
    assert_eq!(bw.get("okay").str(), "unchecked");
    assert_eq!(d.get("errors"), &J::List(vec![]));
    // Doubles are written with %lf (six decimals).
    for num in raw.split("\"alg_bw\":").skip(1) {
        let num = &num[..num.find(',').unwrap()];
        let decimals = num.split_once('.').map(|(_, d)| d.len());
        assert_eq!(decimals, Some(6), "{num}");
    }

    // A second run does not overwrite: the file gets a .0 suffix (fopen "wx"); -c 0 and -C 1
    // write nwrong null and cpu_time.
    let (o, _) = bench_ok(
        &[
            "all_reduce",
            "-g",
            "2",
            "-b",
            "1K",
            "-e",
            "1K",
            "-J",
            p,
            "-c",
            "0",
            "-C",
            "1",
        ],
        "2",
    );
    let second = format!("{p}.0");
    assert!(text(&o).contains(&format!("# Writing JSON output to {second}")));
    let d = parse(&std::fs::read_to_string(&second).unwrap());
    let c = d.get("config");
    assert!(c.keys().contains(&"step_bytes") && !c.keys().contains(&"step_factor"));
    let pl = d.get("results").list()[0].get("out_of_place");
    assert_eq!(pl.keys(), ["cpu_time", "alg_bw", "bus_bw", "nwrong"]);
    assert_eq!(pl.get("nwrong"), &J::Null);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Under `mpirun`, rank 0 lists every rank's device, gathered through the communicator.
#[cfg(feature = "mpi")]
#[test]
fn under_mpirun_every_rank_is_listed() {
    let launcher = std::env::var("UNIHAL_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let o = Command::new(launcher)
        .args(["--allow-run-as-root", "--oversubscribe", "-n", "3"])
        .arg(env!("CARGO_BIN_EXE_unihal"))
        .args([
            "bench",
            "all_gather",
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "2",
            "-n",
            "2",
            "-g",
            "1",
        ])
        .env("UNIHAL_CPU_CCL", "mpi")
        .env("UNIHAL_CPU_DEVICES", "1")
        .env_remove("UNIHAL_BACKENDS")
        .output()
        .expect("cannot start mpirun; install openmpi-bin");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for r in 0..3 {
        assert_eq!(
            t.matches(&format!("#  Rank {r:2} Group  0 Pid ")).count(),
            1,
            "rank {r}: {t}"
        );
    }
    let pids: std::collections::BTreeSet<&str> = t
        .lines()
        .filter(|l| l.starts_with("#  Rank "))
        .filter_map(|l| l.split_whitespace().nth(6))
        .collect();
    assert_eq!(pids.len(), 3, "one process per rank: {t}");
    // Per-rank count over the 3-rank world; printed once (rank 0).
    let r = rows(&o);
    assert_eq!(r.len(), 3, "{t}");
    assert_eq!((r[0][0].as_str(), r[0][1].as_str()), ("1008", "84"), "{t}");
    assert!(
        t.contains("# Out of bounds values : 0 OK\n# Avg bus bandwidth"),
        "{t}"
    );
}
