//! Host callbacks on ACL streams: ACL runs a callback queued with `aclrtLaunchCallback` only on
//! a thread subscribed to its stream (`aclrtSubscribeReport`), inside that thread's
//! `aclrtProcessReport`. So every stream that gets a callback gets a report thread of its own,
//! started on its first callback, with the stream's context current, that processes reports
//! until the stream is retired.
//!
//! One thread per stream, not one per device: a callback may block (the conformance suite holds
//! a stream with one), and it must not hold back the callbacks of the device's other streams.
//! Callbacks are queued `ACL_CALLBACK_BLOCK`: the stream goes on after the callback returned,
//! which is what the HAL's host callbacks promise (work queued after one runs after it).
//!
//! Retiring: a stream with a report thread is not destroyed at once (its callbacks, the shared
//! layer's final release among them, still need the thread). [`destroy`] hands it to its
//! thread, which waits until `aclrtStreamQuery` says the stream's work ran, then unsubscribes,
//! destroys the stream and ends. Streams without callbacks are destroyed directly.

use crate::ffi::acl::{Callback, Handle, CALLBACK_BLOCK, STREAM_STATUS_COMPLETE};
use crate::loader::Cann;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use unihal_hal::{HalError, Result};

extern "C" {
    /// POSIX: the calling thread's id (`pthread_t`, an unsigned long on Linux): what
    /// `aclrtSubscribeReport` takes.
    fn pthread_self() -> u64;
}

/// How long one `aclrtProcessReport` waits before the thread looks at its retire flag again.
const POLL_MS: i32 = 20;

struct Reporter {
    thread: u64,
    retire: Arc<AtomicBool>,
}

/// The report threads, by stream handle.
fn reporters() -> &'static Mutex<HashMap<usize, Reporter>> {
    static R: std::sync::OnceLock<Mutex<HashMap<usize, Reporter>>> = std::sync::OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Starts the report thread of `stream` (context `ctx` current on it) and subscribes it.
fn start(cann: &'static Cann, ctx: Handle, stream: Handle) -> Result<u64> {
    let (tx, rx) = std::sync::mpsc::channel::<Result<u64>>();
    let retire = Arc::new(AtomicBool::new(false));
    let flag = retire.clone();
    let (ctx_u, stream_u) = (ctx as usize, stream as usize);
    std::thread::Builder::new()
        .name("unihal-ascend report".into())
        .spawn(move || {
            let (ctx, stream) = (ctx_u as Handle, stream_u as Handle);
            // SAFETY: no preconditions.
            let me = unsafe { pthread_self() };
            // SAFETY: a live context of this process; the stream is live (its destruction
            // waits for this thread, below).
            let setup = unsafe {
                match (cann.acl.set_current_context)(ctx) {
                    0 => (cann.acl.subscribe_report)(me, stream),
                    rc => rc,
                }
            };
            if setup != 0 {
                let _ = tx.send(Err(cann.vendor("aclrtSubscribeReport", setup)));
                return;
            }
            let _ = tx.send(Ok(me));
            serve(cann, stream, &flag);
            // SAFETY: this thread subscribed to the stream above; the stream's work ran (serve
            // returned after aclrtStreamQuery said so), and nothing else uses the handle.
            unsafe {
                let _ = (cann.acl.unsubscribe_report)(me, stream);
                let rc = (cann.acl.destroy_stream)(stream);
                if rc != 0 {
                    tracing::warn!(target: "unihal::ascend", "{}", cann.vendor("aclrtDestroyStream", rc));
                }
            }
        })
        .map_err(|e| HalError::Internal(format!("no report thread: {e}")))?;
    let thread = rx
        .recv()
        .map_err(|_| HalError::Internal("the report thread ended before subscribing".into()))??;
    reporters()
        .lock()
        .insert(stream as usize, Reporter { thread, retire });
    Ok(thread)
}

/// Processes the stream's reports until it is retired and its work has run.
fn serve(cann: &Cann, stream: Handle, retire: &AtomicBool) {
    loop {
        // SAFETY: this thread is subscribed to a live stream.
        let rc = unsafe { (cann.acl.process_report)(POLL_MS) };
        if rc != 0 && rc != crate::conv::codes::RT_REPORT_TIMEOUT {
            // Not expected while subscribed; do not spin on it.
            std::thread::sleep(Duration::from_millis(POLL_MS as u64));
        }
        if retire.load(Ordering::Acquire) {
            let mut status = -1;
            // SAFETY: a live stream of the context current on this thread; an out-pointer.
            let q = unsafe { (cann.acl.stream_query)(stream, &mut status) };
            if q != 0 || status == STREAM_STATUS_COMPLETE {
                return;
            }
        }
    }
}

/// Queues `f(data)` on `stream` as a blocking callback, starting the stream's report thread
/// on its first callback. The current context must be the stream's.
///
/// # Errors
/// The runtime's (`aclrtGetCurrentContext`, `aclrtSubscribeReport`, `aclrtLaunchCallback`);
/// [`HalError::Internal`] when no thread can start.
///
/// # Safety
/// `f` must accept `data` once; it is never called when this fails.
pub unsafe fn launch(
    cann: &'static Cann,
    stream: Handle,
    f: Callback,
    data: *mut std::ffi::c_void,
) -> Result<()> {
    let known = reporters().lock().contains_key(&(stream as usize));
    if !known {
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        cann.check("aclrtGetCurrentContext", unsafe {
            (cann.acl.get_current_context)(&mut ctx)
        })?;
        start(cann, ctx, stream)?;
    }
    // SAFETY: the caller's contract for `f` and `data`; a live stream with a subscribed thread.
    cann.check("aclrtLaunchCallback", unsafe {
        (cann.acl.launch_callback)(f, data, CALLBACK_BLOCK, stream)
    })
}

/// Destroys `stream` once its queued work ran: at once when it has no report thread, else by
/// that thread.
///
/// # Safety
/// A live stream, destroyed once.
pub unsafe fn destroy(cann: &Cann, stream: Handle) -> Result<()> {
    match reporters().lock().remove(&(stream as usize)) {
        Some(r) => {
            let _ = r.thread;
            r.retire.store(true, Ordering::Release);
            Ok(())
        }
        // SAFETY: the caller's contract.
        None => cann.check("aclrtDestroyStream", unsafe {
            (cann.acl.destroy_stream)(stream)
        }),
    }
}
