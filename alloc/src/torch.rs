//! The snapshot in PyTorch's layout, for PyTorch's own memory tools: what
//! `torch.cuda.memory._snapshot()` returns, pickled as `torch.cuda.memory._dump_snapshot` writes
//! it, so `python -m torch.cuda._memory_viz stats|trace|segments FILE` and the memory visualiser
//! read a unihal run unchanged.
//!
//! The dict: `segments` (each: `device`, `address`, `total_size`, `allocated_size`,
//! `active_size`, `requested_size`, `stream`, `segment_type` "small"/"large", `segment_pool_id`
//! (`(0, 0)` in the general cache, a graph pool's [`crate::GraphPoolId`] otherwise, as torch
//! writes its private pools' `MempoolId_t`), `is_expandable` false, `frames` [], and `blocks` in address order with `address`,
//! `size`, `requested_size`, `state` and `frames`), `device_traces` (one list per device index up
//! to this device's, the recorded history as `action`, `addr`, `size`, `stream`, `frames`, and
//! `device_free` for `oom`) and `allocator_settings`. unihal records no stack frames: `frames` are
//! empty lists, which the tools accept. A segment's `stream` is 0: unihal's segments serve every
//! stream (its blocks carry theirs).
//!
//! The pickle is protocol 2, written by [`Value::pickle`]: dicts, lists, a tuple, strings,
//! integers (any 64-bit address), booleans.

use crate::size::PoolKind;
use crate::stats::{BlockState, SegmentSnapshot, TraceEvent};

/// A value of the snapshot dict.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i128),
    Bool(bool),
    Str(String),
    List(Vec<Value>),
    /// A tuple of two values (`segment_pool_id`).
    Pair(Box<(Value, Value)>),
    /// Keys in order.
    Dict(Vec<(String, Value)>),
}

fn int(v: u64) -> Value {
    Value::Int(v.into())
}

fn s(v: &str) -> Value {
    Value::Str(v.into())
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn no_frames() -> Value {
    Value::List(Vec::new())
}

impl Value {
    /// The value as a protocol-2 pickle (`PROTO 2` ... `STOP`).
    pub fn pickle(&self) -> Vec<u8> {
        let mut out = vec![0x80, 2];
        self.write(&mut out);
        out.push(b'.');
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        match self {
            Value::Int(v) => match i32::try_from(*v) {
                // BININT: a signed 32-bit little-endian integer.
                Ok(small) => {
                    out.push(b'J');
                    out.extend_from_slice(&small.to_le_bytes());
                }
                // LONG1: a length byte, then two's complement little-endian, shortest form.
                Err(_) => {
                    let bytes = v.to_le_bytes();
                    let mut n = bytes.len();
                    while n > 1 {
                        let (last, prev) = (bytes[n - 1], bytes[n - 2]);
                        let redundant =
                            (last == 0 && prev & 0x80 == 0) || (last == 0xff && prev & 0x80 != 0);
                        if !redundant {
                            break;
                        }
                        n -= 1;
                    }
                    out.push(0x8a);
                    out.push(n as u8);
                    out.extend_from_slice(&bytes[..n]);
                }
            },
            Value::Bool(b) => out.push(if *b { 0x88 } else { 0x89 }),
            Value::Str(t) => {
                // BINUNICODE: a 32-bit little-endian length, then UTF-8.
                out.push(b'X');
                out.extend_from_slice(&(t.len() as u32).to_le_bytes());
                out.extend_from_slice(t.as_bytes());
            }
            Value::List(items) => {
                out.push(b']');
                if !items.is_empty() {
                    out.push(b'(');
                    for v in items {
                        v.write(out);
                    }
                    out.push(b'e');
                }
            }
            Value::Pair(p) => {
                p.0.write(out);
                p.1.write(out);
                out.push(0x86);
            }
            Value::Dict(entries) => {
                out.push(b'}');
                if !entries.is_empty() {
                    out.push(b'(');
                    for (k, v) in entries {
                        Value::Str(k.clone()).write(out);
                        v.write(out);
                    }
                    out.push(b'u');
                }
            }
        }
    }
}

fn segment(device: u64, seg: &SegmentSnapshot) -> Value {
    let blocks = seg
        .blocks
        .iter()
        .map(|b| {
            let state = match b.state {
                BlockState::ActiveAllocated => "active_allocated",
                BlockState::ActivePendingFree => "active_pending_free",
                BlockState::Inactive => "inactive",
            };
            dict(vec![
                ("address", int(b.address)),
                ("size", int(b.size)),
                ("requested_size", int(b.requested_size)),
                ("state", s(state)),
                ("frames", no_frames()),
            ])
        })
        .collect();
    let kind = match seg.pool {
        PoolKind::Small => "small",
        PoolKind::Large => "large",
    };
    dict(vec![
        ("device", int(device)),
        ("address", int(seg.address)),
        ("total_size", int(seg.total_size)),
        ("allocated_size", int(seg.allocated_size)),
        ("active_size", int(seg.active_size)),
        ("requested_size", int(seg.requested_size)),
        ("stream", int(0)),
        ("segment_type", s(kind)),
        (
            "segment_pool_id",
            Value::Pair(Box::new(
                seg.graph_pool
                    .map_or((int(0), int(0)), |g| (int(g.0), int(g.1))),
            )),
        ),
        ("is_expandable", Value::Bool(false)),
        ("frames", no_frames()),
        ("blocks", Value::List(blocks)),
    ])
}

fn entry(e: &TraceEvent) -> Value {
    let (action, addr, size, stream) = match *e {
        TraceEvent::Alloc {
            addr, size, stream, ..
        } => ("alloc", addr, size, stream),
        TraceEvent::FreeRequested {
            addr, size, stream, ..
        } => ("free_requested", addr, size, stream),
        TraceEvent::FreeCompleted {
            addr, size, stream, ..
        } => ("free_completed", addr, size, stream),
        TraceEvent::SegmentAlloc { addr, size } => ("segment_alloc", addr, size, 0),
        TraceEvent::SegmentFree { addr, size } => ("segment_free", addr, size, 0),
        TraceEvent::Oom { size, device_free } => {
            return dict(vec![
                ("action", s("oom")),
                ("addr", int(0)),
                ("size", int(size)),
                ("stream", int(0)),
                ("device_free", int(device_free)),
                ("frames", no_frames()),
            ])
        }
    };
    dict(vec![
        ("action", s(action)),
        ("addr", int(addr)),
        ("size", int(size)),
        ("stream", int(stream)),
        ("frames", no_frames()),
    ])
}

/// The snapshot dict of device index `device` from its segments and recorded history, with
/// `max_split_size` (None: unset) in `allocator_settings`.
pub fn snapshot(
    device: u64,
    segments: &[SegmentSnapshot],
    history: &[TraceEvent],
    max_split_size: Option<u64>,
) -> Value {
    let mut traces: Vec<Value> = (0..device).map(|_| Value::List(Vec::new())).collect();
    traces.push(Value::List(history.iter().map(entry).collect()));
    let settings = dict(vec![(
        "max_split_size",
        Value::Int(max_split_size.map_or(-1, i128::from)),
    )]);
    dict(vec![
        (
            "segments",
            Value::List(segments.iter().map(|g| segment(device, g)).collect()),
        ),
        ("device_traces", Value::List(traces)),
        ("allocator_settings", settings),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_the_shortest_pickle_form() {
        assert_eq!(Value::Int(5).pickle(), [0x80, 2, b'J', 5, 0, 0, 0, b'.']);
        assert_eq!(
            Value::Int(-1).pickle()[2..7],
            [b'J', 0xff, 0xff, 0xff, 0xff]
        );
        // 2^31: LONG1 of 5 bytes (a zero byte keeps it positive).
        assert_eq!(
            Value::Int(1 << 31).pickle()[2..9],
            [0x8a, 5, 0, 0, 0, 0x80, 0]
        );
        // u64::MAX: 9 bytes.
        let p = Value::Int(u64::MAX.into()).pickle();
        assert_eq!(p[2..4], [0x8a, 9]);
        assert_eq!(
            p[4..13],
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]
        );
    }

    #[test]
    fn containers_and_strings() {
        let v = dict(vec![("a", Value::List(vec![])), ("b", Value::Bool(true))]);
        let mut want = vec![0x80, 2, b'}', b'(', b'X', 1, 0, 0, 0, b'a', b']'];
        want.extend_from_slice(&[b'X', 1, 0, 0, 0, b'b', 0x88, b'u', b'.']);
        assert_eq!(v.pickle(), want);
    }
}
