//! Progress of a conformance run on stderr, per device, so a run of several minutes is not silent
//! until its summary.
//!
//! * **On a terminal** (stderr is one): one line, redrawn in place with `\r`, shows every device
//!   still running (`cpu:0 [#####.....] 123/245 cases, 2 failed, 0:42`); when a device ends, its
//!   final line is written for good (ending in a newline) and the line of the others is redrawn
//!   below it. The line is cut to the terminal's width (`COLUMNS`, else 80) so it never wraps,
//!   which `\r` could not redraw.
//! * **Otherwise** (CI logs, pipes, files): a plain line per device at most every
//!   [`PLAIN_INTERVAL`] (10 s) while it runs, and one when it ends, each written whole in one
//!   write, so lines of devices that run at the same time never interleave within a line.
//! * **A rank of an SPMD run** (one process per rank, under a launcher that may give them one
//!   terminal) writes plain lines even on a terminal.
//! * **Off** with `UNIHAL_PROGRESS=0` ([`PROGRESS_ENV`]); `UNIHAL_PROGRESS=plain` writes plain lines
//!   even on a terminal.
//!
//! Progress goes to stderr only, never to stdout (where `unihal conformance` prints its summary)
//! nor into the report files.

use crate::report::Outcome;
use parking_lot::Mutex;
use std::io::{IsTerminal, Write};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Environment variable that sets the progress mode: `0` (or `off`, `false`, `no`) turns progress
/// off, `plain` writes plain lines even on a terminal, `1` (or `on`, `true`, `yes`, `auto`) or
/// unset picks by stderr (a redrawn line on a terminal, plain lines elsewhere); any other value
/// is refused ([`Mode::check_env`]).
pub const PROGRESS_ENV: &str = "UNIHAL_PROGRESS";

/// Least time between two plain progress lines of one device (its final line excepted).
pub const PLAIN_INTERVAL: Duration = Duration::from_secs(10);

/// Least time between two redraws of the terminal line (a device's end always redraws).
const REDRAW_INTERVAL: Duration = Duration::from_millis(100);

/// Cells of the terminal line's bar.
const BAR_CELLS: usize = 10;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing is written.
    Off,
    /// One line redrawn in place (`\r`), for a terminal.
    Terminal,
    /// Whole lines, at most one per device every interval plus one at its end, for logs.
    Plain,
}

impl Mode {
    /// The mode [`PROGRESS_ENV`] asks for, with `stderr_is_terminal` deciding when it does not.
    /// A value the variable does not accept picks by stderr too; [`Mode::check_env`] refuses it.
    pub fn from_setting(value: Option<&str>, stderr_is_terminal: bool) -> Mode {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            Some("0" | "off" | "false" | "no") => Mode::Off,
            Some("plain") => Mode::Plain,
            _ if stderr_is_terminal => Mode::Terminal,
            _ => Mode::Plain,
        }
    }

    /// The mode for this process: [`PROGRESS_ENV`] and whether stderr is a terminal.
    pub fn from_env() -> Mode {
        Mode::from_setting(
            unihal_hal::settings::get(PROGRESS_ENV).as_deref(),
            std::io::stderr().is_terminal(),
        )
    }

    /// Refuses a [`PROGRESS_ENV`] value that is none of those listed there.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::InvalidArgument`] naming the variable and the value.
    pub fn check_env() -> unihal_hal::Result<()> {
        unihal_hal::settings::parse(PROGRESS_ENV, |v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "0" | "off" | "false" | "no" | "plain" | "1" | "on" | "true" | "yes" | "auto"
            )
            .then_some(())
        })
        .map(|_| ())
    }
}

/// Where progress text goes. The default, [`StderrSink`], writes through `eprint!` (so a test
/// harness that captures output captures it too).
pub type Sink = Box<dyn Write + Send>;

/// Writes to stderr through `eprint!`, one call per write.
pub struct StderrSink;

impl Write for StderrSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        eprint!("{}", String::from_utf8_lossy(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// A clock: the time since some fixed start. Injectable so tests need no sleeping.
pub type Clock = Box<dyn Fn() -> Duration + Send + Sync>;

/// The state of one device's run.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProgress {
    /// What the lines call the device (`cpu:0`).
    pub label: String,
    /// Cases to run on it (skips included).
    pub total: usize,
    /// Cases that ended.
    pub done: usize,
    /// Cases that failed.
    pub failed: usize,
    /// Clock reading when it started.
    pub started: Duration,
    /// Clock reading of its last plain line (its start before the first).
    last_line: Duration,
    /// True once all its cases ended.
    pub finished: bool,
}

impl DeviceProgress {
    /// The terminal line: `cpu:0 [#####.....] 123/245 cases, 2 failed, 0:42`.
    pub fn terminal_line(&self, now: Duration) -> String {
        format!(
            "{} {} {}/{} cases, {} failed, {}",
            self.label,
            bar(self.done, self.total, BAR_CELLS),
            self.done,
            self.total,
            self.failed,
            clock_time(now.saturating_sub(self.started))
        )
    }

    /// The plain line: `unihal conformance: cpu:0 123/245 cases, 2 failed, 0:42` (`, done` at the
    /// end of the device's last).
    pub fn plain_line(&self, now: Duration) -> String {
        format!(
            "unihal conformance: {} {}/{} cases, {} failed, {}{}",
            self.label,
            self.done,
            self.total,
            self.failed,
            clock_time(now.saturating_sub(self.started)),
            if self.finished { ", done" } else { "" }
        )
    }
}

/// `[#####.....]`: `done` of `total` in `cells` cells (full when `total` is 0).
pub fn bar(done: usize, total: usize, cells: usize) -> String {
    let filled = (done.min(total) * cells)
        .checked_div(total)
        .unwrap_or(cells);
    format!("[{}{}]", "#".repeat(filled), ".".repeat(cells - filled))
}

/// `0:42`, `12:03`, `1:02:03`: a duration in whole seconds.
pub fn clock_time(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

struct State {
    devices: Vec<DeviceProgress>,
    /// True while a terminal line is on screen.
    drawn: bool,
    /// Clock reading of the last terminal redraw.
    last_redraw: Option<Duration>,
    sink: Sink,
}

/// Progress of a run, shared by the threads that run its devices.
///
/// Thread-safe: every method takes `&self` and one lock, and each write to the sink is made
/// whole under it, so devices that run at the same time never interleave their lines. Writes
/// that fail are ignored (progress never fails a run).
pub struct Progress {
    mode: Mode,
    interval: Duration,
    width: usize,
    clock: Clock,
    state: Mutex<State>,
}

/// Index of a device in a [`Progress`], from [`Progress::device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlot(usize);

impl Progress {
    /// Progress in `mode`, written to `sink`, read from `clock`, plain lines at most every
    /// `interval` per device, terminal lines cut to `width` characters (at least 20).
    pub fn new(mode: Mode, sink: Sink, clock: Clock, interval: Duration, width: usize) -> Progress {
        Progress {
            mode,
            interval,
            width: width.max(20),
            clock,
            state: Mutex::new(State {
                devices: Vec::new(),
                drawn: false,
                last_redraw: None,
                sink,
            }),
        }
    }

    /// Progress on stderr in the mode of [`Mode::from_env`], with [`PLAIN_INTERVAL`] and the
    /// terminal width from `COLUMNS` (80 when unset). With `shared`, for a process that may share
    /// its terminal with others (a rank of an SPMD run under a launcher), plain lines instead of
    /// a redrawn one: each is written whole, where redrawn lines of several processes would
    /// overwrite each other.
    pub fn stderr(shared: bool) -> Progress {
        let start = Instant::now();
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse().ok())
            .unwrap_or(80);
        let mode = match Mode::from_env() {
            Mode::Terminal if shared => Mode::Plain,
            m => m,
        };
        Progress::new(
            mode,
            Box::new(StderrSink),
            Box::new(move || start.elapsed()),
            PLAIN_INTERVAL,
            width,
        )
    }

    /// The mode it writes in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Starts a device called `label` with `total` cases to run.
    pub fn device(&self, label: impl Into<String>, total: usize) -> DeviceSlot {
        let now = (self.clock)();
        let mut st = self.state.lock();
        st.devices.push(DeviceProgress {
            label: label.into(),
            total,
            done: 0,
            failed: 0,
            started: now,
            last_line: now,
            finished: false,
        });
        let slot = DeviceSlot(st.devices.len() - 1);
        drop(st);
        self.write_due(Some(slot));
        slot
    }

    /// Counts a case of `slot` that ended with `outcome`.
    pub fn case_done(&self, slot: DeviceSlot, outcome: &Outcome) {
        {
            let mut st = self.state.lock();
            let d = &mut st.devices[slot.0];
            d.done += 1;
            d.failed += usize::from(outcome.is_failure());
        }
        self.write_due(Some(slot));
    }

    /// Ends `slot`: writes its final line (in every mode but [`Mode::Off`]).
    pub fn finish(&self, slot: DeviceSlot) {
        let now = (self.clock)();
        let mut st = self.state.lock();
        if st.devices[slot.0].finished {
            return;
        }
        st.devices[slot.0].finished = true;
        let text = match self.mode {
            Mode::Off => return,
            Mode::Plain => format!("{}\n", st.devices[slot.0].plain_line(now)),
            Mode::Terminal => {
                let last = cut(&st.devices[slot.0].terminal_line(now), self.width);
                let mut text = format!("\r{last}\x1b[K\n");
                let rest = self.terminal_text(&st, now);
                if !rest.is_empty() {
                    text.push_str(&redraw(&rest));
                }
                st.drawn = !rest.is_empty();
                st.last_redraw = Some(now);
                text
            }
        };
        write_whole(&mut st.sink, &text);
    }

    /// Writes what is due now: in plain mode the line of each running device whose last one is
    /// at least the interval old; on a terminal a redraw (at most every 100 ms). Called after
    /// each event and by the [`Ticker`], so the time moves on while a long case runs.
    pub fn tick(&self) {
        self.write_due(None);
    }

    /// As [`Progress::tick`], with the plain lines of `only` (when set) alone.
    fn write_due(&self, only: Option<DeviceSlot>) {
        let now = (self.clock)();
        let mut st = self.state.lock();
        let text = match self.mode {
            Mode::Off => return,
            Mode::Plain => {
                let mut text = String::new();
                for (i, d) in st.devices.iter_mut().enumerate() {
                    if d.finished || only.is_some_and(|o| o.0 != i) {
                        continue;
                    }
                    if now.saturating_sub(d.last_line) >= self.interval {
                        d.last_line = now;
                        text.push_str(&d.plain_line(now));
                        text.push('\n');
                    }
                }
                text
            }
            Mode::Terminal => {
                if st
                    .last_redraw
                    .is_some_and(|t| now.saturating_sub(t) < REDRAW_INTERVAL)
                {
                    return;
                }
                let line = self.terminal_text(&st, now);
                if line.is_empty() && !st.drawn {
                    return;
                }
                st.drawn = !line.is_empty();
                st.last_redraw = Some(now);
                redraw(&line)
            }
        };
        if !text.is_empty() {
            write_whole(&mut st.sink, &text);
        }
    }

    /// Clears the terminal line, if one is drawn (nothing to do in the other modes).
    pub fn close(&self) {
        let mut st = self.state.lock();
        if self.mode == Mode::Terminal && st.drawn {
            st.drawn = false;
            write_whole(&mut st.sink, &redraw(""));
        }
    }

    /// The terminal line of every running device, joined by ` | ` and cut to the width.
    fn terminal_text(&self, st: &State, now: Duration) -> String {
        let parts: Vec<String> = st
            .devices
            .iter()
            .filter(|d| !d.finished)
            .map(|d| d.terminal_line(now))
            .collect();
        cut(&parts.join(" | "), self.width)
    }

    /// Starts a thread that calls [`Progress::tick`] every `period` until the returned
    /// [`Ticker`] is dropped (no thread when the mode is [`Mode::Off`]).
    pub fn ticker(self: &Arc<Self>, period: Duration) -> Ticker {
        if self.mode == Mode::Off {
            return Ticker { stop: None };
        }
        let (tx, rx) = mpsc::channel::<()>();
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("conformance progress".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = rx.recv_timeout(period) {
                    me.tick();
                }
            })
            .ok();
        Ticker {
            stop: thread.map(|t| (tx, t)),
        }
    }
}

/// Stops its [`Progress::ticker`] thread when dropped (and waits for it to end).
pub struct Ticker {
    stop: Option<(mpsc::Sender<()>, std::thread::JoinHandle<()>)>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        if let Some((tx, thread)) = self.stop.take() {
            drop(tx);
            let _ = thread.join();
        }
    }
}

/// `\r`, `line`, the rest of the screen line erased (ANSI `EL`, `ESC [ K`: only ever written to a
/// terminal), then `\r` again: the cursor waits at the line's start, so a line another writer
/// (the log) puts on stderr meanwhile overwrites the progress line instead of running on after
/// it, and the next redraw comes below it.
fn redraw(line: &str) -> String {
    format!("\r{line}\x1b[K\r")
}

/// `s` cut to `width - 1` characters (the last column left empty: a full line may wrap).
fn cut(s: &str, width: usize) -> String {
    let max = width.saturating_sub(1);
    if s.chars().count() <= max {
        s.to_string()
    } else {
        s.chars().take(max.saturating_sub(1)).chain(['…']).collect()
    }
}

fn write_whole(sink: &mut Sink, text: &str) {
    let _ = sink.write_all(text.as_bytes());
    let _ = sink.flush();
}

#[cfg(test)]
mod tests {
    use super::*;

    type Shared<T> = Arc<Mutex<T>>;

    /// A sink whose bytes the test reads back, and a clock the test sets.
    fn harness(
        mode: Mode,
        interval_s: u64,
        width: usize,
    ) -> (Progress, Shared<Vec<u8>>, Shared<Duration>) {
        struct Capture(Shared<Vec<u8>>);
        impl Write for Capture {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let out = Arc::new(Mutex::new(Vec::new()));
        let now = Arc::new(Mutex::new(Duration::ZERO));
        let clock = now.clone();
        let p = Progress::new(
            mode,
            Box::new(Capture(out.clone())),
            Box::new(move || *clock.lock()),
            Duration::from_secs(interval_s),
            width,
        );
        (p, out, now)
    }

    fn text(out: &Arc<Mutex<Vec<u8>>>) -> String {
        String::from_utf8(out.lock().clone()).unwrap()
    }

    fn fail() -> Outcome {
        Outcome::Failed {
            message: "deliberate".into(),
        }
    }

    #[test]
    fn lines_are_formatted() {
        let d = DeviceProgress {
            label: "cpu:0".into(),
            total: 245,
            done: 123,
            failed: 2,
            started: Duration::from_secs(5),
            last_line: Duration::ZERO,
            finished: false,
        };
        assert_eq!(
            d.terminal_line(Duration::from_secs(47)),
            "cpu:0 [#####.....] 123/245 cases, 2 failed, 0:42"
        );
        assert_eq!(
            d.plain_line(Duration::from_millis(47_900)),
            "unihal conformance: cpu:0 123/245 cases, 2 failed, 0:42"
        );
        let done = DeviceProgress {
            done: 245,
            finished: true,
            ..d
        };
        assert_eq!(
            done.plain_line(Duration::from_secs(3605 + 3723)),
            "unihal conformance: cpu:0 245/245 cases, 2 failed, 2:02:03, done"
        );
        assert_eq!(bar(0, 10, 10), "[..........]");
        assert_eq!(bar(9, 10, 10), "[#########.]");
        assert_eq!(bar(10, 10, 10), "[##########]");
        assert_eq!(bar(0, 0, 4), "[####]");
        assert_eq!(clock_time(Duration::from_secs(600)), "10:00");
        assert_eq!(cut("abcdef", 20), "abcdef");
        assert_eq!(cut(&"x".repeat(30), 20).chars().count(), 19);
    }

    #[test]
    fn settings_pick_the_mode() {
        assert_eq!(Mode::from_setting(None, true), Mode::Terminal);
        assert_eq!(Mode::from_setting(None, false), Mode::Plain);
        assert_eq!(Mode::from_setting(Some("0"), true), Mode::Off);
        assert_eq!(Mode::from_setting(Some(" OFF "), false), Mode::Off);
        assert_eq!(Mode::from_setting(Some("plain"), true), Mode::Plain);
        assert_eq!(Mode::from_setting(Some("1"), false), Mode::Plain);
        assert_eq!(Mode::from_setting(Some("1"), true), Mode::Terminal);
    }

    #[test]
    fn plain_lines_come_at_most_every_interval_per_device_and_at_each_end() {
        let (p, out, now) = harness(Mode::Plain, 10, 80);
        let a = p.device("cpu:0", 30);
        let b = p.device("cpu:1", 30);
        // A case every second on both devices for 25 s: lines at 10 s and 20 s for each.
        for s in 1..=25 {
            *now.lock() = Duration::from_secs(s);
            p.case_done(a, &Outcome::Passed);
            let outcome = if s == 3 { fail() } else { Outcome::Passed };
            p.case_done(b, &outcome);
            p.tick();
        }
        // A hang: no case ends, but the ticker's calls still give a line every interval.
        for ms in (25_000..=42_000).step_by(250) {
            *now.lock() = Duration::from_millis(ms);
            p.tick();
        }
        p.finish(a);
        p.finish(a); // twice: one final line
        *now.lock() = Duration::from_secs(43);
        p.finish(b);
        p.close();
        assert_eq!(
            text(&out),
            "unihal conformance: cpu:0 10/30 cases, 0 failed, 0:10\n\
             unihal conformance: cpu:1 10/30 cases, 1 failed, 0:10\n\
             unihal conformance: cpu:0 20/30 cases, 0 failed, 0:20\n\
             unihal conformance: cpu:1 20/30 cases, 1 failed, 0:20\n\
             unihal conformance: cpu:0 25/30 cases, 0 failed, 0:30\n\
             unihal conformance: cpu:1 25/30 cases, 1 failed, 0:30\n\
             unihal conformance: cpu:0 25/30 cases, 0 failed, 0:40\n\
             unihal conformance: cpu:1 25/30 cases, 1 failed, 0:40\n\
             unihal conformance: cpu:0 25/30 cases, 0 failed, 0:42, done\n\
             unihal conformance: cpu:1 25/30 cases, 1 failed, 0:43, done\n"
        );
    }

    #[test]
    fn a_short_device_writes_only_its_final_line() {
        let (p, out, now) = harness(Mode::Plain, 10, 80);
        let a = p.device("cpu:0", 2);
        *now.lock() = Duration::from_secs(3);
        p.case_done(a, &Outcome::Passed);
        p.case_done(a, &fail());
        p.finish(a);
        assert_eq!(
            text(&out),
            "unihal conformance: cpu:0 2/2 cases, 1 failed, 0:03, done\n"
        );
    }

    #[test]
    fn the_terminal_line_is_redrawn_in_place_and_each_device_ends_on_its_own_line() {
        let (p, out, now) = harness(Mode::Terminal, 10, 120);
        let a = p.device("cpu:0", 4);
        for ms in [50, 200, 400] {
            *now.lock() = Duration::from_millis(ms);
            p.case_done(a, &Outcome::Passed);
        }
        *now.lock() = Duration::from_secs(2);
        let b = p.device("cpu:1", 2);
        p.finish(a);
        *now.lock() = Duration::from_secs(3);
        p.case_done(b, &fail());
        p.close();
        let t = text(&out);
        // No newline but the one that ends cpu:0's final line; every draw starts with \r.
        assert_eq!(t.matches('\n').count(), 1, "{t:?}");
        let draws: Vec<&str> = t.split('\r').filter(|s| !s.is_empty()).collect();
        assert_eq!(
            draws[0],
            "cpu:0 [..........] 0/4 cases, 0 failed, 0:00\x1b[K"
        );
        // Each draw leaves the cursor at the line's start.
        assert!(t.starts_with("\rcpu:0 [..........] 0/4 cases, 0 failed, 0:00\x1b[K\r"));
        // The 50 ms case is within the redraw interval of the first draw: not drawn.
        assert!(
            draws[1].starts_with("cpu:0 [#####.....] 2/4 cases"),
            "{t:?}"
        );
        assert!(t.contains("cpu:0 [#######...] 3/4 cases, 0 failed, 0:00"));
        assert!(t.contains(
            "cpu:0 [#######...] 3/4 cases, 0 failed, 0:02 | cpu:1 [..........] 0/2 cases, 0 failed, 0:00"
        ));
        // cpu:0 ends: its line is written over the shared one for good, then cpu:1 alone.
        assert!(
            t.contains("\rcpu:0 [#######...] 3/4 cases, 0 failed, 0:02\x1b[K\n\rcpu:1 [..........] 0/2 cases, 0 failed, 0:00\x1b[K\r"),
            "{t:?}"
        );
        assert!(
            t.contains("\rcpu:1 [#####.....] 1/2 cases, 1 failed, 0:01\x1b[K"),
            "{t:?}"
        );
        // close() erases the line.
        assert!(t.ends_with("\r\x1b[K\r"), "{t:?}");
        assert_eq!(t.matches("\x1b[K").count(), draws.len(), "{t:?}");
    }

    #[test]
    fn the_terminal_line_never_exceeds_the_width() {
        let (p, out, now) = harness(Mode::Terminal, 10, 80);
        for i in 0..8 {
            p.device(format!("cpu:{i}"), 100);
        }
        *now.lock() = Duration::from_secs(1);
        p.tick();
        let t = text(&out);
        for draw in t.split('\r') {
            let visible = draw.trim_end_matches("\x1b[K");
            assert!(visible.chars().count() < 80, "{draw:?}");
        }
    }

    #[test]
    fn off_writes_nothing() {
        let (p, out, now) = harness(Mode::Off, 10, 80);
        let a = p.device("cpu:0", 1);
        *now.lock() = Duration::from_secs(60);
        p.case_done(a, &fail());
        p.tick();
        p.finish(a);
        p.close();
        assert!(text(&out).is_empty());
    }
}
