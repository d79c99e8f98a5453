//! The caching allocator (`unihal-alloc`) and DLPack (`unihal-dlpack`) over the backend: the
//! statistics of hand-computed traces, blocks accepted as ordinary buffers by every call,
//! stream-ordered reuse from the HAL's use tracking, out-of-memory retry, `empty_cache`, and a
//! DLPack round trip of device memory. The same numbers on every backend: the allocator is
//! backend-neutral, so any difference is a backend that tracks queued uses differently.

use crate::blocker::Blocker;
use crate::case::{pattern, Case, CaseResult, Ctx, Failure, Need};
use crate::{ensure, ensure_eq};
use std::sync::Arc;
use unihal_alloc::{AllocatorConfig, BlockState, CachingAllocator, MemoryStats};
use unihal_dlpack::{export, import_versioned, ConsumerStream};
use unihal_hal::{DType, FillValue, HalError, OpCall, OpId, Stream, TensorView};

const MIB: u64 = 1 << 20;

pub fn cases() -> Vec<Case> {
    // Cases that hold a stream (a Blocker: a spinning kernel or a blocking host callback).
    let blocking = [Need::StreamHold, Need::ConcurrentKernels];
    vec![
        Case::new("alloc.stats.split_and_coalesce", split_and_coalesce),
        Case::new("alloc.stats.large_pool", large_pool),
        Case::new("alloc.blocks.are_ordinary_buffers", ordinary_buffers),
        Case::new("alloc.blocks.views_keep_the_block", views_keep_the_block),
        Case::new(
            "alloc.max_split_size.serves_from_new_segments",
            max_split_size,
        ),
        Case::new("alloc.reuse.same_stream_at_once", same_stream).needs(&blocking),
        Case::new("alloc.reuse.other_stream_after_completion", other_stream).needs(&blocking),
        Case::new("alloc.reuse.two_streams_wait_for_both", two_streams).needs(&blocking),
        Case::new("alloc.oom.release_retry_report", oom),
        Case::new("alloc.empty_cache.returns_segments", empty_cache),
        Case::new("alloc.dlpack.device_round_trip", dlpack_round_trip).needs(&[Need::DlpackDevice]),
    ]
}

fn allocator(ctx: &Ctx) -> Result<CachingAllocator, Failure> {
    Ok(CachingAllocator::new(
        ctx.device.clone(),
        AllocatorConfig::default(),
    )?)
}

/// allocation, allocated, reserved, active, inactive split blocks and bytes, requested.
fn all(s: &MemoryStats) -> [u64; 7] {
    [
        s.allocation.all.current,
        s.allocated_bytes.all.current,
        s.reserved_bytes.all.current,
        s.active_bytes.all.current,
        s.inactive_split.all.current,
        s.inactive_split_bytes.all.current,
        s.requested_bytes.all.current,
    ]
}

fn split_and_coalesce(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let x = a.alloc(&s, 4000)?;
    let y = a.alloc(&s, 8192)?;
    let z = a.alloc(&s, 100)?;
    ensure_eq!(
        [y.device_addr(), z.device_addr()],
        [x.device_addr() + 4096, y.device_addr() + 8192],
        "blocks follow each other in their segment"
    );
    let rest = 2 * MIB - 4096 - 8192 - 512;
    ensure_eq!(
        all(&a.stats()),
        [3, 12800, 2 * MIB, 12800, 1, rest, 12292],
        "after three small allocations"
    );
    drop(y);
    ensure_eq!(
        all(&a.stats()),
        [2, 4608, 2 * MIB, 4608, 2, rest + 8192, 4100],
        "after freeing the middle block"
    );
    drop(x);
    ensure_eq!(
        all(&a.stats()),
        [1, 512, 2 * MIB, 512, 2, rest + 12288, 100],
        "after freeing the first block (coalesced with the middle one)"
    );
    drop(z);
    let st = a.stats();
    ensure_eq!(
        all(&st),
        [0, 0, 2 * MIB, 0, 0, 0, 0],
        "after freeing all (one block again)"
    );
    ensure_eq!(
        (st.allocation.all.peak, st.allocated_bytes.all.peak),
        (3, 12800),
        "peaks"
    );
    ensure_eq!(
        (
            st.allocated_bytes.all.allocated,
            st.allocated_bytes.all.freed
        ),
        (12800, 12800),
        "running totals"
    );
    ensure_eq!(st.segment.small_pool.current, 1, "small segments");
    let again = a.alloc(&s, 512)?;
    ensure!(
        a.stats().num_device_alloc == 1,
        "a cache hit called the device: {:?}",
        a.stats()
    );
    drop(again);
    Ok(())
}

fn large_pool(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let x = a.alloc(&s, (3 * MIB) as usize)?;
    let st = a.stats();
    ensure_eq!(
        (
            st.reserved_bytes.large_pool.current,
            st.inactive_split_bytes.large_pool.current
        ),
        (20 * MIB, 17 * MIB),
        "3 MiB from a 20 MiB large segment"
    );
    let y = a.alloc(&s, (16 * MIB + MIB / 2) as usize)?;
    let st = a.stats();
    ensure_eq!(
        (
            st.allocated_bytes.large_pool.current,
            st.inactive_split.large_pool.current,
            st.segment.large_pool.current
        ),
        (20 * MIB, 0, 1),
        "16.5 MiB takes the 17 MiB rest whole"
    );
    let z = a.alloc(&s, (11 * MIB + 1) as usize)?;
    ensure_eq!(
        a.stats().reserved_bytes.large_pool.current,
        32 * MIB,
        "11 MiB gets a 12 MiB segment of its own"
    );
    drop((x, y, z));
    ensure_eq!(
        a.stats().active_bytes.all.current,
        0,
        "nothing active after the frees"
    );
    Ok(())
}

fn ordinary_buffers(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let x = a.alloc(&s, 1000)?;
    ensure_eq!(x.len(), 1000, "a block's length is the request");
    s.write(&x, 0, &pattern(1000, 3))?;
    let y = a.alloc(&s, 1000)?;
    s.copy_d2d(&x, 0, &y, 0, 1000)?;
    s.synchronize()?;
    ensure_eq!(ctx.download(&y)?, pattern(1000, 3), "copy between blocks");
    s.fill(&y, 10, 20, FillValue::U8(0xAB))?;
    s.synchronize()?;
    let got = ctx.download(&y)?;
    ensure!(
        got[10..30].iter().all(|&b| b == 0xAB) && got[..10] == pattern(1000, 3)[..10],
        "fill inside a block"
    );
    crate::case::expect_invalid(s.fill(&x, 0, 1001, FillValue::U8(0)), "dst")?;
    if ctx.device.capabilities().supports(OpId::Add, DType::F32) {
        let (p, q, r) = (a.alloc(&s, 64)?, a.alloc(&s, 64)?, a.alloc(&s, 64)?);
        let v = |b| TensorView::contiguous(b, DType::F32, &[16]);
        s.run_op(&OpCall::fill(v(&p), unihal_hal::Scalar::F64(1.5)))?;
        s.run_op(&OpCall::fill(v(&q), unihal_hal::Scalar::F64(2.0)))?;
        s.run_op(&OpCall::binary(OpId::Add, v(&p), v(&q), v(&r)))?;
        s.synchronize()?;
        ensure_eq!(
            ctx.download(&r)?,
            3.5f32.to_le_bytes().repeat(16),
            "an op over three blocks"
        );
    }
    if ctx.device.capabilities().optional.stream_ordered_alloc {
        s.free_async(&x)?;
        crate::case::expect_invalid(s.fill(&x, 0, 1, FillValue::U8(0)), "dst")?;
        s.fill(&y, 0, 1, FillValue::U8(1))?;
        s.synchronize()?;
    }
    drop((x, y));
    ensure_eq!(
        a.stats().allocation.all.current,
        0,
        "every block given back"
    );
    Ok(())
}

/// Views of a block are handles of it: dropping views (`slice`, a view of a view) while the block
/// is held hands nothing back, so the next allocation gets other bytes and the block's data
/// stays the caller's; the block goes back once the last view and the block are gone.
fn views_keep_the_block(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let x = a.alloc(&s, 4096)?;
    s.write(&x, 0, &pattern(4096, 5))?;
    for (off, len) in [(0, 4096), (100, 200), (4095, 1)] {
        let view = x.slice(off, len)?;
        let inner = view.slice(0, len.min(8))?;
        drop(view);
        drop(inner);
    }
    ensure_eq!(
        a.stats().allocation.all.current,
        1,
        "dropping views of a held block freed it"
    );
    let y = a.alloc(&s, 4096)?;
    let (xa, ya) = (x.device_addr(), y.device_addr());
    ensure!(
        ya + 4096 <= xa || xa + 4096 <= ya,
        "a new block [{ya:#x}, +4096) overlaps a held one [{xa:#x}, +4096) after views of          the held one were dropped"
    );
    s.fill(&y, 0, 4096, FillValue::U8(0x77))?;
    s.synchronize()?;
    ensure_eq!(
        ctx.download(&x)?,
        pattern(4096, 5),
        "the held block's bytes"
    );
    let last = x.slice(8, 16)?;
    drop((x, y));
    ensure_eq!(
        a.stats().allocation.all.current,
        1,
        "a view that outlives its block keeps it"
    );
    drop(last);
    ensure_eq!(
        a.stats().allocation.all.current,
        0,
        "every block given back"
    );
    Ok(())
}

/// `max_split_size_mb:20` (PyTorch's smallest): a request whose segment is one no cached-block
/// rule lets it take (5 MiB from a 20 MiB segment) is served from that segment, with one device
/// allocation per request, never by reserving segment after segment until a false
/// out-of-memory; values below 20 are refused.
fn max_split_size(ctx: &Ctx) -> CaseResult {
    let conf = AllocatorConfig::parse("max_split_size_mb:20")?;
    let a = CachingAllocator::new(ctx.device.clone(), conf)?;
    let s = ctx.stream()?;
    let mut held = Vec::new();
    for (i, len) in [5 * MIB, MIB + 1, 15 * MIB, 4096].into_iter().enumerate() {
        let before = a.stats().num_device_alloc;
        let b = a.alloc(&s, len as usize)?;
        ensure!(
            a.stats().num_device_alloc - before <= 1,
            "request {i} of {len} bytes reserved {} segments",
            a.stats().num_device_alloc - before
        );
        held.push(b);
    }
    drop(held);
    a.empty_cache();
    ensure_eq!(
        a.stats().reserved_bytes.all.current,
        0,
        "everything back after empty_cache"
    );
    for bad in ["max_split_size_mb:2", "max_split_size_mb:19"] {
        ensure!(
            matches!(
                AllocatorConfig::parse(bad),
                Err(HalError::InvalidArgument { .. })
            ),
            "{bad} accepted"
        );
    }
    let below = AllocatorConfig {
        max_split_size: Some(2 * MIB),
        ..AllocatorConfig::default()
    };
    ensure!(
        matches!(
            CachingAllocator::new(ctx.device.clone(), below),
            Err(HalError::InvalidArgument { .. })
        ),
        "an allocator with max_split_size of 2 MiB was made"
    );
    Ok(())
}

/// A block `x` on `s`, used by a copy queued behind a blocker, then dropped by its caller.
struct Pending {
    blocker: Blocker,
    addr: u64,
    dst: unihal_hal::HostBuffer,
}

fn queue_and_drop(
    ctx: &Ctx,
    a: &CachingAllocator,
    s: &Arc<dyn Stream>,
) -> Result<Pending, Failure> {
    let x = a.alloc(s, 4096)?;
    s.write(&x, 0, &pattern(4096, 21))?;
    let addr = x.device_addr();
    let dst = ctx.device.alloc_host(4096)?;
    let blocker = Blocker::new(ctx, s)?;
    s.copy_d2h(&x, 0, &dst, 0, 4096)?;
    drop(x);
    Ok(Pending { blocker, addr, dst })
}

fn same_stream(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let mut p = queue_and_drop(ctx, &a, &s)?;
    let st = a.stats();
    ensure_eq!(
        (st.allocated_bytes.all.current, st.active_bytes.all.current),
        (0, 0),
        "a block dropped with work queued on one stream is free (for that stream)"
    );
    let snap = a.snapshot();
    ensure!(
        snap.iter()
            .flat_map(|s| &s.blocks)
            .any(|b| b.address == p.addr && b.pending_uses_on == vec![s.stream_id().get()]),
        "the snapshot names the stream whose work still uses the block: {snap:?}"
    );
    let again = a.alloc(&s, 4096)?;
    ensure_eq!(
        again.device_addr(),
        p.addr,
        "the same stream reuses the block at once"
    );
    // Stream order: this fill runs after the queued copy, which must still read the old bytes.
    s.fill(&again, 0, 4096, FillValue::U8(0))?;
    p.blocker.release()?;
    s.synchronize()?;
    ensure!(
        *p.dst.map()? == pattern(4096, 21)[..],
        "the queued copy read bytes written by the block's next user"
    );
    Ok(())
}

fn other_stream(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let (s, t) = (ctx.stream()?, ctx.stream()?);
    let mut p = queue_and_drop(ctx, &a, &s)?;
    let on_t = a.alloc(&t, 4096)?;
    ensure!(
        on_t.device_addr() != p.addr,
        "another stream got a block that queued work on the first still uses"
    );
    p.blocker.release()?;
    s.synchronize()?;
    ensure!(
        *p.dst.map()? == pattern(4096, 21)[..],
        "the queued copy read wrong bytes"
    );
    let later = a.alloc(&t, 4096)?;
    ensure_eq!(
        later.device_addr(),
        p.addr,
        "once the work completed, the block serves other streams"
    );
    drop(on_t);
    Ok(())
}

fn two_streams(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let (s, t) = (ctx.stream()?, ctx.stream()?);
    let x = a.alloc(&s, 4096)?;
    let addr = x.device_addr();
    let (hs, ht) = (ctx.device.alloc_host(2048)?, ctx.device.alloc_host(2048)?);
    let mut bs = Blocker::new(ctx, &s)?;
    let mut bt = Blocker::new(ctx, &t)?;
    s.copy_d2h(&x, 0, &hs, 0, 2048)?;
    t.copy_d2h(&x, 2048, &ht, 0, 2048)?;
    drop(x);
    let st = a.stats();
    ensure_eq!(
        (st.allocated_bytes.all.current, st.active_bytes.all.current),
        (0, 4096),
        "a block two streams still use is freed but active"
    );
    let state = a
        .snapshot()
        .iter()
        .flat_map(|s| s.blocks.clone())
        .find(|b| b.address == addr)
        .map(|b| b.state);
    ensure_eq!(state, Some(BlockState::ActivePendingFree), "snapshot state");
    for st in [&s, &t] {
        ensure!(
            a.alloc(st, 4096)?.device_addr() != addr,
            "a stream got a block another stream's work still uses"
        );
    }
    bs.release()?;
    s.synchronize()?;
    ensure!(
        a.alloc(&s, 4096)?.device_addr() != addr,
        "reused while the second stream's work was queued"
    );
    bt.release()?;
    t.synchronize()?;
    ensure_eq!(a.stats().active_bytes.all.current, 0, "nothing active");
    ensure_eq!(
        a.alloc(&s, 4096)?.device_addr(),
        addr,
        "free for all once both completed"
    );
    Ok(())
}

fn oom(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let total = ctx.device.memory_info()?.total;
    let free = ctx.device.memory_info()?.free;
    ensure!(free >= 64 * MIB, "the case needs 64 MiB free, {free} are");
    // A limit of 60 MiB (the memory fraction) makes the trace independent of the device's size.
    a.set_memory_fraction((60 * MIB) as f64 / total as f64)?;
    let limit = a.limit().unwrap_or(0);
    ensure!(
        (59 * MIB..=60 * MIB).contains(&limit),
        "limit {limit} for a fraction of {total}"
    );
    drop(a.alloc(&s, (30 * MIB) as usize)?); // 30 MiB cached
                                             // 40 MiB more would pass the limit: the cache is released and the request retried.
    let z = a.alloc(&s, (40 * MIB) as usize)?;
    let st = a.stats();
    ensure_eq!(
        (
            st.num_alloc_retries,
            st.num_ooms,
            st.num_device_alloc,
            st.num_device_free
        ),
        (1, 0, 2, 1),
        "released, retried, served"
    );
    ensure_eq!(st.reserved_bytes.all.current, 40 * MIB, "reserved");
    let e = a.alloc(&s, (40 * MIB) as usize).err();
    let Some(HalError::AllocatorOutOfMemory(r)) = &e else {
        return Err(Failure::new(format!(
            "expected an allocator out-of-memory error, got {e:?}"
        )));
    };
    ensure_eq!(
        (
            r.requested,
            r.allocated,
            r.reserved,
            r.largest_free_block,
            r.limit
        ),
        (40 * MIB, 40 * MIB, 40 * MIB, 0, Some(limit)),
        "the report"
    );
    ensure!(r.free > 0 && r.total == total, "device figures {r:?}");
    ensure_eq!(
        (a.stats().num_alloc_retries, a.stats().num_ooms),
        (2, 1),
        "a failed retry counts as an out-of-memory error"
    );
    drop(z);
    Ok(())
}

fn empty_cache(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let blocks: Vec<_> = [100usize, 5000, 3 << 20, 18 << 20]
        .iter()
        .map(|&n| a.alloc(&s, n))
        .collect::<Result<_, _>>()?;
    let before = ctx.device.memory_info()?.free;
    let reserved = a.stats().reserved_bytes.all.current;
    ensure_eq!(reserved, (2 + 20 + 18) * MIB, "three segments");
    drop(blocks);
    a.empty_cache();
    let st = a.stats();
    ensure_eq!(
        (
            st.reserved_bytes.all.current,
            st.segment.all.current,
            st.num_device_free
        ),
        (0, 0, 3),
        "everything returned"
    );
    let after = ctx.device.memory_info()?.free;
    ensure!(
        after >= before + reserved / 2,
        "the device's free memory did not grow: {before} -> {after} after releasing {reserved}"
    );
    Ok(())
}

fn dlpack_round_trip(ctx: &Ctx) -> CaseResult {
    let a = allocator(ctx)?;
    let s = ctx.stream()?;
    let b = a.alloc(&s, 24 * 4)?;
    s.copy_h2d_staged(&pattern(96, 5), &b, 0)?;
    // A [4, 6] f32 view with its rows reversed (negative stride, offset at the last row).
    let v = TensorView::contiguous(&b, DType::F32, &[4, 6]).strided(18 * 4, &[-6, 1]);
    let m = export(&v, &s, ConsumerStream::Foreign)?.into_versioned();
    drop((v, b));
    ensure_eq!(
        a.stats().allocated_bytes.all.current,
        512,
        "the export keeps the block"
    );
    // SAFETY: `m` was just made by `into_versioned` and is read before being handed over.
    let dl = unsafe { &(*m).dl_tensor };
    let want = unihal_dlpack::conv::device_type_of(ctx.device.id())?;
    ensure_eq!(
        (dl.device.device_type, dl.device.device_id, dl.byte_offset),
        (want, ctx.device.id().ordinal as i32, 72),
        "DLPack device and offset"
    );
    // SAFETY: a valid export, handed over once.
    let imp = unsafe { import_versioned(&ctx.device, m) }?;
    ensure!(imp.is_aligned(), "a block's export is 256-byte aligned");
    let out = a.alloc(&s, 96)?;
    s.run_op(&OpCall::copy(
        imp.view().clone(),
        TensorView::contiguous(&out, DType::F32, &[4, 6]),
    ))
    .or_else(|e| match e {
        // Without a copy op, the bytes are checked as they lie.
        HalError::Unsupported { .. } => Ok(()),
        e => Err(e),
    })?;
    s.synchronize()?;
    let got = ctx.download(imp.buffer())?;
    ensure_eq!(got, pattern(96, 5), "imported bytes");
    if ctx.device.capabilities().supports(OpId::Copy, DType::F32) {
        let rows: Vec<u8> = pattern(96, 5).chunks(24).rev().flatten().copied().collect();
        ensure_eq!(ctx.download(&out)?, rows, "the imported view's strides");
    }
    drop((imp, out));
    ensure_eq!(
        a.stats().allocated_bytes.all.current,
        0,
        "the import's deleter gave the block back"
    );
    Ok(())
}
