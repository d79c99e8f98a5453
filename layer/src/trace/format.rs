//! The Trace Event Format (the JSON that Perfetto and chrome://tracing open), as this layer writes
//! it: complete slices (`X`), flow arrows (`s`, `f`), counters (`C`) and track names (`M`), in a
//! JSON object format document (`{"traceEvents": [...]}`). Times are written in microseconds with
//! nanosecond decimals, as the format's `ts` and `dur` are.

use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// One record of a trace.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    /// A complete slice on track `tid` of process `pid`.
    Slice {
        pid: u32,
        tid: u64,
        ts: u64,
        dur: u64,
        name: Cow<'static, str>,
        cat: &'static str,
        args: Vec<(&'static str, Value)>,
    },
    /// The start (`s`) or end (`f`, bound to its enclosing slice) of flow arrow `id`.
    Flow {
        start: bool,
        id: u64,
        pid: u32,
        tid: u64,
        ts: u64,
    },
    /// Counter `name` of process `pid`: each series a line.
    Counter {
        pid: u32,
        ts: u64,
        name: &'static str,
        series: Vec<(&'static str, i64)>,
    },
    /// The name and sort position of a process.
    ProcessName { pid: u32, name: String },
    /// The name and sort position of a track.
    ThreadName {
        pid: u32,
        tid: u64,
        name: String,
        sort: u64,
    },
}

/// Nanoseconds as the format's microseconds.
fn us(ns: u64) -> Value {
    // Exact to the nanosecond for any trace shorter than about 100 days (2^53 ns).
    json!(ns as f64 / 1000.0)
}

impl Record {
    /// The record as a Trace Event Format event.
    pub fn to_json(&self) -> Value {
        match self {
            Record::Slice {
                pid,
                tid,
                ts,
                dur,
                name,
                cat,
                args,
            } => {
                let args: Map<String, Value> = args
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone()))
                    .collect();
                json!({"ph": "X", "pid": pid, "tid": tid, "ts": us(*ts), "dur": us(*dur),
                       "name": name, "cat": cat, "args": args})
            }
            Record::Flow {
                start,
                id,
                pid,
                tid,
                ts,
            } => {
                let mut v = json!({"ph": if *start { "s" } else { "f" }, "id": id, "pid": pid,
                                   "tid": tid, "ts": us(*ts), "name": "event", "cat": "event"});
                if !start {
                    v["bp"] = json!("e");
                }
                v
            }
            Record::Counter {
                pid,
                ts,
                name,
                series,
            } => {
                let args: Map<String, Value> = series
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), json!(v)))
                    .collect();
                json!({"ph": "C", "pid": pid, "tid": 0, "ts": us(*ts), "name": name, "args": args})
            }
            Record::ProcessName { pid, name } => json!({"ph": "M", "pid": pid, "tid": 0,
                "name": "process_name", "args": {"name": name}}),
            Record::ThreadName {
                pid,
                tid,
                name,
                sort,
            } => json!([
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": name}},
                {"ph": "M", "pid": pid, "tid": tid, "name": "thread_sort_index",
                 "args": {"sort_index": sort}}
            ]),
        }
    }
}

/// The document of `records`, with `meta` as its `otherData`.
///
/// A flow arrow has one start and one end, but an event record may be waited for by several
/// streams: each wait after the first gets an arrow of its own, from a copy of the record's start
/// (ids above 2^48 are these copies).
pub(crate) fn document(records: &[Record], meta: Value) -> Value {
    let mut ends: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    let mut extra = Vec::new();
    let starts: std::collections::HashMap<u64, &Record> = records
        .iter()
        .filter_map(|r| match r {
            Record::Flow {
                start: true, id, ..
            } => Some((*id, r)),
            _ => None,
        })
        .collect();
    let mut records: Vec<Record> = records
        .iter()
        .map(|r| match r {
            Record::Flow {
                start: false,
                id,
                pid,
                tid,
                ts,
            } => {
                let n = ends.entry(*id).or_default();
                *n += 1;
                if *n == 1 {
                    return r.clone();
                }
                let copy = (*n << 48) | id;
                if let Some(Record::Flow {
                    pid: p,
                    tid: t,
                    ts: s,
                    ..
                }) = starts.get(id)
                {
                    extra.push(Record::Flow {
                        start: true,
                        id: copy,
                        pid: *p,
                        tid: *t,
                        ts: *s,
                    });
                }
                Record::Flow {
                    start: false,
                    id: copy,
                    pid: *pid,
                    tid: *tid,
                    ts: *ts,
                }
            }
            r => r.clone(),
        })
        .collect();
    records.extend(extra);
    let mut events = Vec::with_capacity(records.len() + 16);
    for r in &records {
        match r.to_json() {
            Value::Array(a) => events.extend(a),
            v => events.push(v),
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta})
}
