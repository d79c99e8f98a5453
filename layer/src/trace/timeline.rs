//! Device execution spans of one stream: a timing event recorded after each traced call, turned
//! into a slice once it completed.
//!
//! Clocks: a stream's device time of an event is `anchor + elapsed(anchor, event)`, both
//! events of that stream (ACL times events of one stream only). The first anchor is an event
//! recorded on the idle stream, given the host time just before its record. Whenever nothing is
//! pending, the newest resolved event becomes the anchor, with the time computed for it, which
//! keeps every `elapsed_ms` short (it is an `f32` of milliseconds: about 0.1 µs of rounding at
//! one second) without drifting. The device reached the first anchor a little after the host
//! time it was given (its pick-up latency), so each stream's times move later when the trace is
//! written ([`super::Trace::document`]) by the least amount that ends every span after the host
//! enqueued it and every wait after the record it waited for.
//!
//! Costs: one event record per traced call, and one `query` of the oldest pending event per call;
//! events are reused once resolved. Nothing here ever blocks: an event not yet complete stays
//! pending until a later call, the stream's synchronisation or the trace's end.

use super::{Detail, Trace};
use std::collections::VecDeque;
use std::sync::Arc;
use unihal_hal::{Device, Event, EventFlags, Stream};

/// An arrow end a span carries: the record (`start`) or wait of event flow `id`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlowEnd {
    pub start: bool,
    pub id: u64,
}

/// A stream's clock: its anchor event and the anchor's time.
#[derive(Default)]
struct Clock {
    anchor: Option<(Arc<dyn Event>, i64)>,
}

impl Clock {
    /// The device time of `event` (complete, of the anchor's stream), in nanoseconds on the
    /// trace's host clock before the stream's offset; `None` when the event cannot be timed.
    fn time(&self, event: &dyn Event) -> Option<i64> {
        let (anchor, ns) = self.anchor.as_ref()?;
        let ms = anchor.elapsed_ms(event).ok()?;
        Some(*ns + (f64::from(ms) * 1e6) as i64)
    }
}

struct Pending {
    /// The timing event after the call; `None` for a call that completes when the work before
    /// it does (an event record), which so adds nothing to the stream: a program that waits for
    /// its own event and then queries the stream finds it idle, as without the layer.
    end: Option<Arc<dyn Event>>,
    enqueued: u64,
    detail: Detail,
    flow: Option<FlowEnd>,
}

/// Ownership: one per traced stream, shared with the [`Trace`] (which resolves what is left at
/// its end). Holds the backend's device and events, never the layer's. Thread safety: behind the
/// stream's mutex.
pub(crate) struct Timeline {
    pid: u32,
    tid: u64,
    device: Arc<dyn Device>,
    clock: Clock,
    pending: VecDeque<Pending>,
    pool: Vec<Arc<dyn Event>>,
    /// The device time of the last resolved span (or of the anchor).
    last: Option<i64>,
    /// Spans whose time could not be read (a failed record or a stream in error).
    pub lost: u64,
}

impl Timeline {
    /// A timeline of `stream` (the backend's) on `device` (the backend's), anchored now. When
    /// the backend cannot time events, the timeline has no anchor and records nothing.
    pub fn new(
        trace: &Trace,
        device: Arc<dyn Device>,
        stream: &dyn Stream,
        pid: u32,
        tid: u64,
    ) -> Timeline {
        let anchored = device.create_event(EventFlags::default()).and_then(|e| {
            let before = trace.now();
            stream.record_event(&e)?;
            e.synchronize()?;
            Ok((e, before as i64))
        });
        let anchor = anchored
            .map_err(|e| {
                tracing::warn!(target: "unihal::layer", "no device spans for stream {tid}: {e}")
            })
            .ok();
        Timeline {
            pid,
            tid,
            device,
            last: anchor.as_ref().map(|a| a.1),
            clock: Clock { anchor },
            pending: VecDeque::new(),
            pool: Vec::new(),
            lost: 0,
        }
    }

    /// After a traced call that `stream` (the backend's) accepted at host time `enqueued`: a
    /// timing event marks its end. Then resolves what completed.
    pub fn after(
        &mut self,
        trace: &Trace,
        stream: &dyn Stream,
        enqueued: u64,
        detail: Detail,
        flow: Option<FlowEnd>,
    ) {
        if self.clock.anchor.is_none() {
            return;
        }
        let end = match self.pool.pop() {
            Some(e) => Ok(e),
            None => self.device.create_event(EventFlags::default()),
        };
        match end.and_then(|e| stream.record_event(&e).map(|()| e)) {
            Ok(end) => self.pending.push_back(Pending {
                end: Some(end),
                enqueued,
                detail,
                flow,
            }),
            Err(_) => self.lost += 1,
        }
        self.resolve(trace);
    }

    /// After an event record the backend accepted at host time `enqueued`: a span that ends
    /// when the work before it did (no timing event of its own).
    pub fn after_record(&mut self, trace: &Trace, enqueued: u64, detail: Detail, flow: FlowEnd) {
        if self.clock.anchor.is_none() {
            return;
        }
        self.pending.push_back(Pending {
            end: None,
            enqueued,
            detail,
            flow: Some(flow),
        });
        self.resolve(trace);
    }

    /// Turns every leading pending span whose event completed into a slice.
    pub fn resolve(&mut self, trace: &Trace) {
        while let Some(p) = self.pending.front() {
            if let Some(end) = &p.end {
                match end.query() {
                    Ok(false) => return,
                    Ok(true) => {}
                    Err(_) => {
                        self.pending.pop_front();
                        self.lost += 1;
                        continue;
                    }
                }
            }
            let p = self.pending.pop_front().expect("front exists");
            let Some(marker) = p.end else {
                // A record: it completed with the span before it.
                let at = self.last.unwrap_or(0);
                trace.device_span(self.pid, self.tid, p.enqueued, at, true, p.detail, p.flow);
                continue;
            };
            let Some(end) = self.clock.time(marker.as_ref()) else {
                self.lost += 1;
                continue;
            };
            self.last = Some(end);
            if self.pending.is_empty() {
                // Re-anchor on the newest resolved event, keeping elapsed times short.
                let old = self.clock.anchor.replace((marker, end));
                self.pool.extend(old.map(|a| a.0));
            } else {
                self.pool.push(marker);
            }
            trace.device_span(self.pid, self.tid, p.enqueued, end, false, p.detail, p.flow);
        }
    }

    /// True when spans are still pending.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
