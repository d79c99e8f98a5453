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

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub unihal_version: String,
    pub started_unix_s: u64,
    pub duration_s: f64,
    pub verify: bool,
    pub isolate: bool,
    pub filter: Option<String>,
    pub unavailable: Vec<UnavailableBackend>,
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

    /// The report as JUnit XML: one `testsuite` per device, one `testcase` per case.
    pub fn to_junit(&self) -> String {
        let c = self.counts();
        let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(x, "<testsuites name=\"unihal-conformance\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            c.total, c.failed, c.skipped, self.duration_s);
        for t in &self.targets {
            let tc = t.counts;
            let time: f64 = t.results.iter().map(|r| r.duration_ms).sum::<f64>() / 1e3;
            let _ = writeln!(x, "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
                esc(&t.device.id.to_string()), tc.total, tc.failed, tc.skipped, time);
            let _ = writeln!(x, "    <properties>");
            let mut props = vec![
                ("unihal.version", self.unihal_version.clone()),
                ("backend.name", t.backend.name.clone()),
                ("backend.version", t.backend.version.clone()),
                ("backend.simulated", t.backend.simulated.to_string()),
                ("backend.concurrent", t.backend.concurrent.to_string()),
                ("device.name", t.device.name.clone()),
                ("device.vendor", t.device.vendor.clone()),
                (
                    "capabilities",
                    serde_json::to_string(&t.capabilities).unwrap_or_default(),
                ),
            ];
            for l in &t.backend.libraries {
                props.push((
                    "library",
                    format!(
                        "{} {} {}",
                        l.name,
                        l.version.as_deref().unwrap_or("?"),
                        l.path.as_deref().unwrap_or("")
                    ),
                ));
            }
            for (k, v) in props {
                let _ = writeln!(
                    x,
                    "      <property name=\"{}\" value=\"{}\"/>",
                    esc(k),
                    esc(&v)
                );
            }
            let _ = writeln!(x, "    </properties>");
            for r in &t.results {
                let (class, name) = r.id.rsplit_once('.').unwrap_or(("", &r.id));
                let open = format!(
                    "    <testcase classname=\"{}.{}\" name=\"{}\" time=\"{:.3}\"",
                    esc(&t.device.id.to_string()),
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
                            "{open}>\n      <failure message=\"{}\"/>\n    </testcase>",
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
                            "{open}>\n      <system-out>{}</system-out>\n    </testcase>",
                            esc(&format!("expected failure ({reason}): {message}"))
                        );
                    }
                    Outcome::Xpassed { reason } => {
                        let _ = writeln!(
                            x,
                            "{open}>\n      <system-out>{}</system-out>\n    </testcase>",
                            esc(&format!("unexpected pass ({reason})"))
                        );
                    }
                }
            }
            let _ = writeln!(x, "  </testsuite>");
        }
        x.push_str("</testsuites>\n");
        x
    }

    /// Writes `conformance.json`, `conformance.xml` and `summary.txt` into `dir` (created if needed).
    pub fn write_to(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("conformance.json"), self.to_json())?;
        std::fs::write(dir.join("conformance.xml"), self.to_junit())?;
        std::fs::write(dir.join("summary.txt"), self.summary())
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
