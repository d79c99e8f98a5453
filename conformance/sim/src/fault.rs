//! Test controls of every simulated vendor runtime: injected failures and recorded violations.
//! Vendor-neutral: a face counts its entry points by their exported names and returns the
//! injected number as its own result code; it exports the C controls (`unihal_sim_fail`,
//! `unihal_sim_fail_clear`, `unihal_sim_violations`, `unihal_sim_last_violation`) as thin calls
//! of these functions.
//!
//! **Injected failures.** The `n`th call (1 = the next one) of an entry point, counted from
//! when the failure is armed, returns a chosen code instead of running: any code, including one
//! the vendor's header does not list (a backend must not assume a library returns only known
//! codes). Each armed failure fires once. Two ways to arm one:
//!
//! * [`arm_thread`]: for calls made *by the calling thread* only, so tests running in parallel
//!   in one process do not disturb each other; [`clear_thread`] disarms them;
//! * `UNIHAL_SIM_FAIL=name:n:code[,name:n:code...]` (read at the first call): for calls from any
//!   thread, counted process-wide (for the CLI and whole-process tests).
//!
//! **Sweeps.** A fault sweep (the conformance crate's `faults`) needs, process-wide: how often
//! a workload calls each entry point ([`count_calls`], [`calls`]), failures armed for calls from
//! any thread ([`arm_process`], [`clear_process`]), and the objects still alive ([`live`]) to
//! prove that nothing leaked once the handles dropped.
//!
//! **Violations.** Misuse that the real libraries do not report but that is undefined behaviour
//! there (a runtime call from inside a host function, a communicator used after abort, two
//! threads inside calls on one communicator) is refused with an error code *and* recorded
//! ([`violation`]); [`violations`] and [`last_violation`] read them. Each is also printed to
//! stderr.

use parking_lot::Mutex;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::OnceLock;

/// An armed failure.
struct Armed {
    name: String,
    /// Calls still to let through before failing.
    skip: u32,
    code: i32,
}

thread_local! {
    static THREAD: RefCell<Vec<Armed>> = const { RefCell::new(Vec::new()) };
}

fn process() -> &'static Mutex<Vec<Armed>> {
    static P: OnceLock<Mutex<Vec<Armed>>> = OnceLock::new();
    P.get_or_init(|| Mutex::new(parse(&std::env::var("UNIHAL_SIM_FAIL").unwrap_or_default())))
}

/// `name:n:code` items, comma-separated (malformed items are ignored, with a message).
fn parse(spec: &str) -> Vec<Armed> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|item| {
            let parts: Vec<&str> = item.split(':').collect();
            let armed = match parts.as_slice() {
                [name, n, code] => n
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .zip(code.trim().parse::<i32>().ok())
                    .map(|(n, code)| Armed {
                        name: name.trim().to_string(),
                        skip: n - 1,
                        code,
                    }),
                _ => None,
            };
            if armed.is_none() {
                eprintln!("unihal-sim: UNIHAL_SIM_FAIL item {item:?} is not name:n:code");
            }
            armed
        })
        .collect()
}

/// Counts a call of `name` against the armed failures; the code to return if one fires.
fn fire(list: &mut Vec<Armed>, name: &str) -> Option<i32> {
    let i = list.iter().position(|a| a.name == name)?;
    if list[i].skip > 0 {
        list[i].skip -= 1;
        return None;
    }
    Some(list.remove(i).code)
}

/// Whether calls are being counted ([`count_calls`]); off by default, so that ordinary runs
/// take no process-wide lock per call.
static COUNTING: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Starts (`true`, from zero) or stops counting the calls of every entry point, process-wide.
pub fn count_calls(on: bool) {
    CALLS.lock().clear();
    COUNTING.store(on, Ordering::SeqCst);
}

/// The calls of each entry point counted since [`count_calls`]`(true)`, by name.
pub fn calls() -> BTreeMap<String, u64> {
    CALLS.lock().clone()
}

/// The injected result of this call of entry point `name`, if a failure fires now.
pub fn injected(name: &str) -> Option<i32> {
    if COUNTING.load(Ordering::Relaxed) {
        *CALLS.lock().entry(name.to_string()).or_insert(0) += 1;
    }
    if let Some(code) = THREAD.with(|t| fire(&mut t.borrow_mut(), name)) {
        return Some(code);
    }
    fire(&mut process().lock(), name)
}

/// Arms a failure for the calling thread: its `n`th call (from now, 1 = the next) of entry point
/// `name` returns `code` without running.
///
/// # Errors
/// `n == 0` (the first call is `n = 1`).
pub fn arm_thread(name: &str, n: u32, code: i32) -> Result<(), String> {
    if n == 0 {
        return Err("n counts from 1".into());
    }
    THREAD.with(|t| {
        t.borrow_mut().push(Armed {
            name: name.to_string(),
            skip: n - 1,
            code,
        })
    });
    Ok(())
}

/// Disarms the calling thread's failures.
pub fn clear_thread() {
    THREAD.with(|t| t.borrow_mut().clear());
}

/// Arms a failure for calls from any thread: the `n`th call (from now, 1 = the next) of entry
/// point `name` in this process returns `code` without running.
///
/// # Errors
/// `n == 0` (the first call is `n = 1`).
pub fn arm_process(name: &str, n: u32, code: i32) -> Result<(), String> {
    if n == 0 {
        return Err("n counts from 1".into());
    }
    process().lock().push(Armed {
        name: name.to_string(),
        skip: n - 1,
        code,
    });
    Ok(())
}

/// Disarms the failures armed for any thread (by [`arm_process`] or `UNIHAL_SIM_FAIL`); returns
/// how many had not fired.
pub fn clear_process() -> usize {
    let mut p = process().lock();
    let left = p.len();
    p.clear();
    left
}

pub(crate) static LIVE_ALLOCATIONS: AtomicI64 = AtomicI64::new(0);
pub(crate) static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);
pub(crate) static LIVE_STREAMS: AtomicI64 = AtomicI64::new(0);
pub(crate) static LIVE_EVENTS: AtomicI64 = AtomicI64::new(0);
pub(crate) static LIVE_MODULES: AtomicI64 = AtomicI64::new(0);

/// Counts one object more (`delta = 1`) or less (`-1`).
pub(crate) fn track(counter: &AtomicI64, delta: i64) {
    counter.fetch_add(delta, Ordering::SeqCst);
}

/// The simulated objects alive now, over every device of this process: allocations, their
/// bytes, streams (a device's legacy default stream included once created), events, modules.
pub fn live() -> [i64; 5] {
    [
        &LIVE_ALLOCATIONS,
        &LIVE_BYTES,
        &LIVE_STREAMS,
        &LIVE_EVENTS,
        &LIVE_MODULES,
    ]
    .map(|c| c.load(Ordering::SeqCst))
}

static VIOLATIONS: AtomicU32 = AtomicU32::new(0);
static LAST_VIOLATION: Mutex<String> = Mutex::new(String::new());

/// Records a violation (see the module docs).
pub fn violation(msg: String) {
    eprintln!("unihal-sim: VIOLATION: {msg}");
    *LAST_VIOLATION.lock() = msg;
    VIOLATIONS.fetch_add(1, Ordering::SeqCst);
}

/// How many violations were recorded in this process.
pub fn violations() -> u32 {
    VIOLATIONS.load(Ordering::SeqCst)
}

/// The latest violation's message.
pub fn last_violation() -> String {
    LAST_VIOLATION.lock().clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nth_call_fails_once_for_the_arming_thread_only() {
        arm_thread("entryA", 2, -7).unwrap();
        assert_eq!(injected("entryA"), None);
        assert_eq!(
            std::thread::spawn(|| injected("entryA")).join().unwrap(),
            None,
            "another thread's call does not count"
        );
        assert_eq!(injected("entryB"), None);
        assert_eq!(injected("entryA"), Some(-7));
        assert_eq!(injected("entryA"), None, "fires once");
        assert!(arm_thread("entryA", 0, 1).is_err());
        arm_thread("entryC", 1, 3).unwrap();
        clear_thread();
        assert_eq!(injected("entryC"), None);
    }

    #[test]
    fn calls_are_counted_and_process_failures_fire_for_any_thread() {
        count_calls(true);
        assert_eq!(injected("sweepA"), None);
        arm_process("sweepA", 2, -9).unwrap();
        assert_eq!(
            std::thread::spawn(|| injected("sweepA")).join().unwrap(),
            None
        );
        assert_eq!(
            std::thread::spawn(|| injected("sweepA")).join().unwrap(),
            Some(-9)
        );
        assert_eq!(calls().get("sweepA"), Some(&3));
        arm_process("sweepA", 5, 1).unwrap();
        assert_eq!(clear_process(), 1, "the unfired failure is reported");
        count_calls(false);
        assert_eq!(injected("sweepA"), None);
        assert!(calls().is_empty(), "not counting any more");
    }

    #[test]
    fn the_setting_parses_items_and_ignores_malformed_ones() {
        let list = parse("cuMemAlloc_v2:3:2, bad, x:0:1, ncclAllReduce:1:6");
        let got: Vec<(String, u32, i32)> =
            list.into_iter().map(|a| (a.name, a.skip, a.code)).collect();
        assert_eq!(
            got,
            vec![
                ("cuMemAlloc_v2".into(), 2, 2),
                ("ncclAllReduce".into(), 0, 6)
            ]
        );
    }
}
