//! A check of a trace against the Trace Event Format's rules (the format's documentation, "Trace
//! Event Format", Google, the JSON Object and JSON Array forms), for the phases this layer
//! writes and those a reader meets most: complete (`X`), begin/end (`B`/`E`), counter (`C`),
//! metadata (`M`), flow (`s`, `t`, `f`) and instant (`i`, `I`) events.
//!
//! Beyond each event's fields it checks what makes a viewer draw a trace wrongly: slices on one
//! track must nest (a slice that starts inside another ends inside it), `B`/`E` must pair, every
//! flow end must follow its start and lie inside a slice of its track (the slice the arrow
//! attaches to), counters carry numbers only.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};

/// What a trace that passed holds.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Checked {
    pub events: usize,
    pub slices: usize,
    pub flows: usize,
    pub counters: usize,
    /// Distinct (pid, tid) tracks holding slices.
    pub tracks: usize,
    pub processes: usize,
}

/// A flow event: its index, phase, track, time, key (category, name, id) and whether it binds
/// to its enclosing slice.
type FlowEvent = (usize, char, (i64, i64), f64, String, bool);

fn num(e: &Value, k: &str) -> Option<f64> {
    e.get(k).and_then(Value::as_f64)
}

fn int(e: &Value, k: &str) -> Option<i64> {
    e.get(k).and_then(Value::as_i64)
}

/// Checks `doc` (a parsed trace file).
///
/// # Errors
/// Every rule broken (at most 20 listed, then a count), each naming the event's index.
pub fn check(doc: &Value) -> Result<Checked, Vec<String>> {
    let mut bad = Vec::new();
    let events = match doc {
        Value::Array(a) => a,
        Value::Object(o) => match o.get("traceEvents") {
            Some(Value::Array(a)) => a,
            _ => return Err(vec!["an object trace needs a \"traceEvents\" array".into()]),
        },
        _ => return Err(vec!["a trace is a JSON object or array".into()]),
    };
    let mut ok = Checked {
        events: events.len(),
        ..Checked::default()
    };
    // Per track: the complete slices (ts, end), and the open B events.
    let mut slices: BTreeMap<(i64, i64), Vec<(f64, f64)>> = BTreeMap::new();
    let mut open: HashMap<(i64, i64), Vec<f64>> = HashMap::new();
    let mut flows: Vec<FlowEvent> = Vec::new();
    let mut pids = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let mut fail = |why: String| bad.push(format!("event {i}: {why}: {e}"));
        if !e.is_object() {
            fail("not an object".into());
            continue;
        }
        let Some(ph) = e.get("ph").and_then(Value::as_str) else {
            fail("no \"ph\" string".into());
            continue;
        };
        if e.get("name").is_some_and(|n| !n.is_string()) {
            fail("\"name\" is not a string".into());
        }
        if e.get("cat").is_some_and(|n| !n.is_string()) {
            fail("\"cat\" is not a string".into());
        }
        if e.get("args").is_some_and(|a| !a.is_object()) {
            fail("\"args\" is not an object".into());
        }
        let (pid, tid) = (int(e, "pid"), int(e, "tid"));
        if pid.is_none() || tid.is_none() {
            fail("\"pid\" and \"tid\" must be integers".into());
            continue;
        }
        let track = (pid.unwrap_or(0), tid.unwrap_or(0));
        pids.insert(track.0);
        let ts = num(e, "ts");
        if ph != "M" && ts.is_none() {
            fail("no numeric \"ts\"".into());
            continue;
        }
        let ts = ts.unwrap_or(0.0);
        if e.get("name").is_none() && ph != "E" {
            fail("no \"name\"".into());
        }
        match ph {
            "X" => match num(e, "dur") {
                Some(d) if d >= 0.0 => {
                    ok.slices += 1;
                    slices.entry(track).or_default().push((ts, ts + d));
                }
                _ => fail("a complete event needs a \"dur\" >= 0".into()),
            },
            "B" => open.entry(track).or_default().push(ts),
            "E" => match open.get_mut(&track).and_then(Vec::pop) {
                Some(b) if b <= ts => {
                    ok.slices += 1;
                    slices.entry(track).or_default().push((b, ts));
                }
                _ => fail("an end event without an earlier begin on its track".into()),
            },
            "C" => {
                ok.counters += 1;
                match e.get("args").and_then(Value::as_object) {
                    Some(a) if !a.is_empty() && a.values().all(Value::is_number) => {}
                    _ => fail("a counter's \"args\" must be a non-empty map of numbers".into()),
                }
            }
            "M" => {
                let name = e.get("name").and_then(Value::as_str).unwrap_or("");
                let key = match name {
                    "process_name" | "thread_name" | "process_labels" => "name",
                    "process_sort_index" | "thread_sort_index" => "sort_index",
                    _ => {
                        fail(format!("unknown metadata {name:?}"));
                        continue;
                    }
                };
                let arg = e.get("args").and_then(|a| a.get(key));
                let fits = if key == "name" {
                    arg.is_some_and(Value::is_string)
                } else {
                    arg.is_some_and(Value::is_i64)
                };
                if !fits {
                    fail(format!("metadata {name} needs args.{key}"));
                }
            }
            "s" | "t" | "f" => {
                let id = match e.get("id") {
                    Some(Value::Number(n)) => n.to_string(),
                    Some(Value::String(s)) => s.clone(),
                    _ => {
                        fail("a flow event needs an \"id\"".into());
                        continue;
                    }
                };
                let bp_e = match e.get("bp").and_then(Value::as_str) {
                    None => false,
                    Some("e") => true,
                    Some(b) => {
                        fail(format!("\"bp\" must be \"e\", not {b:?}"));
                        false
                    }
                };
                let key = format!(
                    "{}/{}/{id}",
                    e.get("cat").and_then(Value::as_str).unwrap_or(""),
                    e.get("name").and_then(Value::as_str).unwrap_or("")
                );
                let c = ph.chars().next().unwrap_or('s');
                flows.push((i, c, track, ts, key, bp_e));
            }
            "i" | "I" => {}
            other => fail(format!("phase {other:?} is not one this check knows")),
        }
    }
    for (track, b) in &open {
        if !b.is_empty() {
            bad.push(format!(
                "track {track:?}: {} begin event(s) never ended",
                b.len()
            ));
        }
    }
    // Slices on a track nest.
    const EPS: f64 = 1e-3;
    for (track, s) in &mut slices {
        s.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut stack: Vec<(f64, f64)> = Vec::new();
        for &(a, b) in s.iter() {
            while stack.last().is_some_and(|top| top.1 <= a + EPS) {
                stack.pop();
            }
            if let Some(top) = stack.last() {
                if b > top.1 + EPS {
                    bad.push(format!(
                        "track {track:?}: slice [{a}, {b}] overlaps [{}, {}] without nesting in it",
                        top.0, top.1
                    ));
                }
            }
            stack.push((a, b));
        }
    }
    // Flows: a start before every step and end; each end inside a slice of its track.
    let mut started = HashSet::new();
    let inside = |track: &(i64, i64), ts: f64, end_ok: bool| {
        slices.get(track).is_some_and(|s| {
            s.iter()
                .any(|&(a, b)| a <= ts + EPS && (ts < b || (end_ok && ts <= b + EPS)))
        })
    };
    let mut sorted = flows.clone();
    // At one time, starts before steps and ends (the format does not order equal times).
    sorted.sort_by(|a, b| {
        a.3.total_cmp(&b.3)
            .then((a.1 != 's').cmp(&(b.1 != 's')))
            .then(a.0.cmp(&b.0))
    });
    for (i, c, track, ts, key, bp_e) in &sorted {
        if *c == 's' {
            started.insert(key.clone());
        } else if !started.contains(key) {
            bad.push(format!("event {i}: flow {key} has no earlier start"));
        }
        if !inside(track, *ts, *bp_e) {
            bad.push(format!(
                "event {i}: flow {key} at {ts} lies in no slice of track {track:?}"
            ));
        }
        ok.flows += 1;
    }
    ok.tracks = slices.len();
    ok.processes = pids.len();
    if bad.is_empty() {
        Ok(ok)
    } else {
        let n = bad.len();
        bad.truncate(20);
        if n > 20 {
            bad.push(format!("... and {} more", n - 20));
        }
        Err(bad)
    }
}
