#!/usr/bin/env python3
"""Reads unihal conformance JUnit reports with three real JUnit readers and checks what they read.

Usage: check-junit.py [--require OUTCOME]... [--min-suites N] DIR/conformance.xml...

For each file, the `conformance.json` beside it gives what every suite (one per device) must
hold: its tests, failures, skips (skips and expected failures: an xfail is a JUnit skip) and no
errors. Each reader must parse the file and count the same, case by case and in the suite's
attributes:

* junitparser (JUnitXml.fromfile; each suite's attributes and cases, timestamp and hostname),
* junit2html (its parser, then the HTML page it renders),
* xunitparser (its parser, which asserts the document's totals and refuses a property name
  that repeats anywhere in the file).

--require OUTCOME (pass, failure, skip, xfail; repeatable) fails when no case of the files has
that outcome, so a check cannot pass on a report that lacks what it is meant to prove.
--min-suites N fails when a file has fewer suites. A missing library is a failure, never a skip.
Exit status 0 when every check passed, 1 otherwise.
"""

import argparse
import datetime
import json
import os
import sys
import tempfile


def fail(msg):
    print(f"check-junit: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


try:
    import junitparser
    import xunitparser
    from junit2htmlreport import parser as junit2html
except ImportError as e:
    fail(f"a JUnit reader is not installed ({e}); install junitparser, junit2html and xunitparser")


def expected_suites(xml_path):
    """{suite name: (tests, failures, skipped)} from the conformance.json beside xml_path."""
    json_path = os.path.join(os.path.dirname(os.path.abspath(xml_path)), "conformance.json")
    with open(json_path, encoding="utf-8") as f:
        report = json.load(f)
    if not isinstance(report.get("schema_version"), int):
        fail(f"{json_path}: no integer schema_version")
    out = {}
    for t in report["targets"]:
        dev = t["device"]["id"]
        name = f"{dev['backend']}:{dev['ordinal']}"
        c = t["counts"]
        out[name] = (c["total"], c["failed"], c["skipped"] + c["xfailed"])
    return out


def check_equal(what, got, want):
    if got != want:
        fail(f"{what}: read {got}, the report says {want}")


def with_junitparser(path, want):
    xml = junitparser.JUnitXml.fromfile(path)
    suites = list(xml) if isinstance(xml, junitparser.JUnitXml) else [xml]
    got = {}
    outcomes = set()
    for s in suites:
        tests = failures = skipped = errors = 0
        for case in s:
            tests += 1
            failures += case.is_failure
            errors += case.is_error
            skipped += case.is_skipped
            if case.is_passed:
                outcomes.add("pass")
            for r in case.result:
                if isinstance(r, junitparser.Failure):
                    outcomes.add("failure")
                    if not r.type:
                        fail(f"junitparser: {s.name} {case.classname}.{case.name}: failure without a type")
                elif isinstance(r, junitparser.Skipped):
                    outcomes.add("xfail" if r.type == "xfail" else "skip")
        check_equal(f"junitparser: {s.name}: counted errors", errors, 0)
        check_equal(
            f"junitparser: {s.name}: attributes tests, failures, skipped, errors",
            (s.tests, s.failures, s.skipped, s.errors),
            (tests, failures, skipped, 0),
        )
        if not s.hostname:
            fail(f"junitparser: {s.name}: no hostname")
        try:
            stamp = datetime.datetime.fromisoformat(s.timestamp or "")
        except ValueError:
            fail(f"junitparser: {s.name}: timestamp {s.timestamp!r} is not ISO 8601")
        if stamp.tzinfo is not None:
            fail(f"junitparser: {s.name}: timestamp {s.timestamp!r} has a zone suffix")
        got[s.name] = (tests, failures, skipped)
    check_equal("junitparser: suites and their tests, failures, skipped", got, want)
    check_equal(
        "junitparser: document errors, failures, tests",
        (xml.errors, xml.failures, xml.tests),
        (0, sum(v[1] for v in want.values()), sum(v[0] for v in want.values())),
    )
    return outcomes


def with_junit2html(path, want):
    report = junit2html.Junit(filename=path)
    got = {s.name: (len(s.all()), len(s.failed()), len(s.skipped())) for s in report.suites}
    check_equal("junit2html: suites and their tests, failures, skipped", got, want)
    html = report.html()
    for name in want:
        if name not in html:
            fail(f"junit2html: the rendered page does not name suite {name}")
    with tempfile.NamedTemporaryFile("w", suffix=".html", delete=True, encoding="utf-8") as f:
        f.write(html)
    return len(html)


def with_xunitparser(path, want):
    with open(path, "rb") as f:
        # Asserts the document's tests, failures and errors totals and unique property names.
        try:
            suite, result = xunitparser.parse(f)
        except AssertionError as e:
            fail(f"xunitparser refused {path}: {e!r} (a repeated property name or a wrong total)")
    got = {}
    for case in suite:
        # One flat suite: each case's class name starts with its device (`cpu:0.memory.copy`).
        dev = case.classname.split(".", 1)[0]
        t, fa, sk = got.get(dev, (0, 0, 0))
        if case.errored:
            fail(f"xunitparser: {case.classname}.{case.methodname} is an error")
        if case.failed and not case.typename:
            fail(f"xunitparser: {case.classname}.{case.methodname}: failure without a type")
        got[dev] = (t + 1, fa + case.failed, sk + case.skipped)
    check_equal("xunitparser: suites and their tests, failures, skipped", got, want)
    check_equal(
        "xunitparser: result failures, skipped, errors",
        (len(result.failures), len(result.skipped), len(result.errors)),
        (sum(v[1] for v in want.values()), sum(v[2] for v in want.values()), 0),
    )
    return len(suite.properties)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml", nargs="+")
    ap.add_argument("--require", action="append", default=[],
                    choices=["pass", "failure", "skip", "xfail"])
    ap.add_argument("--min-suites", type=int, default=1)
    args = ap.parse_args()
    seen = set()
    for path in args.xml:
        want = expected_suites(path)
        if len(want) < args.min_suites:
            fail(f"{path}: {len(want)} suites, fewer than {args.min_suites}")
        seen |= with_junitparser(path, want)
        page = with_junit2html(path, want)
        props = with_xunitparser(path, want)
        tests = sum(v[0] for v in want.values())
        print(
            f"check-junit: {path}: {len(want)} suites, {tests} tests, "
            f"{sum(v[1] for v in want.values())} failures, {sum(v[2] for v in want.values())} skipped: "
            f"junitparser {junitparser.version} agrees; junit2html agrees (a {page}-character page); "
            f"xunitparser agrees ({props} unique properties)"
        )
    missing = [o for o in args.require if o not in seen]
    if missing:
        fail(f"no case with outcome {', '.join(missing)} in {', '.join(args.xml)}")
    print(f"check-junit: OK: outcomes seen: {', '.join(sorted(seen))}")


if __name__ == "__main__":
    main()
