//! The `cargo test` face of the suite: one libtest trial per case per device (libtest-mimic), so
//! `cargo test -p unihal-conformance -- <filter>` lists, filters and runs cases like ordinary
//! tests.
//!
//! Trials whose needs a device lacks are *ignored*, with the reason printed when the trial is
//! forced to run (`--include-ignored`), never counted as passed. Environment:
//! `UNIHAL_CONFORMANCE_VERIFY=1` (unexpected passes fail), `UNIHAL_CONFORMANCE_ISOLATE=1` (a
//! process per case), `UNIHAL_CONFORMANCE_TIMEOUT_S` (watchdog, default 60),
//! `UNIHAL_CONFORMANCE_REPORT=DIR` (write JSON, JUnit and summary reports there).

use crate::report::{CaseReport, Outcome, Report, TargetReport};
use crate::runner::{discover, plan, run_case, run_child_if_requested, Plan, RunOptions};
use libtest_mimic::{Arguments, Failed, Trial};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::Registry;

/// Run options from the `UNIHAL_CONFORMANCE_*` environment variables.
///
/// # Errors
/// [`unihal_hal::HalError::InvalidArgument`] naming the variable for a value it does not accept
/// (a timeout that is not a number of seconds of at least 0.001, a switch that is not 1 or 0).
pub fn options_from_env() -> unihal_hal::Result<RunOptions> {
    use unihal_hal::settings;
    let flag = |name| settings::parse(name, settings::switch).map(|v| v.unwrap_or(false));
    Ok(RunOptions {
        filter: None,
        partition: None,
        verify: flag("UNIHAL_CONFORMANCE_VERIFY")?,
        isolate: flag("UNIHAL_CONFORMANCE_ISOLATE")?,
        timeout: settings::parse("UNIHAL_CONFORMANCE_TIMEOUT_S", settings::seconds)?
            .unwrap_or(Duration::from_secs(60)),
    })
}

/// The `main` of a `harness = false` test target running the suite on `registry`'s backends,
/// every case on every device. Exits the process with libtest's status (2 when discovery fails).
pub fn libtest_main(registry: &Registry) -> ! {
    libtest_main_on_first(registry, usize::MAX)
}

/// As [`libtest_main`], with each case run on the first `max_devices` devices of each backend
/// only (as `unihal conformance --max-devices`): the other devices still take part as peer ranks
/// of the collective cases. For a route whose op cases another target already runs on every
/// device (the CPU backend through its plugin), so that its trials prove the route, not the
/// device count again.
pub fn libtest_main_on_first(registry: &Registry, max_devices: usize) -> ! {
    run_child_if_requested(registry);
    let args = Arguments::from_args();
    let opts = options_from_env().unwrap_or_else(|e| {
        eprintln!("unihal conformance: {e}");
        std::process::exit(2);
    });
    let started = Instant::now();
    let started_unix_s = crate::runner::unix_now_s();
    let (mut targets, unavailable) = match discover(registry, None) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("unihal conformance: {e}");
            std::process::exit(2);
        }
    };
    targets.retain(|t| (t.device.id().ordinal as usize) < max_devices);
    for u in &unavailable {
        eprintln!(
            "unihal conformance: backend {} unavailable: {}",
            u.backend, u.reason
        );
    }
    let results: Arc<Mutex<Vec<Vec<CaseReport>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); targets.len()]));
    let wanted = |name: &str| match &args.filter {
        None => true,
        Some(f) if args.exact => name == f,
        Some(f) => name.contains(f.as_str()),
    };
    let mut trials = Vec::new();
    for (ti, target) in targets.iter().enumerate() {
        for case in crate::cases::all() {
            let name = format!("{}/{}", target.device.id(), case.id);
            let kind = target.backend.name();
            match plan(&case, target) {
                Plan::Skip(reason) => {
                    if wanted(&name) {
                        results.lock()[ti].push(CaseReport {
                            id: case.id.clone(),
                            outcome: Outcome::Skipped {
                                reason: reason.clone(),
                            },
                            duration_ms: 0.0,
                        });
                    }
                    trials.push(
                        Trial::test(name, move || {
                            Err(Failed::from(format!("skipped: {reason}")))
                        })
                        .with_kind(kind)
                        .with_ignored_flag(true),
                    );
                }
                Plan::Run { .. } => {
                    let (target, opts, results) = (target.clone(), opts.clone(), results.clone());
                    trials.push(
                        Trial::test(name, move || {
                            let r = run_case(&case, &target, &opts);
                            let outcome = r.outcome.clone();
                            results.lock()[ti].push(r);
                            match outcome {
                                Outcome::Failed { message } => Err(Failed::from(message)),
                                Outcome::Skipped { reason } => {
                                    Err(Failed::from(format!("skipped at run time: {reason}")))
                                }
                                _ => Ok(()),
                            }
                        })
                        .with_kind(kind),
                    );
                }
            }
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(dir) = std::env::var("UNIHAL_CONFORMANCE_REPORT") {
        let mut per_target = results.lock().clone();
        let report = Report {
            schema_version: crate::report::SCHEMA_VERSION,
            unihal_version: unihal_hal::VERSION.into(),
            started_unix_s,
            hostname: unihal_hal::ccl::process_tag().host.clone(),
            duration_s: started.elapsed().as_secs_f64(),
            verify: opts.verify,
            isolate: opts.isolate,
            filter: args.filter.clone(),
            partition: None,
            unavailable,
            targets: targets
                .iter()
                .zip(per_target.iter_mut())
                .map(|(t, r)| {
                    r.sort_by(|a, b| a.id.cmp(&b.id));
                    TargetReport::of(t, std::mem::take(r))
                })
                .collect(),
        };
        if let Err(e) = report.write_to(std::path::Path::new(&dir)) {
            eprintln!("unihal conformance: cannot write reports to {dir}: {e}");
        }
    }
    conclusion.exit()
}
