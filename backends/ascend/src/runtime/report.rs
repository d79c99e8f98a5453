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
//! Callbacks the runtime will never deliver: every callback is registered until it runs; when a
//! retired stream has failed (its query reports the error), it is destroyed and the callbacks it
//! still held run on its report thread, since nothing of the stream runs any more (the shared
//! layer's final release among them, which would otherwise leak what the stream kept).
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

/// A callback queued and not yet run: its function and data, and its stream.
struct Pending {
    f: Callback,
    data: usize,
    stream: usize,
}

/// Callbacks queued and not yet run, by id (the id is what the runtime hands back).
fn pending() -> &'static Mutex<HashMap<u64, Pending>> {
    static P: std::sync::OnceLock<Mutex<HashMap<u64, Pending>>> = std::sync::OnceLock::new();
    P.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Runs the callback registered under `id` once (whoever takes it first: the runtime's delivery
/// or a retired stream's report thread).
fn run_pending(id: u64) {
    let taken = pending().lock().remove(&id);
    if let Some(p) = taken {
        // SAFETY: the function and data `launch` was given, called once (removed above).
        unsafe { (p.f)(p.data as *mut std::ffi::c_void) };
    }
}

/// What the runtime calls: the registered callback `user` names.
unsafe extern "C" fn deliver(user: *mut std::ffi::c_void) {
    run_pending(user as u64);
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
                    tracing::warn!(target: "unihal::device", "{}", cann.vendor("aclrtDestroyStream", rc));
                }
            }
            // The stream is gone: callbacks it never delivered (it failed) run here.
            let left: Vec<u64> = pending()
                .lock()
                .iter()
                .filter(|(_, p)| p.stream == stream_u)
                .map(|(&id, _)| id)
                .collect();
            for id in left {
                run_pending(id);
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
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    pending().lock().insert(
        id,
        Pending {
            f,
            data: data as usize,
            stream: stream as usize,
        },
    );
    // SAFETY: `deliver` takes any id (it runs the registered callback at most once); a live
    // stream with a subscribed thread.
    let r = cann.check("aclrtLaunchCallback", unsafe {
        (cann.acl.launch_callback)(deliver, id as *mut std::ffi::c_void, CALLBACK_BLOCK, stream)
    });
    if r.is_err() {
        // Not queued: never called (the caller gets `f` back unrun).
        pending().lock().remove(&id);
    }
    r
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
