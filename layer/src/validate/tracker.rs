//! The happens-before model: vector clocks per stream, the host's clock, and per-allocation
//! access records.
//!
//! Every enqueue on stream `s` gets the next *epoch* of `s`. Stream `s` *knows* epoch `e` of
//! stream `t` when `t == s`, when an event wait carried it to `s` (its own clock), or when the
//! host learned it (a stream, event or device synchronisation, a completed query): whatever the
//! host knows when it enqueues is ordered before what it enqueues, so the host's clock counts for
//! every later enqueue and is never copied into the streams' clocks.
//!
//! An access conflicts with an earlier one of another stream on overlapping bytes when at least
//! one writes and the later stream does not know the earlier epoch. Records the host knows are
//! ordered before everything that can still come and are dropped; the rest are bounded per
//! allocation (`MAX_RECORDS`), the oldest dropped first, which can only hide findings.

use crate::validate::finding::{Finding, FindingKind, Site};
use std::collections::{BTreeMap, HashMap};
use unihal_hal::DeviceId;

/// Most access records kept per allocation.
const MAX_RECORDS: usize = 64;

/// A vector clock: stream key -> the last epoch known of it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Clock(HashMap<u64, u64>);

impl Clock {
    fn get(&self, stream: u64) -> u64 {
        self.0.get(&stream).copied().unwrap_or(0)
    }

    fn raise(&mut self, stream: u64, epoch: u64) {
        let e = self.0.entry(stream).or_insert(0);
        *e = (*e).max(epoch);
    }

    fn join(&mut self, other: &Clock) {
        for (&s, &e) in &other.0 {
            self.raise(s, e);
        }
    }
}

/// The parts of `[a, b)` outside `[lo, hi)` (none, one or two ranges).
fn outside(a: u64, b: u64, lo: u64, hi: u64) -> impl Iterator<Item = (u64, u64)> {
    let disjoint = b <= lo || hi <= a;
    let left = if disjoint {
        (a, b)
    } else {
        (a, a.max(lo).min(b))
    };
    let right = (b.min(hi).max(a), b);
    [left, if disjoint { (0, 0) } else { right }]
        .into_iter()
        .filter(|(s, e)| s < e)
}

/// Where an access lands: device memory (records per allocation) or a host buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    Device(DeviceId),
    Host,
}

/// One access an enqueue makes: bytes `[start, end)` of the allocation at `base`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touch {
    pub space: Space,
    pub base: u64,
    pub start: u64,
    pub end: u64,
    pub write: bool,
    /// The argument (`dst`, `send`, `tensors[2]`).
    pub arg: &'static str,
    /// True when the HAL will refuse the handle itself (freed in stream order): no finding then.
    pub refused_by_hal: bool,
}

#[derive(Clone, Copy, Debug)]
struct Access {
    start: u64,
    end: u64,
    write: bool,
    stream: u64,
    epoch: u64,
    site: Site,
    what: &'static str,
    arg: &'static str,
}

#[derive(Clone, Copy, Debug)]
struct Freed {
    start: u64,
    end: u64,
    stream: u64,
    site: Site,
}

struct StreamState {
    device: DeviceId,
    epoch: u64,
    /// What event waits carried to this stream (entries the host knows as well may linger).
    own: Clock,
    live: bool,
}

/// The whole model of one validated backend. Not thread-safe by itself: the layer keeps it
/// behind one mutex, held for bookkeeping only (never across a backend call).
#[derive(Default)]
pub(crate) struct Tracker {
    host: Clock,
    streams: HashMap<u64, StreamState>,
    records: HashMap<(Space, u64), Vec<Access>>,
    /// Allocation bases per space, to find the records a new allocation replaces.
    bases: HashMap<Space, BTreeMap<u64, u64>>,
    freed: HashMap<DeviceId, Vec<Freed>>,
    /// Allocations the program orders itself (device-side flags): never tracked.
    exempt: std::collections::HashSet<(Space, u64)>,
}

impl Tracker {
    pub fn stream_created(&mut self, stream: u64, device: DeviceId) {
        self.streams.insert(
            stream,
            StreamState {
                device,
                epoch: 0,
                own: Clock::default(),
                live: true,
            },
        );
    }

    pub fn stream_dropped(&mut self, stream: u64) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.live = false;
        }
    }

    /// The next epoch of `stream` (each enqueue takes one).
    pub fn tick(&mut self, stream: u64) -> u64 {
        match self.streams.get_mut(&stream) {
            Some(s) => {
                s.epoch += 1;
                s.epoch
            }
            None => 0,
        }
    }

    fn knows(&self, stream: u64, other: u64, epoch: u64) -> bool {
        if stream == other || self.host.get(other) >= epoch {
            return true;
        }
        self.streams
            .get(&stream)
            .is_some_and(|s| s.own.get(other) >= epoch)
    }

    /// The findings `touches` of an enqueue on `stream` would make (nothing is recorded).
    pub fn check(
        &self,
        stream: u64,
        what: &'static str,
        site: Site,
        touches: &[Touch],
    ) -> Vec<Finding> {
        let mut out = Vec::new();
        for t in touches.iter().filter(|t| {
            t.start < t.end && !t.refused_by_hal && !self.exempt.contains(&(t.space, t.base))
        }) {
            if let Space::Device(dev) = t.space {
                for f in self.freed.get(&dev).into_iter().flatten() {
                    if f.start < t.end && t.start < f.end {
                        out.push(Finding {
                            kind: FindingKind::UseAfterFreeAsync,
                            message: format!(
                                "{what} ({}) on stream {stream} uses bytes [{:#x}, {:#x}) of {dev} \
                                 that free_async on stream {} freed (through another handle of the \
                                 same memory)",
                                t.arg,
                                t.start.max(f.start),
                                t.end.min(f.end),
                                f.stream
                            ),
                            site,
                            earlier: Some(f.site),
                        });
                    }
                }
            }
            for a in self.records.get(&(t.space, t.base)).into_iter().flatten() {
                let overlap = a.start < t.end && t.start < a.end;
                if !overlap || !(a.write || t.write) || self.knows(stream, a.stream, a.epoch) {
                    continue;
                }
                let (lo, hi) = (t.start.max(a.start), t.end.min(a.end));
                let place = match t.space {
                    Space::Device(d) => format!("{d}"),
                    Space::Host => "a host buffer".into(),
                };
                out.push(Finding {
                    kind: FindingKind::UnorderedAccess,
                    message: format!(
                        "{what} ({}) on stream {stream} {} bytes [{lo:#x}, {hi:#x}) of {place} that \
                         {} ({}) on stream {} {}, and nothing orders the two (record an event after \
                         the first and wait for it on stream {stream}, or synchronise)",
                        t.arg,
                        if t.write { "writes" } else { "reads" },
                        a.what,
                        a.arg,
                        a.stream,
                        if a.write { "wrote" } else { "read" },
                    ),
                    site,
                    earlier: Some(a.site),
                });
            }
        }
        out
    }

    /// Records what an accepted enqueue on `stream` (at `epoch`) touched.
    pub fn commit(
        &mut self,
        stream: u64,
        epoch: u64,
        what: &'static str,
        site: Site,
        touches: &[Touch],
    ) {
        for t in touches
            .iter()
            .filter(|t| t.start < t.end && !self.exempt.contains(&(t.space, t.base)))
        {
            let host = &self.host;
            let list = self.records.entry((t.space, t.base)).or_default();
            // What the host knows is ordered before every later enqueue and map: drop it. A write
            // supersedes what it covers; a read supersedes this stream's reads it covers.
            list.retain(|a| {
                let covered = t.start <= a.start && a.end <= t.end;
                host.get(a.stream) < a.epoch
                    && !(covered && (t.write || (!a.write && a.stream == stream)))
            });
            if list.len() >= MAX_RECORDS {
                list.remove(0);
            }
            list.push(Access {
                start: t.start,
                end: t.end,
                write: t.write,
                stream,
                epoch,
                site,
                what,
                arg: t.arg,
            });
        }
    }

    /// A new allocation `[base, base + len)`: the history of the memory it reuses is over.
    pub fn allocated(&mut self, space: Space, base: u64, len: u64) {
        let end = base.saturating_add(len);
        let bases = self.bases.entry(space).or_default();
        // The allocations inside the new one, and the one just below it if it reaches in.
        let mut gone: Vec<u64> = bases.range(base..end).map(|(&b, _)| b).collect();
        if let Some((&b, &l)) = bases.range(..base).next_back() {
            if b.saturating_add(l) > base {
                gone.push(b);
            }
        }
        for b in gone {
            bases.remove(&b);
            self.records.remove(&(space, b));
            self.exempt.remove(&(space, b));
        }
        bases.insert(base, len.max(1));
        if let Space::Device(d) = space {
            if let Some(f) = self.freed.get_mut(&d) {
                f.retain(|f| !(f.start < end && base < f.end));
            }
        }
    }

    /// A sub-allocator handed out bytes `[start, end)` of the allocation at `base` for work on
    /// `stream` (see `Device::block_handed_out`). The sub-allocator reuses a range for another
    /// stream only once the earlier work on it has completed, and for the stream whose queued
    /// work still uses it at once (stream order puts the new work after it): so the records of
    /// other streams over those bytes are over, as is a `free_async` of an earlier block there,
    /// while the records of `stream` that the host has not seen complete stay: another stream
    /// the new owner hands the block to must be ordered after them. Records of the allocation's
    /// other bytes stay.
    pub fn handed_out(&mut self, space: Space, base: u64, (start, end): (u64, u64), stream: u64) {
        if let Space::Device(d) = space {
            if let Some(f) = self.freed.get_mut(&d) {
                let mut kept = Vec::with_capacity(f.len());
                for x in f.drain(..) {
                    for (s, e) in outside(x.start, x.end, start, end) {
                        kept.push(Freed {
                            start: s,
                            end: e,
                            ..x
                        });
                    }
                }
                *f = kept;
            }
        }
        let host = &self.host;
        let Some(list) = self.records.get_mut(&(space, base)) else {
            return;
        };
        let mut kept = Vec::with_capacity(list.len() + 2);
        for a in list.drain(..) {
            if a.stream == stream && host.get(a.stream) < a.epoch {
                kept.push(a);
                continue;
            }
            for (s, e) in outside(a.start, a.end, start, end) {
                kept.push(Access {
                    start: s,
                    end: e,
                    ..a
                });
            }
        }
        let excess = kept.len().saturating_sub(MAX_RECORDS);
        kept.drain(..excess);
        *list = kept;
    }

    /// The program orders the accesses to the allocation at `base` itself: stop tracking it
    /// (until the memory is allocated again).
    pub fn exempt(&mut self, space: Space, base: u64) {
        self.records.remove(&(space, base));
        self.exempt.insert((space, base));
    }

    /// `free_async` on `stream` freed `[start, end)` of `device`.
    pub fn freed(&mut self, device: DeviceId, start: u64, end: u64, stream: u64, site: Site) {
        self.freed.entry(device).or_default().push(Freed {
            start,
            end,
            stream,
            site,
        });
    }

    /// What a record on `stream` captures: everything the stream knows at its current epoch.
    pub fn snapshot(&self, stream: u64) -> Clock {
        let mut c = Clock::default();
        if let Some(s) = self.streams.get(&stream) {
            for (&t, &e) in &s.own.0 {
                if self.host.get(t) < e {
                    c.raise(t, e);
                }
            }
            c.raise(stream, s.epoch);
        }
        c
    }

    /// Stream `stream` waited for an event that captured `clock`.
    pub fn wait(&mut self, stream: u64, clock: &Clock) {
        let host = &self.host;
        if let Some(s) = self.streams.get_mut(&stream) {
            s.own.0.retain(|t, e| host.get(*t) < *e);
            s.own.join(clock);
        }
    }

    /// What a device synchronisation captures: every stream of `device`.
    pub fn device_snapshot(&self, device: DeviceId) -> Clock {
        let mut c = Clock::default();
        for (&k, s) in &self.streams {
            if s.device == device {
                c.raise(k, s.epoch);
                c.join(&s.own);
            }
        }
        c
    }

    /// The host learned that the work `clock` captures has completed.
    pub fn host_learns(&mut self, clock: &Clock) {
        self.host.join(clock);
        // A dropped stream the host has caught up with can never be needed again.
        let host = &self.host;
        self.streams.retain(|&k, s| s.live || host.get(k) < s.epoch);
    }

    /// The host maps (or lends) the host buffer at `base`, `len` bytes, at `site`.
    pub fn host_map(&self, base: u64, len: u64, site: Site) -> Vec<Finding> {
        let mut out = Vec::new();
        let end = base.saturating_add(len);
        for a in self.records.get(&(Space::Host, base)).into_iter().flatten() {
            if a.start < end && base < a.end && self.host.get(a.stream) < a.epoch {
                out.push(Finding {
                    kind: FindingKind::UnorderedHostMap,
                    message: format!(
                        "the host maps a host buffer that {} ({}) on stream {} {}, without a \
                         synchronisation that tells the host the work completed (the map \
                         succeeded only because it had; synchronise the stream or an event \
                         recorded after it first)",
                        a.what,
                        a.arg,
                        a.stream,
                        if a.write { "wrote" } else { "read" }
                    ),
                    site,
                    earlier: Some(a.site),
                });
            }
        }
        out
    }
}
