//! The `unihal` command: list devices, run the conformance suite.

use clap::{Parser, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use unihal::{Backend, BackendInfo, Capabilities, DeviceInfo, MemoryInfo};
use unihal_conformance::{runner, RunOptions};

#[derive(Parser)]
#[command(name = "unihal", version = unihal::VERSION, long_version = unihal::BUILD_INFO,
    about = "unihal: one device layer for CPUs, NVIDIA, AMD/Hygon and Ascend accelerators")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Check FILE against the Trace Event Format's rules, then print per device the busy share
    /// of each stream, the top ops by device time, the communication share (and how much of it
    /// no compute overlapped) and the longest idle gaps.
    Summary {
        file: PathBuf,
        /// How many ops and gaps to list per device.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// List backends (available or not, with the reason) and their devices.
    Devices {
        /// Backends to list (comma-separated; default: UNIHAL_BACKENDS or all registered).
        #[arg(long)]
        backend: Option<String>,
        /// Print JSON instead of text (everything the text shows, the plugins included).
        #[arg(long)]
        json: bool,
        /// List every library path tried, not only the outcome.
        #[arg(short, long)]
        verbose: bool,
    },
    /// Run the conformance suite on every device of the selected backends (or, with --list,
    /// print its case ids).
    Conformance {
        /// Print the case ids, one per line, and their count (on stderr), and run nothing. With
        /// FILTER, only ids that contain it (a substring, as --filter: `memory.copy.` is a
        /// prefix, `.f16.` every case of that dtype).
        #[arg(long, value_name = "FILTER", num_args = 0..=1, default_missing_value = "")]
        list: Option<String>,
        /// Backends to test (comma-separated; default: UNIHAL_BACKENDS or all registered).
        #[arg(long)]
        backend: Option<String>,
        /// Only cases whose id contains this text.
        #[arg(long)]
        filter: Option<String>,
        /// Only the Kth of N shares of the selected cases (K/N, 1 <= K <= N): case i of the
        /// selection runs in share i mod N + 1, so the N shares together run every case once.
        #[arg(long, value_name = "K/N")]
        partition: Option<unihal_conformance::runner::Partition>,
        /// Write conformance.json, conformance.xml (JUnit) and summary.txt into this directory.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Run each case in its own process.
        #[arg(long)]
        isolate: bool,
        /// Fail on an unexpected pass of a case the manifest marks xfail.
        #[arg(long)]
        verify: bool,
        /// Watchdog limit per case, in seconds (at least 0.001).
        #[arg(long, default_value = "60", value_parser = seconds)]
        timeout_s: Duration,
        /// Only the first N devices of each backend (1 or more).
        #[arg(long, value_parser = at_least_one)]
        max_devices: Option<usize>,
    },
    /// Read a timeline written with UNIHAL_TRACE=FILE.
    Trace {
        #[command(subcommand)]
        what: TraceCmd,
    },
    /// Benchmark a collective with nccl-tests' flags, output and JSON file (all_reduce,
    /// all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv); nccl-tests flags
    /// unihal cannot honour are refused with the reason.
    // A flag given twice takes its last value, as getopt_long gives it to nccl-tests.
    #[command(args_override_self = true)]
    Bench {
        /// The collective.
        op: String,
        /// Backend whose devices are the ranks (default: the first of UNIHAL_BACKENDS, else
        /// the first registered backend that has devices and collectives: cpu, cuda).
        #[arg(long)]
        backend: Option<String>,
        #[command(flatten)]
        flags: Box<unihal::bench::NcclFlags>,
    },
}

#[derive(Serialize)]
struct DeviceEntry {
    info: DeviceInfo,
    memory: Option<MemoryInfo>,
    capabilities: Capabilities,
}

#[derive(Serialize)]
struct BackendEntry {
    name: String,
    available: bool,
    reason: Option<String>,
    info: BackendInfo,
    /// The collective engine and its capabilities (None: the backend has none).
    collectives: Option<unihal::CclCaps>,
    devices: Vec<DeviceEntry>,
}

fn list(backend: &dyn Backend) -> BackendEntry {
    let (devices, reason) = match backend.probe() {
        Ok(n) => {
            let mut devs = Vec::new();
            let mut reason = None;
            for i in 0..n {
                match backend.open(i) {
                    Ok(d) => devs.push(DeviceEntry {
                        info: d.info().clone(),
                        memory: d.memory_info().ok(),
                        capabilities: d.capabilities().clone(),
                    }),
                    Err(e) => reason = Some(format!("device {i}: {e}")),
                }
            }
            (devs, reason)
        }
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    BackendEntry {
        name: backend.name().into(),
        available: !devices.is_empty(),
        reason,
        info: backend.info(),
        collectives: backend.collectives().map(|c| c.capabilities().clone()),
        devices,
    }
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

/// What `unihal devices` reports about plugins (`UNIHAL_PLUGIN_PATH`).
#[derive(Serialize)]
struct PluginsEntry {
    /// The variable's value (None: unset).
    path: Option<String>,
    /// Every library tried: its path and the backend it registered, or why it was refused.
    attempts: Vec<PluginAttempt>,
}

#[derive(Serialize)]
struct PluginAttempt {
    path: String,
    backend: Option<String>,
    refused: Option<String>,
}

/// `unihal devices --json`.
#[derive(Serialize)]
struct DevicesReport<'a> {
    backends: &'a [BackendEntry],
    plugins: PluginsEntry,
}

/// A library's "not found" message split into its outcome and the names tried (our loaders
/// write `no X found, tried A: why; B: why (set VAR to ...)`).
fn split_tried(error: &str) -> (String, Vec<String>) {
    let Some(at) = error.find(", tried ") else {
        return (error.to_string(), Vec::new());
    };
    let rest = &error[at + ", tried ".len()..];
    let (list, hint) = match rest.rfind(" (set ") {
        Some(h) => (&rest[..h], rest[h + 2..].trim_end_matches(')')),
        None => (rest, ""),
    };
    let tried: Vec<String> = list.split("; ").map(str::to_string).collect();
    let mut head = format!("{}, {} names tried", &error[..at], tried.len());
    if !hint.is_empty() {
        head.push_str(&format!("; {hint}"));
    }
    (head, tried)
}

fn devices(backend: Option<String>, json: bool, verbose: bool) -> ExitCode {
    let asked = backend
        .clone()
        .or_else(|| unihal::settings::get(unihal::BACKENDS_ENV));
    let backends = match unihal::registry().select(asked.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("unihal: {e}");
            return ExitCode::from(2);
        }
    };
    let entries: Vec<BackendEntry> = backends.iter().map(|b| list(&**b)).collect();
    let plugins = PluginsEntry {
        path: unihal::settings::get(unihal::plugin::host::PATH_ENV),
        attempts: unihal::plugin::host::attempts()
            .into_iter()
            .map(|a| PluginAttempt {
                path: a.path.clone(),
                backend: a.outcome.as_ref().ok().map(|n| n.to_string()),
                refused: a.outcome.as_ref().err().map(|w| w.to_string()),
            })
            .collect(),
    };
    // A backend asked for by name that is unavailable fails the command (scripts check it);
    // listing every backend fails only when none is available.
    let failed = if asked.is_some() {
        entries.iter().any(|e| !e.available)
    } else {
        !entries.iter().any(|e| e.available)
    };
    let code = if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    };
    if json {
        let report = DevicesReport {
            backends: &entries,
            plugins,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("serialisable")
        );
        return code;
    }
    for e in &entries {
        let status = if e.available {
            "Available"
        } else {
            "Unavailable"
        };
        // The reason once: a library line below that says it already is not repeated here.
        let shown_below = |r: &str| {
            e.info.libraries.iter().any(|l| {
                l.error
                    .as_deref()
                    .is_some_and(|w| w.contains(r) || r.contains(w))
            })
        };
        let reason = match e.reason.as_deref() {
            Some(r) if shown_below(r) => " (see its libraries)".to_string(),
            Some(r) => format!(": {r}"),
            None => String::new(),
        };
        println!(
            "{} {} — {status}{}{reason}",
            e.name,
            e.info.version,
            if e.info.simulated {
                " (SIMULATED runtime)"
            } else {
                ""
            },
        );
        for l in &e.info.libraries {
            let version = l.version.as_deref().unwrap_or("(version unknown)");
            match (&l.error, &l.path) {
                (None, path) => println!(
                    "  {:<17} {} {version} found at {}",
                    l.role,
                    l.name,
                    path.as_deref().unwrap_or("?")
                ),
                (Some(why), Some(path)) => {
                    println!(
                        "  {:<17} {} {version} found at {path}, UNUSABLE: {why}",
                        l.role, l.name
                    )
                }
                (Some(why), None) => {
                    let (head, tried) = split_tried(why);
                    println!("  {:<17} {} NOT FOUND: {head}", l.role, l.name);
                    if verbose {
                        for t in tried {
                            println!("  {:<17}   tried {t}", "");
                        }
                    } else if !tried.is_empty() {
                        println!("  {:<17}   (-v lists every name tried)", "");
                    }
                }
            }
        }
        match &e.collectives {
            Some(c) => {
                let ops: Vec<String> = c
                    .ops
                    .iter()
                    .map(|(op, d)| format!("{} ({} dtypes)", op.name(), d.len()))
                    .collect();
                println!(
                    "  collective engine {}: {}; groups {}, split {}, survives a dead rank {}",
                    c.engine,
                    if ops.is_empty() {
                        "no operations".to_string()
                    } else {
                        ops.join(", ")
                    },
                    c.groups,
                    c.split,
                    c.survives_dead_rank
                );
            }
            None => println!("  collective engine: none"),
        }
        let shared = e.devices.len() > 1 && e.name == "cpu";
        for d in &e.devices {
            let (m, o) = (&d.capabilities.mandatory, &d.capabilities.optional);
            let mem = d.memory.map_or("memory ?".into(), |mi| {
                format!(
                    "memory {} total, {} free{}",
                    gib(mi.total),
                    gib(mi.free),
                    if shared {
                        " (its share of the host's memory)"
                    } else {
                        ""
                    }
                )
            });
            println!(
                "  {}  {} ({})  {mem}",
                d.info.id, d.info.name, d.info.vendor
            );
            println!("      arch {}, {} compute units, warp {}, max block {:?} ({} threads), shared {} KiB, modules {:?}",
                o.arch.as_deref().unwrap_or("?"), m.compute_units, m.warp_size, m.max_block, m.max_threads_per_block,
                m.max_shared_mem_per_block / 1024, m.module_formats);
            let feats: Vec<&str> = [
                (o.event_timing, "event-timing"),
                (o.pinned_host_memory, "pinned-host"),
                (o.wide_fill, "wide-fill"),
                (o.host_callbacks, "host-callbacks"),
                (o.stream_ordered_alloc, "stream-ordered-alloc"),
                (o.fault_poisons_device, "fault-poisons-device"),
                (o.negative_strides_copied, "negative-strides-copied"),
            ]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .collect();
            println!(
                "      features: {}; peers {:?}",
                feats.join(", "),
                o.peer_devices
            );
        }
    }
    let var = unihal::plugin::host::PATH_ENV;
    match &plugins.path {
        None => println!("plugins: none loaded ({var} is unset)"),
        Some(spec) => {
            println!("plugins ({var}={spec}):");
            if plugins.attempts.is_empty() {
                println!("  no plugin library found there");
            }
            for a in &plugins.attempts {
                match (&a.backend, &a.refused) {
                    (Some(name), _) => println!("  {}: loaded, backend {name}", a.path),
                    (None, why) => {
                        println!("  {}: REFUSED: {}", a.path, why.as_deref().unwrap_or("?"))
                    }
                }
            }
        }
    }
    if failed {
        eprintln!(
            "unihal devices: {}",
            if asked.is_some() {
                "a backend asked for is unavailable"
            } else {
                "no backend is available"
            }
        );
    }
    code
}

/// Under a launcher whose collective engine connects the processes already (MPI), the SPMD target:
/// this process's device with its rank of the world.
fn spmd_target(targets: &[runner::Target]) -> unihal::Result<Option<runner::Target>> {
    for (i, t) in targets.iter().enumerate() {
        let first_of_backend = !targets[..i]
            .iter()
            .any(|u| std::sync::Arc::ptr_eq(&u.backend, &t.backend));
        if !first_of_backend {
            continue;
        }
        let cfg = unihal::CommConfig::default();
        if let Some(world) = unihal::bootstrap::connected_world(&*t.backend, &cfg)? {
            let id = world.device().id();
            let dev = targets
                .iter()
                .find(|u| std::sync::Arc::ptr_eq(&u.backend, &t.backend) && u.device.id() == id)
                .unwrap_or(t);
            return Ok(Some(runner::Target {
                world: Some(world),
                ..dev.clone()
            }));
        }
    }
    Ok(None)
}

/// `unihal conformance --list [FILTER]`: the case ids that contain `pattern` (and `filter`, when
/// --filter is given too), one per line on stdout, then their count on stderr.
fn list_cases(pattern: &str, filter: Option<&str>) -> ExitCode {
    let cases = unihal_conformance::cases::all();
    let mut ids: Vec<&str> = cases
        .iter()
        .map(|c| &*c.id)
        .filter(|id| id.contains(pattern) && filter.is_none_or(|f| id.contains(f)))
        .collect();
    ids.sort_unstable();
    let mut out = String::with_capacity(ids.len() * 40);
    for id in &ids {
        out.push_str(id);
        out.push('\n');
    }
    // One write: a closed pipe (`| head`) ends the listing quietly.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
    let what = match (pattern, filter) {
        ("", None) => String::new(),
        (p, None) | ("", Some(p)) => format!(" containing {p:?}"),
        (p, Some(f)) => format!(" containing {p:?} and {f:?}"),
    };
    eprintln!("{} of {} cases{what}", ids.len(), cases.len());
    if ids.is_empty() {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// Refuses a selection that would not test what the user meant because of a refused plugin
/// (`unihal_plugin::host::selection_problem`): a backend not registered because its plugin was
/// refused, or a built-in backend whose name a refused plugin gave.
fn check_selection(backend: Option<&str>) -> Result<(), String> {
    let registry = unihal::registry();
    let spec = backend
        .map(str::to_string)
        .or_else(|| std::env::var(unihal::BACKENDS_ENV).ok())
        .filter(|s| !s.trim().is_empty());
    let names: Vec<String> = match spec {
        Some(s) => s
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect(),
        None => registry.names(),
    };
    let attempts = unihal::plugin::host::attempts();
    for n in &names {
        if let Some(why) = unihal::plugin::host::selection_problem(registry, n, &attempts) {
            return Err(why);
        }
    }
    Ok(())
}

fn conformance(
    backend: Option<String>,
    mut opts: RunOptions,
    report: Option<PathBuf>,
    max_devices: Option<usize>,
) -> ExitCode {
    if let Err(why) = check_selection(backend.as_deref()) {
        eprintln!("unihal: {why}");
        return ExitCode::from(2);
    }
    let (mut targets, unavailable) = match runner::discover(unihal::registry(), backend.as_deref())
    {
        Ok(t) => t,
        Err(e) => {
            eprintln!("unihal: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(max) = max_devices {
        targets.retain(|t| (t.device.id().ordinal as usize) < max);
    }
    let mut rank = 0;
    match spmd_target(&targets) {
        Ok(Some(t)) => {
            let w = t.world.as_ref().expect("SPMD target has a world");
            rank = w.rank();
            if rank == 0 {
                println!(
                    "SPMD run: {} ranks of {}, one per process",
                    w.size(),
                    t.backend
                        .collectives()
                        .map_or("?".into(), |c| c.capabilities().engine.clone())
                );
            }
            targets = vec![t];
            opts.isolate = false;
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("unihal: cannot join the SPMD world: {e}");
            report_to_launcher(&format!("cannot join the SPMD world: {e}"));
            return ExitCode::from(2);
        }
    }
    let cases = unihal_conformance::cases::all();
    if !cases.iter().any(|c| runner::selected(&c.id, &opts)) {
        eprintln!(
            "unihal: no case matches the filter {:?}",
            opts.filter.as_deref().unwrap_or("")
        );
        return ExitCode::from(2);
    }
    let report_data = runner::run(&targets, unavailable, &cases, &opts);
    if rank == 0 {
        print!("{}", report_data.summary());
    } else {
        let c = &report_data.targets[0].counts;
        // One write, so lines of concurrent ranks do not interleave under mpirun.
        let line = format!(
            "rank {rank}: {} passed, {} failed, {} skipped\n",
            c.passed, c.failed, c.skipped
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    if let Some(dir) = report.filter(|_| rank == 0) {
        if let Err(e) = report_data.write_to(&dir) {
            eprintln!("unihal: cannot write reports to {}: {e}", dir.display());
            return ExitCode::from(2);
        }
        println!("reports written to {}", dir.display());
    }
    if report_data.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn bench_cmd(cmd: Cmd) -> ExitCode {
    let Cmd::Bench { op, backend, flags } = cmd else {
        unreachable!()
    };
    let o = match flags.options(&op, std::env::args().collect()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("unihal bench: {e}");
            return ExitCode::from(2);
        }
    };
    let b = match bench_backend(backend.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("unihal bench: {e}");
            return ExitCode::from(2);
        }
    };
    match unihal::bench::run(&*b, &o, &mut std::io::stdout()) {
        // As nccl-tests: failed checks, or an average below NCCL_TESTS_MIN_BW, fail the run.
        Ok(r) if r.errors == 0 && r.bandwidth_ok => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e @ unihal::HalError::InvalidArgument { .. }) => {
            eprintln!("unihal bench: {e}");
            report_to_launcher(&e);
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("unihal bench: {e}");
            report_to_launcher(&e);
            ExitCode::FAILURE
        }
    }
}

/// Under a launcher that collects errors (torchrun's error file), hands it this rank's error.
fn report_to_launcher(e: &dyn std::fmt::Display) {
    if let Ok(info) = unihal::bootstrap::LaunchInfo::from_env() {
        unihal::bootstrap::report_failure(&info, e);
    }
}

/// The backend `unihal bench` measures: the one named, else the first selected by
/// `UNIHAL_BACKENDS` (or registered) that has devices and a collective engine.
fn bench_backend(name: Option<&str>) -> Result<std::sync::Arc<dyn Backend>, String> {
    if let Some(n) = name {
        return unihal::registry().get(n).map_err(|e| e.to_string());
    }
    let all = unihal::registry()
        .select_from_env()
        .map_err(|e| e.to_string())?;
    let mut why = Vec::new();
    for b in all {
        match (b.probe(), b.collectives().is_some()) {
            (Ok(_), true) => return Ok(b),
            (Ok(_), false) => why.push(format!("{}: no collective engine", b.name())),
            (Err(e), _) => why.push(format!("{}: {e}", b.name())),
        }
    }
    Err(format!("no backend to benchmark ({})", why.join("; ")))
}

/// A command-line number of seconds: finite and at least 0.001.
fn seconds(v: &str) -> Result<Duration, String> {
    unihal::settings::seconds(v)
        .ok_or_else(|| format!("{v:?} is not a number of seconds of at least 0.001"))
}

/// A command-line count of 1 or more.
fn at_least_one(v: &str) -> Result<usize, String> {
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{v:?} is not an integer of 1 or more")),
    }
}

fn main() -> ExitCode {
    // Logging first: making the registry loads the plugins, and their loads are logged.
    unihal::init_logging_or_exit("unihal");
    unihal_conformance::run_child_if_requested(unihal::registry());
    let code = match Cli::parse().command {
        Cmd::Devices {
            backend,
            json,
            verbose,
        } => devices(backend, json, verbose),
        Cmd::Conformance {
            list: Some(pattern),
            filter,
            ..
        } => list_cases(&pattern, filter.as_deref()),
        Cmd::Conformance {
            list: None,
            backend,
            filter,
            partition,
            report,
            isolate,
            verify,
            timeout_s,
            max_devices,
        } => conformance(
            backend,
            RunOptions {
                filter,
                partition,
                verify,
                isolate,
                timeout: timeout_s,
            },
            report,
            max_devices,
        ),
        Cmd::Trace {
            what: TraceCmd::Summary { file, top, json },
        } => trace_summary(&file, top, json),
        cmd @ Cmd::Bench { .. } => bench_cmd(cmd),
    };
    // UNIHAL_TRACE: the run's timeline, written once its work is done.
    if let Err(e) = unihal::layer::trace::finish() {
        eprintln!("unihal: {e}");
        return ExitCode::FAILURE;
    }
    code
}

/// `unihal trace summary FILE`.
fn trace_summary(file: &std::path::Path, top: usize, json: bool) -> ExitCode {
    let doc = match std::fs::read(file)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| format!("not JSON: {e}")))
    {
        Ok(d) => d,
        Err(e) => {
            eprintln!("unihal trace summary: {}: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    let text = match unihal::layer::trace::summary::summarize(&doc, top) {
        Ok(s) if json => serde_json::to_string_pretty(&s).unwrap_or_default() + "\n",
        Ok(s) => s.to_string(),
        Err(e) => {
            eprintln!(
                "unihal trace summary: {} breaks the Trace Event Format's rules:\n{e}",
                file.display()
            );
            return ExitCode::FAILURE;
        }
    };
    // A reader that stops early (`| head`) is not an error.
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes());
    ExitCode::SUCCESS
}
