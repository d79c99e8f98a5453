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
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
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
        /// Write conformance.json, conformance.xml (JUnit) and summary.txt into this directory.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Run each case in its own process.
        #[arg(long)]
        isolate: bool,
        /// Fail on an unexpected pass of a case the manifest marks xfail.
        #[arg(long)]
        verify: bool,
        /// Watchdog limit per case, in seconds.
        #[arg(long, default_value_t = 60.0)]
        timeout_s: f64,
        /// Only the first N devices of each backend.
        #[arg(long)]
        max_devices: Option<usize>,
    },
    /// Read a timeline written with UNIHAL_TRACE=FILE.
    Trace {
        #[command(subcommand)]
        what: TraceCmd,
    },
    /// Benchmark a collective with nccl-tests' flags and output (all_reduce, all_gather,
    /// reduce_scatter, broadcast, reduce, alltoall, sendrecv).
    Bench {
        /// The collective.
        op: String,
        /// Backend whose devices are the ranks (default: the first of UNIHAL_BACKENDS, else
        /// the first registered backend that has devices and collectives: cpu, cuda).
        #[arg(long)]
        backend: Option<String>,
        /// Number of ranks (devices); 0 = all devices.
        #[arg(short = 'g', default_value_t = 0)]
        ngpus: usize,
        /// Minimum size in bytes (K/M/G suffixes).
        #[arg(short = 'b', default_value = "32M")]
        minbytes: String,
        /// Maximum size in bytes.
        #[arg(short = 'e', default_value = "32M")]
        maxbytes: String,
        /// Size step factor.
        #[arg(short = 'f', default_value_t = 2)]
        stepfactor: u64,
        /// Iterations per size.
        #[arg(short = 'n', default_value_t = 20)]
        iters: usize,
        /// Warm-up iterations.
        #[arg(short = 'w', default_value_t = 5)]
        warmup_iters: usize,
        /// Check results (1) or not (0).
        #[arg(short = 'c', default_value_t = 1)]
        check: u8,
        /// Data type (float, half, bfloat16, double, int32, int64, uint8, ...).
        #[arg(short = 'd', default_value = "float")]
        datatype: String,
        /// Reduction (sum, prod, min, max, avg).
        #[arg(short = 'o', default_value = "sum")]
        op_red: String,
        /// Root rank for broadcast and reduce.
        #[arg(short = 'r', default_value_t = 0)]
        root: usize,
        /// Also write the results as JSON to this file.
        #[arg(short = 'J')]
        json: Option<PathBuf>,
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

fn devices(backend: Option<String>, json: bool) -> ExitCode {
    let backends = match unihal::registry().select(
        backend
            .as_deref()
            .or(std::env::var(unihal::BACKENDS_ENV).ok().as_deref()),
    ) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("unihal: {e}");
            return ExitCode::from(2);
        }
    };
    let entries: Vec<BackendEntry> = backends.iter().map(|b| list(&**b)).collect();
    let plugins = unihal::plugin::host::attempts();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&entries).expect("serialisable")
        );
        return ExitCode::SUCCESS;
    }
    for e in &entries {
        let status = if e.available {
            "Available"
        } else {
            "Unavailable"
        };
        println!(
            "{} {} — {status}{}{}",
            e.name,
            e.info.version,
            if e.info.simulated {
                " (SIMULATED runtime)"
            } else {
                ""
            },
            e.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        for l in &e.info.libraries {
            match &l.error {
                None => println!(
                    "  {:<17} {} {} ({})",
                    l.role,
                    l.name,
                    l.version.as_deref().unwrap_or("?"),
                    l.path.as_deref().unwrap_or("?")
                ),
                Some(why) => match &l.path {
                    Some(path) => println!(
                        "  {:<17} {} {} ({path}) UNUSABLE: {why}",
                        l.role,
                        l.name,
                        l.version.as_deref().unwrap_or("?")
                    ),
                    None => println!("  {:<17} {} NOT FOUND: {why}", l.role, l.name),
                },
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
        for d in &e.devices {
            let (m, o) = (&d.capabilities.mandatory, &d.capabilities.optional);
            let mem = d.memory.map_or("memory ?".into(), |mi| {
                format!("memory {} total, {} free", gib(mi.total), gib(mi.free))
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
    match std::env::var(unihal::plugin::host::PATH_ENV) {
        Err(_) => println!(
            "plugins: none loaded ({} is unset)",
            unihal::plugin::host::PATH_ENV
        ),
        Ok(spec) => {
            println!("plugins ({}={spec}):", unihal::plugin::host::PATH_ENV);
            if plugins.is_empty() {
                println!("  no plugin library found there");
            }
            for a in &plugins {
                match &a.outcome {
                    Ok(name) => println!("  {}: loaded, backend {name}", a.path),
                    Err(why) => println!("  {}: REFUSED: {why}", a.path),
                }
            }
        }
    }
    ExitCode::SUCCESS
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
    let Cmd::Bench {
        op,
        backend,
        ngpus,
        minbytes,
        maxbytes,
        stepfactor,
        iters,
        warmup_iters,
        check,
        datatype,
        op_red,
        root,
        json,
    } = cmd
    else {
        unreachable!()
    };
    let op = match op.as_str() {
        "all_reduce" | "allreduce" => unihal::CollectiveOp::AllReduce,
        "all_gather" | "allgather" => unihal::CollectiveOp::AllGather,
        "reduce_scatter" | "reducescatter" => unihal::CollectiveOp::ReduceScatter,
        "broadcast" => unihal::CollectiveOp::Broadcast,
        "reduce" => unihal::CollectiveOp::Reduce,
        "alltoall" | "all_to_all" => unihal::CollectiveOp::AllToAll,
        "sendrecv" => unihal::CollectiveOp::SendRecv,
        other => {
            eprintln!("unihal bench: unknown collective {other:?}");
            return ExitCode::from(2);
        }
    };
    let dtype = unihal::DType::ALL
        .into_iter()
        .find(|d| unihal::bench::nccl_type_name(*d) == datatype || d.name() == datatype);
    let redop = unihal::ReduceOp::ALL
        .into_iter()
        .find(|r| r.name() == op_red);
    let (Some(dtype), Some(redop), Some(min_bytes), Some(max_bytes)) = (
        dtype,
        redop,
        unihal::bench::parse_size(&minbytes),
        unihal::bench::parse_size(&maxbytes),
    ) else {
        eprintln!("unihal bench: bad -d, -o, -b or -e value");
        return ExitCode::from(2);
    };
    let b = match bench_backend(backend.as_deref()) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("unihal bench: {e}");
            return ExitCode::from(2);
        }
    };
    let o = unihal::bench::BenchOptions {
        op,
        min_bytes,
        max_bytes,
        step_factor: stepfactor,
        iters,
        warmup: warmup_iters,
        check: check != 0,
        dtype,
        redop,
        root,
        ranks: ngpus,
    };
    match unihal::bench::run(&*b, &o, &mut std::io::stdout()) {
        Ok(rows) => {
            if let Some(path) = json {
                if let Err(e) = std::fs::write(
                    &path,
                    serde_json::to_string_pretty(&rows).expect("serialisable"),
                ) {
                    eprintln!("unihal bench: cannot write {}: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            if rows
                .iter()
                .any(|r| r.out_of_place.wrong + r.in_place.wrong > 0)
            {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
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

fn main() -> ExitCode {
    unihal_conformance::run_child_if_requested(unihal::registry());
    unihal::init_logging();
    let code = match Cli::parse().command {
        Cmd::Devices { backend, json } => devices(backend, json),
        Cmd::Conformance {
            list: Some(pattern),
            filter,
            ..
        } => list_cases(&pattern, filter.as_deref()),
        Cmd::Conformance {
            list: None,
            backend,
            filter,
            report,
            isolate,
            verify,
            timeout_s,
            max_devices,
        } => {
            let timeout = Duration::try_from_secs_f64(timeout_s).unwrap_or(Duration::from_secs(60));
            conformance(
                backend,
                RunOptions {
                    filter,
                    verify,
                    isolate,
                    timeout,
                },
                report,
                max_devices,
            )
        }
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
