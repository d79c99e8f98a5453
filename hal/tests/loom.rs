//! Model checking of [`HostBuffer`]'s map/use protocol with loom, over the production code
//! (`hal/src/host.rs` builds on `unihal_hal::sync`, which is loom's under `--cfg loom`).
//!
//! Run by `scripts/loom.sh`:
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p unihal-hal --test loom`.
//!
//! The test allocation's bytes live in a loom `UnsafeCell`, and [`HostAllocation::ptr`] records an
//! access to it: every place the production code takes the pointer (a queued use's `with_ptr`, the
//! host's `HostMap` deref) is an access loom checks for races, without the test touching the cell
//! itself. Exclusivity is also checked over whole intervals with `Relaxed` flags (they add no
//! synchronisation that could hide a missing one), and the data a use writes is read back by the
//! host through the map.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, Ordering::Relaxed};
use loom::sync::Arc;
use loom::thread;
use std::any::Any;
use unihal_hal::{DeviceId, HostAllocation, HostBuffer};

/// Four bytes whose every pointer hand-out is a loom-checked access.
struct CellAlloc {
    bytes: UnsafeCell<[u8; 4]>,
}

// SAFETY: the bytes are only accessed through `ptr`, by the HostBuffer protocol under test, which
// grants access to one party at a time (the property loom checks; a violation panics the model).
unsafe impl Send for CellAlloc {}
// SAFETY: as for Send.
unsafe impl Sync for CellAlloc {}

// SAFETY: `ptr` points to the 4 bytes of `self.bytes`, which live as long as `self` and never move
// (the allocation is boxed by `from_allocation`); `len` is constant.
unsafe impl HostAllocation for CellAlloc {
    fn device(&self) -> DeviceId {
        DeviceId {
            backend: "loom",
            ordinal: 0,
        }
    }
    fn ptr(&self) -> *mut u8 {
        // The caller is about to read or write the bytes: a write access for loom's race check.
        self.bytes.with_mut(|p| p.cast::<u8>())
    }
    fn len(&self) -> usize {
        4
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn buffer() -> HostBuffer {
    HostBuffer::from_allocation(Box::new(CellAlloc {
        bytes: UnsafeCell::new([0; 4]),
    }))
}

/// Relaxed flags: "a use is inside `with_ptr`", "the host holds a map".
#[derive(Clone, Default)]
struct Flags {
    using: Arc<AtomicBool>,
    mapped: Arc<AtomicBool>,
}

/// A queued operation on another thread: begins a use (refused while mapped), writes `v` to byte 0
/// inside `with_ptr`, ends the use. Returns whether it ran.
fn queued_use(b: &HostBuffer, f: &Flags, v: u8) -> bool {
    let Ok(u) = b.begin_use("buf", 0, 4) else {
        return false;
    };
    u.with_ptr(|p, n| {
        assert_eq!(n, 4);
        assert!(
            !f.mapped.load(Relaxed),
            "a use runs while the host has the buffer mapped"
        );
        f.using.store(true, Relaxed);
        // SAFETY: `with_ptr` hands out the 4 bytes of the range begun above; the protocol (checked
        // here) makes this use their only accessor.
        unsafe { p.write(v) };
        f.using.store(false, Relaxed);
    });
    drop(u);
    true
}

/// The host maps (retrying while busy), reads byte 0, unmaps.
fn host_map(b: &HostBuffer, f: &Flags) -> u8 {
    loop {
        match b.map() {
            Ok(m) => {
                f.mapped.store(true, Relaxed);
                assert!(!f.using.load(Relaxed), "mapped while a use runs");
                let v = m[0];
                f.mapped.store(false, Relaxed);
                return v;
            }
            Err(_) => thread::yield_now(),
        }
    }
}

/// The model of `host_map_against_a_queued_use`, optionally with the planted bug.
fn map_against_use(planted: bool) {
    let buf = buffer();
    if planted {
        buf.plant_relaxed_use_end();
    }
    let flags = Flags::default();
    let (b, f) = (buf.clone(), flags.clone());
    let t = thread::spawn(move || queued_use(&b, &f, 42));
    let seen = host_map(&buf, &flags);
    let used = t.join().unwrap();
    assert!(
        seen == 0 || (used && seen == 42),
        "seen {seen}, used {used}"
    );
    // Every use has been dropped: the map succeeds, and sees what the use wrote.
    let m = buf.map().expect("map once every use is dropped");
    assert_eq!(m[0], if used { 42 } else { 0 });
    assert_eq!(buf.pending_uses(), 0);
}

/// A host thread maps while a queued use begins, writes and ends on another thread: never both at
/// once, the map succeeds once the use is dropped, and sees the use's write.
/// Exhaustive (no preemption bound).
#[test]
fn host_map_against_a_queued_use() {
    loom::model(|| map_against_use(false));
}

/// Two queued uses on different threads (streams) and a host map: the uses never touch the bytes
/// at once (the device-side lock), the host never while either runs, and after both the host sees
/// the last write. Preemption bound 4 (~2 s on 2 cores; 5 takes ~10 s, exhaustive minutes).
#[test]
fn two_uses_and_a_host_map() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b.check(|| {
        let buf = buffer();
        let flags = Flags::default();
        let ts: Vec<_> = [1u8, 2]
            .into_iter()
            .map(|v| {
                let (b, f) = (buf.clone(), flags.clone());
                thread::spawn(move || queued_use(&b, &f, v))
            })
            .collect();
        let seen = host_map(&buf, &flags);
        let used: Vec<bool> = ts.into_iter().map(|t| t.join().unwrap()).collect();
        assert!([0, 1, 2].contains(&seen));
        let m = buf.map().expect("map once every use is dropped");
        let wrote: Vec<u8> = [1, 2]
            .into_iter()
            .zip(used)
            .filter(|&(_, u)| u)
            .map(|(v, _)| v)
            .collect();
        if wrote.is_empty() {
            assert_eq!(m[0], 0);
        } else {
            assert!(
                wrote.contains(&m[0]),
                "lost write: {} not in {wrote:?}",
                m[0]
            );
        }
    });
}

/// The planted bug (`HostBuffer::plant_relaxed_use_end`): a use ends with a `Relaxed` decrement
/// instead of `AcqRel`. The host's map then reads the count without synchronising with the use's
/// write, and loom must report the race on the bytes (exhaustive).
#[test]
#[should_panic(expected = "Causality violation")]
fn planted_relaxed_use_end_is_caught() {
    loom::model(|| map_against_use(true));
}

/// A GPU-like stream that learns of completion lazily: it keeps the use of its queued copy until
/// asked, and releases it only once its "device" says the copy ran (a flag with `Release` on the
/// device's side, `Acquire` here, as a vendor event query gives).
struct LazyStream {
    kept: loom::sync::Mutex<Option<unihal_hal::HostUse>>,
    done: AtomicBool,
}

impl unihal_hal::UseHolder for LazyStream {
    fn release_completed(&self) {
        if self.done.load(loom::sync::atomic::Ordering::Acquire) {
            drop(self.kept.lock().unwrap().take());
        }
    }
}

/// `map` asks the buffer's holder: the device writes the bytes through the use and then signals
/// completion; no stream call follows, yet the host's map succeeds once the copy ran and sees its
/// write, and never while it runs (the holder releases the use only after completion).
#[test]
fn map_asks_a_lazy_holder_to_release_completed_work() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b.check(|| {
        let buf = buffer();
        let stream = std::sync::Arc::new(LazyStream {
            kept: loom::sync::Mutex::new(None),
            done: AtomicBool::new(false),
        });
        let holder: std::sync::Weak<dyn unihal_hal::UseHolder> =
            std::sync::Arc::downgrade(&stream) as std::sync::Weak<dyn unihal_hal::UseHolder>;
        let u = buf.begin_use_by("buf", 0, 4, holder).unwrap();
        *stream.kept.lock().unwrap() = Some(u);
        let (b2, s2) = (buf.clone(), stream.clone());
        let device = thread::spawn(move || {
            // The copy runs: the bytes are written through the kept use.
            let g = s2.kept.lock().unwrap();
            g.as_ref().unwrap().with_ptr(|p, _| {
                // SAFETY: the use's 4 bytes; the protocol makes it their only accessor.
                unsafe { p.write(7) }
            });
            drop(g);
            s2.done.store(true, loom::sync::atomic::Ordering::Release);
            drop(b2);
        });
        let seen = loop {
            match buf.map() {
                Ok(m) => break m[0],
                Err(_) => thread::yield_now(),
            }
        };
        device.join().unwrap();
        assert_eq!(seen, 7, "mapped before the copy ran, or without its write");
        assert_eq!(buf.pending_uses(), 0);
    });
}
