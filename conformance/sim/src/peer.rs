//! Work that spans two devices: copies between their memories and waits on another device's
//! events.
//!
//! Each is a [`Gate`] on the stream's own device. A gate is polled with its device's lock held, so
//! it touches the other device only through `try_lock`: two devices whose streams reach such work
//! at the same time never wait on each other's lock (a busy peer is reported as blocked, and the
//! synchronisation retries with no lock held). The other device's streams are not run by a copy:
//! a copy is ordered on its own stream only, so data another device's queued work has yet to
//! produce must be awaited with an event, as on hardware.

use crate::{Blocker, Device, EventId, Gate, GatePoll, Memory, SimError, SimResult, StreamId};
use std::sync::Arc;
use std::time::Duration;

/// Which side of a peer copy lives on the other device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remote {
    /// Copy from the other device's memory into this device's.
    Source,
    /// Copy from this device's memory into the other device's.
    Destination,
}

impl Device {
    /// Queues a copy of `len` bytes from `src` to `dst` on `stream`, one side of which is in
    /// `other`'s memory (`remote` says which). Both ranges are checked now and again when the
    /// stream runs the copy.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`]; [`SimError::InvalidValue`] when either
    /// range is outside a live allocation of its device or `other` is this device.
    pub fn enqueue_peer_copy(
        &self,
        stream: StreamId,
        other: &Arc<Device>,
        dst: u64,
        src: u64,
        len: u64,
        remote: Remote,
    ) -> SimResult<()> {
        if std::ptr::eq(self, other.as_ref()) {
            return Err(SimError::InvalidValue(
                "a peer copy needs two devices".into(),
            ));
        }
        let (local, far) = match remote {
            Remote::Source => (dst, src),
            Remote::Destination => (src, dst),
        };
        other
            .state
            .lock()
            .memory
            .check(far, len)
            .map_err(|e| SimError::InvalidValue(e.to_string()))?;
        let other = other.clone();
        self.enqueue_gate(stream, vec![(local, len)], move |_| {
            Box::new(PeerCopy {
                other,
                local,
                far,
                len,
                remote,
            })
        })
    }

    /// Makes later work on `stream` wait for the latest record of `event` of device `other`
    /// (no-op if never recorded). A synchronisation blocked on it runs the recording stream as
    /// far as that goes without blocking.
    ///
    /// # Errors
    /// The sticky error; [`SimError::InvalidHandle`] for an unknown stream or event.
    pub fn wait_other(
        &self,
        stream: StreamId,
        other: &Arc<Device>,
        event: EventId,
    ) -> SimResult<()> {
        let Some((on, position)) = other.live()?.event(event)?.record else {
            return Ok(());
        };
        let other = other.clone();
        self.enqueue_gate(stream, Vec::new(), move |_| {
            Box::new(CrossWait {
                awaited: Arc::new(Awaited {
                    other,
                    on,
                    position,
                }),
            })
        })
    }
}

/// A copy between this device's memory and another's.
struct PeerCopy {
    other: Arc<Device>,
    local: u64,
    far: u64,
    len: u64,
    remote: Remote,
}

impl Gate for PeerCopy {
    fn poll(&mut self, memory: &mut Memory) -> GatePoll {
        let Some(mut o) = self.other.state.try_lock() else {
            return GatePoll::Blocked(Arc::new(Busy(self.other.ordinal())));
        };
        let mut bytes = vec![0u8; self.len as usize];
        let r = match self.remote {
            Remote::Source => o
                .memory
                .read(self.far, &mut bytes)
                .and_then(|()| memory.write(self.local, &bytes)),
            Remote::Destination => memory
                .read(self.local, &mut bytes)
                .and_then(|()| o.memory.write(self.far, &bytes)),
        };
        GatePoll::Done(r)
    }
}

/// The other device's lock was taken: retry shortly.
struct Busy(u32);

impl Blocker for Busy {
    fn unblock(&self, timeout: Duration) {
        std::thread::sleep(timeout.min(Duration::from_micros(50)));
    }
    fn expire(&self) -> String {
        format!("a peer copy: device {} stayed busy", self.0)
    }
}

/// A wait for another device's stream to reach a position.
struct CrossWait {
    awaited: Arc<Awaited>,
}

struct Awaited {
    other: Arc<Device>,
    on: StreamId,
    position: u64,
}

impl Gate for CrossWait {
    fn poll(&mut self, _memory: &mut Memory) -> GatePoll {
        let a = &self.awaited;
        match a.other.state.try_lock() {
            Some(o) if o.reached(a.on, a.position) => GatePoll::Done(Ok(())),
            _ => GatePoll::Blocked(self.awaited.clone()),
        }
    }
}

impl Blocker for Awaited {
    fn unblock(&self, timeout: Duration) {
        self.other.advance(self.on, self.position);
        if !self.other.state.lock().reached(self.on, self.position) {
            // Blocked itself (on a collective, or on this device): give it time.
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
    }
    fn expire(&self) -> String {
        format!(
            "a wait on device {}: its stream {} never reached the event",
            self.other.ordinal(),
            self.on.0
        )
    }
}
