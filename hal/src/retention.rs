//! What queued work on a device queue uses, kept until the device says the work ran.
//!
//! A GPU runtime's stream runs work long after the enqueue returned, so the buffers, host
//! buffers, functions and events it uses must outlive the caller's handles. [`Retention`] is the
//! bookkeeping, written once for every backend whose streams are vendor queues (CUDA, HIP, ACL)
//! and for backends loaded as plugins (`unihal-plugin`), whose queues the host sees through the
//! plugin ABI:
//!
//! * **Batched seals.** What an enqueue keeps goes into an unsealed batch; every
//!   [`SEAL_EVERY`] enqueues the batch is sealed behind a vendor event recorded after them (one
//!   event record per 32 launches, not per launch). Host-buffer uses, whose busy state callers
//!   observe (`HostBuffer::map`), are sealed at once.
//! * **Release when complete.** Sealed batches are released oldest first once their event has
//!   completed ([`Retention::retire`], at every enqueue and query, and when a host buffer's
//!   holder is asked), or all at once when a query saw the whole stream complete
//!   ([`Retention::retire_all`]).
//! * **A synchronisation retires only the work it covered** ([`Retention::begin_sync`] /
//!   [`Retention::end_sync`]): batches sealed, and unsealed work enqueued, before it began; work
//!   other threads enqueue meanwhile keeps what it uses. A failed synchronisation releases
//!   nothing it cannot prove ran.
//! * **No error path releases what queued work still uses.** When no event can be created or
//!   recorded the batch stays unsealed, released by a later synchronisation (never earlier).
//! * **Host callbacks.** A host function must not call the runtime, but work queued before it has
//!   completed when it runs: [`Retention::take_host_uses`] moves the host-buffer uses out of the
//!   sealed batches (the buffers stay kept) for the callback to drop, and
//!   [`Retention::give_back`] returns them if the callback could not be queued. This fits CUDA's
//!   `cuLaunchHostFunc`, HIP 5.2's `hipStreamAddCallback` (no host-function launch there) and
//!   ACL's callbacks run by a thread subscribed with `aclrtSubscribeReport`.
//! * **Dropping a stream never waits** ([`Retention::into_parts`]): the backend queues a host
//!   function behind the work that releases everything, and destroys the events after it.
//!
//! The vendor's events are a type parameter `E` (a raw handle); the backend passes closures that
//! create, record and query them. Thread safety: a `Retention` lives under its stream's lock.

use crate::{HostUse, Keep};
use std::collections::VecDeque;

/// How many enqueues may share one tracking event: what they keep is released together, once
/// the last of them ran. Recording an event per enqueue would cost every launch a vendor call.
pub const SEAL_EVERY: usize = 32;

/// What a batch of enqueues keeps, behind the event recorded after them.
struct Sealed<E> {
    /// Position in the stream's sequence of batches.
    seq: u64,
    event: E,
    keep: Vec<Keep>,
}

/// The retention state of one stream (see the module docs). `E` is the vendor's event handle.
pub struct Retention<E> {
    pending: VecDeque<Sealed<E>>,
    next_seq: u64,
    unsealed: Vec<Keep>,
    unsealed_ops: usize,
    /// Completed events for reuse.
    spare: Vec<E>,
}

/// Why a batch could not be sealed (the vendor's message); it stays kept until a
/// synchronisation.
pub type SealError = String;

/// What a synchronisation covers, from [`Retention::begin_sync`] to [`Retention::end_sync`].
#[must_use = "pass it to end_sync"]
pub struct SyncCover {
    upto: u64,
    covered: Vec<Keep>,
}

/// Everything a dropped stream still keeps, for a host function queued behind its work.
pub struct Parts<E> {
    /// What queued work keeps.
    pub keep: Vec<Keep>,
    /// Events to destroy once that work ran (their records have completed then).
    pub events: Vec<E>,
}

impl<E: Copy> Default for Retention<E> {
    fn default() -> Self {
        Retention::new()
    }
}

impl<E: Copy> Retention<E> {
    /// Nothing kept.
    pub fn new() -> Retention<E> {
        Retention {
            pending: VecDeque::new(),
            next_seq: 0,
            unsealed: Vec::new(),
            unsealed_ops: 0,
            spare: Vec::new(),
        }
    }

    /// Keeps what one enqueue (already queued) uses. Seals the batch when it holds a host-buffer
    /// use or [`SEAL_EVERY`] enqueues: `create` makes an event (called only when no spare one
    /// exists), `record` records it on the stream after the work.
    ///
    /// # Errors
    /// The vendor's message when no event could be created or recorded: the batch stays kept,
    /// released by a later synchronisation (the caller logs it; the enqueue itself succeeded).
    pub fn keep(
        &mut self,
        keep: Vec<Keep>,
        create: impl FnOnce() -> Result<E, SealError>,
        record: impl FnOnce(E) -> Result<(), SealError>,
    ) -> Result<(), SealError> {
        if keep.is_empty() {
            return Ok(());
        }
        let observable = keep.iter().any(|k| k.is::<HostUse>());
        self.unsealed.extend(keep);
        self.unsealed_ops += 1;
        if !observable && self.unsealed_ops < SEAL_EVERY {
            return Ok(());
        }
        self.unsealed_ops = 0;
        let ev = match self.spare.pop() {
            Some(ev) => ev,
            None => create()?,
        };
        if let Err(e) = record(ev) {
            self.spare.push(ev);
            return Err(e);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.pending.push_back(Sealed {
            seq,
            event: ev,
            keep: std::mem::take(&mut self.unsealed),
        });
        Ok(())
    }

    /// Releases the sealed batches whose event `done` says completed, oldest first (stops at
    /// the first that has not).
    pub fn retire(&mut self, mut done: impl FnMut(E) -> bool) {
        while let Some(b) = self.pending.front() {
            if !done(b.event) {
                break;
            }
            self.pop_front();
        }
    }

    /// Releases everything: only when the caller saw the whole stream complete under the lock
    /// that serialises its enqueues (a query that returned done).
    pub fn retire_all(&mut self) {
        self.unsealed.clear();
        self.unsealed_ops = 0;
        while !self.pending.is_empty() {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(b) = self.pending.pop_front() {
            drop(b.keep);
            self.spare.push(b.event);
        }
    }

    /// A synchronisation begins: it covers the batches sealed so far and the unsealed work
    /// (taken out, so work enqueued meanwhile starts a new batch).
    pub fn begin_sync(&mut self) -> SyncCover {
        self.unsealed_ops = 0;
        SyncCover {
            upto: self.next_seq,
            covered: std::mem::take(&mut self.unsealed),
        }
    }

    /// The synchronisation ended: on success what it covered is released; on failure it is kept
    /// (released by a later synchronisation) and only batches whose event `done` says completed
    /// are released.
    pub fn end_sync(&mut self, cover: SyncCover, ok: bool, done: impl FnMut(E) -> bool) {
        if ok {
            while self.pending.front().is_some_and(|b| b.seq < cover.upto) {
                self.pop_front();
            }
            drop(cover.covered);
        } else {
            self.unsealed.extend(cover.covered);
            self.retire(done);
        }
    }

    /// Moves the host-buffer uses out of the sealed batches (their buffers stay kept), for a
    /// host callback queued after them to end.
    pub fn take_host_uses(&mut self) -> Vec<HostUse> {
        let mut uses = Vec::new();
        for b in self.pending.iter_mut() {
            let (host, mut rest): (Vec<Keep>, Vec<Keep>) = std::mem::take(&mut b.keep)
                .into_iter()
                .partition(|k| k.is::<HostUse>());
            for u in host
                .into_iter()
                .filter_map(|k| k.downcast::<HostUse>().ok())
            {
                rest.push(Box::new(u.buffer().clone()));
                uses.push(*u);
            }
            b.keep = rest;
        }
        uses
    }

    /// Gives back uses taken for a callback that could not be queued: kept until a
    /// synchronisation (the work holding them may still run).
    pub fn give_back(&mut self, uses: Vec<HostUse>) {
        self.hold(uses.into_iter().map(|u| Box::new(u) as Keep).collect());
    }

    /// Keeps `keep` until a synchronisation, without sealing (no runtime call): for what queued
    /// work uses when the runtime could not be reached to seal it (a device that could not be
    /// made current). Never released earlier than the work it belongs to.
    pub fn hold(&mut self, keep: Vec<Keep>) {
        self.unsealed.extend(keep);
    }

    /// Number of sealed batches not yet released (tests, diagnostics).
    pub fn sealed_batches(&self) -> usize {
        self.pending.len()
    }

    /// Everything kept and every event, for a dropped stream's final host function.
    pub fn into_parts(mut self) -> Parts<E> {
        let mut keep = std::mem::take(&mut self.unsealed);
        let mut events = std::mem::take(&mut self.spare);
        for b in self.pending.drain(..) {
            keep.extend(b.keep);
            events.push(b.event);
        }
        Parts { keep, events }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A kept object that counts its drops.
    struct Probe(Arc<AtomicUsize>);
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn probe(c: &Arc<AtomicUsize>) -> Vec<Keep> {
        vec![Box::new(Probe(c.clone()))]
    }

    /// A fake vendor: events are numbers, complete when at most `done`.
    struct Vendor {
        next: u32,
        done: u32,
    }
    impl Vendor {
        fn keep(&mut self, r: &mut Retention<u32>, k: Vec<Keep>) {
            let next = &mut self.next;
            r.keep(
                k,
                || {
                    *next += 1;
                    Ok(*next)
                },
                |_| Ok(()),
            )
            .unwrap();
        }
    }

    #[test]
    fn batches_seal_every_32_enqueues_and_release_when_their_event_completed() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut v = Vendor { next: 0, done: 0 };
        let mut r = Retention::new();
        for _ in 0..SEAL_EVERY * 2 + 5 {
            v.keep(&mut r, probe(&dropped));
        }
        assert_eq!(r.sealed_batches(), 2);
        assert_eq!(v.next, 2, "one event per batch");
        let done = v.done;
        r.retire(|e| e <= done);
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "nothing completed yet");
        r.retire(|e| e <= 1);
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY);
        // The spare event is reused: no new create for the next batch.
        for _ in 0..SEAL_EVERY {
            v.keep(&mut r, probe(&dropped));
        }
        assert_eq!(v.next, 2);
        r.retire_all();
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY * 3 + 5);
    }

    #[test]
    fn a_synchronisation_retires_only_what_it_covered() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut v = Vendor { next: 0, done: 0 };
        let mut r = Retention::new();
        for _ in 0..SEAL_EVERY + 3 {
            v.keep(&mut r, probe(&dropped));
        }
        let cover = r.begin_sync();
        // Another thread enqueues meanwhile: not covered.
        for _ in 0..SEAL_EVERY + 2 {
            v.keep(&mut r, probe(&dropped));
        }
        r.end_sync(cover, true, |_| false);
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY + 3);
        assert_eq!(r.sealed_batches(), 1);
    }

    #[test]
    fn a_failed_synchronisation_releases_nothing_unproven() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut v = Vendor { next: 0, done: 0 };
        let mut r = Retention::new();
        for _ in 0..SEAL_EVERY + 3 {
            v.keep(&mut r, probe(&dropped));
        }
        let cover = r.begin_sync();
        r.end_sync(cover, false, |_| false);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        // The uncovered work is still kept, and a later good synchronisation releases it.
        let cover = r.begin_sync();
        r.end_sync(cover, true, |_| false);
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY + 3);
    }

    #[test]
    fn an_event_that_cannot_be_made_or_recorded_keeps_the_batch_until_a_synchronisation() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut r: Retention<u32> = Retention::new();
        for i in 0..SEAL_EVERY {
            let res = r.keep(probe(&dropped), || Err("no event".into()), |_| Ok(()));
            assert_eq!(res.is_err(), i == SEAL_EVERY - 1);
        }
        let res = r.keep(
            vec![Box::new(0u8)],
            || Ok(7),
            |_| Err("record failed".into()),
        );
        assert!(res.is_ok(), "not at a seal point yet");
        r.retire(|_| true);
        assert_eq!(dropped.load(Ordering::SeqCst), 0, "released without proof");
        let cover = r.begin_sync();
        r.end_sync(cover, true, |_| true);
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY);
    }

    #[test]
    fn dropping_hands_everything_to_the_final_release() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let mut v = Vendor { next: 0, done: 0 };
        let mut r = Retention::new();
        for _ in 0..SEAL_EVERY + 1 {
            v.keep(&mut r, probe(&dropped));
        }
        let parts = r.into_parts();
        assert_eq!(parts.events, vec![1]);
        assert_eq!(parts.keep.len(), SEAL_EVERY + 1);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(parts);
        assert_eq!(dropped.load(Ordering::SeqCst), SEAL_EVERY + 1);
    }
}
