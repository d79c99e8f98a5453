//! Results and reports: the human summary, JSON and JUnit XML.
//!
//! Every report carries the unihal version, each backend's and vendor library's version, the device
//! and its capability snapshot, so a result can be traced to what produced it.

use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;
use unihal_hal::{BackendInfo, Capabilities, DeviceInfo};

/// How one case ended on one device.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Outcome {
    Passed,
    Failed {
        message: String,
    },
    /// Not run: the device lacks a need, or the manifest says unsupported.
    Skipped {
        reason: String,
    },
    /// Failed as the manifest expects.
    Xfailed {
        reason: String,
        message: String,
    },
    /// Passed although the manifest expects a failure (outside verify mode; in verify mode an
    /// unexpected pass is `Failed`).
    Xpassed {
        reason: String,
    },
}

impl Outcome {
    /// True for outcomes that make a run fail.
    pub fn is_failure(&self) -> bool {
        matches!(self, Outcome::Failed { .. })
    }
}

/// One case on one device.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseReport {
    pub id: String,
    pub outcome: Outcome,
    pub duration_ms: f64,
}

/// Counts of outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub xfailed: usize,
    pub xpassed: usize,
}

impl Counts {
    /// Counts of `results`.
    pub fn of(results: &[CaseReport]) -> Counts {
        let mut c = Counts {
            total: results.len(),
            ..Default::default()
        };
        for r in results {
            match r.outcome {
                Outcome::Passed => c.passed += 1,
                Outcome::Failed { .. } => c.failed += 1,
                Outcome::Skipped { .. } => c.skipped += 1,
                Outcome::Xfailed { .. } => c.xfailed += 1,
                Outcome::Xpassed { .. } => c.xpassed += 1,
            }
        }
        c
    }
}

/// All cases on one device.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub backend: BackendInfo,
    pub device: DeviceInfo,
    pub capabilities: Capabilities,
    /// The backend's collective engine and what it supports (None: no engine).
    pub collectives: Option<unihal_hal::CclCaps>,
    pub counts: Counts,
    pub results: Vec<CaseReport>,
    /// The validation layer's mode when the backend ran under it (`report`, `error`).
    pub validation: Option<String>,
}

impl TargetReport {
    /// The report of `target` with its results (sorted by the caller as it wants them).
    pub fn of(target: &crate::runner::Target, results: Vec<CaseReport>) -> TargetReport {
        TargetReport {
            backend: target.backend.info(),
            device: target.device.info().clone(),
            capabilities: target.device.capabilities().clone(),
            collectives: target
                .backend
                .collectives()
                .map(|c| c.capabilities().clone()),
            counts: Counts::of(&results),
            results,
            validation: crate::runner::validation_layer(target)
                .and_then(|v| v.mode())
                .map(|m| format!("{m:?}").to_lowercase()),
        }
    }
}

/// A backend that could not be tested, and why.
#[derive(Debug, Clone, Serialize)]
pub struct UnavailableBackend {
    pub backend: String,
    pub reason: String,
}

/// The version of the JSON report's schema: `conformance.json`'s top-level `schema_version`.
///
/// It goes up by one when a field of the document is removed or renamed, or changes its type or
/// meaning (an outcome's `status` values included). Adding a field does not change it: a reader
/// should ignore the fields it does not know. The schema is described in docs/ARCHITECTURE.md
/// (Reports).
pub const SCHEMA_VERSION: u32 = 1;

/// A whole run.
///
/// A plain value (owned data, `Send` and `Sync`): built by [`crate::runner::run`] or the libtest
/// harness once every case has ended, then read by the summary and report writers.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// [`SCHEMA_VERSION`] when the report was made (first in the JSON document).
    pub schema_version: u32,
    /// The unihal version that ran the suite.
    pub unihal_version: String,
    /// When the run started, in seconds since the Unix epoch (UTC).
    pub started_unix_s: u64,
    /// The host that ran it (`unihal_hal::ccl::process_tag`'s).
    pub hostname: String,
    /// Wall-clock time of the whole run, in seconds.
    pub duration_s: f64,
    /// Verify mode: an unexpected pass of an `xfail` case failed.
    pub verify: bool,
    /// Each case ran in its own process.
    pub isolate: bool,
    /// The `--filter` text, if any.
    pub filter: Option<String>,
    /// The share of the selected cases that ran (`--partition K/N`), if not all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Backends (or devices) that could not be tested, with the reasons.
    pub unavailable: Vec<UnavailableBackend>,
    /// One per device, in the order they ran.
    pub targets: Vec<TargetReport>,
}

impl Report {
    /// Counts over every target.
    pub fn counts(&self) -> Counts {
        let all: Vec<CaseReport> = self
            .targets
            .iter()
            .flat_map(|t| t.results.clone())
            .collect();
        Counts::of(&all)
    }

    /// True when no case failed and at least one ran.
    pub fn success(&self) -> bool {
        let c = self.counts();
        c.failed == 0 && c.total > 0
    }

    /// The readable summary: a table per device, then every failure and skip with its reason.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "unihal conformance {} ({} mode{})",
            self.unihal_version,
            if self.isolate {
                "isolated"
            } else {
                "in-process"
            },
            if self.verify { ", verify" } else { "" }
        );
        for u in &self.unavailable {
            let _ = writeln!(s, "backend {}: unavailable: {}", u.backend, u.reason);
        }
        // A device that runs no library op skips every op case: say why before the table.
        for t in &self.targets {
            if !t.capabilities.optional.ops.is_empty() {
                continue;
            }
            let missing: Vec<String> = t
                .backend
                .libraries
                .iter()
                .filter_map(|l| Some(format!("{}: {}", l.name, l.error.as_ref()?)))
                .collect();
            let _ = writeln!(
                s,
                "NOTE: {} runs no library op, so every op case skips{}",
                t.device.id,
                if missing.is_empty() {
                    String::new()
                } else {
                    format!("; missing: {}", missing.join("; "))
                }
            );
        }
        let _ = writeln!(
            s,
            "{:<10} {:<34} {:>6} {:>7} {:>7} {:>8} {:>7} {:>7} {:>9}",
            "device", "name", "cases", "passed", "failed", "skipped", "xfail", "xpass", "time"
        );
        for t in &self.targets {
            let c = t.counts;
            let ms: f64 = t.results.iter().map(|r| r.duration_ms).sum();
            let _ = writeln!(
                s,
                "{:<10} {:<34} {:>6} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8.2}s",
                t.device.id.to_string(),
                truncate(&t.device.name, 34),
                c.total,
                c.passed,
                c.failed,
                c.skipped,
                c.xfailed,
                c.xpassed,
                ms / 1e3
            );
        }
        let mut seen = Vec::new();
        for t in &self.targets {
            if seen.contains(&t.backend.name) {
                continue;
            }
            seen.push(t.backend.name.clone());
            let libs: Vec<String> = t
                .backend
                .libraries
                .iter()
                .map(|l| match &l.error {
                    None => format!("{} {}", l.name, l.version.as_deref().unwrap_or("?")),
                    Some(_) => format!("{} (not found)", l.name),
                })
                .collect();
            let _ = writeln!(
                s,
                "backend {} {}{}{}",
                t.backend.name,
                t.backend.version,
                match (t.backend.simulated, t.backend.concurrent) {
                    (true, true) => " (SIMULATED runtime, concurrent mode)",
                    (true, false) => " (SIMULATED runtime)",
                    _ => "",
                },
                if libs.is_empty() {
                    String::new()
                } else {
                    format!(", libraries: {}", libs.join(", "))
                }
            );
            if let Some(mode) = &t.validation {
                let _ = writeln!(
                    s,
                    "backend {} ran under the validation layer ({mode} mode): a case that made \
                     findings failed with them",
                    t.backend.name
                );
            }
            if t.backend.simulated {
                let _ = writeln!(
                    s,
                    "NOTE: backend {} ran on a SIMULATED runtime: no device code ran on a GPU \
                     (warp-{} paths included); the modules it loaded (real compiler output) were \
                     read for their kernels, and each kernel ran its CPU build on the host",
                    t.backend.name, t.capabilities.mandatory.warp_size
                );
            }
        }
        for t in &self.targets {
            for r in &t.results {
                let line = match &r.outcome {
                    Outcome::Failed { message } => {
                        format!("FAILED  {} {}: {message}", t.device.id, r.id)
                    }
                    Outcome::Skipped { reason } => {
                        format!("skipped {} {}: {reason}", t.device.id, r.id)
                    }
                    Outcome::Xfailed { reason, .. } => {
                        format!("xfail   {} {}: {reason}", t.device.id, r.id)
                    }
                    Outcome::Xpassed { reason } => format!(
                        "XPASS   {} {}: expected to fail ({reason})",
                        t.device.id, r.id
                    ),
                    Outcome::Passed => continue,
                };
                let _ = writeln!(s, "{line}");
            }
        }
        let c = self.counts();
        let _ = writeln!(
            s,
            "total: {} cases, {} passed, {} failed, {} skipped, {} xfail, {} xpass in {:.2}s: {}",
            c.total,
            c.passed,
            c.failed,
            c.skipped,
            c.xfailed,
            c.xpassed,
            self.duration_s,
            if self.success() { "OK" } else { "FAILED" }
        );
        s
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("reports serialise")
    }

    /// The report as JUnit XML (the Ant format, as Jenkins' `junit-10.xsd` describes it): one
    /// `testsuite` per device, one `testcase` per case.
    ///
    /// * `testsuites` carries `name`, `tests`, `failures`, `errors` (always 0: a case that went
    ///   wrong in any way is a failure) and `time`; each `testsuite` also `id` (its index),
    ///   `package` (the backend), `skipped`, `timestamp` (the run's start, ISO 8601 in UTC
    ///   without a zone suffix, as the Ant schema's pattern wants) and `hostname`.
    /// * Property names are unique in the whole document (prefixed with the device: `cpu:0.backend.name`,
    ///   `cpu:0.library.<name>`), as some readers (xunitparser) keep one property table per file.
    /// * A failure is `<failure type=".." message="..">` with the message as its text too; its
    ///   type names the kind: `watchdog`, `panic`, `crash` (an isolated process that gave no
    ///   result), `unexpected-pass` (verify mode), `validation` (the validation layer's findings)
    ///   or `failure`.
    /// * An expected failure (`xfail`) is a skip of type `xfail` (as pytest writes them), so the
    ///   suite's `skipped` counts skips and expected failures; an unexpected pass outside verify
    ///   mode is a pass, named in a line of the suite's `system-out` (in verify mode it is a
    ///   failure of type `unexpected-pass`).
    /// * Each suite is `properties`, the `testcase`s, then `system-out` and `system-err`, the
    ///   order the Ant schema (windyroad's `JUnit.xsd`) wants; a `testcase` holds at most one
    ///   `failure` or `skipped`.
    pub fn to_junit(&self) -> String {
        let c = self.counts();
        let timestamp = unihal_hal::clock::UtcDateTime::from_unix(self.started_unix_s).format('T');
        let hostname = if self.hostname.trim().is_empty() {
            "localhost"
        } else {
            &self.hostname
        };
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            x,
            "<testsuites name=\"unihal-conformance\" tests=\"{}\" failures=\"{}\" errors=\"0\" \
             time=\"{:.3}\">",
            c.total, c.failed, self.duration_s
        );
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            let tc = t.counts;
            let dev = t.device.id.to_string();
            let time: f64 = t.results.iter().map(|r| r.duration_ms).sum::<f64>() / 1e3;
            let _ = writeln!(
                x,
                "  <testsuite name=\"{}\" id=\"{i}\" package=\"{}\" tests=\"{}\" failures=\"{}\" \
                 errors=\"0\" skipped=\"{}\" time=\"{time:.3}\" timestamp=\"{timestamp}\" \
                 hostname=\"{}\">",
                esc(&dev),
                esc(&t.backend.name),
                tc.total,
                tc.failed,
                tc.skipped + tc.xfailed,
                esc(hostname),
            );
            let _ = writeln!(x, "    <properties>");
            let mut props = vec![
                ("unihal.version".to_string(), self.unihal_version.clone()),
                ("backend.name".into(), t.backend.name.clone()),
                ("backend.version".into(), t.backend.version.clone()),
                ("backend.simulated".into(), t.backend.simulated.to_string()),
                (
                    "backend.concurrent".into(),
                    t.backend.concurrent.to_string(),
                ),
                ("device.name".into(), t.device.name.clone()),
                ("device.vendor".into(), t.device.vendor.clone()),
                (
                    "capabilities".into(),
                    serde_json::to_string(&t.capabilities).unwrap_or_default(),
                ),
            ];
            if let Some(mode) = &t.validation {
                props.push(("validation".into(), mode.clone()));
            }
            for l in &t.backend.libraries {
                let value = match (&l.error, &l.path) {
                    (Some(e), _) => format!("not found: {e}"),
                    (None, path) => format!(
                        "{} {}",
                        l.version.as_deref().unwrap_or("?"),
                        path.as_deref().unwrap_or("")
                    )
                    .trim_end()
                    .to_string(),
                };
                props.push((format!("library.{}", l.name), value));
            }
            for (k, v) in props {
                // Unique in the document: the device's prefix, then a count for a repeat.
                let base = format!("{dev}.{k}");
                let mut name = base.clone();
                let mut n = 1;
                while !names.insert(name.clone()) {
                    n += 1;
                    name = format!("{base}.{n}");
                }
                let _ = writeln!(
                    x,
                    "      <property name=\"{}\" value=\"{}\"/>",
                    esc(&name),
                    esc(&v)
                );
            }
            let _ = writeln!(x, "    </properties>");
            let mut xpassed = Vec::new();
            for r in &t.results {
                let (class, name) = r.id.rsplit_once('.').unwrap_or(("", &r.id));
                let open = format!(
                    "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.3}\"",
                    esc(&dev),
                    esc(class),
                    esc(name),
                    r.duration_ms / 1e3
                );
                match &r.outcome {
                    Outcome::Passed => {
                        let _ = writeln!(x, "{open}/>");
                    }
                    Outcome::Failed { message } => {
                        let _ = writeln!(
                            x,
                            "{open}>\n      <failure type=\"{}\" message=\"{}\">{}</failure>\n    </testcase>",
                            failure_type(message),
                            esc(message),
                            esc(message)
                        );
                    }
                    Outcome::Skipped { reason } => {
                        let _ = writeln!(
                            x,
                            "{open}>\n      <skipped message=\"{}\"/>\n    </testcase>",
                            esc(reason)
                        );
                    }
                    Outcome::Xfailed { reason, message } => {
                        let _ = writeln!(
                            x,
                            "{open}>\n      <skipped type=\"xfail\" message=\"{}\"/>\n    </testcase>",
                            esc(&format!("expected failure ({reason}): {message}"))
                        );
                    }
                    Outcome::Xpassed { reason } => {
                        // A pass; said in the suite's system-out (the Ant schema allows no
                        // system-out in a testcase).
                        let _ = writeln!(x, "{open}/>");
                        xpassed.push(format!(
                            "unexpected pass: {dev} {}: the manifest expects a failure ({reason})",
                            r.id
                        ));
                    }
                }
            }
            if xpassed.is_empty() {
                let _ = writeln!(x, "    <system-out/>");
            } else {
                let _ = writeln!(
                    x,
                    "    <system-out>{}</system-out>",
                    esc(&xpassed.join("\n"))
                );
            }
            let _ = writeln!(x, "    <system-err/>");
            let _ = writeln!(x, "  </testsuite>");
        }
        x.push_str("</testsuites>\n");
        x
    }

    /// Writes `conformance.json`, `conformance.xml` and `summary.txt` into `dir` (created if
    /// needed).
    ///
    /// # Errors
    /// The first I/O error creating `dir` or writing a file (files written before it stay).
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("conformance.json"), self.to_json())?;
        std::fs::write(dir.join("conformance.xml"), self.to_junit())?;
        std::fs::write(dir.join("summary.txt"), self.summary())
    }
}

/// The kind of a failure, from its message, for the JUnit `failure` element's `type`.
fn failure_type(message: &str) -> &'static str {
    if message.starts_with("watchdog") {
        "watchdog"
    } else if message.starts_with("panicked") {
        "panic"
    } else if message.starts_with("the isolated process ended") {
        "crash"
    } else if message.starts_with("unexpected pass") {
        "unexpected-pass"
    } else if message.starts_with("validation layer:") {
        "validation"
    } else {
        "failure"
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).chain(['…']).collect()
    }
}

/// Escapes text for an XML attribute or element.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // XML 1.0 cannot carry other control characters at all.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => o.push('\u{FFFD}'),
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_types_name_the_kind() {
        assert_eq!(
            failure_type("watchdog: the case did not finish"),
            "watchdog"
        );
        assert_eq!(failure_type("panicked: boom"), "panic");
        assert_eq!(
            failure_type("the isolated process ended (signal: 11) without a result; stderr: "),
            "crash"
        );
        assert_eq!(
            failure_type("unexpected pass: the manifest expects a failure (x)"),
            "unexpected-pass"
        );
        assert_eq!(
            failure_type("validation layer: 1 finding(s): x"),
            "validation"
        );
        assert_eq!(failure_type("copy: got [1] expected [2]"), "failure");
    }
}
