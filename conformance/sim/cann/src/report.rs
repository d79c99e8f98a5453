//! Host callbacks as CANN documents them: `aclrtLaunchCallback` queues a callback on a stream;
//! when the stream reaches it, the callback is handed to the thread subscribed to that stream
//! with `aclrtSubscribeReport`, which runs it inside `aclrtProcessReport`. With
//! `ACL_CALLBACK_BLOCK` the stream waits until the callback has run; with
//! `ACL_CALLBACK_NO_BLOCK` it goes on at once.
//!
//! Stricter than a lenient reading: a callback on a stream no thread subscribed to is
//! `ACL_ERROR_RT_STREAM_NO_CB_REG`; `aclrtProcessReport` from a thread subscribed to no stream
//! is `ACL_ERROR_RT_THREAD_SUBSCRIBE`, and returns `ACL_ERROR_RT_REPORT_TIMEOUT` when no
//! callback arrives in time (a timeout of -1 waits at most the simulator's watchdog: nothing
//! hangs forever). A blocking callback nobody processes fails its stream after the watchdog.
//! `aclrtProcessReport` is a synchronisation point of its subscribed streams (in deferred mode
//! it runs them up to their callbacks).

use crate::conv::*;
use crate::runtime::sim;
use crate::{api, Err};
use parking_lot::{Condvar, Mutex};
use std::collections::{HashMap, VecDeque};
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use unihal_sim::{Blocker, Device, Gate, GatePoll, Memory, StreamId};

/// `typedef void (*aclrtCallback)(void *userData)`.
pub type AclrtCallback = Option<unsafe extern "C" fn(*mut c_void)>;

extern "C" {
    /// POSIX: the calling thread's id (what `aclrtSubscribeReport` is given).
    fn pthread_self() -> u64;
}

/// Whether a blocking callback ran.
#[derive(Default)]
struct Done {
    ran: Mutex<bool>,
    cv: Condvar,
}

struct Pending {
    f: unsafe extern "C" fn(*mut c_void),
    data: usize,
    done: Arc<Done>,
}

#[derive(Default)]
struct Reports {
    /// Core stream handle → (subscribed thread, device).
    subs: Mutex<HashMap<u64, (u64, Arc<Device>)>>,
    /// Callbacks waiting for their thread.
    queues: Mutex<HashMap<u64, VecDeque<Pending>>>,
    arrived: Condvar,
}

fn reports() -> &'static Reports {
    static R: OnceLock<Reports> = OnceLock::new();
    R.get_or_init(Reports::default)
}

#[no_mangle]
pub extern "C" fn aclrtSubscribeReport(thread: u64, stream: *mut c_void) -> i32 {
    api("aclrtSubscribeReport", || {
        let s = sim()?;
        let (dev, id) = s.core_stream(stream)?;
        let mut subs = reports().subs.lock();
        if subs.contains_key(&id.0) {
            return Err(Err::new(
                ACL_ERROR_RT_STREAM_SUBSCRIBE,
                "the stream already has a subscribed thread",
            ));
        }
        subs.insert(id.0, (thread, dev));
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn aclrtUnSubscribeReport(thread: u64, stream: *mut c_void) -> i32 {
    api("aclrtUnSubscribeReport", || {
        let s = sim()?;
        let (_, id) = s.core_stream(stream)?;
        let mut subs = reports().subs.lock();
        match subs.get(&id.0) {
            Some((t, _)) if *t == thread => {
                subs.remove(&id.0);
                Ok(())
            }
            _ => Err(Err::new(
                ACL_ERROR_RT_STREAM_SUBSCRIBE,
                "this thread is not subscribed to the stream",
            )),
        }
    })
}

struct CallbackGate {
    thread: u64,
    pending: Option<Pending>,
    done: Arc<Done>,
    block: bool,
}

struct Unprocessed(Arc<Done>);

impl Blocker for Unprocessed {
    fn unblock(&self, timeout: Duration) {
        let mut ran = self.0.ran.lock();
        if !*ran {
            self.0.cv.wait_for(&mut ran, timeout);
        }
    }
    fn expire(&self) -> String {
        "a blocking host callback was never processed (no aclrtProcessReport on its subscribed thread)"
            .into()
    }
}

impl Gate for CallbackGate {
    fn poll(&mut self, _memory: &mut Memory) -> GatePoll {
        if let Some(p) = self.pending.take() {
            let r = reports();
            r.queues.lock().entry(self.thread).or_default().push_back(p);
            r.arrived.notify_all();
        }
        if !self.block || *self.done.ran.lock() {
            GatePoll::Done(Ok(()))
        } else {
            GatePoll::Blocked(Arc::new(Unprocessed(self.done.clone())))
        }
    }
}

#[no_mangle]
pub extern "C" fn aclrtLaunchCallback(
    f: AclrtCallback,
    data: *mut c_void,
    block_type: i32,
    stream: *mut c_void,
) -> i32 {
    api("aclrtLaunchCallback", || {
        let s = sim()?;
        let f = f.ok_or_else(|| Err::param("NULL callback"))?;
        let block = match block_type {
            0 => false,
            1 => true,
            b => return Err(Err::param(format!("callback block type {b}"))),
        };
        let (dev, id) = s.core_stream(stream)?;
        let thread = reports()
            .subs
            .lock()
            .get(&id.0)
            .map(|(t, _)| *t)
            .ok_or_else(|| {
                Err::new(
                    ACL_ERROR_RT_STREAM_NO_CB_REG,
                    "no thread is subscribed to the stream (aclrtSubscribeReport)",
                )
            })?;
        let done = Arc::new(Done::default());
        let pending = Pending {
            f,
            data: data as usize,
            done: done.clone(),
        };
        Ok(dev.enqueue_gate(id, Vec::new(), move |_| {
            Box::new(CallbackGate {
                thread,
                pending: Some(pending),
                done,
                block,
            })
        })?)
    })
}

/// Runs the calling thread's subscribed streams up to their end (callbacks reach the queue).
fn drive(me: u64) {
    let streams: Vec<(u64, Arc<Device>)> = reports()
        .subs
        .lock()
        .iter()
        .filter(|(_, (t, _))| *t == me)
        .map(|(s, (_, d))| (*s, d.clone()))
        .collect();
    for (s, dev) in streams {
        if let Ok(end) = dev.enqueued(StreamId(s)) {
            dev.advance(StreamId(s), end);
        }
    }
}

#[no_mangle]
pub extern "C" fn aclrtProcessReport(timeout: i32) -> i32 {
    api("aclrtProcessReport", || {
        let s = sim()?;
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { pthread_self() };
        let r = reports();
        if !r.subs.lock().values().any(|(t, _)| *t == me) {
            return Err(Err::new(
                ACL_ERROR_RT_THREAD_SUBSCRIBE,
                "the calling thread is subscribed to no stream (aclrtSubscribeReport)",
            ));
        }
        let wait = match timeout {
            -1 => s.face.watchdog,
            t if t < -1 => return Err(Err::param(format!("timeout {t}"))),
            t => Duration::from_millis(t as u64),
        };
        let deadline = unihal_hal::deadline::after(wait);
        loop {
            drive(me);
            let batch: Vec<Pending> = r
                .queues
                .lock()
                .get_mut(&me)
                .map(|q| q.drain(..).collect())
                .unwrap_or_default();
            if !batch.is_empty() {
                for p in batch {
                    // SAFETY: the application's callback with its own user data, as
                    // aclrtLaunchCallback was given them.
                    unsafe { (p.f)(p.data as *mut c_void) };
                    *p.done.ran.lock() = true;
                    p.done.cv.notify_all();
                }
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Err::new(
                    ACL_ERROR_RT_REPORT_TIMEOUT,
                    format!("no callback arrived in {} ms", wait.as_millis()),
                ));
            }
            let mut q = r.queues.lock();
            let step = (deadline - now).min(Duration::from_millis(2));
            r.arrived.wait_for(&mut q, step);
        }
    })
}
