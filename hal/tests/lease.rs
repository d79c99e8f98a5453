//! The buffer lease of sub-allocated blocks ([`Segment::block`]): every handle of a block, clones
//! and views alike, counts, so its owner hears of the last handle exactly once, only after every
//! clone and view is gone, with the queued uses still pending. The same protocol runs under loom
//! in `loom.rs` (racing); these are the sequential facts.
#![cfg(not(loom))]

use std::any::Any;
use std::sync::{Arc, Mutex};
use unihal_hal::{
    BlockOwner, Buffer, DeviceAllocation, DeviceId, PendingUses, Reclaim, Segment, StreamId,
};

/// An allocation nobody touches: the lease protocol never reads the memory.
struct Untouched;

// SAFETY: the tests never read or write through the address; it is a constant number standing
// for 4096 bytes this object owns, with constant device, address and length.
unsafe impl DeviceAllocation for Untouched {
    fn device(&self) -> DeviceId {
        DeviceId {
            backend: "lease-test",
            ordinal: 0,
        }
    }
    fn addr(&self) -> u64 {
        0x10_000
    }
    fn len(&self) -> u64 {
        4096
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Dropped(u64, PendingUses),
    Retired(u64, bool),
}

/// Records what it hears and answers `answer` to `handles_dropped`.
struct Owner {
    heard: Mutex<Vec<Heard>>,
    answer: Reclaim,
}

impl BlockOwner for Owner {
    fn handles_dropped(&self, token: u64, pending: PendingUses) -> Reclaim {
        self.heard
            .lock()
            .unwrap()
            .push(Heard::Dropped(token, pending));
        self.answer
    }
    fn retired(&self, token: u64, early: bool) {
        self.heard
            .lock()
            .unwrap()
            .push(Heard::Retired(token, early));
    }
}

fn segment(answer: Reclaim) -> (Segment, Arc<Owner>) {
    let owner = Arc::new(Owner {
        heard: Mutex::new(Vec::new()),
        answer,
    });
    let whole = Buffer::from_allocation(Untouched);
    (Segment::new(&whole, owner.clone()).unwrap(), owner)
}

fn heard(o: &Owner) -> Vec<Heard> {
    o.heard.lock().unwrap().clone()
}

#[test]
fn dropping_a_view_of_a_held_block_does_not_hand_the_block_back() {
    let (seg, owner) = segment(Reclaim::Now);
    let block = seg.block(512, 1024, 7).unwrap();
    let view = block.slice(100, 200).unwrap();
    assert_eq!(view.device_addr(), block.device_addr() + 100);
    drop(view);
    assert_eq!(heard(&owner), [], "a dropped view handed back a held block");
    drop(block);
    assert_eq!(heard(&owner), [Heard::Dropped(7, PendingUses::None)]);
}

#[test]
fn a_view_that_outlives_its_block_keeps_it_until_the_view_goes() {
    let (seg, owner) = segment(Reclaim::Now);
    let block = seg.block(0, 1024, 3).unwrap();
    let inner = block.slice(8, 64).unwrap().slice(8, 8).unwrap();
    let clone = inner.clone();
    drop(block);
    drop(inner);
    assert_eq!(heard(&owner), [], "the block went back while a view lived");
    drop(clone);
    assert_eq!(heard(&owner), [Heard::Dropped(3, PendingUses::None)]);
}

#[test]
fn a_queued_use_made_through_a_view_is_pending_when_the_last_handle_goes() {
    let (seg, owner) = segment(Reclaim::ForStream);
    let block = seg.block(0, 1024, 9).unwrap();
    let s = StreamId::fresh();
    let keep = block.slice(0, 16).unwrap().use_on(s);
    drop(block);
    assert_eq!(
        heard(&owner),
        [Heard::Dropped(9, PendingUses::OneStream(s))]
    );
    drop(keep);
    assert_eq!(
        heard(&owner),
        [
            Heard::Dropped(9, PendingUses::OneStream(s)),
            Heard::Retired(9, true)
        ]
    );
}

#[test]
fn many_views_and_clones_count_one_last_handle() {
    let (seg, owner) = segment(Reclaim::Now);
    let block = seg.block(0, 4096, 1).unwrap();
    let handles: Vec<Buffer> = (0..64)
        .map(|i| {
            if i % 2 == 0 {
                block.slice(i * 16, 16).unwrap()
            } else {
                block.clone()
            }
        })
        .collect();
    drop(block);
    for (i, h) in handles.into_iter().enumerate() {
        assert_eq!(
            heard(&owner),
            [],
            "handed back with {} handles left",
            64 - i
        );
        drop(h);
    }
    assert_eq!(heard(&owner), [Heard::Dropped(1, PendingUses::None)]);
}
