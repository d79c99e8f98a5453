//! Deadlines made from durations that a caller, a setting or a peer chose, and the timeouts such a
//! duration may be.
//!
//! `Instant::now() + timeout` panics when the sum passes the clock's range: `Duration::MAX` (the
//! natural "no timeout" of a [`crate::CommConfig`]) or a setting of `1e19` seconds would panic on
//! the caller's thread, or on a stream worker where the panic turns every later operation into an
//! error. So every deadline made from a duration the program does not fix itself comes from
//! [`after`] (or [`from`]): a timeout longer than [`NEVER`] is no deadline, an instant a century
//! away, which every wait treats as never and to which a small grace can still be added.
//!
//! A timeout shorter than [`MIN_TIMEOUT`] cannot work (an operation cannot even reach its peers
//! in less) and would be indistinguishable from a zero timeout: [`check_timeout`] refuses it,
//! naming where it came from, and the settings parser for timeouts ([`crate::settings::timeout`])
//! does the same for a variable.
//!
//! Thread-safety: free functions over values; nothing is shared.

use crate::error::{HalError, Invalid, Result};
use std::time::{Duration, Instant};

/// Timeouts at least this long are no deadline: a century.
pub const NEVER: Duration = Duration::from_secs(100 * 365 * 86_400);

/// The shortest timeout a caller or a setting may ask for: one millisecond.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// The instant `timeout` from now; a timeout longer than [`NEVER`] (up to `Duration::MAX`) ends
/// a century from now instead. Never panics.
pub fn after(timeout: Duration) -> Instant {
    from(Instant::now(), timeout)
}

/// The instant `timeout` after `start`, as [`after`]. Never panics.
pub fn from(start: Instant, timeout: Duration) -> Instant {
    start
        .checked_add(timeout.min(NEVER))
        // A clock whose range ends within the century (none that Rust supports): a day, else
        // the start itself (the wait then ends at once, reporting its timeout).
        .or_else(|| start.checked_add(Duration::from_secs(86_400)))
        .unwrap_or(start)
}

/// `d` in whole milliseconds, saturating at `u64::MAX` (for messages and C interfaces that carry
/// milliseconds: `Duration::MAX` has more than 64 bits of them).
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in milliseconds for a library that adds it to a nanosecond clock (gloo, `std::chrono`'s
/// `steady_clock`): at most [`NEVER`], so the sum stays inside a signed 64-bit count of
/// nanoseconds.
pub fn clock_millis(d: Duration) -> i64 {
    i64::try_from(millis(d.min(NEVER))).unwrap_or(i64::MAX)
}

/// `timeout` when it is at least [`MIN_TIMEOUT`].
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `what` (where the timeout came from, such as
/// `CommConfig::timeout`) for a shorter one.
pub fn check_timeout(what: &'static str, timeout: Duration) -> Result<Duration> {
    if timeout >= MIN_TIMEOUT {
        return Ok(timeout);
    }
    Err(HalError::invalid(
        what,
        Invalid::Value {
            value: format!("{what} = {timeout:?}"),
            accepted: "at least 1 ms (one longer than the clock can hold, such as Duration::MAX, \
                       is no deadline)"
                .into(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_overflow() {
        let now = Instant::now();
        for t in [
            Duration::MAX,
            Duration::from_secs_f64(1e19),
            NEVER + Duration::from_secs(1),
        ] {
            let d = from(now, t);
            assert!(d >= now + NEVER, "{t:?}");
            // A grace added to a deadline is still in range.
            let _ = d + Duration::from_secs(3600);
        }
        assert_eq!(
            from(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert!(after(Duration::ZERO) <= Instant::now());
    }

    #[test]
    fn timeouts_too_short_to_work_are_refused() {
        assert!(check_timeout("t", Duration::MAX).is_ok());
        assert!(check_timeout("t", MIN_TIMEOUT).is_ok());
        for t in [
            Duration::ZERO,
            Duration::from_secs_f64(1e-300),
            Duration::from_micros(999),
        ] {
            let e = check_timeout("CommConfig::timeout", t).unwrap_err();
            assert!(e.to_string().contains("CommConfig::timeout"), "{e}");
        }
        assert_eq!(millis(Duration::MAX), u64::MAX);
        assert_eq!(millis(Duration::from_millis(7)), 7);
        // A century of milliseconds, in nanoseconds, added to a boot-time clock still fits.
        let ns = clock_millis(Duration::MAX) as i128 * 1_000_000;
        assert!(ns + (1i128 << 62) < i64::MAX as i128);
    }
}
