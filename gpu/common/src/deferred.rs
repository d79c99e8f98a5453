//! Runtime calls that must not run where they are triggered.
//!
//! A host function queued on a stream (the HAL's `host_callback`) must not call the GPU runtime
//! (CUDA and HIP both forbid it: a wait there would wait for the callback itself), yet the user's
//! closure may hold the last handle of a buffer, host buffer, event or module, whose release calls
//! the runtime. So releases requested on a callback thread are queued here and run by the next
//! backend call made outside a callback. One queue serves every GPU backend of the process.

use parking_lot::Mutex;
use std::cell::Cell;

type Release = Box<dyn FnOnce() + Send>;

static QUEUE: Mutex<Vec<Release>> = Mutex::new(Vec::new());

thread_local! {
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as a host callback (runtime calls it triggers are deferred).
pub fn as_callback(f: impl FnOnce()) {
    IN_CALLBACK.set(true);
    f();
    IN_CALLBACK.set(false);
}

/// True on a thread running a host callback.
pub fn in_callback() -> bool {
    IN_CALLBACK.get()
}

/// `Err` on a thread running a host callback, where GPU runtimes forbid their own calls. Checked
/// before any lock is taken: the thread that enqueued the callback may hold the stream's lock
/// while the runtime runs it (a simulated runtime runs an idle stream's host function at once).
///
/// # Errors
/// [`unihal_hal::HalError::InvalidArgument`] naming `what` and `vendor`.
pub fn refuse_in_callback(vendor: &str, what: &str) -> unihal_hal::Result<()> {
    if !in_callback() {
        return Ok(());
    }
    Err(unihal_hal::HalError::invalid(
        "stream",
        unihal_hal::Invalid::Other(format!(
            "{what} inside a host callback: {vendor} forbids runtime calls there (a wait would \
             wait for the callback itself)"
        )),
    ))
}

/// Runs `release` now, or later when called from a host callback.
pub fn release(release: impl FnOnce() + Send + 'static) {
    if IN_CALLBACK.get() {
        QUEUE.lock().push(Box::new(release));
    } else {
        release();
    }
}

/// Queues `f` for the next backend call outside a callback (a release whose device could not be
/// made current: [`crate::device::Core::release`]).
pub fn later(f: impl FnOnce() + Send + 'static) {
    QUEUE.lock().push(Box::new(f));
}

/// Runs the queued releases (outside callbacks only).
pub fn flush() {
    if IN_CALLBACK.get() {
        return;
    }
    let queued = std::mem::take(&mut *QUEUE.lock());
    for r in queued {
        r();
    }
}
