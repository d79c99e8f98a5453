//! Holding a stream back on purpose, to make ordering observable.
//!
//! A [`Blocker`] enqueues the `wait_flag` test kernel, which spins on a flag in device memory until
//! another stream sets it, and waits until the kernel is seen running. From then on, everything
//! enqueued on the stream is queued behind it until [`Blocker::release`], so a case can inspect the
//! state of queued work (events pending, buffers in use, queue order) deterministically, without
//! sleeping and hoping.

use crate::case::Ctx;
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{Buffer, HalError, KernelArgs, LaunchConfig, Result, Stream};
use unihal_kernels::testing::names;

/// How long the blocking kernel waits before failing (so a bug never hangs forever).
pub const BLOCK_TIMEOUT_MS: u32 = 10_000;

/// A stream held back by a spinning kernel until released.
pub struct Blocker {
    flag: Buffer,
    out: Buffer,
    side: Arc<dyn Stream>,
    released: bool,
}

impl Blocker {
    /// Blocks `stream` (which must be on the context's device) at its current end, and returns once
    /// the blocking kernel runs. The stream must not already be blocked (use [`Blocker::behind`]).
    pub fn new(ctx: &Ctx, stream: &Arc<dyn Stream>) -> Result<Blocker> {
        Self::enqueue(ctx, stream, true)
    }

    /// Enqueues a blocking kernel behind whatever `stream` holds already (e.g. another blocker),
    /// without waiting for it to start.
    pub fn behind(ctx: &Ctx, stream: &Arc<dyn Stream>) -> Result<Blocker> {
        Self::enqueue(ctx, stream, false)
    }

    fn enqueue(ctx: &Ctx, stream: &Arc<dyn Stream>, wait_started: bool) -> Result<Blocker> {
        let mem = ctx.device.alloc(8)?;
        let side = ctx.stream()?;
        side.write(&mem, 0, &[0u8; 8])?;
        let flag = mem.slice(0, 4)?;
        let out = mem.slice(4, 4)?;
        let f = ctx.kernel(names::WAIT_FLAG)?;
        let mut args = KernelArgs::new();
        args.push_buffer(&flag)
            .push_buffer(&out)
            .push(0xB10Cu32)
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
            flag,
            out,
            side,
            released: false,
        })
    }

    /// Sets the flag (through another stream) and waits for that write.
    pub fn release(&mut self) -> Result<()> {
        if !self.released {
            self.released = true;
            self.side.write(&self.flag, 0, &1u32.to_le_bytes())?;
        }
        Ok(())
    }

    /// The word the kernel writes after the flag is seen (0xB10C once it has run).
    pub fn out(&self) -> &Buffer {
        &self.out
    }
}

impl Drop for Blocker {
    fn drop(&mut self) {
        let _ = self.release();
    }
}
