//! Holding a stream back on purpose, to make ordering observable.
//!
//! A [`Blocker`] holds a stream at its current end until [`Blocker::release`], so a case can inspect
//! the state of queued work (events pending, buffers in use, queue order) deterministically, without
//! sleeping and hoping. It holds the stream in one of two ways ([`HoldMode`]):
//!
//! * **Kernel** (the default wherever the backend has the conformance test kernels): the
//!   `wait_flag` test kernel spins on a flag in device memory until another stream sets it.
//! * **Host callback** (a backend without test kernels whose devices have host callbacks, such as
//!   one that runs only its vendor's operator library): a host callback marks itself started and
//!   then blocks on a host-side flag until released.
//!
//! Either way the hold is bounded by [`BLOCK_TIMEOUT_MS`], so a bug never hangs a run: the kernel
//! fails its stream, the callback returns and [`Blocker::release`] reports the timeout.

use crate::case::Ctx;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use unihal_hal::{Backend, Buffer, Device, HalError, KernelArgs, LaunchConfig, Result, Stream};
use unihal_kernels::testing::names;

/// How long a blocker holds its stream at most (so a bug never hangs forever).
pub const BLOCK_TIMEOUT_MS: u32 = 10_000;

/// The word a blocker's stream writes to [`Blocker::out`] once released.
pub const RELEASED_WORD: u32 = 0xB10C;

/// How a [`Blocker`] holds its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldMode {
    /// The `wait_flag` test kernel spins on a device flag.
    Kernel,
    /// A host callback blocks on a host flag.
    HostCallback,
}

impl HoldMode {
    /// The mode a blocker uses on `device` of `backend`: the kernel where the backend has test
    /// kernels for the device, else a host callback where the device has them, else none.
    pub fn of(backend: &dyn Backend, device: &dyn Device) -> Option<HoldMode> {
        if backend.test_kernels(device).is_some() {
            Some(HoldMode::Kernel)
        } else if device.capabilities().optional.host_callbacks {
            Some(HoldMode::HostCallback)
        } else {
            None
        }
    }
}

/// What a blocking host callback and its blocker share.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    started: bool,
    released: bool,
    timed_out: bool,
}

impl Gate {
    /// The state, also after a panic elsewhere (a host callback must never panic on it).
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The body of the blocking callback: started, then wait (bounded) for the release.
    fn hold(&self) {
        let mut st = self.lock();
        st.started = true;
        self.changed.notify_all();
        let limit = Duration::from_millis(BLOCK_TIMEOUT_MS as u64);
        let (mut st, _) = self
            .changed
            .wait_timeout_while(st, limit, |s| !s.released)
            .unwrap_or_else(|e| e.into_inner());
        if !st.released {
            st.timed_out = true;
        }
    }
}

enum Hold {
    Kernel { flag: Buffer },
    Callback { gate: Arc<Gate> },
}

/// A stream held back (by a spinning kernel or a blocking host callback) until released.
pub struct Blocker {
    hold: Hold,
    out: Buffer,
    side: Arc<dyn Stream>,
    released: bool,
}

impl Blocker {
    /// Blocks `stream` (which must be on the context's device) at its current end, and returns once
    /// the hold is seen running. The stream must not already be blocked (use [`Blocker::behind`]).
    pub fn new(ctx: &Ctx, stream: &Arc<dyn Stream>) -> Result<Blocker> {
        Self::enqueue(ctx, stream, true)
    }

    /// Enqueues a hold behind whatever `stream` holds already (e.g. another blocker), without
    /// waiting for it to start.
    pub fn behind(ctx: &Ctx, stream: &Arc<dyn Stream>) -> Result<Blocker> {
        Self::enqueue(ctx, stream, false)
    }

    fn enqueue(ctx: &Ctx, stream: &Arc<dyn Stream>, wait_started: bool) -> Result<Blocker> {
        let mode = HoldMode::of(&*ctx.backend, &*ctx.device).ok_or_else(|| {
            HalError::unsupported(format!(
                "holding a stream: backend {} has no test kernels for {} and the device has no \
                 host callbacks",
                ctx.backend.name(),
                ctx.device.id()
            ))
        })?;
        match mode {
            HoldMode::Kernel => Self::enqueue_kernel(ctx, stream, wait_started),
            HoldMode::HostCallback => Self::enqueue_callback(ctx, stream, wait_started),
        }
    }

    fn enqueue_kernel(ctx: &Ctx, stream: &Arc<dyn Stream>, wait_started: bool) -> Result<Blocker> {
        let mem = ctx.device.alloc(8)?;
        // The kernel and the side stream talk through `mem` while both run: device-side
        // synchronisation a validation layer cannot see, so it is told.
        unihal_layer::exempt(ctx.device.as_ref(), &mem);
        let side = ctx.stream()?;
        side.write(&mem, 0, &[0u8; 8])?;
        let flag = mem.slice(0, 4)?;
        let out = mem.slice(4, 4)?;
        let f = ctx.kernel(names::WAIT_FLAG)?;
        let mut args = KernelArgs::new();
        args.push_buffer(&flag)
            .push_buffer(&out)
            .push(RELEASED_WORD)
            .push(BLOCK_TIMEOUT_MS);
        // SAFETY: wait_flag takes (flag, out, value, timeout) and reads/writes 4 bytes at each
        // pointer; both buffers are 4 bytes and kept alive by the args.
        unsafe { stream.launch(&f, &LaunchConfig::linear(1, 1), &args)? };
        // Wait until the kernel runs (it writes 1 to `out` first thing).
        let start = Instant::now();
        let mut word = [0u8; 4];
        while wait_started && u32::from_le_bytes(word) == 0 {
            side.read(&out, 0, &mut word)?;
            if u32::from_le_bytes(word) != 0 {
                break;
            }
            if start.elapsed() > Duration::from_millis(BLOCK_TIMEOUT_MS as u64) {
                return Err(HalError::Timeout {
                    what: "the blocking kernel did not start".into(),
                    millis: BLOCK_TIMEOUT_MS as u64,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(Blocker {
            hold: Hold::Kernel { flag },
            out,
            side,
            released: false,
        })
    }

    fn enqueue_callback(
        ctx: &Ctx,
        stream: &Arc<dyn Stream>,
        wait_started: bool,
    ) -> Result<Blocker> {
        let out = ctx.device.alloc(4)?;
        let side = ctx.stream()?;
        side.write(&out, 0, &[0u8; 4])?;
        let gate = Arc::new(Gate::default());
        let held = gate.clone();
        stream.host_callback(Box::new(move || held.hold()))?;
        // What the kernel writes once it sees the flag, written in stream order after the hold.
        stream.copy_h2d_staged(&RELEASED_WORD.to_le_bytes(), &out, 0)?;
        let mut blocker = Blocker {
            hold: Hold::Callback { gate: gate.clone() },
            out,
            side,
            released: false,
        };
        if wait_started {
            let limit = Duration::from_millis(BLOCK_TIMEOUT_MS as u64);
            let (st, _) = gate
                .changed
                .wait_timeout_while(gate.lock(), limit, |s| !s.started)
                .unwrap_or_else(|e| e.into_inner());
            if !st.started {
                drop(st);
                // Let the callback go at once when it runs at last.
                let _ = blocker.release();
                return Err(HalError::Timeout {
                    what: "the blocking host callback did not start".into(),
                    millis: BLOCK_TIMEOUT_MS as u64,
                });
            }
        }
        Ok(blocker)
    }

    /// The way this blocker holds its stream.
    pub fn mode(&self) -> HoldMode {
        match self.hold {
            Hold::Kernel { .. } => HoldMode::Kernel,
            Hold::Callback { .. } => HoldMode::HostCallback,
        }
    }

    /// Lets the stream go on: sets the flag (through another stream, waiting for that write) or
    /// wakes the host callback.
    ///
    /// # Errors
    /// [`HalError::Timeout`] when the host callback gave up waiting before the release (the stream
    /// was not held as long as the case needed); the kernel reports its timeout as a failure of its
    /// stream instead.
    pub fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        match &self.hold {
            Hold::Kernel { flag } => self.side.write(flag, 0, &1u32.to_le_bytes()),
            Hold::Callback { gate } => {
                let mut st = gate.lock();
                st.released = true;
                gate.changed.notify_all();
                if st.timed_out {
                    return Err(HalError::Timeout {
                        what: "the blocking host callback gave up before it was released, so its \
                               stream was not held"
                            .into(),
                        millis: BLOCK_TIMEOUT_MS as u64,
                    });
                }
                Ok(())
            }
        }
    }

    /// A word the held stream writes: [`RELEASED_WORD`] once the hold is over (before that, 1 while
    /// the kernel spins, 0 while the host callback waits).
    pub fn out(&self) -> &Buffer {
        &self.out
    }
}

impl Drop for Blocker {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
