//! What the engine needs from a backend: [`Platform`].

use std::ffi::c_void;
use std::sync::Arc;
use unihal_hal::{Buffer, Device, DeviceId, HalError, Keep, Result, Stream};

/// Called after each launch of a graph with the stream it was launched on: what a captured
/// collective registers so that its replays are tracked in flight.
pub type ReplayHook = Arc<dyn Fn(&Arc<dyn Stream>) + Send + Sync>;

/// The backend side of the engine: a GPU backend whose streams are vendor queues (CUDA, HIP)
/// implements it once, and the engine runs NCCL or RCCL on it.
///
/// Ownership: the engine holds it as `Arc<dyn Platform>`. Thread safety: called from any thread
/// (the caller's, the communicator's watchdog, the helper threads of blocking calls).
pub trait Platform: Send + Sync + 'static {
    /// The backend's name for messages ("CUDA", "HIP").
    fn name(&self) -> &'static str;

    /// The vendor ordinal of `device` (what `ncclCommInitAll` takes).
    ///
    /// # Errors
    /// [`unihal_hal::Invalid::ForeignHandle`] (argument `device`) for another backend's device.
    fn device_ordinal(&self, device: &Arc<dyn Device>) -> Result<i32>;

    /// Runs `f` on this thread with `device` current (NCCL and RCCL use the current device).
    ///
    /// # Errors
    /// `f`'s; the backend's own when the device cannot be made current, or when called where
    /// vendor calls are forbidden (a host callback).
    fn with_current(
        &self,
        device: &Arc<dyn Device>,
        what: &str,
        f: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()>;

    /// The device address of bytes `[0, len)` of `buf`, after the backend's checks (its own
    /// allocation, on `device`, in range, not freed).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] naming `arg`.
    fn buffer_addr(
        &self,
        buf: &Buffer,
        arg: &'static str,
        device: DeviceId,
        len: u64,
    ) -> Result<u64>;

    /// Checks that `stream` is this backend's.
    ///
    /// # Errors
    /// [`unihal_hal::Invalid::ForeignHandle`] (argument `stream`) naming the stream.
    fn check_stream(&self, stream: &Arc<dyn Stream>) -> Result<()>;

    /// Enqueues `f(native stream)` (the collective's library calls) on `stream`, in its order
    /// with the stream's other work, and keeps `keep` until that work ran.
    ///
    /// # Errors
    /// The stream's sticky error; `f`'s (nothing is kept then).
    fn submit(
        &self,
        stream: &Arc<dyn Stream>,
        what: &str,
        keep: Vec<Keep>,
        f: &mut dyn FnMut(*mut c_void) -> Result<()>,
    ) -> Result<()>;

    /// Has `hook` called after each launch of the graph that `stream`'s active capture makes
    /// (with the launch's stream, after the launch was enqueued), for as long as the graph
    /// lives. Returns false where the platform cannot (the default): the captured work's
    /// replays are then not tracked.
    fn on_replay(&self, _stream: &Arc<dyn Stream>, _hook: ReplayHook) -> bool {
        false
    }

    /// Fails `stream` with `e`: its later enqueues, synchronisations and queries return it.
    fn fail_stream(&self, stream: &Arc<dyn Stream>, e: HalError);

    /// Runs `release` (library calls that free a communicator) now, or later where such calls
    /// are forbidden (inside a host callback).
    fn release(&self, release: Box<dyn FnOnce() + Send>);
}

/// [`Platform::with_current`] for a closure with a result.
///
/// # Errors
/// As [`Platform::with_current`].
pub fn with_current<T>(
    p: &dyn Platform,
    device: &Arc<dyn Device>,
    what: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let mut f = Some(f);
    let mut out = None;
    p.with_current(device, what, &mut || {
        let f = f.take().ok_or_else(|| {
            HalError::Internal(format!("{what}: the platform ran the call twice"))
        })?;
        out = Some(f()?);
        Ok(())
    })?;
    out.ok_or_else(|| HalError::Internal(format!("{what}: the platform did not run the call")))
}
