//! `streams.*`: in-order execution under load, asynchrony, many streams and host threads, sticky
//! errors, synchronisation.

use crate::blocker::Blocker;
use crate::case::{bytes_u32, pattern, u32_bytes, Case, CaseResult, Ctx, Need};
use crate::{ensure, ensure_eq};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use unihal_hal::{Buffer, FillValue, HalError, KernelArgs, LaunchConfig, Stream};
use unihal_kernels::testing::names;

pub fn cases() -> Vec<Case> {
    const K: &[Need] = &[Need::TestKernels];
    // Cases that hold a stream (a Blocker) and run test kernels behind it.
    const KB: &[Need] = &[Need::TestKernels, Need::ConcurrentKernels];
    // Cases that hold a stream (a Blocker: a spinning kernel or a blocking host callback).
    const B: &[Need] = &[Need::StreamHold, Need::ConcurrentKernels];
    vec![
        Case::new(
            "streams.async.enqueue_returns_before_completion",
            enqueue_is_async,
        )
        .needs(B),
        Case::new("streams.order.blocked_queue", blocked_queue).needs(KB),
        Case::new("streams.order.mixed_operations", mixed_ops),
        Case::new("streams.order.under_load", under_load).needs(K),
        Case::new("streams.many.independent", many_streams),
        Case::new("streams.threads.concurrent_enqueue", concurrent_enqueue),
        Case::new("streams.threads.fresh_thread", fresh_thread),
        Case::new("streams.query.pending_then_done", query).needs(B),
        Case::new("streams.synchronize.empty", sync_empty),
        Case::new("streams.host_callback.order", host_callback).needs(&[Need::HostCallbacks]),
        Case::new(
            "streams.host_callback.waiting_on_own_stream_is_an_error",
            callback_self_wait,
        )
        .needs(&[Need::HostCallbacks]),
        Case::new("streams.synchronize.device", device_sync).needs(B),
        Case::new("streams.error.sticky", sticky_error)
            .needs(K)
            .faulting(),
        Case::new("streams.drop.pending_work_completes", drop_pending).needs(B),
    ]
}

/// Enqueues `buf[i] = buf[i] * mul + add` over `n` u32s.
fn mul_add(
    ctx: &Ctx,
    s: &Arc<dyn Stream>,
    buf: &Buffer,
    n: u32,
    mul: u32,
    add: u32,
) -> unihal_hal::Result<()> {
    let f = ctx.kernel(names::MUL_ADD_U32)?;
    let mut args = KernelArgs::new();
    args.push_buffer(buf).push(n).push(mul).push(add);
    // SAFETY: mul_add_u32 takes (buf, n, mul, add) and touches buf[0..n]; buf holds n u32s.
    unsafe { s.launch(&f, &LaunchConfig::linear(n.div_ceil(64), 64), &args) }
}

fn enqueue_is_async(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let mut blocker = Blocker::new(ctx, &s)?;
    // If enqueue waited for completion, Blocker::new would not have returned before release.
    let dst = ctx.device.alloc(4)?;
    s.copy_d2d(blocker.out(), 0, &dst, 0, 4)?;
    ensure!(
        !s.query()?,
        "the stream reports completion while its kernel waits for the host"
    );
    blocker.release()?;
    s.synchronize()?;
    ensure_eq!(
        bytes_u32(&ctx.download(&dst)?),
        vec![crate::blocker::RELEASED_WORD],
        "value written after the release"
    );
    Ok(())
}

fn blocked_queue(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let buf = ctx.upload(&u32_bytes(&[1; 8]))?;
    let mut blocker = Blocker::new(ctx, &s)?;
    let mut want = 1u32;
    for i in 0..100u32 {
        let (m, a) = (3 + i % 5, i);
        mul_add(ctx, &s, &buf, 8, m, a)?;
        want = want.wrapping_mul(m).wrapping_add(a);
    }
    blocker.release()?;
    s.synchronize()?;
    ensure_eq!(
        bytes_u32(&ctx.download(&buf)?),
        vec![want; 8],
        "100 queued non-commuting updates"
    );
    Ok(())
}

fn mixed_ops(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let a = ctx.device.alloc(1024)?;
    let b = ctx.device.alloc(1024)?;
    let h = ctx.device.alloc_host(1024)?;
    for round in 0..20u8 {
        s.fill(&a, 0, 1024, FillValue::U8(round))?;
        s.copy_d2d(&a, 0, &b, 0, 512)?;
        s.fill(&a, 0, 512, FillValue::U8(round.wrapping_add(100)))?;
        s.copy_d2d(&a, 0, &b, 512, 256)?;
    }
    s.copy_d2h(&b, 0, &h, 0, 1024)?;
    s.synchronize()?;
    let m = h.map()?;
    ensure!(
        m[..512].iter().all(|&x| x == 19),
        "first half: {:?}",
        &m[..8]
    );
    ensure!(
        m[512..768].iter().all(|&x| x == 119),
        "third quarter: {:?}",
        &m[512..520]
    );
    Ok(())
}

fn under_load(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let n = 4096u32;
    let buf = ctx.upload(&u32_bytes(&vec![7; n as usize]))?;
    let mut want = 7u32;
    for i in 0..1000u32 {
        mul_add(ctx, &s, &buf, n, 2 + (i & 1), i)?;
        want = want.wrapping_mul(2 + (i & 1)).wrapping_add(i);
    }
    s.synchronize()?;
    ensure_eq!(
        bytes_u32(&ctx.download(&buf)?),
        vec![want; n as usize],
        "1000 back-to-back launches"
    );
    Ok(())
}

fn many_streams(ctx: &Ctx) -> CaseResult {
    let streams: Vec<_> = (0..64).map(|_| ctx.stream()).collect::<Result<_, _>>()?;
    let bufs: Vec<_> = (0..64)
        .map(|_| ctx.device.alloc(4096))
        .collect::<Result<_, _>>()?;
    for (i, (s, b)) in streams.iter().zip(&bufs).enumerate() {
        s.copy_h2d_staged(&pattern(4096, i as u32), b, 0)?;
        s.fill(b, 0, 16, FillValue::U8(i as u8))?;
    }
    for s in &streams {
        s.synchronize()?;
    }
    for (i, b) in bufs.iter().enumerate() {
        let got = ctx.download(b)?;
        ensure!(
            got[..16] == [i as u8; 16] && got[16..] == pattern(4096, i as u32)[16..],
            "stream {i} differs"
        );
    }
    Ok(())
}

fn concurrent_enqueue(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let bufs: Vec<_> = (0..8)
        .map(|_| ctx.device.alloc(256))
        .collect::<Result<_, _>>()?;
    std::thread::scope(|scope| {
        let handles: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(t, b)| {
                let s = s.clone();
                scope.spawn(move || -> unihal_hal::Result<()> {
                    for k in 0..200u32 {
                        s.fill(b, 0, 256, FillValue::U8((t as u32 * 31 + k) as u8))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .map_err(|_| HalError::Internal("thread panicked".into()))?
        })
    })?;
    s.synchronize()?;
    for (t, b) in bufs.iter().enumerate() {
        let want = (t as u32 * 31 + 199) as u8;
        ensure!(
            ctx.download(b)?.iter().all(|&x| x == want),
            "thread {t}'s last fill is not the final value"
        );
    }
    Ok(())
}

fn fresh_thread(ctx: &Ctx) -> CaseResult {
    // Objects made here, used on a new thread.
    let s = ctx.stream()?;
    let b = ctx.device.alloc(64)?;
    let e = ctx.device.create_event(Default::default())?;
    let dev = ctx.device.clone();
    let made_there = std::thread::spawn(move || -> unihal_hal::Result<_> {
        s.write(&b, 0, &[5u8; 64])?;
        s.record_event(&e)?;
        e.synchronize()?;
        // Objects made there, used here.
        let s2 = dev.create_stream()?;
        let b2 = dev.alloc(64)?;
        s2.copy_d2d(&b, 0, &b2, 0, 64)?;
        Ok((s2, b2))
    })
    .join()
    .map_err(|_| crate::Failure::new("the fresh thread panicked"))??;
    let (s2, b2) = made_there;
    s2.synchronize()?;
    ensure_eq!(
        ctx.download(&b2)?,
        vec![5u8; 64],
        "data through objects crossing threads"
    );
    Ok(())
}

fn query(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    ensure!(s.query()?, "an empty stream is not complete");
    let mut blocker = Blocker::new(ctx, &s)?;
    s.fill(&ctx.device.alloc(16)?, 0, 16, FillValue::U8(1))?;
    ensure!(!s.query()?, "a blocked stream reports completion");
    blocker.release()?;
    s.synchronize()?;
    ensure!(s.query()?, "a synchronized stream is not complete");
    Ok(())
}

fn sync_empty(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    for _ in 0..3 {
        s.synchronize()?;
    }
    ensure!(s.query()?, "empty stream incomplete");
    ensure!(s.async_error().is_none(), "fresh stream has an error");
    ctx.device.synchronize()?;
    Ok(())
}

fn host_callback(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(4)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..10u32 {
        // A host buffer per step: a queued copy keeps its host buffer busy until it has run.
        let h = ctx.device.alloc_host(4)?;
        s.copy_h2d_staged(&i.to_le_bytes(), &b, 0)?;
        s.copy_d2h(&b, 0, &h, 0, 4)?;
        let seen = seen.clone();
        s.host_callback(Box::new(move || {
            let v = h
                .map()
                .map(|m| u32::from_le_bytes([m[0], m[1], m[2], m[3]]));
            seen.lock().unwrap().push(v.ok());
        }))?;
    }
    s.synchronize()?;
    let seen = seen.lock().unwrap().clone();
    ensure_eq!(
        seen,
        (0..10).map(Some).collect::<Vec<_>>(),
        "values seen by callbacks in order"
    );
    Ok(())
}

/// A host callback that waits for its own stream (synchronize, an event recorded after it, the
/// whole device) would wait for itself forever: each wait returns `InvalidArgument` instead, and
/// the stream goes on.
fn callback_self_wait(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let ev = ctx.device.create_event(Default::default())?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let (s2, ev2, dev, got2) = (s.clone(), ev.clone(), ctx.device.clone(), got.clone());
    // The event is recorded after the callback; the callback waits (bounded) until the host has
    // enqueued that record, or its event wait would rightly find a never-recorded event complete.
    let recorded = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let recorded2 = recorded.clone();
    s.host_callback(Box::new(move || {
        let t0 = std::time::Instant::now();
        while !recorded2.load(std::sync::atomic::Ordering::Acquire)
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut g = got2.lock().unwrap();
        g.push(("stream synchronize", s2.synchronize()));
        g.push(("event synchronize", ev2.synchronize()));
        g.push(("device synchronize", dev.synchronize()));
    }))?;
    s.record_event(&ev)?;
    recorded.store(true, std::sync::atomic::Ordering::Release);
    let b = ctx.device.alloc(4)?;
    s.fill(&b, 0, 4, FillValue::U8(9))?;
    s.synchronize()?;
    let got = std::mem::take(&mut *got.lock().unwrap());
    ensure_eq!(got.len(), 3, "the callback ran its three waits");
    for (what, r) in got {
        ensure!(
            matches!(r, Err(HalError::InvalidArgument { .. })),
            "{what} inside a callback of the same stream: {r:?}"
        );
    }
    ensure_eq!(ctx.download(&b)?, vec![9; 4], "work after the callback");
    Ok(())
}

fn device_sync(ctx: &Ctx) -> CaseResult {
    let streams: Vec<_> = (0..3).map(|_| ctx.stream()).collect::<Result<_, _>>()?;
    let buf = ctx.upload(&u32_bytes(&[0; 3]))?;
    let mut blockers = Vec::new();
    for (i, s) in streams.iter().enumerate() {
        blockers.push(Blocker::new(ctx, s)?);
        s.fill(&buf, 4 * i as u64, 4, FillValue::U8(i as u8 + 1))?;
    }
    let done = Arc::new(AtomicU32::new(0));
    let d2 = done.clone();
    let dev = ctx.device.clone();
    let t = std::thread::spawn(move || {
        let r = dev.synchronize();
        d2.store(1, Ordering::SeqCst);
        r
    });
    std::thread::sleep(Duration::from_millis(30));
    ensure_eq!(
        done.load(Ordering::SeqCst),
        0,
        "device synchronize returned while streams were blocked"
    );
    for b in &mut blockers {
        b.release()?;
    }
    t.join()
        .map_err(|_| crate::Failure::new("synchronize thread panicked"))??;
    ensure_eq!(
        ctx.download(&buf)?,
        [vec![1u8; 4], vec![2; 4], vec![3; 4]].concat(),
        "stream results"
    );
    Ok(())
}

fn sticky_error(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    // Allocated before the fault: on devices whose faults poison the context, nothing new can
    // be allocated afterwards.
    let spare = ctx.device.alloc(4)?;
    let f = ctx.kernel(names::FAIL)?;
    let mut args = KernelArgs::new();
    args.push(42i32);
    // SAFETY: the fail kernel takes one i32 and touches no memory.
    unsafe { s.launch(&f, &LaunchConfig::linear(1, 1), &args)? };
    let e = match s.synchronize() {
        Err(e) => e,
        Ok(()) => {
            return Err(crate::Failure::new(
                "a failing kernel did not fail synchronize",
            ))
        }
    };
    ensure!(!e.is_not_available(), "a kernel fault reported as {e:?}");
    ensure_eq!(s.async_error(), Some(e.clone()), "sticky error");
    ensure_eq!(s.synchronize().err(), Some(e.clone()), "second synchronize");
    let later = s.fill(&spare, 0, 4, FillValue::U8(0));
    ensure_eq!(later.err(), Some(e.clone()), "enqueue after the error");
    ensure!(
        matches!(s.query(), Err(ref x) if *x == e),
        "query after the error"
    );
    if !ctx.device.capabilities().optional.fault_poisons_device {
        let b = ctx.upload(&[9u8; 8])?;
        ensure_eq!(
            ctx.download(&b)?,
            vec![9u8; 8],
            "a new stream after another stream's fault"
        );
    }
    Ok(())
}

fn drop_pending(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(8)?;
    let e = ctx.device.create_event(Default::default())?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.fill(&b, 0, 8, FillValue::U8(0x5A))?;
    s.record_event(&e)?;
    drop(s);
    blocker.release()?;
    let t0 = Instant::now();
    e.synchronize()?;
    ensure!(
        t0.elapsed() < Duration::from_secs(5),
        "pending work on a dropped stream took too long"
    );
    ensure_eq!(
        ctx.download(&b)?,
        vec![0x5Au8; 8],
        "work queued before the stream was dropped"
    );
    Ok(())
}
