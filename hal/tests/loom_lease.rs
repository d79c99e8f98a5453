//! Model checking of the buffer lease of sub-allocated blocks with loom, over the production code
//! (`hal/src/buffer.rs` builds its handle count, queued uses and reclaim on `unihal_hal::sync`,
//! which is loom's under `--cfg loom`): clones, views (`slice`), drops, queued uses (`use_on`)
//! and their completion race, and the owner must hear of the last handle exactly once, only when
//! no handle of any kind is left, with the pending uses right, and of the retirement exactly
//! once after that. The owner then *reuses* the block: it writes the block's bytes (a loom
//! `UnsafeCell`), which every handle holder reads while it holds its handle, so a hand-back made
//! too early is also a data race loom reports.
//!
//! Run by `scripts/loom.sh` (with feature `planted-defects`, for the planted uncounted view):
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release -p unihal-hal
//! --features planted-defects --test loom_lease`.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use loom::thread;
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{
    BlockOwner, Buffer, DeviceAllocation, DeviceId, PendingUses, Reclaim, Segment, StreamId,
};

/// The models share the planted switch (process-wide): one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// An allocation whose address nobody dereferences: the block's "bytes" are the owner's cell.
struct Untouched;

// SAFETY: the models never read or write through the address; it is a constant standing for 64
// bytes this object owns, with constant device, address and length.
unsafe impl DeviceAllocation for Untouched {
    fn device(&self) -> DeviceId {
        DeviceId {
            backend: "loom",
            ordinal: 0,
        }
    }
    fn addr(&self) -> u64 {
        0x1000
    }
    fn len(&self) -> u64 {
        64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The block's owner: counts what it hears, checks that no handle is left when told the last
/// one went, and reuses the bytes when it takes the block back.
struct Owner {
    /// Handles the model holds (decremented just before each drop): `Relaxed`, so it adds no
    /// synchronisation; the protocol's own ordering must make every decrement visible.
    live: AtomicUsize,
    dropped: AtomicUsize,
    retired: AtomicUsize,
    /// 1 when `handles_dropped` answered `Now` (nothing follows then).
    now: AtomicUsize,
    /// The block's bytes: read by handle holders, written by the owner on reuse.
    bytes: UnsafeCell<u8>,
}

// SAFETY: `bytes` is only accessed through loom's `UnsafeCell` API, whose every access loom
// checks for races (a concurrent unsynchronised access fails the model); the rest is atomics.
unsafe impl Sync for Owner {}
// SAFETY: as for Sync; the cell holds a plain byte.
unsafe impl Send for Owner {}

impl Owner {
    fn reuse(&self) {
        // SAFETY: loom checks this write against every holder's read (a race fails the model).
        self.bytes.with_mut(|p| unsafe { *p = 0xEE });
    }
}

impl BlockOwner for Owner {
    fn handles_dropped(&self, _token: u64, pending: PendingUses) -> Reclaim {
        assert_eq!(
            self.live.load(Relaxed),
            0,
            "told of the last handle while a handle lives"
        );
        assert_eq!(
            self.dropped.fetch_add(1, Relaxed),
            0,
            "told of the last handle twice"
        );
        match pending {
            PendingUses::None => {
                self.now.store(1, Relaxed);
                self.reuse();
                Reclaim::Now
            }
            PendingUses::OneStream(_) => Reclaim::ForStream,
            PendingUses::Several => Reclaim::Later,
        }
    }

    fn retired(&self, _token: u64, _early: bool) {
        assert_eq!(
            self.dropped.load(Relaxed),
            1,
            "retired before the last handle"
        );
        assert_eq!(self.retired.fetch_add(1, Relaxed), 0, "retired twice");
        self.reuse();
    }
}

/// A handle the model holds: reads the bytes while held, announces its drop.
struct Held {
    buf: Option<Buffer>,
    owner: Arc<Owner>,
}

impl Held {
    fn new(buf: Buffer, owner: &Arc<Owner>) -> Held {
        owner.live.fetch_add(1, Relaxed);
        Held {
            buf: Some(buf),
            owner: owner.clone(),
        }
    }
    fn touch(&self) {
        // SAFETY: a read loom checks against the owner's reuse write.
        self.owner.bytes.with(|p| unsafe { *p });
    }
    fn slice(&self, off: u64, len: u64) -> Held {
        let b = self.buf.as_ref().unwrap().slice(off, len).unwrap();
        Held::new(b, &self.owner)
    }
    fn clone_handle(&self) -> Held {
        Held::new(self.buf.as_ref().unwrap().clone(), &self.owner)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.touch();
        self.owner.live.fetch_sub(1, Relaxed);
        drop(self.buf.take());
    }
}

fn block() -> (Held, Arc<Owner>) {
    let owner = Arc::new(Owner {
        live: AtomicUsize::new(0),
        dropped: AtomicUsize::new(0),
        retired: AtomicUsize::new(0),
        now: AtomicUsize::new(0),
        bytes: UnsafeCell::new(0),
    });
    let whole = Buffer::from_allocation(Untouched);
    let seg = Segment::new(&whole, owner.clone()).unwrap();
    let b = seg.block(0, 64, 1).unwrap();
    (Held::new(b, &owner), owner)
}

/// Views and clones made and dropped on two threads while the main thread drops the block.
fn views_and_clones() {
    let (b, owner) = block();
    let v1 = b.slice(8, 16);
    let c1 = b.clone_handle();
    let t1 = thread::spawn(move || {
        let inner = v1.slice(0, 4);
        inner.touch();
        drop(v1);
        drop(inner);
    });
    let t2 = thread::spawn(move || {
        let v2 = c1.slice(32, 8);
        drop(c1);
        v2.touch();
    });
    b.touch();
    drop(b);
    t1.join().unwrap();
    t2.join().unwrap();
    assert_eq!(
        owner.dropped.load(Relaxed),
        1,
        "never told of the last handle"
    );
}

/// Queued uses made through a view on two streams, completing on other threads while the last
/// handles go: the pending uses the owner hears match, and it hears of retirement once.
fn uses_complete_while_handles_go(streams: usize) {
    let (b, owner) = block();
    let ids: Vec<StreamId> = (0..streams).map(|_| StreamId::fresh()).collect();
    let view = b.slice(0, 16);
    let keeps: Vec<_> = ids
        .iter()
        .map(|&s| view.buf.as_ref().unwrap().use_on(s))
        .collect();
    let workers: Vec<_> = keeps
        .into_iter()
        .map(|k| thread::spawn(move || drop(k)))
        .collect();
    let t = thread::spawn(move || drop(view));
    drop(b);
    t.join().unwrap();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(
        owner.dropped.load(Relaxed),
        1,
        "never told of the last handle"
    );
    // `Now` (only with nothing pending) ends it; otherwise retirement follows, once.
    assert_eq!(
        owner.retired.load(Relaxed),
        1 - owner.now.load(Relaxed),
        "retirements after the answer {}",
        owner.now.load(Relaxed)
    );
}

#[test]
fn views_and_clones_race_with_the_block_drop() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(views_and_clones);
}

#[test]
fn one_streams_use_completes_while_the_handles_go() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    loom::model(|| uses_complete_while_handles_go(1));
}

#[test]
fn two_streams_uses_complete_while_the_handles_go() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| uses_complete_while_handles_go(2));
}

/// The planted uncounted view (`unihal_hal::planted::set_uncounted_slice`): dropping a view
/// hands the held block back, and the model must fail.
#[cfg(feature = "planted-defects")]
#[test]
fn planted_uncounted_view_is_caught() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    unihal_hal::planted::set_uncounted_slice(true);
    let r = std::panic::catch_unwind(|| {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(views_and_clones);
    });
    unihal_hal::planted::set_uncounted_slice(false);
    let e = r.expect_err("the model passed with the planted uncounted view");
    eprintln!("planted uncounted view caught");
    let msg = unihal_hal::panic_message(&*e).unwrap_or_default();
    assert!(
        msg.contains("while a handle lives")
            || msg.contains("twice")
            || msg.contains("Causality violation"),
        "the model failed, but not on the planted view: {msg}"
    );
}
