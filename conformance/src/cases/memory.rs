//! `memory.*`: allocation, copies in every direction, sub-ranges, fills, host buffers, peers.

use crate::blocker::Blocker;
use crate::case::{pattern, Case, CaseResult, Ctx, Need};
use crate::{ensure, ensure_eq};
use unihal_hal::{EventFlags, FillValue, HalError, Invalid};

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("memory.alloc.sizes", alloc_sizes),
        Case::new("memory.alloc.alignment", alloc_alignment),
        Case::new("memory.alloc.out_of_memory", out_of_memory),
        Case::new("memory.alloc.accounting", accounting),
        Case::new("memory.copy.sync_round_trip", sync_round_trip),
        Case::new("memory.copy.h2d_d2h.async", async_round_trip),
        Case::new("memory.copy.d2d", d2d),
        Case::new("memory.copy.offsets", offsets),
        Case::new("memory.copy.large", large),
        Case::new("memory.slice.subranges", subranges),
        Case::new("memory.fill.u8", fill_u8),
        Case::new("memory.fill.wide", fill_wide).needs(&[Need::WideFill]),
        Case::new("memory.host.pinned", pinned),
        Case::new("memory.host.zeroed", host_zeroed),
        Case::new("memory.host.busy_while_queued", host_busy)
            .needs(&[Need::StreamHold, Need::ConcurrentKernels]),
        Case::new("memory.host.map_after.stream_sync", |c| {
            map_after(c, Route::StreamSync)
        }),
        Case::new("memory.host.map_after.device_sync", |c| {
            map_after(c, Route::DeviceSync)
        }),
        Case::new("memory.host.map_after.event_sync", |c| {
            map_after(c, Route::EventSync)
        }),
        Case::new("memory.host.map_after.event_query", |c| {
            map_after(c, Route::EventQuery)
        }),
        Case::new("memory.host.map_after.stream_query", |c| {
            map_after(c, Route::StreamQuery)
        }),
        Case::new("memory.host.map_after.cross_stream_wait", |c| {
            map_after(c, Route::CrossStreamWait)
        }),
        Case::new("memory.host.map_after.host_callback", |c| {
            map_after(c, Route::HostCallback)
        })
        .needs(&[Need::HostCallbacks]),
        Case::new("memory.copy.peer", peer).needs(&[Need::PeerDevice]),
        Case::new("memory.alloc_async.free_async", alloc_async).needs(&[Need::StreamOrderedAlloc]),
        Case::new("memory.buffer.drop_with_queued_work", drop_queued)
            .needs(&[Need::StreamHold, Need::ConcurrentKernels]),
        Case::new(
            "memory.free_async.deferred_until_work_done",
            free_async_deferred,
        )
        .needs(&[
            Need::StreamHold,
            Need::StreamOrderedAlloc,
            Need::ConcurrentKernels,
        ]),
    ]
}

fn alloc_sizes(ctx: &Ctx) -> CaseResult {
    for len in [0usize, 1, 3, 255, 4097, 1 << 20] {
        let b = ctx.device.alloc(len)?;
        ensure_eq!(b.len(), len as u64, "length of a {len}-byte allocation");
        ensure_eq!(
            b.device(),
            ctx.device.id(),
            "owner of a {len}-byte allocation"
        );
        let data = pattern(len, len as u32);
        ctx.stream()?.write(&b, 0, &data)?;
        ensure!(
            ctx.download(&b)? == data,
            "round trip of {len} bytes differs"
        );
    }
    Ok(())
}

fn alloc_alignment(ctx: &Ctx) -> CaseResult {
    let align = ctx.device.capabilities().mandatory.alloc_alignment;
    ensure!(
        align.is_power_of_two() && align >= 16,
        "alloc_alignment {align} is not a power of two >= 16"
    );
    let bufs: Vec<_> = [1usize, 7, 64, 100, 4096, 12345]
        .iter()
        .map(|&n| ctx.device.alloc(n))
        .collect::<Result<_, _>>()?;
    for b in &bufs {
        ensure!(b.device_addr() % align == 0, "{b:?} is not {align}-aligned");
    }
    Ok(())
}

fn out_of_memory(ctx: &Ctx) -> CaseResult {
    let info = ctx.device.memory_info()?;
    let request = info.total.saturating_add(1).min(usize::MAX as u64);
    match ctx.device.alloc(request as usize) {
        Err(HalError::OutOfMemory { requested, free }) => {
            ensure_eq!(requested, request, "requested bytes in the error");
            ensure!(
                free <= info.total,
                "free {free} exceeds total {}",
                info.total
            );
        }
        other => {
            return Err(crate::Failure::new(format!(
                "expected OutOfMemory, got {other:?}"
            )))
        }
    }
    // The device stays usable.
    let b = ctx.upload(&pattern(1024, 9))?;
    ensure!(
        ctx.download(&b)? == pattern(1024, 9),
        "device unusable after out-of-memory"
    );
    Ok(())
}

fn accounting(ctx: &Ctx) -> CaseResult {
    const LEN: u64 = 64 << 20;
    let before = ctx.device.memory_info()?;
    let b = ctx.device.alloc(LEN as usize)?;
    let during = ctx.device.memory_info()?;
    ensure!(
        during.free + LEN / 2 <= before.free,
        "free memory went from {} to {} after a {LEN}-byte allocation",
        before.free,
        during.free
    );
    drop(b);
    ctx.device.synchronize()?;
    let after = ctx.device.memory_info()?;
    ensure!(
        after.free + LEN / 2 >= before.free,
        "free memory did not recover: {} before, {} after the drop",
        before.free,
        after.free
    );
    Ok(())
}

fn sync_round_trip(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    for len in [0usize, 1, 7, 4099] {
        let b = ctx.device.alloc(len)?;
        let data = pattern(len, 3);
        s.write(&b, 0, &data)?;
        let mut out = vec![0u8; len];
        s.read(&b, 0, &mut out)?;
        ensure!(out == data, "synchronous round trip of {len} bytes differs");
    }
    Ok(())
}

fn async_round_trip(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let len = 100_003;
    let src = ctx.device.alloc_host(len)?;
    let dst = ctx.device.alloc_host(len)?;
    src.map()?.copy_from_slice(&pattern(len, 5));
    let d = ctx.device.alloc(len)?;
    s.copy_h2d(&src, 0, &d, 0, len as u64)?;
    s.copy_d2h(&d, 0, &dst, 0, len as u64)?;
    s.synchronize()?;
    ensure!(
        *dst.map()? == pattern(len, 5)[..],
        "asynchronous h2d then d2h differs"
    );
    Ok(())
}

fn d2d(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let a = ctx.upload(&pattern(5000, 11))?;
    let b = ctx.device.alloc(5000)?;
    s.copy_d2d(&a, 0, &b, 0, 5000)?;
    s.synchronize()?;
    ensure!(ctx.download(&b)? == pattern(5000, 11), "d2d copy differs");
    // Disjoint ranges of one allocation.
    let c = ctx.upload(&pattern(64, 12))?;
    s.copy_d2d(&c, 0, &c, 32, 32)?;
    s.synchronize()?;
    let got = ctx.download(&c)?;
    ensure!(
        got[32..] == got[..32] && got[..32] == pattern(64, 12)[..32],
        "copy inside one allocation differs"
    );
    Ok(())
}

fn offsets(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let base = pattern(256, 21);
    let b = ctx.upload(&base)?;
    let host = ctx.device.alloc_host(64)?;
    host.map()?.copy_from_slice(&pattern(64, 22));
    // host[8..40] -> b[100..132]
    s.copy_h2d(&host, 8, &b, 100, 32)?;
    let back = ctx.device.alloc_host(16)?;
    // b[110..120] -> back[3..13]
    s.copy_d2h(&b, 110, &back, 3, 10)?;
    let c = ctx.upload(&[0u8; 16])?;
    // b[0..5] -> c[11..16]
    s.copy_d2d(&b, 0, &c, 11, 5)?;
    s.synchronize()?;
    let mut want = base.clone();
    want[100..132].copy_from_slice(&pattern(64, 22)[8..40]);
    ensure!(
        ctx.download(&b)? == want,
        "h2d with offsets wrote the wrong bytes"
    );
    ensure!(
        back.map()?[3..13] == want[110..120],
        "d2h with offsets read the wrong bytes"
    );
    let cw = ctx.download(&c)?;
    ensure!(
        cw[11..] == base[..5] && cw[..11] == [0u8; 11],
        "d2d with offsets differs: {cw:?}"
    );
    Ok(())
}

fn large(ctx: &Ctx) -> CaseResult {
    let len = 64 << 20;
    let data = pattern(len, 77);
    let a = ctx.upload(&data)?;
    let b = ctx.device.alloc(len)?;
    let s = ctx.stream()?;
    s.copy_d2d(&a, 0, &b, 0, len as u64)?;
    s.synchronize()?;
    ensure!(ctx.download(&b)? == data, "64 MiB d2d copy differs");
    Ok(())
}

fn subranges(ctx: &Ctx) -> CaseResult {
    let b = ctx.upload(&[0u8; 64])?;
    let mid = b.slice(16, 32)?;
    ensure_eq!(
        (mid.offset(), mid.len()),
        (16, 32),
        "slice offset and length"
    );
    ensure_eq!(mid.device_addr(), b.device_addr() + 16, "slice address");
    let inner = mid.slice(8, 8)?;
    ensure_eq!(
        inner.device_addr(),
        b.device_addr() + 24,
        "nested slice address"
    );
    ctx.stream()?.write(&inner, 0, &[7u8; 8])?;
    let got = ctx.download(&b)?;
    let mut want = [0u8; 64];
    want[24..32].fill(7);
    ensure!(
        got == want,
        "writing through a nested slice changed the wrong bytes: {got:?}"
    );
    ensure!(
        ctx.download(&mid)?[8..16] == [7u8; 8],
        "reading through a slice differs"
    );
    let e = crate::case::expect_invalid(mid.slice(30, 3), "slice")?;
    ensure_eq!(
        e,
        Invalid::OutOfRange {
            offset: 30,
            len: 3,
            size: 32
        },
        "slice past the end"
    );
    Ok(())
}

fn fill_u8(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.upload(&[1u8; 100])?;
    s.fill(&b, 10, 33, FillValue::U8(0xAB))?;
    s.fill(&b.slice(90, 10)?, 5, 5, FillValue::U8(0))?;
    s.synchronize()?;
    let mut want = [1u8; 100];
    want[10..43].fill(0xAB);
    want[95..].fill(0);
    ensure!(
        ctx.download(&b)? == want,
        "byte fills wrote the wrong bytes"
    );
    Ok(())
}

fn fill_wide(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.upload(&[0u8; 64])?;
    s.fill(&b, 4, 12, FillValue::U16(0xBEEF))?;
    s.fill(&b, 32, 16, FillValue::U32(0xDEADBEEF))?;
    s.synchronize()?;
    let got = ctx.download(&b)?;
    let mut want = vec![0u8; 64];
    for i in (4..16).step_by(2) {
        want[i..i + 2].copy_from_slice(&0xBEEFu16.to_le_bytes());
    }
    for i in (32..48).step_by(4) {
        want[i..i + 4].copy_from_slice(&0xDEADBEEFu32.to_le_bytes());
    }
    ensure!(got == want, "wide fills differ: {got:?}");
    Ok(())
}

fn pinned(ctx: &Ctx) -> CaseResult {
    let h = ctx.device.alloc_host(4096)?;
    ensure_eq!(h.len(), 4096, "host buffer length");
    {
        let mut m = h.map()?;
        m.copy_from_slice(&pattern(4096, 8));
        let e = crate::case::expect_invalid(h.map().map(|_| ()), "host buffer")?;
        ensure!(
            matches!(e, Invalid::Busy(_)),
            "second map while mapped: {e:?}"
        );
    }
    let d = ctx.device.alloc(4096)?;
    let s = ctx.stream()?;
    s.copy_h2d(&h, 0, &d, 0, 4096)?;
    s.synchronize()?;
    ensure!(
        ctx.download(&d)? == pattern(4096, 8),
        "copy from a host buffer differs"
    );
    Ok(())
}

/// Host buffers are zeroed at allocation on every backend: their bytes become a `&[u8]`, and
/// must never show a previous user's data. Freed dirty buffers of the same sizes come first, so
/// an allocator that reuses blocks without clearing them is caught.
fn host_zeroed(ctx: &Ctx) -> CaseResult {
    const SIZES: [usize; 4] = [64, 4096, 200 * 1024, 4 << 20];
    for round in 0..2 {
        let dirty: Vec<_> = SIZES
            .iter()
            .map(|&n| ctx.device.alloc_host(n))
            .collect::<Result<_, _>>()?;
        for h in &dirty {
            h.map()?.fill(0xa5);
        }
        drop(dirty);
        for &n in &SIZES {
            let h = ctx.device.alloc_host(n)?;
            let m = h.map()?;
            let nonzero = m.iter().filter(|&&b| b != 0).count();
            ensure!(
                nonzero == 0,
                "round {round}: {nonzero} of {n} bytes of a fresh host buffer are not zero"
            );
        }
    }
    Ok(())
}

fn host_busy(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let d = ctx.upload(&pattern(256, 4))?;
    let h = ctx.device.alloc_host(256)?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.copy_d2h(&d, 0, &h, 0, 256)?;
    ensure_eq!(h.pending_uses(), 1, "queued uses of the host buffer");
    let e = crate::case::expect_invalid(h.map().map(|_| ()), "host buffer")?;
    ensure!(
        matches!(e, Invalid::Busy(_)),
        "map while a queued copy uses the buffer: {e:?}"
    );
    blocker.release()?;
    s.synchronize()?;
    ensure!(
        *h.map()? == pattern(256, 4)[..],
        "queued copy into the host buffer differs"
    );
    Ok(())
}

/// How the caller learns that the queued copy into a host buffer has completed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    StreamSync,
    DeviceSync,
    EventSync,
    EventQuery,
    StreamQuery,
    CrossStreamWait,
    HostCallback,
}

/// `HostBuffer::map` succeeds once every queued use has completed, however the caller learned
/// it: a backend may not wait for its own next call on the stream to notice. The copy is large
/// (still running on hardware when the event is recorded) and an event is recorded after it, so
/// the stream's last enqueue happens before the copy completes.
fn map_after(ctx: &Ctx, route: Route) -> CaseResult {
    const LEN: usize = 4 << 20;
    let want = pattern(LEN, 41);
    let d = ctx.upload(&want)?;
    let h = ctx.device.alloc_host(LEN)?;
    let s = ctx.stream()?;
    s.copy_d2h(&d, 0, &h, 0, LEN as u64)?;
    let ev = ctx.device.create_event(EventFlags {
        disable_timing: true,
    })?;
    match route {
        Route::HostCallback => {
            // The callback runs once the copy completed: it may map the buffer.
            let (tx, rx) = std::sync::mpsc::channel();
            let hc = h.clone();
            let want = want.clone();
            s.host_callback(Box::new(move || {
                let r = hc.map().map(|m| *m == want[..]).map_err(|e| e.to_string());
                let _ = tx.send(r);
            }))?;
            s.synchronize()?;
            let r = rx
                .recv_timeout(std::time::Duration::from_secs(30))
                .map_err(|e| crate::Failure::new(format!("host callback did not run: {e}")))?;
            match r {
                Ok(true) => {}
                Ok(false) => return Err(crate::Failure::new("the callback read wrong bytes")),
                Err(e) => {
                    return Err(crate::Failure::new(format!(
                        "map in a host callback behind the copy failed: {e}"
                    )))
                }
            }
        }
        _ => s.record_event(&ev)?,
    }
    match route {
        Route::StreamSync => s.synchronize()?,
        Route::DeviceSync => ctx.device.synchronize()?,
        Route::EventSync => ev.synchronize()?,
        Route::EventQuery => poll("event query", || ev.query())?,
        Route::StreamQuery => poll("stream query", || s.query())?,
        Route::CrossStreamWait => {
            let other = ctx.stream()?;
            other.wait_event(&ev)?;
            other.synchronize()?;
        }
        Route::HostCallback => {}
    }
    ensure_eq!(
        h.pending_uses(),
        0,
        "queued uses after {route:?} said the copy completed"
    );
    let m = h.map().map_err(|e| {
        crate::Failure::new(format!("map after {route:?} said the copy completed: {e}"))
    })?;
    ensure!(
        *m == want[..],
        "host buffer after {route:?} differs from the copy's source"
    );
    Ok(())
}

/// Polls `done` until it returns true (at most 30 s).
fn poll(what: &str, mut done: impl FnMut() -> Result<bool, HalError>) -> CaseResult {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done()? {
        ensure!(
            std::time::Instant::now() < deadline,
            "{what} did not report completion within 30 s"
        );
        std::thread::yield_now();
    }
    Ok(())
}

fn peer(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let a = ctx.upload(&pattern(3000, 31))?;
    let b = other.alloc(3000)?;
    let s = ctx.stream()?;
    s.copy_peer(&a, 0, &b, 0, 3000)?;
    s.synchronize()?;
    ensure!(
        ctx.download(&b)? == pattern(3000, 31),
        "peer copy to {} differs",
        other.id()
    );
    let c = ctx.device.alloc(1000)?;
    s.copy_peer(&b, 1000, &c, 0, 1000)?;
    s.synchronize()?;
    ensure!(
        ctx.download(&c)? == pattern(3000, 31)[1000..2000],
        "peer copy from {} differs",
        other.id()
    );
    Ok(())
}

fn alloc_async(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let before = ctx.device.memory_info()?.free;
    let b = s.alloc_async(1 << 20)?;
    s.copy_h2d_staged(&pattern(1 << 20, 2), &b, 0)?;
    let h = ctx.device.alloc_host(1 << 20)?;
    s.copy_d2h(&b, 0, &h, 0, 1 << 20)?;
    s.free_async(&b)?;
    drop(b);
    s.synchronize()?;
    ensure!(
        *h.map()? == pattern(1 << 20, 2)[..],
        "data through a stream-ordered allocation differs"
    );
    let after = ctx.device.memory_info()?.free;
    ensure!(
        after + (1 << 19) >= before,
        "memory not returned: free {before} before, {after} after"
    );
    Ok(())
}

fn drop_queued(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let src = ctx.upload(&pattern(1 << 16, 6))?;
    let h = ctx.device.alloc_host(1 << 16)?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.copy_d2h(&src, 0, &h, 0, 1 << 16)?;
    drop(src); // the queued copy still holds it
               // Reuse freed memory aggressively: a premature free would let these allocations overwrite it.
    let junk: Vec<_> = (0..8)
        .map(|_| ctx.upload(&[0xEE; 1 << 16]))
        .collect::<Result<_, _>>()?;
    blocker.release()?;
    s.synchronize()?;
    drop(junk);
    ensure!(
        *h.map()? == pattern(1 << 16, 6)[..],
        "a dropped buffer's queued copy read wrong data"
    );
    Ok(())
}

fn free_async_deferred(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.upload(&pattern(4096, 13))?;
    let h = ctx.device.alloc_host(4096)?;
    let mut blocker = Blocker::new(ctx, &s)?;
    s.copy_d2h(&b, 0, &h, 0, 4096)?;
    s.free_async(&b)?;
    drop(b);
    blocker.release()?;
    s.synchronize()?;
    ensure!(
        *h.map()? == pattern(4096, 13)[..],
        "work queued before free_async read wrong data"
    );
    Ok(())
}
