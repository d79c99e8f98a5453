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
    /// Run the conformance suite on every device of the selected backends.
    Conformance {
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
            println!(
                "  library {} {} {}",
                l.name,
                l.version.as_deref().unwrap_or("?"),
                l.path.as_deref().unwrap_or("")
            );
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
    ExitCode::SUCCESS
}

fn conformance(
    backend: Option<String>,
    opts: RunOptions,
    report: Option<PathBuf>,
    max_devices: Option<usize>,
) -> ExitCode {
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
    let cases = unihal_conformance::cases::all();
    if !cases.iter().any(|c| runner::selected(&c.id, &opts)) {
        eprintln!(
            "unihal: no case matches the filter {:?}",
            opts.filter.as_deref().unwrap_or("")
        );
        return ExitCode::from(2);
    }
    let report_data = runner::run(&targets, unavailable, &cases, &opts);
    print!("{}", report_data.summary());
    if let Some(dir) = report {
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

fn main() -> ExitCode {
    unihal_conformance::run_child_if_requested(unihal::registry());
    unihal::init_logging();
    match Cli::parse().command {
        Cmd::Devices { backend, json } => devices(backend, json),
        Cmd::Conformance {
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
    }
}
