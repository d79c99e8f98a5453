//! `events.*`: query, synchronize, timing, waits across streams and devices.

use crate::blocker::Blocker;
use crate::case::{expect_invalid, Case, CaseResult, Ctx, Need};
use crate::{ensure, ensure_eq};
use std::sync::Arc;
use std::time::{Duration, Instant};
use unihal_hal::{Event, EventFlags, FillValue, Invalid, Stream};

pub fn cases() -> Vec<Case> {
    // Cases that hold a stream (a Blocker: a spinning kernel or a blocking host callback).
    const B: &[Need] = &[Need::StreamHold, Need::ConcurrentKernels];
    vec![
        Case::new("events.query.never_recorded", never_recorded),
        Case::new("events.query.pending_then_complete", pending_then_complete).needs(B),
        Case::new("events.synchronize.waits_for_work", synchronize).needs(B),
        Case::new("events.elapsed.measures_work", elapsed).needs(&[
            Need::StreamHold,
            Need::EventTiming,
            Need::ConcurrentKernels,
        ]),
        Case::new("events.elapsed.timing_disabled", timing_disabled).needs(&[Need::EventTiming]),
        Case::new("events.elapsed.not_recorded", elapsed_unrecorded).needs(&[Need::EventTiming]),
        Case::new("events.wait.cross_stream", cross_stream).needs(B),
        Case::new("events.wait.cross_device", cross_device).needs(&[
            Need::StreamHold,
            Need::Devices(2),
            Need::ConcurrentKernels,
        ]),
        Case::new("events.wait.never_recorded", wait_unrecorded),
        Case::new("events.record.latest_wins", rerecord).needs(B),
    ]
}

fn never_recorded(ctx: &Ctx) -> CaseResult {
    let e = ctx.device.create_event(EventFlags::default())?;
    ensure!(e.query()?, "a never-recorded event is not complete");
    e.synchronize()?;
    ensure_eq!(e.device_id(), ctx.device.id(), "event device");
    Ok(())
}

fn pending_then_complete(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let e = ctx.device.create_event(EventFlags::default())?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.record_event(&e)?;
    ensure!(!e.query()?, "an event behind blocked work reports complete");
    blocker.release()?;
    e.synchronize()?;
    ensure!(e.query()?, "a synchronized event is not complete");
    Ok(())
}

fn synchronize(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let e = ctx.device.create_event(EventFlags::default())?;
    let b = ctx.device.alloc(1 << 20)?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.fill(&b, 0, 1 << 20, FillValue::U8(3))?;
    s.record_event(&e)?;
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        blocker.release()
    });
    e.synchronize()?;
    t.join()
        .map_err(|_| crate::Failure::new("release thread panicked"))??;
    ensure!(
        s.query()?,
        "stream work before the event is not complete after event synchronize"
    );
    ensure!(
        ctx.download(&b)?.iter().all(|&x| x == 3),
        "fill before the event not visible"
    );
    Ok(())
}

fn elapsed(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let start = ctx.device.create_event(EventFlags::default())?;
    let end = ctx.device.create_event(EventFlags::default())?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.record_event(&start)?;
    let mut second = Blocker::behind(ctx, &s)?;
    s.record_event(&end)?;
    let t0 = Instant::now();
    blocker.release()?;
    std::thread::sleep(Duration::from_millis(30));
    second.release()?;
    end.synchronize()?;
    let wall = t0.elapsed().as_secs_f64() * 1e3;
    let ms = start.elapsed_ms(&*end)? as f64;
    ensure!(
        ms >= 25.0,
        "elapsed {ms} ms, but the work between the events took at least 30 ms"
    );
    ensure!(
        ms <= wall + 5.0,
        "elapsed {ms} ms exceeds the wall time {wall} ms"
    );
    ensure!(
        start.elapsed_ms(&*start)?.abs() < 1e-3,
        "elapsed from an event to itself"
    );
    Ok(())
}

fn timing_disabled(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let a = ctx.device.create_event(EventFlags {
        disable_timing: true,
    })?;
    let b = ctx.device.create_event(EventFlags::default())?;
    s.record_event(&a)?;
    s.record_event(&b)?;
    s.synchronize()?;
    let r = expect_invalid(a.elapsed_ms(&*b), "start")?;
    ensure!(
        matches!(r, Invalid::Other(ref m) if m.contains("timing disabled")),
        "reason: {r:?}"
    );
    Ok(())
}

fn elapsed_unrecorded(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let a = ctx.device.create_event(EventFlags::default())?;
    let b = ctx.device.create_event(EventFlags::default())?;
    s.record_event(&a)?;
    s.synchronize()?;
    let r = expect_invalid(a.elapsed_ms(&*b), "end")?;
    ensure!(
        matches!(r, Invalid::Other(ref m) if m.contains("never recorded")),
        "reason: {r:?}"
    );
    Ok(())
}

/// Asserts, for `window`, that `done` stays incomplete (its stream waits on blocked work). A stream
/// that ignored the wait would complete it within microseconds; the window absorbs scheduling delay.
fn stays_pending(done: &Arc<dyn Event>, what: &str) -> CaseResult {
    let until = Instant::now() + Duration::from_millis(100);
    while Instant::now() < until {
        ensure!(!done.query()?, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// Makes sure a stream's worker has started (so a missing wait shows up at once, not late).
fn warm(ctx: &Ctx, s: &Arc<dyn Stream>) -> unihal_hal::Result<()> {
    s.fill(&ctx.device.alloc(4)?, 0, 4, FillValue::U8(0))?;
    s.synchronize()
}

fn cross_stream(ctx: &Ctx) -> CaseResult {
    let producer = ctx.stream()?;
    let consumer = ctx.stream()?;
    warm(ctx, &consumer)?;
    let data = ctx.upload(&[1u8; 4096])?;
    let out = ctx.device.alloc(4096)?;
    let e = ctx.device.create_event(EventFlags::default())?;
    let done = ctx.device.create_event(EventFlags::default())?;
    let mut blocker = Blocker::new(ctx, &producer)?;
    producer.fill(&data, 0, 4096, FillValue::U8(2))?;
    producer.record_event(&e)?;
    consumer.wait_event(&e)?;
    consumer.copy_d2d(&data, 0, &out, 0, 4096)?;
    consumer.record_event(&done)?;
    stays_pending(&done, "the consumer ran past a wait on blocked work")?;
    blocker.release()?;
    consumer.synchronize()?;
    ensure!(
        ctx.download(&out)?.iter().all(|&x| x == 2),
        "the consumer copied before the producer's fill"
    );
    Ok(())
}

fn cross_device(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let a = ctx.stream()?;
    let b = other.create_stream()?;
    b.fill(&other.alloc(4)?, 0, 4, FillValue::U8(0))?;
    b.synchronize()?;
    let e = ctx.device.create_event(EventFlags::default())?;
    let done = other.create_event(EventFlags::default())?;
    let mut blocker = Blocker::new(ctx, &a)?;
    a.record_event(&e)?;
    b.wait_event(&e)?;
    b.record_event(&done)?;
    let until = Instant::now() + Duration::from_millis(30);
    while Instant::now() < until {
        ensure!(
            !done.query()?,
            "{}'s stream ran past a wait on {}'s blocked work",
            other.id(),
            ctx.device.id()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    blocker.release()?;
    b.synchronize()?;
    ensure!(
        done.query()?,
        "event after the cross-device wait incomplete"
    );
    Ok(())
}

fn wait_unrecorded(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let e = ctx.device.create_event(EventFlags::default())?;
    s.wait_event(&e)?;
    let b = ctx.device.alloc(4)?;
    s.fill(&b, 0, 4, FillValue::U8(8))?;
    s.synchronize()?;
    ensure_eq!(
        ctx.download(&b)?,
        vec![8u8; 4],
        "work after waiting on a never-recorded event"
    );
    Ok(())
}

fn rerecord(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let e = ctx.device.create_event(EventFlags::default())?;
    s.record_event(&e)?;
    s.synchronize()?;
    ensure!(e.query()?, "first record incomplete");
    let mut blocker = Blocker::new(ctx, &s)?;
    s.record_event(&e)?;
    ensure!(
        !e.query()?,
        "the event still reports its first, completed record"
    );
    blocker.release()?;
    e.synchronize()?;
    ensure!(e.query()?, "second record incomplete after synchronize");
    Ok(())
}
