//! Tests of the conformance harness itself: the watchdog fires, verify mode catches an unexpected
//! pass, skips are reported as skips, and the JSON and JUnit reports parse and agree with the run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_conformance::case::{Case, CaseResult, Ctx, Need};
use unihal_conformance::manifest::Manifest;
use unihal_conformance::report::Outcome;
use unihal_conformance::runner::{run, run_case, RunOptions, Target};
use unihal_cpu::{CpuBackend, CpuConfig};
use unihal_hal::{Backend, LibraryInfo};

fn target(manifest: &str) -> Target {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_config(
        CpuConfig::from_values(Some("2"), Some("1G"), Some("1")).unwrap(),
    ));
    Target {
        device: backend.open(0).unwrap(),
        backend,
        manifest: Manifest::parse(manifest).unwrap(),
        world: None,
    }
}

static RELEASE_HANG: AtomicBool = AtomicBool::new(false);

fn hangs(_: &Ctx) -> CaseResult {
    let start = Instant::now();
    while !RELEASE_HANG.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn passes(ctx: &Ctx) -> CaseResult {
    let b = ctx.upload(&[1, 2, 3])?;
    unihal_conformance::ensure_eq!(ctx.download(&b)?, vec![1u8, 2, 3], "round trip");
    Ok(())
}

fn fails(_: &Ctx) -> CaseResult {
    Err(unihal_conformance::Failure::new("deliberate failure"))
}

fn panics(_: &Ctx) -> CaseResult {
    panic!("deliberate panic")
}

#[test]
fn watchdog_turns_a_hang_into_a_failure() {
    let case = Case {
        timeout: Some(Duration::from_millis(200)),
        ..Case::new("harness.hang", hangs)
    };
    let t0 = Instant::now();
    let r = run_case(&case, &target(""), &RunOptions::default());
    RELEASE_HANG.store(true, Ordering::SeqCst);
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the watchdog did not fire in time"
    );
    match r.outcome {
        Outcome::Failed { message } => assert!(message.starts_with("watchdog"), "{message}"),
        o => panic!("hang reported as {o:?}"),
    }
}

#[test]
fn panics_are_failures_not_crashes() {
    let r = run_case(
        &Case::new("harness.panic", panics),
        &target(""),
        &RunOptions::default(),
    );
    assert_eq!(
        r.outcome,
        Outcome::Failed {
            message: "panicked: deliberate panic".into()
        }
    );
}

#[test]
fn verify_mode_fails_an_unexpected_pass() {
    let t = target("xfail harness.passes known bug 123\nxfail harness.fails known bug 456\n");
    let pass = Case::new("harness.passes", passes);
    let fail = Case::new("harness.fails", fails);
    let lax = RunOptions::default();
    let verify = RunOptions {
        verify: true,
        ..RunOptions::default()
    };
    assert_eq!(
        run_case(&pass, &t, &lax).outcome,
        Outcome::Xpassed {
            reason: "known bug 123".into()
        }
    );
    match run_case(&pass, &t, &verify).outcome {
        Outcome::Failed { message } => {
            assert!(message.contains("unexpected pass") && message.contains("known bug 123"))
        }
        o => panic!("verify mode reported {o:?}"),
    }
    assert_eq!(
        run_case(&fail, &t, &verify).outcome,
        Outcome::Xfailed {
            reason: "known bug 456".into(),
            message: "deliberate failure".into()
        }
    );
}

#[test]
fn missing_needs_and_unsupported_entries_are_skips() {
    let t = target("unsupported harness.unsup.* not on this chip\n");
    let needy = Case::new("harness.needy", passes).needs(&[Need::Devices(99)]);
    match run_case(&needy, &t, &RunOptions::default()).outcome {
        Outcome::Skipped { reason } => assert_eq!(reason, "needs 99 devices, backend has 2"),
        o => panic!("{o:?}"),
    }
    match run_case(
        &Case::new("harness.unsup.x", passes),
        &t,
        &RunOptions::default(),
    )
    .outcome
    {
        Outcome::Skipped { reason } => assert!(reason.contains("not on this chip"), "{reason}"),
        o => panic!("{o:?}"),
    }
}

#[test]
fn json_and_junit_reports_parse_and_agree_with_the_run() {
    let cases = vec![
        Case::new("harness.a.passes", passes),
        Case::new("harness.a.fails", fails),
        Case::new("harness.b.skipped", passes).needs(&[Need::Devices(99)]),
        Case::new("harness.b.xfail", fails),
        Case::new("harness.c.<&\"escaped\">", passes),
    ];
    let t = target("xfail harness.b.xfail tracked\n");
    let report = run(
        std::slice::from_ref(&t),
        Vec::new(),
        &cases,
        &RunOptions::default(),
    );
    let c = report.counts();
    assert_eq!(
        (c.total, c.passed, c.failed, c.skipped, c.xfailed),
        (5, 2, 1, 1, 1)
    );
    assert!(!report.success());

    let dir = std::env::temp_dir().join(format!("unihal-harness-report-{}", std::process::id()));
    report.write_to(&dir).unwrap();

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("conformance.json")).unwrap())
            .unwrap();
    assert_eq!(
        json["schema_version"],
        unihal_conformance::report::SCHEMA_VERSION
    );
    let text = std::fs::read_to_string(dir.join("conformance.json")).unwrap();
    assert!(
        text.starts_with("{\n  \"schema_version\": "),
        "schema_version leads the document: {}",
        &text[..40]
    );
    assert_eq!(json["unihal_version"], unihal_hal::VERSION);
    assert!(!json["hostname"].as_str().unwrap().is_empty());
    assert!(json["started_unix_s"].as_u64().unwrap() > 1_600_000_000);
    let tj = &json["targets"][0];
    assert_eq!(tj["backend"]["name"], "cpu");
    assert_eq!(tj["device"]["id"]["ordinal"], 0);
    assert!(
        tj["capabilities"]["mandatory"]["memory_bytes"]
            .as_u64()
            .unwrap()
            > 0
    );
    let statuses: Vec<(String, String)> = tj["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap().to_string(),
                r["outcome"]["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = report.targets[0]
        .results
        .iter()
        .map(|r| {
            let s = match r.outcome {
                Outcome::Passed => "passed",
                Outcome::Failed { .. } => "failed",
                Outcome::Skipped { .. } => "skipped",
                Outcome::Xfailed { .. } => "xfailed",
                Outcome::Xpassed { .. } => "xpassed",
            };
            (r.id.clone(), s.to_string())
        })
        .collect();
    assert_eq!(statuses, expected);
    assert_eq!(tj["counts"]["failed"], 1);

    let xml = std::fs::read_to_string(dir.join("conformance.xml")).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    assert_eq!(root.attribute("tests"), Some("5"));
    assert_eq!(root.attribute("failures"), Some("1"));
    assert_eq!(root.attribute("errors"), Some("0"));
    let suite = root
        .children()
        .find(|n| n.has_tag_name("testsuite"))
        .unwrap();
    assert_eq!(suite.attribute("name"), Some("cpu:0"));
    // The xfail case counts among the skips, as an expected failure.
    assert_eq!(suite.attribute("skipped"), Some("2"));
    assert_eq!(suite.attribute("errors"), Some("0"));
    assert_eq!(suite.attribute("id"), Some("0"));
    assert_eq!(suite.attribute("package"), Some("cpu"));
    assert!(!suite.attribute("hostname").unwrap().is_empty());
    let props: Vec<_> = suite
        .descendants()
        .filter(|n| n.has_tag_name("property"))
        .collect();
    assert!(props
        .iter()
        .any(|p| p.attribute("name") == Some("cpu:0.unihal.version")
            && p.attribute("value") == Some(unihal_hal::VERSION)));
    assert!(props
        .iter()
        .any(|p| p.attribute("name") == Some("cpu:0.capabilities")
            && serde_json::from_str::<serde_json::Value>(p.attribute("value").unwrap()).is_ok()));
    let testcases: Vec<_> = suite
        .children()
        .filter(|n| n.has_tag_name("testcase"))
        .collect();
    assert_eq!(testcases.len(), 5);
    for (tc, (id, status)) in testcases.iter().zip(&expected) {
        let full = format!(
            "{}.{}",
            tc.attribute("classname")
                .unwrap()
                .trim_start_matches("cpu:0."),
            tc.attribute("name").unwrap()
        );
        assert_eq!(&full, id);
        let failure = tc.children().find(|n| n.has_tag_name("failure"));
        let skipped = tc.children().find(|n| n.has_tag_name("skipped"));
        assert_eq!(failure.is_some(), status == "failed", "{id}");
        assert_eq!(
            skipped.is_some(),
            status == "skipped" || status == "xfailed",
            "{id}"
        );
        if let Some(f) = failure {
            assert_eq!(f.attribute("type"), Some("failure"), "{id}");
            assert_eq!(f.attribute("message"), Some("deliberate failure"), "{id}");
        }
        if status == "xfailed" {
            assert_eq!(skipped.unwrap().attribute("type"), Some("xfail"), "{id}");
        }
    }
    let summary = std::fs::read_to_string(dir.join("summary.txt")).unwrap();
    assert!(
        summary.contains("FAILED  cpu:0 harness.a.fails: deliberate failure"),
        "{summary}"
    );
    assert!(
        summary.contains("skipped cpu:0 harness.b.skipped: needs 99 devices"),
        "{summary}"
    );
    assert!(
        summary.contains("total: 5 cases, 2 passed, 1 failed, 1 skipped, 1 xfail, 0 xpass"),
        "{summary}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A report of 4 devices with every outcome (pass, failure, panic, watchdog, skip, xfail, xpass),
/// checked for the JUnit shape its readers need, and left in `target/tmp/junit-sample` for CI's
/// JUnit readers (`scripts/check-junit.py`, .ci/run), which must accept a failure too.
#[test]
fn a_multi_device_junit_report_has_unique_properties_and_every_outcome() {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::with_config(
        CpuConfig::from_values(Some("4"), Some("1G"), Some("1")).unwrap(),
    ));
    let manifest =
        Manifest::parse("xfail harness.x.xfail tracked\nxfail harness.x.xpass tracked too\n")
            .unwrap();
    let targets: Vec<Target> = (0..4)
        .map(|i| Target {
            device: backend.open(i).unwrap(),
            backend: backend.clone(),
            manifest: manifest.clone(),
            world: None,
        })
        .collect();
    let cases = vec![
        Case::new("harness.x.passes", passes),
        Case::new("harness.x.fails", fails),
        Case::new("harness.x.panics", panics),
        Case::new("harness.x.skipped", passes).needs(&[Need::Devices(99)]),
        Case::new("harness.x.xfail", fails),
        Case::new("harness.x.xpass", passes),
        // Last: a hang leaves its device's later cases unrun.
        Case {
            timeout: Some(Duration::from_millis(1)),
            ..Case::new("harness.x.hangs", |_: &Ctx| {
                std::thread::sleep(Duration::from_millis(200));
                Ok(())
            })
        },
    ];
    let mut report = run(&targets, Vec::new(), &cases, &RunOptions::default());
    let c = report.counts();
    assert_eq!(
        (c.total, c.passed, c.failed, c.skipped, c.xfailed, c.xpassed),
        (28, 4, 12, 4, 4, 4)
    );
    // Vendor libraries as a GPU backend lists them, one name twice: every property name stays
    // unique in the document.
    for t in &mut report.targets {
        t.backend.libraries = vec![
            LibraryInfo::found(
                "BLAS",
                "libx",
                "/opt/x/libx.so.1".into(),
                Some("1.2".into()),
            ),
            LibraryInfo::found(
                "BLAS",
                "libx",
                "/opt/x/libx.so.2".into(),
                Some("2.0".into()),
            ),
            LibraryInfo::missing("runtime compiler", "rtc <&>", "not on this host".into()),
        ];
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("junit-sample");
    report.write_to(&dir).unwrap();
    let xml = std::fs::read_to_string(dir.join("conformance.xml")).unwrap();
    let doc = roxmltree::Document::parse(&xml).unwrap();
    let root = doc.root_element();
    assert_eq!(
        (
            root.attribute("tests"),
            root.attribute("failures"),
            root.attribute("errors")
        ),
        (Some("28"), Some("12"), Some("0"))
    );
    // The attributes junit-10.xsd declares on testsuites, and no other.
    for a in root.attributes() {
        assert!(
            ["name", "time", "tests", "failures", "errors"].contains(&a.name()),
            "{}",
            a.name()
        );
    }
    let suites: Vec<_> = root.children().filter(|n| n.is_element()).collect();
    assert_eq!(suites.len(), 4);
    let mut names = std::collections::HashSet::new();
    for (i, s) in suites.iter().enumerate() {
        assert!(s.has_tag_name("testsuite"));
        assert_eq!(s.attribute("name"), Some(format!("cpu:{i}").as_str()));
        assert_eq!(s.attribute("id"), Some(i.to_string().as_str()));
        let counts = ["tests", "failures", "errors", "skipped"].map(|a| s.attribute(a));
        assert_eq!(counts, [Some("7"), Some("3"), Some("0"), Some("2")]);
        let ts = s.attribute("timestamp").unwrap();
        assert_eq!(ts.len(), 19, "{ts}");
        assert!(ts.as_bytes()[10] == b'T' && !ts.ends_with('Z'), "{ts}");
        assert!(!s.attribute("hostname").unwrap().is_empty());
        for p in s.descendants().filter(|n| n.has_tag_name("property")) {
            let name = p.attribute("name").unwrap().to_string();
            assert!(name.starts_with(&format!("cpu:{i}.")), "{name}");
            assert!(names.insert(name.clone()), "property {name} repeats");
        }
        let library = |n: &str| {
            s.descendants()
                .find(|p| p.attribute("name") == Some(format!("cpu:{i}.library.{n}").as_str()))
                .and_then(|p| p.attribute("value"))
        };
        assert_eq!(library("libx"), Some("1.2 /opt/x/libx.so.1"));
        assert_eq!(library("libx.2"), Some("2.0 /opt/x/libx.so.2"));
        assert_eq!(library("rtc <&>"), Some("not found: not on this host"));
        let types: Vec<&str> = s
            .descendants()
            .filter(|n| n.has_tag_name("failure"))
            .map(|f| f.attribute("type").unwrap())
            .collect();
        assert_eq!(types, ["failure", "panic", "watchdog"]);
        // Properties, cases, then the suite's output, where the unexpected pass is named.
        let tags: Vec<&str> = s
            .children()
            .filter(|n| n.is_element())
            .map(|n| n.tag_name().name())
            .collect();
        assert_eq!(tags.first(), Some(&"properties"));
        assert_eq!(tags[tags.len() - 2..], ["system-out", "system-err"]);
        let out = s
            .children()
            .find(|n| n.has_tag_name("system-out"))
            .and_then(|n| n.text())
            .unwrap();
        assert_eq!(
            out,
            format!(
                "unexpected pass: cpu:{i} harness.x.xpass: the manifest expects a failure (tracked too)"
            )
        );
    }
}

#[test]
fn suite_has_enough_cases_per_area_and_unique_ids() {
    let all = unihal_conformance::cases::all();
    assert!(all.len() >= 60, "{} cases", all.len());
    for area in ["memory.", "streams.", "events.", "kernels.", "misuse."] {
        let n = all.iter().filter(|c| c.id.starts_with(area)).count();
        assert!(n >= 8, "{area}: {n} cases");
    }
    let mut ids: Vec<_> = all.iter().map(|c| c.id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), all.len(), "duplicate case ids");
    for c in &all {
        assert!(
            c.id.split('.').count() >= 3
                && c.id
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._".contains(ch)),
            "{}",
            c.id
        );
    }
}
