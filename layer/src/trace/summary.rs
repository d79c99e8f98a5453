//! What a trace says, in numbers (`unihal trace summary FILE`): per device, over the window from
//! its first device span to its last, the busy share of each stream, the ops that took the most
//! device time, the communication share (time any collective ran) and the exposed
//! communication (time a collective ran while no compute, copy or fill did on any stream of the
//! device: what overlapping would still hide), and the longest idle gaps of its streams.
//!
//! It reads any trace in the format whose device tracks carry categories as this layer writes
//! them (`collective` for communication; `host` for host spans, which are left out).

use super::HOST_TRACK_BASE;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;

/// One stream's share.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StreamShare {
    pub track: u64,
    pub name: String,
    pub busy_ms: f64,
    pub busy_share: f64,
    /// Time of its ops and kernels (computation).
    pub compute_ms: f64,
    /// Time it waited for a record that followed a collective on another stream.
    pub comm_wait_ms: f64,
}

/// Device time of one op name.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OpTime {
    pub name: String,
    pub calls: u64,
    pub ms: f64,
}

/// An idle gap on a stream.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Gap {
    pub track: u64,
    pub start_ms: f64,
    pub ms: f64,
}

/// The summary of one device (a process of the trace).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DeviceSummary {
    pub pid: i64,
    pub name: String,
    pub window_ms: f64,
    pub streams: Vec<StreamShare>,
    /// The top ops by device time, most first.
    pub top_ops: Vec<OpTime>,
    /// Time any collective ran, over the window.
    pub comm_share: f64,
    /// Time a collective ran and no op or kernel did, over the window.
    pub exposed_comm_share: f64,
    /// Time streams waited for an event recorded right after a collective (a compute stream
    /// stalled on communication), summed over streams, in milliseconds and over the window.
    pub comm_wait_ms: f64,
    pub comm_wait_share: f64,
    /// The longest idle gaps inside the window, longest first.
    pub gaps: Vec<Gap>,
}

/// The summary of a trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    pub devices: Vec<DeviceSummary>,
}

/// Merged intervals of `v` (sorted, disjoint).
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(v.len());
    for (a, b) in v {
        match out.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

fn length(v: &[(f64, f64)]) -> f64 {
    v.iter().map(|(a, b)| b - a).sum()
}

/// The length of `a` not covered by `b` (both unions, so sorted and disjoint).
fn uncovered(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let (mut j, mut total) = (0, 0.0);
    for &(s, e) in a {
        while j < b.len() && b[j].1 <= s {
            j += 1;
        }
        let mut covered = 0.0;
        let mut k = j;
        while k < b.len() && b[k].0 < e {
            covered += (e.min(b[k].1) - s.max(b[k].0)).max(0.0);
            k += 1;
        }
        total += (e - s) - covered;
    }
    total
}

struct Span {
    pid: i64,
    /// For a wait that ends an arrow: whether the record that released it followed a collective
    /// on its stream (a wait for communication).
    after_collective: bool,
    tid: u64,
    ts: f64,
    end: f64,
    name: String,
    cat: String,
}

/// Summarises `doc`, `top` ops and gaps per device.
///
/// # Errors
/// A message when `doc` is not a trace (see [`super::check::check`]).
pub fn summarize(doc: &Value, top: usize) -> Result<Summary, String> {
    super::check::check(doc).map_err(|e| e.join("\n"))?;
    let events = doc
        .get("traceEvents")
        .and_then(Value::as_array)
        .or(doc.as_array())
        .ok_or("no events")?;
    let mut names: BTreeMap<(i64, Option<u64>), String> = BTreeMap::new();
    let mut spans = Vec::new();
    // Arrows: the track of each start, and each end by track and time.
    let mut starts: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    let mut ends: BTreeMap<(i64, u64), Vec<(f64, String)>> = BTreeMap::new();
    for e in events {
        let ph = e["ph"].as_str().unwrap_or("");
        let pid = e["pid"].as_i64().unwrap_or(0);
        let tid = e["tid"].as_u64().unwrap_or(0);
        if ph == "M" {
            let n = e["args"]["name"].as_str().unwrap_or("").to_owned();
            match e["name"].as_str() {
                Some("process_name") => drop(names.insert((pid, None), n)),
                Some("thread_name") => drop(names.insert((pid, Some(tid)), n)),
                _ => {}
            }
            continue;
        }
        if ph == "s" || ph == "f" {
            let id = format!("{pid}/{}", e["id"]);
            let ts = e["ts"].as_f64().unwrap_or(0.0) / 1000.0;
            if ph == "s" {
                starts.insert(id, (tid, ts));
            } else {
                ends.entry((pid, tid)).or_default().push((ts, id));
            }
            continue;
        }
        let cat = e["cat"].as_str().unwrap_or("").to_owned();
        if ph != "X" || cat == "host" || tid >= HOST_TRACK_BASE {
            continue;
        }
        let ts = e["ts"].as_f64().unwrap_or(0.0) / 1000.0;
        spans.push(Span {
            pid,
            after_collective: false,
            tid,
            ts,
            end: ts + e["dur"].as_f64().unwrap_or(0.0) / 1000.0,
            name: e["name"].as_str().unwrap_or("").to_owned(),
            cat,
        });
    }
    // What each track ran, in order (records and waits left out), to see what a record followed.
    let mut work: BTreeMap<(i64, u64), Vec<(f64, bool)>> = BTreeMap::new();
    for s in spans.iter().filter(|s| s.cat != "event") {
        work.entry((s.pid, s.tid))
            .or_default()
            .push((s.end, s.cat == "collective"));
    }
    for v in work.values_mut() {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    let followed_collective = |pid: i64, tid: u64, ts: f64| {
        work.get(&(pid, tid)).is_some_and(|v| {
            let i = v.partition_point(|w| w.0 <= ts + 1e-6);
            i > 0 && v[i - 1].1
        })
    };
    // A wait span is released by the record whose arrow ends inside it.
    for s in spans.iter_mut().filter(|s| s.cat == "event") {
        if let Some(v) = ends.get(&(s.pid, s.tid)) {
            s.after_collective = v
                .iter()
                .find(|(t, _)| *t >= s.ts - 1e-6 && *t <= s.end + 1e-6)
                .and_then(|(_, id)| starts.get(id))
                .is_some_and(|&(tid, ts)| followed_collective(s.pid, tid, ts));
        }
    }
    let mut by_pid: BTreeMap<i64, Vec<Span>> = BTreeMap::new();
    for s in spans {
        by_pid.entry(s.pid).or_default().push(s);
    }
    let mut devices = Vec::new();
    for (pid, spans) in by_pid {
        let lo = spans.iter().map(|s| s.ts).fold(f64::INFINITY, f64::min);
        let hi = spans
            .iter()
            .map(|s| s.end)
            .fold(f64::NEG_INFINITY, f64::max);
        let window = (hi - lo).max(0.0);
        let share = |ms: f64| if window > 0.0 { ms / window } else { 0.0 };
        let mut per_track: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
        let mut ops: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
        let (mut comm, mut work) = (Vec::new(), Vec::new());
        for s in &spans {
            per_track.entry(s.tid).or_default().push((s.ts, s.end));
            if s.cat == "event" {
                continue;
            }
            let o = ops.entry(&s.name).or_default();
            o.0 += 1;
            o.1 += s.end - s.ts;
            // As Holistic Trace Analysis counts it: computation (ops, kernels) hides
            // communication; copies and fills (memory) do not.
            match s.cat.as_str() {
                "collective" => comm.push((s.ts, s.end)),
                "op" | "kernel" => work.push((s.ts, s.end)),
                _ => {}
            }
        }
        let (comm, work) = (union(comm), union(work));
        let mut compute: BTreeMap<u64, f64> = BTreeMap::new();
        let mut waited: BTreeMap<u64, f64> = BTreeMap::new();
        for s in &spans {
            if s.after_collective {
                *waited.entry(s.tid).or_default() += s.end - s.ts;
            }
            if s.cat == "op" || s.cat == "kernel" {
                *compute.entry(s.tid).or_default() += s.end - s.ts;
            }
        }
        let comm_wait: f64 = waited.values().sum();
        let mut streams = Vec::new();
        let mut gaps = Vec::new();
        for (tid, v) in per_track {
            let u = union(v);
            let busy = length(&u);
            for w in u.windows(2) {
                gaps.push(Gap {
                    track: tid,
                    start_ms: w[0].1,
                    ms: w[1].0 - w[0].1,
                });
            }
            streams.push(StreamShare {
                track: tid,
                name: names
                    .get(&(pid, Some(tid)))
                    .cloned()
                    .unwrap_or_else(|| format!("track {tid}")),
                busy_ms: busy,
                busy_share: share(busy),
                compute_ms: compute.get(&tid).copied().unwrap_or(0.0),
                comm_wait_ms: waited.get(&tid).copied().unwrap_or(0.0),
            });
        }
        gaps.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        gaps.truncate(top);
        let mut top_ops: Vec<OpTime> = ops
            .into_iter()
            .map(|(n, (calls, ms))| OpTime {
                name: n.to_owned(),
                calls,
                ms,
            })
            .collect();
        top_ops.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        top_ops.truncate(top);
        devices.push(DeviceSummary {
            pid,
            name: names
                .get(&(pid, None))
                .cloned()
                .unwrap_or_else(|| format!("process {pid}")),
            window_ms: window,
            streams,
            top_ops,
            comm_share: share(length(&comm)),
            exposed_comm_share: share(uncovered(&comm, &work)),
            comm_wait_ms: comm_wait,
            comm_wait_share: share(comm_wait),
            gaps,
        });
    }
    Ok(Summary { devices })
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.devices {
            writeln!(f, "{} — {:.3} ms of device time", d.name, d.window_ms)?;
            writeln!(
                f,
                "  {:<28} {:>12} {:>7} {:>12} {:>14}",
                "stream", "busy ms", "busy", "compute ms", "comm wait ms"
            )?;
            for s in &d.streams {
                writeln!(
                    f,
                    "  {:<28} {:>12.3} {:>6.1}% {:>12.3} {:>14.3}",
                    s.name,
                    s.busy_ms,
                    s.busy_share * 100.0,
                    s.compute_ms,
                    s.comm_wait_ms
                )?;
            }
            writeln!(
                f,
                "  communication: {:.1}% of the window, {:.1}% exposed (no op or kernel beside it)",
                d.comm_share * 100.0,
                d.exposed_comm_share * 100.0
            )?;
            writeln!(
                f,
                "  waits for communication: {:.3} ms, {:.1}% of the window (streams stalled on a record that followed a collective)",
                d.comm_wait_ms,
                d.comm_wait_share * 100.0
            )?;
            writeln!(f, "  top ops by device time:")?;
            for o in &d.top_ops {
                writeln!(
                    f,
                    "    {:<24} {:>6} call(s) {:>10.3} ms  {:>5.1}%",
                    o.name,
                    o.calls,
                    o.ms,
                    if d.window_ms > 0.0 {
                        o.ms / d.window_ms * 100.0
                    } else {
                        0.0
                    }
                )?;
            }
            writeln!(f, "  longest idle gaps:")?;
            for g in &d.gaps {
                let track = d
                    .streams
                    .iter()
                    .find(|s| s.track == g.track)
                    .map_or("?", |s| s.name.as_str());
                writeln!(
                    f,
                    "    {:<24} {:>10.3} ms at {:.3} ms",
                    track, g.ms, g.start_ms
                )?;
            }
        }
        Ok(())
    }
}
