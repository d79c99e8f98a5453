//! `misuse.*`: every misuse of the safe API is a typed error carrying the offending values, and
//! leaves the stream usable.

use crate::case::{expect_foreign, expect_invalid, Case, CaseResult, Ctx, Failure, Need};
use crate::{ensure, ensure_eq};
use std::any::Any;
use std::sync::Arc;
use unihal_hal::{
    Buffer, DeviceAllocation, DeviceId, Event, FillValue, Function, Invalid, KernelArgs,
    LaunchConfig, NativeHandle, Result,
};
use unihal_kernels::testing::names;

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("misuse.copy.out_of_range", out_of_range),
        Case::new("misuse.copy.offset_overflow", offset_overflow),
        Case::new("misuse.copy.overlap", overlap),
        Case::new("misuse.fill.misaligned", fill_misaligned).needs(&[Need::WideFill]),
        Case::new("misuse.buffer.other_device", other_device).needs(&[Need::Devices(2)]),
        Case::new("misuse.buffer.free_enqueued", free_enqueued),
        Case::new("misuse.handle.foreign_buffer", foreign_buffer),
        Case::new("misuse.handle.foreign_event", foreign_event),
        Case::new("misuse.handle.foreign_function", foreign_function),
        Case::new("misuse.event.record_on_other_device", event_other_device)
            .needs(&[Need::Devices(2)]),
        Case::new(
            "misuse.launch.function_of_other_device",
            function_other_device,
        )
        .needs(&[Need::Devices(2), Need::TestKernels]),
        Case::new("misuse.host.mapped_buffer_in_copy", mapped_in_copy),
        Case::new("misuse.zero_sized.operations", zero_sized),
        Case::new("misuse.stream.usable_after_rejected_calls", usable_after),
    ]
}

fn oor(offset: u64, len: u64, size: u64) -> Invalid {
    Invalid::OutOfRange { offset, len, size }
}

fn out_of_range(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(100)?;
    let c = ctx.device.alloc(50)?;
    let h = ctx.device.alloc_host(10)?;
    ensure_eq!(
        expect_invalid(s.copy_d2d(&b, 90, &c, 0, 20), "src")?,
        oor(90, 20, 100),
        "d2d source"
    );
    ensure_eq!(
        expect_invalid(s.copy_d2d(&b, 0, &c, 40, 20), "dst")?,
        oor(40, 20, 50),
        "d2d destination"
    );
    ensure_eq!(
        expect_invalid(s.copy_h2d(&h, 5, &b, 0, 6), "src")?,
        oor(5, 6, 10),
        "h2d host side"
    );
    ensure_eq!(
        expect_invalid(s.copy_h2d(&h, 0, &c, 45, 6), "dst")?,
        oor(45, 6, 50),
        "h2d device side"
    );
    ensure_eq!(
        expect_invalid(s.copy_d2h(&c, 0, &h, 8, 4), "dst")?,
        oor(8, 4, 10),
        "d2h host side"
    );
    ensure_eq!(
        expect_invalid(s.copy_h2d_staged(&[0; 11], &c, 40), "dst")?,
        oor(40, 11, 50),
        "staged h2d"
    );
    ensure_eq!(
        expect_invalid(s.fill(&b, 99, 2, FillValue::U8(0)), "dst")?,
        oor(99, 2, 100),
        "fill"
    );
    let view = b.slice(10, 20)?;
    ensure_eq!(
        expect_invalid(s.fill(&view, 15, 6, FillValue::U8(0)), "dst")?,
        oor(15, 6, 20),
        "fill of a view"
    );
    let mut out = [0u8; 8];
    ensure_eq!(
        expect_invalid(s.read(&c, 45, &mut out), "src")?,
        oor(45, 8, 50),
        "synchronous read"
    );
    Ok(())
}

fn offset_overflow(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(16)?;
    let r = expect_invalid(s.copy_d2d(&b, u64::MAX, &b, 0, 2), "src")?;
    ensure_eq!(r, oor(u64::MAX, 2, 16), "offset near u64::MAX");
    let r = expect_invalid(s.fill(&b, 8, u64::MAX - 4, FillValue::U8(1)), "dst")?;
    ensure_eq!(r, oor(8, u64::MAX - 4, 16), "length near u64::MAX");
    let r = expect_invalid(b.slice(u64::MAX, 1), "slice")?;
    ensure_eq!(r, oor(u64::MAX, 1, 16), "slice offset near u64::MAX");
    Ok(())
}

fn overlap(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(64)?;
    let base = b.device_addr();
    let r = expect_invalid(s.copy_d2d(&b, 0, &b, 16, 32), "dst")?;
    ensure_eq!(
        r,
        Invalid::Overlap {
            src: base,
            dst: base + 16,
            len: 32
        },
        "overlapping copy"
    );
    let v = b.slice(8, 40)?;
    let r = expect_invalid(s.copy_d2d(&b, 10, &v, 0, 8), "dst")?;
    ensure_eq!(
        r,
        Invalid::Overlap {
            src: base + 10,
            dst: base + 8,
            len: 8
        },
        "overlap through a view"
    );
    Ok(())
}

fn fill_misaligned(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(64)?;
    let r = expect_invalid(s.fill(&b, 2, 8, FillValue::U32(1)), "dst")?;
    ensure!(
        matches!(r, Invalid::Value { ref value, .. } if value.contains(&format!("{:#x}", b.device_addr() + 2))),
        "misaligned 32-bit fill: {r:?}"
    );
    let r = expect_invalid(s.fill(&b, 0, 6, FillValue::U32(1)), "dst")?;
    ensure!(
        matches!(r, Invalid::Value { ref value, .. } if value.contains("length 6")),
        "ragged 32-bit fill: {r:?}"
    );
    Ok(())
}

fn other_device(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let s = ctx.stream()?;
    let mine = ctx.device.alloc(8)?;
    let theirs = other.alloc(8)?;
    let want = Invalid::WrongDevice {
        expected: ctx.device.id(),
        found: other.id(),
    };
    ensure_eq!(
        expect_invalid(s.copy_d2d(&theirs, 0, &mine, 0, 8), "src")?,
        want,
        "d2d source"
    );
    ensure_eq!(
        expect_invalid(s.copy_d2d(&mine, 0, &theirs, 0, 8), "dst")?,
        want,
        "d2d destination"
    );
    ensure_eq!(
        expect_invalid(s.fill(&theirs, 0, 8, FillValue::U8(0)), "dst")?,
        want,
        "fill"
    );
    ensure_eq!(
        expect_invalid(s.free_async(&theirs), "buffer")?,
        want,
        "free_async"
    );
    Ok(())
}

fn free_enqueued(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(32)?;
    let alias = b.slice(8, 8)?;
    let want = Invalid::FreeEnqueued {
        addr: b.device_addr(),
        len: 32,
    };
    s.free_async(&b)?;
    ensure!(
        alias.is_free_enqueued(),
        "a view does not see the enqueued free"
    );
    ensure_eq!(
        expect_invalid(s.free_async(&b), "buffer")?,
        want,
        "second free_async"
    );
    ensure_eq!(
        expect_invalid(s.fill(&alias, 0, 8, FillValue::U8(0)), "dst")?,
        want,
        "fill of a freed view"
    );
    let other = ctx.device.alloc(32)?;
    ensure_eq!(
        expect_invalid(s.copy_d2d(&b, 0, &other, 0, 8), "src")?,
        want,
        "copy from a freed buffer"
    );
    s.synchronize()?;
    Ok(())
}

/// A device allocation no backend made. It owns 64 real host bytes (zeroed), so a backend that
/// wrongly touches its address reads or writes memory the case then checks, and the case fails
/// instead of crashing the suite.
struct FakeAllocation {
    device: DeviceId,
    bytes: Box<[std::cell::UnsafeCell<u8>; 64]>,
}

impl FakeAllocation {
    fn new(device: DeviceId) -> FakeAllocation {
        FakeAllocation {
            device,
            bytes: Box::new(std::array::from_fn(|_| std::cell::UnsafeCell::new(0))),
        }
    }
}

// SAFETY: the bytes are plain memory owned by this allocation; nothing in the suite forms a
// reference to them while a backend may write them through the address.
unsafe impl Sync for FakeAllocation {}

// SAFETY: addr..addr+len is the allocation's own 64 bytes, live and fixed for its whole life (it
// is not memory of the device it names, which is what the case checks backends notice).
unsafe impl DeviceAllocation for FakeAllocation {
    fn device(&self) -> DeviceId {
        self.device
    }
    fn addr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }
    fn len(&self) -> u64 {
        64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn foreign_buffer(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let alloc = FakeAllocation::new(ctx.device.id());
    let untouched = |b: &Buffer| {
        let a = b.allocation().as_any().downcast_ref::<FakeAllocation>();
        // SAFETY: the stream was synchronised: no backend operation may still use the bytes.
        a.is_some_and(|a| a.bytes.iter().all(|c| unsafe { *c.get() } == 0))
    };
    let fake = Buffer::from_allocation(alloc);
    let (dev, addr) = (
        ctx.device.id().to_string(),
        format!("{:#x}", fake.device_addr()),
    );
    let names = ["buffer", dev.as_str(), addr.as_str()];
    let real = ctx.device.alloc(64)?;
    s.fill(&real, 0, 64, FillValue::U8(7))?;
    expect_foreign(s.copy_d2d(&fake, 0, &real, 0, 8), "src", &names)
        .map_err(|f| Failure::new(format!("d2d source: {}", f.message)))?;
    expect_foreign(s.copy_d2d(&real, 0, &fake, 0, 8), "dst", &names)
        .map_err(|f| Failure::new(format!("d2d destination: {}", f.message)))?;
    expect_foreign(s.fill(&fake, 0, 8, FillValue::U8(5)), "dst", &names)
        .map_err(|f| Failure::new(format!("fill: {}", f.message)))?;
    expect_foreign(s.copy_h2d_staged(&[1; 8], &fake, 0), "dst", &names)
        .map_err(|f| Failure::new(format!("staged h2d: {}", f.message)))?;
    s.synchronize()?;
    ensure!(
        untouched(&fake),
        "a rejected call wrote the foreign buffer's bytes"
    );
    Ok(())
}

/// An event no backend made.
struct FakeEvent(DeviceId);
impl Event for FakeEvent {
    fn device_id(&self) -> DeviceId {
        self.0
    }
    fn query(&self) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    fn elapsed_ms(&self, _: &dyn Event) -> Result<f32> {
        Ok(0.0)
    }
    fn native_handle(&self) -> NativeHandle {
        NativeHandle::None
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn foreign_event(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let fake: Arc<dyn Event> = Arc::new(FakeEvent(ctx.device.id()));
    let dev = ctx.device.id().to_string();
    let names = ["event", dev.as_str()];
    expect_foreign(s.record_event(&fake), "event", &names)
        .map_err(|f| Failure::new(format!("record: {}", f.message)))?;
    expect_foreign(s.wait_event(&fake), "event", &names)
        .map_err(|f| Failure::new(format!("wait: {}", f.message)))?;
    let real = ctx.device.create_event(Default::default())?;
    s.record_event(&real)?;
    s.synchronize()?;
    expect_foreign(real.elapsed_ms(&*fake), "end", &names)
        .map_err(|f| Failure::new(format!("elapsed time: {}", f.message)))?;
    Ok(())
}

/// A function no backend made.
struct FakeFunction(DeviceId);
impl Function for FakeFunction {
    fn device_id(&self) -> DeviceId {
        self.0
    }
    fn name(&self) -> &str {
        "fake"
    }
    fn param_sizes(&self) -> Option<&[usize]> {
        None
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn foreign_function(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let fake: Arc<dyn Function> = Arc::new(FakeFunction(ctx.device.id()));
    let dev = ctx.device.id().to_string();
    expect_foreign(
        // SAFETY: must be rejected before anything runs.
        unsafe { s.launch(&fake, &LaunchConfig::linear(1, 1), &KernelArgs::new()) },
        "function",
        &["function", "\"fake\"", dev.as_str()],
    )?;
    Ok(())
}

fn event_other_device(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let e = other.create_event(Default::default())?;
    let s = ctx.stream()?;
    let r = expect_invalid(s.record_event(&e), "event")?;
    ensure_eq!(
        r,
        Invalid::WrongDevice {
            expected: ctx.device.id(),
            found: other.id()
        },
        "record of another device's event"
    );
    Ok(())
}

fn function_other_device(ctx: &Ctx) -> CaseResult {
    let other = ctx.other_device()?;
    let f = ctx.kernel_on(&other, names::FAIL)?;
    let s = ctx.stream()?;
    let mut args = KernelArgs::new();
    args.push(0i32);
    // SAFETY: must be rejected before running.
    let r = expect_invalid(
        unsafe { s.launch(&f, &LaunchConfig::linear(1, 1), &args) },
        "function",
    )?;
    ensure_eq!(
        r,
        Invalid::WrongDevice {
            expected: ctx.device.id(),
            found: other.id()
        },
        "launch of another device's function"
    );
    Ok(())
}

fn mapped_in_copy(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let h = ctx.device.alloc_host(16)?;
    let d = ctx.device.alloc(16)?;
    let m = h.map()?;
    let r = expect_invalid(s.copy_d2h(&d, 0, &h, 0, 16), "dst")?;
    ensure!(
        matches!(r, Invalid::Busy(_)),
        "copy into a mapped host buffer: {r:?}"
    );
    let r = expect_invalid(s.copy_h2d(&h, 0, &d, 0, 16), "src")?;
    ensure!(
        matches!(r, Invalid::Busy(_)),
        "copy from a mapped host buffer: {r:?}"
    );
    drop(m);
    s.copy_h2d(&h, 0, &d, 0, 16)?;
    s.synchronize()?;
    Ok(())
}

fn zero_sized(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let empty = ctx.device.alloc(0)?;
    let b = ctx.upload(&[4u8; 16])?;
    let h = ctx.device.alloc_host(0)?;
    s.copy_d2d(&empty, 0, &b, 16, 0)?;
    s.copy_d2d(&b, 16, &empty, 0, 0)?;
    s.copy_h2d(&h, 0, &b, 3, 0)?;
    s.copy_d2h(&b, 16, &h, 0, 0)?;
    s.copy_h2d_staged(&[], &empty, 0)?;
    s.fill(&b, 16, 0, FillValue::U8(9))?;
    let tail = b.slice(16, 0)?;
    ensure!(tail.is_empty(), "slice at the end is not empty");
    s.synchronize()?;
    ensure_eq!(
        ctx.download(&b)?,
        vec![4u8; 16],
        "zero-sized operations changed data"
    );
    ensure_eq!(
        expect_invalid(s.copy_d2d(&b, 17, &empty, 0, 0), "src")?,
        oor(17, 0, 16),
        "empty range past the end"
    );
    ensure_eq!(
        expect_invalid(s.fill(&empty, 1, 0, FillValue::U8(0)), "dst")?,
        oor(1, 0, 0),
        "empty fill past an empty buffer"
    );
    Ok(())
}

fn usable_after(ctx: &Ctx) -> CaseResult {
    let s = ctx.stream()?;
    let b = ctx.device.alloc(8)?;
    let _ = s.copy_d2d(&b, 4, &b, 0, 8);
    let _ = s.fill(&b, 0, 9, FillValue::U8(0));
    ensure!(
        s.async_error().is_none(),
        "a rejected call left a sticky error: {:?}",
        s.async_error()
    );
    s.write(&b, 0, &[6u8; 8])?;
    ensure_eq!(
        ctx.download(&b)?,
        vec![6u8; 8],
        "stream after rejected calls"
    );
    Ok(())
}
