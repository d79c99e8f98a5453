//! The timeline (`UNIHAL_TRACE=FILE`): what every stream of every device did, and when, written
//! in the Trace Event Format that Perfetto (ui.perfetto.dev) and chrome://tracing open.
//!
//! ## What a trace holds
//! * **One process per device** (named by its device id and name) with **one track per stream**
//!   (device execution spans) and **one per host thread** that called into the device (host
//!   spans: the time each call took on the host, enqueue or wait).
//! * **Device spans** ([`timeline`]): copies (direction, bytes, GB/s), fills, kernel launches,
//!   library ops (shapes, dtypes, bytes, FLOPs where the op's are known), collectives (op,
//!   count, dtype, bytes, ranks, GB/s), event records and waits. Their times come from timing
//!   events the layer records after each call on the backend's stream: the CPU backend's worker
//!   times, the vendor's event timestamps on a GPU, the simulators' clocks. A record is timed by
//!   the work before it and adds no event; a host callback has a host span only (an event after
//!   either would be work the program did not enqueue, which a stream query would see).
//! * **Event record → wait arrows**: each record and wait is a short slice on its stream's track
//!   holding the end of a flow arrow, so the arrow runs from the record to every wait on it.
//! * **Counters**: the caching allocator's allocated and reserved bytes per device (every change,
//!   through `unihal_hal::counters`).
//!
//! ## How
//! The layer is the validation layer's wrapping backend ([`crate::wrap_with`]), so every backend
//! and plugin gets it. Records are kept in memory and written once, by [`finish`] (the CLI and
//! the GPT call it at their end) or at the process's exit. `%p` in the path is replaced by the
//! process id and `%r` by the launcher's rank (`RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK` or
//! `SLURM_PROCID`; 0 without one), so each process of a multi-process job writes its own file.
//! A program that does not set the variable gets no wrapping at all.
//!
//! [`summary`] reads a trace back: per device the busy share of each stream, the top ops, the
//! communication share and the communication not overlapped by compute, the longest idle gaps
//! (`unihal trace summary FILE`). [`check`] checks a document against the format's rules.

pub mod check;
mod format;
pub mod summary;
pub(crate) mod timeline;

use format::Record;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use timeline::{FlowEnd, Timeline};
use unihal_hal::DeviceId;

/// The variable naming the trace file.
pub const TRACE_ENV: &str = "UNIHAL_TRACE";

/// Host-thread tracks are numbered from here (stream tracks by stream id, which stays below).
pub const HOST_TRACK_BASE: u64 = 1 << 40;

/// What a traced call was: the name and category of its slices and the arguments they show.
#[derive(Debug, Clone)]
pub(crate) struct Detail {
    pub name: Cow<'static, str>,
    /// `copy`, `fill`, `kernel`, `op`, `collective` or `event`.
    pub cat: &'static str,
    pub args: Vec<(&'static str, Value)>,
    /// Bytes moved, for the bandwidth of copies and collectives (0: none shown).
    pub bytes: u64,
}

impl Detail {
    pub fn new(name: impl Into<Cow<'static, str>>, cat: &'static str) -> Detail {
        Detail {
            name: name.into(),
            cat,
            args: Vec::new(),
            bytes: 0,
        }
    }

    pub fn arg(mut self, key: &'static str, v: impl Into<Value>) -> Detail {
        self.args.push((key, v.into()));
        self
    }

    /// Shows `bytes` (and, once timed, the bandwidth).
    pub fn bytes(mut self, bytes: u64) -> Detail {
        self.bytes = bytes;
        self.arg("bytes", bytes)
    }
}

/// The shortest record or wait span written: one that took no device time still gets a slice to
/// hold its arrow end. One nanosecond, so that the slices it lengthens cannot push a record after
/// the wait it released (those are further apart on every device clock).
const MIN_SPAN_NS: u64 = 1;

/// Where an arrow starts: the record's stream, the raw end of the span before it there, and its
/// host enqueue time.
type RecordAt = ((u32, u64), Option<i64>, i64);

/// A device span as resolved: host enqueue time and device end time (before the offset).
struct DeviceSpan {
    pid: u32,
    tid: u64,
    enqueued: u64,
    end: i64,
    /// The end is the previous span's (an event record, timed by no event of its own): it
    /// completed at the later of that and its enqueue.
    derived: bool,
    detail: Detail,
    flow: Option<FlowEnd>,
}

struct State {
    records: Vec<Record>,
    spans: Vec<DeviceSpan>,
    /// Slices, spans and counter samples not kept once the trace held `max_events`.
    dropped: u64,
    /// Per counter of a process: the index of its newest sample in `records`, and its time.
    counters: HashMap<(u32, &'static str), (usize, u64)>,
    pids: HashMap<DeviceId, u32>,
    named: HashSet<(u32, u64)>,
    /// Timelines that may still hold pending spans at the end.
    timelines: Vec<Arc<Mutex<Timeline>>>,
}

/// A trace being recorded: the records, the clock, the track names.
///
/// Ownership: shared (`Arc`) by every layer that records into it; one per file. Thread safety:
/// any thread; one mutex guards the records, held only to append.
pub struct Trace {
    path: PathBuf,
    t0: Instant,
    state: Mutex<State>,
    next_flow: AtomicU64,
    written: AtomicBool,
    max_events: usize,
}

/// The variable bounding the events a trace keeps (default [`DEFAULT_MAX_EVENTS`]).
pub const MAX_EVENTS_ENV: &str = "UNIHAL_TRACE_MAX_EVENTS";

/// Events a trace keeps by default: about 300 MB of JSON, what a trace viewer still opens.
pub const DEFAULT_MAX_EVENTS: usize = 2_000_000;

impl State {
    /// True when another event fits; otherwise counts it dropped (and warns once).
    fn room(&mut self, max: usize) -> bool {
        if self.records.len() + self.spans.len() < max {
            return true;
        }
        if self.dropped == 0 {
            tracing::warn!(
                target: "unihal::layer",
                "the trace holds {max} events ({MAX_EVENTS_ENV}): later events are dropped, and the file says how many"
            );
        }
        self.dropped += 1;
        false
    }
}

thread_local! {
    static HOST_TRACK: std::cell::OnceCell<(u64, String)> = const { std::cell::OnceCell::new() };
}
static NEXT_HOST_TRACK: AtomicU64 = AtomicU64::new(0);

impl Trace {
    /// A trace to be written to `path` (`%p`, `%r` replaced as the module docs say).
    pub fn new(path: impl AsRef<Path>) -> Arc<Trace> {
        Arc::new(Trace {
            path: expand(path.as_ref()),
            t0: Instant::now(),
            state: Mutex::new(State {
                records: Vec::new(),
                spans: Vec::new(),
                dropped: 0,
                counters: HashMap::new(),
                pids: HashMap::new(),
                named: HashSet::new(),
                timelines: Vec::new(),
            }),
            next_flow: AtomicU64::new(1),
            written: AtomicBool::new(false),
            // `unihal::check_settings` refuses a bad value at a program's start.
            max_events: unihal_hal::settings::get(MAX_EVENTS_ENV)
                .and_then(|v| v.parse().ok())
                .filter(|n| *n >= 1)
                .unwrap_or(DEFAULT_MAX_EVENTS),
        })
    }

    /// The same trace keeping at most `max` events (metadata aside); later ones are counted in
    /// the file's `otherData.dropped_events`.
    pub fn with_max_events(path: impl AsRef<Path>, max: usize) -> Arc<Trace> {
        let mut t = Trace::new(path);
        Arc::get_mut(&mut t)
            .expect("a new trace is unshared")
            .max_events = max;
        t
    }

    /// The process's trace when [`TRACE_ENV`] names a file: created on first use, the allocator's
    /// counters routed to it, written at [`finish`] or at exit.
    pub fn from_env() -> Option<Arc<Trace>> {
        static GLOBAL: OnceLock<Option<Arc<Trace>>> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let path = std::env::var_os(TRACE_ENV).filter(|p| !p.is_empty())?;
                let t = Trace::new(path);
                t.record_counters();
                // SAFETY: C's `atexit` takes any `extern "C" fn()`; `at_exit` touches statics only
                // (no thread-local, which may be gone at exit) and never unwinds (it catches
                // panics). A failed registration (it returns non-zero) only loses the fallback.
                unsafe { atexit(at_exit) };
                Some(t)
            })
            .clone()
    }

    /// Routes the process's counter samples (the caching allocator's bytes) to this trace; the
    /// first trace to ask keeps them ([`Trace::from_env`]'s asks first).
    ///
    /// # Errors
    /// `false` when another trace records them.
    pub fn record_counters(self: &Arc<Trace>) -> bool {
        unihal_hal::counters::install(self.clone()).is_ok()
    }

    /// The file it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Nanoseconds since the trace began.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    pub(crate) fn next_flow(&self) -> u64 {
        self.next_flow.fetch_add(1, Ordering::Relaxed)
    }

    /// The process of `device` (named `label` on first sight).
    pub(crate) fn pid(&self, device: DeviceId, label: &str) -> u32 {
        let mut s = self.state.lock();
        if let Some(p) = s.pids.get(&device) {
            return *p;
        }
        let pid = s.pids.len() as u32 + 1;
        s.pids.insert(device, pid);
        s.records.push(Record::ProcessName {
            pid,
            name: format!("{device} ({label})"),
        });
        pid
    }

    /// A timeline for a new stream, kept until the end.
    pub(crate) fn timeline(&self, t: Timeline, pid: u32, tid: u64) -> Arc<Mutex<Timeline>> {
        let t = Arc::new(Mutex::new(t));
        let mut s = self.state.lock();
        // Lock order is timeline, then state: a timeline another thread holds is kept.
        s.timelines
            .retain(|t| Arc::strong_count(t) > 1 || t.try_lock().is_none_or(|t| t.has_pending()));
        s.timelines.push(t.clone());
        if s.named.insert((pid, tid)) {
            s.records.push(Record::ThreadName {
                pid,
                tid,
                name: format!("stream {tid}"),
                sort: tid,
            });
        }
        t
    }

    /// A host span of the calling thread on `pid`'s process, from `start` to now.
    pub(crate) fn host_span(&self, pid: u32, start: u64, name: &'static str) {
        let end = self.now();
        let (tid, tname) = HOST_TRACK.with(|c| {
            c.get_or_init(|| {
                let n = NEXT_HOST_TRACK.fetch_add(1, Ordering::Relaxed);
                let t = std::thread::current();
                let name = t.name().map_or_else(
                    || format!("host thread {n}"),
                    |s| format!("host thread {n} ({s})"),
                );
                (HOST_TRACK_BASE + n, name)
            })
            .clone()
        });
        let mut s = self.state.lock();
        if s.named.insert((pid, tid)) {
            s.records.push(Record::ThreadName {
                pid,
                tid,
                name: tname,
                sort: tid,
            });
        }
        if !s.room(self.max_events) {
            return;
        }
        s.records.push(Record::Slice {
            pid,
            tid,
            ts: start,
            dur: end.saturating_sub(start),
            name: Cow::Borrowed(name),
            cat: "host",
            args: Vec::new(),
        });
    }

    /// A device span: enqueued at host time `enqueued`, ended at device time `end` (before the
    /// device's offset), with its arrow end.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn device_span(
        &self,
        pid: u32,
        tid: u64,
        enqueued: u64,
        end: i64,
        derived: bool,
        detail: Detail,
        flow: Option<FlowEnd>,
    ) {
        let mut s = self.state.lock();
        if !s.room(self.max_events) {
            return;
        }
        s.spans.push(DeviceSpan {
            pid,
            tid,
            enqueued,
            end,
            derived,
            detail,
            flow,
        });
    }

    /// The device spans as slices and arrows: per stream the offset of its clock (see
    /// [`timeline`]); per stream each span from the later of the previous span's end and its
    /// enqueue, to its end.
    fn device_records(spans: &[DeviceSpan]) -> Vec<Record> {
        let offset = Trace::offsets(spans);
        let mut last_end: HashMap<(u32, u64), u64> = HashMap::new();
        let mut out = Vec::with_capacity(spans.len() + spans.len() / 4);
        for s in spans {
            let last = last_end.entry((s.pid, s.tid)).or_insert(0);
            let end = u64::try_from(s.end + offset[&(s.pid, s.tid)])
                .unwrap_or(0)
                .max(*last);
            let end = if s.derived { end.max(s.enqueued) } else { end };
            let start = (*last).max(s.enqueued).min(end);
            let least = if s.detail.cat == "event" {
                MIN_SPAN_NS
            } else {
                0
            };
            let end = end.max(start + least);
            *last = end;
            let dur = end - start;
            let mut args = s.detail.args.clone();
            if s.detail.bytes > 0 && dur > 0 {
                // Bytes per nanosecond are GB/s.
                let gbps = s.detail.bytes as f64 / dur as f64;
                args.push(("GB/s", json!((gbps * 1000.0).round() / 1000.0)));
            }
            out.push(Record::Slice {
                pid: s.pid,
                tid: s.tid,
                ts: start,
                dur,
                name: s.detail.name.clone(),
                cat: s.detail.cat,
                args,
            });
            if let Some(f) = s.flow {
                // The arrow leaves a record where it starts and reaches a wait where it ends
                // (the wait ended because the record completed): it points forward in time.
                out.push(Record::Flow {
                    start: f.start,
                    id: f.id,
                    pid: s.pid,
                    tid: s.tid,
                    ts: if f.start { start } else { end },
                });
            }
        }
        Trace::order_arrows(&mut out);
        out
    }

    /// Keeps every arrow pointing forward: an arrow whose wait ends before its record's slice
    /// starts (possible only within the rounding of two streams' clocks, after [`Trace::offsets`])
    /// starts at the wait's end when that lies in the record's slice, and is dropped otherwise.
    fn order_arrows(out: &mut Vec<Record>) {
        let mut starts: HashMap<u64, (usize, u64)> = HashMap::new();
        let mut slice_start = 0;
        for (i, r) in out.iter().enumerate() {
            match r {
                Record::Slice { ts, .. } => slice_start = *ts,
                Record::Flow {
                    start: true, id, ..
                } => drop(starts.insert(*id, (i, slice_start))),
                _ => {}
            }
        }
        let mut drop_ids = HashSet::new();
        let mut moves = Vec::new();
        for r in out.iter() {
            if let Record::Flow {
                start: false,
                id,
                ts,
                ..
            } = r
            {
                let Some(&(i, lo)) = starts.get(id) else {
                    drop_ids.insert(*id);
                    continue;
                };
                if let Record::Flow { ts: s_ts, .. } = out[i] {
                    if *ts < s_ts {
                        if *ts >= lo {
                            moves.push((i, *ts));
                        } else {
                            drop_ids.insert(*id);
                        }
                    }
                }
            }
        }
        for (i, to) in moves {
            if let Record::Flow { ts, .. } = &mut out[i] {
                *ts = (*ts).min(to);
            }
        }
        out.retain(|r| !matches!(r, Record::Flow { id, .. } if drop_ids.contains(id)));
    }

    /// Per stream, the least offset of its clock that ends every span after its enqueue and
    /// every wait after the record it waited for began: after the stream's previous span ended
    /// and after the host enqueued it (its own timing event may run later: a worker descheduled
    /// between the two). A wait on another stream's record raises the waiting stream's offset; a
    /// few passes settle chains of them.
    fn offsets(spans: &[DeviceSpan]) -> HashMap<(u32, u64), i64> {
        let mut offset: HashMap<(u32, u64), i64> = HashMap::new();
        let mut prev_end: HashMap<(u32, u64), i64> = HashMap::new();
        // Per record: its stream, the raw end of the span before it, its host enqueue time.
        let mut records: HashMap<u64, RecordAt> = HashMap::new();
        let mut waits = Vec::new();
        for s in spans {
            let key = (s.pid, s.tid);
            let o = offset.entry(key).or_insert(0);
            if !s.derived {
                *o = (*o).max(s.enqueued as i64 - s.end);
            }
            match s.flow {
                Some(f) if f.start => {
                    let before = prev_end.get(&key).copied();
                    records.insert(f.id, (key, before, s.enqueued as i64));
                }
                Some(f) => waits.push((f.id, key, s.end)),
                None => {}
            }
            prev_end.insert(key, s.end);
        }
        for _ in 0..8 {
            let mut moved = false;
            for (id, stream, end) in &waits {
                let Some(&(from, before, enqueued)) = records.get(id) else {
                    continue;
                };
                let began = before.map_or(enqueued, |b| enqueued.max(offset[&from] + b));
                let need = began - end;
                let o = offset
                    .get_mut(stream)
                    .expect("every span's stream has an offset");
                if need > *o {
                    *o = need;
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        offset
    }

    /// The document as it stands, pending spans resolved as far as they completed.
    pub fn document(&self) -> Value {
        let timelines = self.state.lock().timelines.clone();
        let mut lost = 0;
        let mut unresolved = 0;
        for t in &timelines {
            let mut t = t.lock();
            t.resolve(self);
            lost += t.lost;
            unresolved += u64::from(t.has_pending());
        }
        let s = self.state.lock();
        let mut records = s.records.clone();
        records.extend(Trace::device_records(&s.spans));
        format::document(
            &records,
            json!({
                "producer": format!("unihal {}", unihal_hal::VERSION),
                "clock": "host monotonic clock, from the trace's start; device spans mapped onto it through timing events",
                "lost_device_spans": lost,
                "streams_with_unfinished_work": unresolved,
                "dropped_events": s.dropped,
                "max_events": self.max_events,
            }),
        )
    }

    /// Writes the trace to its file (again, if it was written before).
    ///
    /// # Errors
    /// The file's I/O error, naming the path.
    pub fn write(&self) -> std::io::Result<()> {
        let doc = self.document();
        let text = serde_json::to_string(&doc).map_err(std::io::Error::other)?;
        std::fs::write(&self.path, text).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("{TRACE_ENV}: {}: {e}", self.path.display()),
            )
        })?;
        self.written.store(true, Ordering::Release);
        Ok(())
    }
}

/// Counter samples closer than this to the previous one of their counter update it instead of
/// adding one: the allocator changes its bytes at every block, far faster than a timeline shows.
const COUNTER_MIN_NS: u64 = 10_000;

impl unihal_hal::counters::CounterSink for Trace {
    fn sample(&self, device: DeviceId, name: &'static str, series: &[(&'static str, i64)]) {
        let ts = self.now();
        let mut s = self.state.lock();
        let Some(&pid) = s.pids.get(&device) else {
            return;
        };
        if let Some(&(i, at)) = s.counters.get(&(pid, name)) {
            if ts.saturating_sub(at) < COUNTER_MIN_NS {
                if let Some(Record::Counter { series: kept, .. }) = s.records.get_mut(i) {
                    if kept.len() == series.len() {
                        kept.copy_from_slice(series);
                        return;
                    }
                }
            }
        }
        if !s.room(self.max_events) {
            return;
        }
        let i = s.records.len();
        s.records.push(Record::Counter {
            pid,
            ts,
            name,
            series: series.to_vec(),
        });
        s.counters.insert((pid, name), (i, ts));
    }
}

/// Writes the process's trace ([`Trace::from_env`]) if there is one, and says where (INFO, and
/// on standard error). Called by the `unihal` CLI and the GPT at their end; at exit otherwise.
///
/// # Errors
/// The file's I/O error.
pub fn finish() -> std::io::Result<Option<PathBuf>> {
    let Some(t) = Trace::from_env() else {
        return Ok(None);
    };
    t.write()?;
    tracing::info!(target: "unihal::layer", "trace written to {}", t.path.display());
    Ok(Some(t.path.clone()))
}

extern "C" {
    /// C's `atexit` (ISO C; the C library std links anyway).
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(t) = Trace::from_env() {
            if !t.written.load(Ordering::Acquire) {
                if let Err(e) = t.write() {
                    eprintln!("unihal: {e}");
                }
            }
        }
    });
}

/// `path` with `%p` (process id) and `%r` (the launcher's rank) replaced.
fn expand(path: &Path) -> PathBuf {
    let s = path.to_string_lossy();
    if !s.contains('%') {
        return path.to_path_buf();
    }
    let rank = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_else(|| "0".into());
    PathBuf::from(
        s.replace("%p", &std::process::id().to_string())
            .replace("%r", &rank),
    )
}
