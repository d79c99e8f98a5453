//! The ACL runtime as a [`Runtime`] of the shared GPU layer (`unihal_gpu`): each raw call once,
//! its failure named with ACL's call name, `aclError` name and `aclGetRecentErrMsg`'s text.
//!
//! What ACL lacks is said, not faked: no stream-ordered allocation (a workspace comes from the
//! caching allocator instead), byte fills only (`aclrtMemsetAsync`), no portable kernel library
//! (every op runs through aclnn, [`crate::ops`]), no BLAS handle (matmul is an aclnn
//! operator). Host callbacks go through a report thread per stream ([`crate::runtime::report`]).

pub mod report;

use crate::conv::{self, codes, LIBRARY};
use crate::ffi::acl::{self, memcpy, Handle};
use crate::loader::Cann;
use std::ffi::{c_void, CStr};
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::library::Library;
use unihal_gpu::runtime::{unsupported_format, HostFn, PreparedModule, Raw, Runtime};
use unihal_gpu::stream::GpuStream;
use unihal_hal::{DeviceId, FillValue, HalError, ModuleSource, NativeHandle, OpCall, Result};

/// An Ascend device of the shared GPU layer.
pub type AscendDevice = GpuDevice<Cann>;
/// An Ascend stream of the shared GPU layer.
pub type AscendStream = GpuStream<Cann>;

/// What makes an Ascend device current: its default context (`aclrtSetDevice` once, then
/// `aclrtSetCurrentContext` on every thread that calls the runtime for it).
pub struct AscendContext {
    pub(crate) id: DeviceId,
    pub(crate) raw: Handle,
}

// SAFETY: an aclrtContext may be made current on any thread (the runtime is thread-safe; the
// handle is only passed back to it).
unsafe impl Send for AscendContext {}
// SAFETY: as above; the value is never changed.
unsafe impl Sync for AscendContext {}

impl Cann {
    /// The most recent error message of the calling thread (`aclGetRecentErrMsg`), if any.
    pub fn recent_message(&self) -> Option<String> {
        let f = self.acl.get_recent_err_msg?;
        // SAFETY: no arguments; returns a NUL-terminated string owned by the runtime, or NULL.
        let s = unsafe { unihal_dynlib::c_str(f()) };
        (!s.is_empty()).then_some(s)
    }

    /// A failed runtime call as a vendor error.
    pub fn vendor(&self, call: &str, rc: i32) -> HalError {
        conv::vendor_of(LIBRARY, call, rc, self.recent_message())
    }

    /// `Ok` for `ACL_SUCCESS`, else the vendor error of `call`.
    pub fn check(&self, call: &str, rc: i32) -> Result<()> {
        match rc {
            0 => Ok(()),
            rc => Err(self.vendor(call, rc)),
        }
    }

    fn alloc_result(&self, call: &str, len: usize, rc: i32, p: *mut c_void) -> Result<u64> {
        match rc {
            0 if !p.is_null() => Ok(p as u64),
            codes::RT_MEMORY_ALLOCATION | codes::RT_DEVICE_OOM | codes::BAD_ALLOC => {
                let free = self.mem_info().map(|(f, _)| f).unwrap_or(0);
                Err(HalError::OutOfMemory {
                    requested: len as u64,
                    free,
                })
            }
            0 => Err(HalError::Internal(format!("{call} returned NULL"))),
            rc => Err(self.vendor(call, rc)),
        }
    }

    /// An asynchronous copy of `len` bytes of `kind`.
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes until the copy ran.
    unsafe fn memcpy(
        &self,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
        kind: i32,
        s: Raw,
    ) -> Result<()> {
        // SAFETY: the caller's contract; destMax = len.
        self.check("aclrtMemcpyAsync", unsafe {
            (self.acl.memcpy_async)(dst, len, src, len, kind, s.0)
        })
    }
}

impl Runtime for Cann {
    type Context = AscendContext;
    type Blas = ();
    const VENDOR: &'static str = "Ascend";

    fn enter<T>(
        &self,
        ctx: &AscendContext,
        _what: &str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        // SAFETY: a context created by aclrtSetDevice for this device, never destroyed.
        self.check("aclrtSetCurrentContext", unsafe {
            (self.acl.set_current_context)(ctx.raw)
        })?;
        f()
    }

    fn native_device(ctx: &AscendContext) -> NativeHandle {
        NativeHandle::Int(ctx.id.ordinal as i64)
    }

    fn poisons(&self, e: &HalError) -> bool {
        matches!(e, HalError::Vendor { code, library, .. } if library == LIBRARY && conv::poisons(*code))
    }

    fn device_synchronize(&self) -> Result<()> {
        // SAFETY: no arguments.
        self.check("aclrtSynchronizeDevice", unsafe {
            (self.acl.synchronize_device)()
        })
    }

    fn mem_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: two out-pointers to locals.
        let rc = unsafe { (self.acl.get_mem_info)(acl::HBM_MEM, &mut free, &mut total) };
        self.check("aclrtGetMemInfo", rc)?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, len: usize) -> Result<u64> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a non-zero size.
        let rc = unsafe { (self.acl.malloc)(&mut p, len, acl::MEM_MALLOC_HUGE_FIRST) };
        self.alloc_result("aclrtMalloc", len, rc, p)
    }

    fn malloc_async(&self, _len: usize, _stream: Raw) -> Result<u64> {
        Err(HalError::unsupported(
            "ACL has no stream-ordered allocation (stream_ordered_alloc is false)",
        ))
    }

    unsafe fn free(&self, ptr: u64, _pooled: bool) -> Result<()> {
        // SAFETY: the caller's contract (memory of aclrtMalloc, freed once, unused).
        self.check("aclrtFree", unsafe { (self.acl.free)(ptr as *mut c_void) })
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        let mut p = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and a non-zero size.
        let rc = unsafe { (self.acl.malloc_host)(&mut p, len) };
        self.alloc_result("aclrtMallocHost", len, rc, p)
            .map(|p| p as *mut u8)
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("aclrtFreeHost", unsafe {
            (self.acl.free_host)(ptr as *mut c_void)
        })
    }

    fn peers(&self, ctx: &AscendContext) -> Result<Vec<u32>> {
        let Some(can_access) = self.acl.can_access_peer else {
            return Ok(Vec::new());
        };
        let me = ctx.id.ordinal as i32;
        let mut peers = Vec::new();
        for d in 0..self.devices as i32 {
            if d == me {
                continue;
            }
            let mut can = 0;
            // SAFETY: an out-pointer to a local and two valid, distinct device ids.
            self.check("aclrtDeviceCanAccessPeer", unsafe {
                can_access(&mut can, me, d)
            })?;
            if can != 0 {
                peers.push(d as u32);
            }
        }
        Ok(peers)
    }

    fn enable_peer(&self, peer: &AscendContext) -> Result<()> {
        let Some(enable) = self.acl.enable_peer_access else {
            return Err(HalError::unsupported("this ACL runtime has no peer access"));
        };
        // SAFETY: a valid device id; flags must be 0.
        self.check("aclrtDeviceEnablePeerAccess", unsafe {
            enable(peer.id.ordinal as i32, 0)
        })
    }

    fn stream_create(&self) -> Result<Raw> {
        let mut s = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local.
        self.check("aclrtCreateStream", unsafe {
            (self.acl.create_stream)(&mut s)
        })?;
        Ok(Raw(s))
    }

    unsafe fn stream_destroy(&self, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract (a live stream, destroyed once).
        unsafe { crate::runtime::report::destroy(self, stream.0) }
    }

    fn stream_synchronize(&self, stream: Raw) -> Result<()> {
        // SAFETY: a live stream.
        self.check("aclrtSynchronizeStream", unsafe {
            (self.acl.synchronize_stream)(stream.0)
        })
    }

    fn stream_query(&self, stream: Raw) -> Result<bool> {
        let mut status = -1;
        // SAFETY: a live stream and an out-pointer to a local.
        self.check("aclrtStreamQuery", unsafe {
            (self.acl.stream_query)(stream.0, &mut status)
        })?;
        Ok(status == acl::STREAM_STATUS_COMPLETE)
    }

    fn stream_wait_event(&self, stream: Raw, event: Raw) -> Result<()> {
        // SAFETY: a live stream and event.
        self.check("aclrtStreamWaitEvent", unsafe {
            (self.acl.stream_wait_event)(stream.0, event.0)
        })
    }

    unsafe fn launch_host_fn(&self, stream: Raw, f: HostFn, data: *mut c_void) -> Result<()> {
        let cann = crate::loader::cann()?;
        // SAFETY: the caller's contract for `f` and `data`; `enter` made the stream's context
        // current.
        unsafe { crate::runtime::report::launch(cann, stream.0, f, data) }
    }

    unsafe fn copy_h2d(&self, dst: u64, src: *const u8, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract (pinned host memory of aclrtMallocHost: stream-ordered).
        unsafe {
            self.memcpy(
                dst as *mut c_void,
                src as *const c_void,
                len,
                memcpy::HOST_TO_DEVICE,
                stream,
            )
        }
    }

    unsafe fn copy_d2h(&self, dst: *mut u8, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.memcpy(
                dst as *mut c_void,
                src as *const c_void,
                len,
                memcpy::DEVICE_TO_HOST,
                stream,
            )
        }
    }

    unsafe fn copy_d2d(&self, dst: u64, src: u64, len: usize, stream: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            self.memcpy(
                dst as *mut c_void,
                src as *const c_void,
                len,
                memcpy::DEVICE_TO_DEVICE,
                stream,
            )
        }
    }

    unsafe fn copy_peer(
        &self,
        dst: (&AscendContext, u64),
        src: (&AscendContext, u64),
        len: usize,
        stream: Raw,
    ) -> Result<()> {
        // Device to device across devices (peer access enabled by the shared layer first).
        // SAFETY: the caller's contract.
        unsafe {
            self.memcpy(
                dst.1 as *mut c_void,
                src.1 as *const c_void,
                len,
                memcpy::DEVICE_TO_DEVICE,
                stream,
            )
        }
    }

    unsafe fn fill(&self, dst: u64, value: FillValue, count: usize, stream: Raw) -> Result<()> {
        let v = match value {
            FillValue::U8(v) => v,
            // ACL's memset fills bytes: wider patterns through aclnn.
            // SAFETY: the caller's contract.
            wide => return unsafe { crate::ops::fill_raw(self, dst, wide, count, stream) },
        };
        // SAFETY: the caller's contract (a valid range of `count` bytes).
        self.check("aclrtMemsetAsync", unsafe {
            (self.acl.memset_async)(dst as *mut c_void, count, v as i32, count, stream.0)
        })
    }

    unsafe fn launch(
        &self,
        _function: Raw,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared_mem: u32,
        _stream: Raw,
        _params: &mut [*mut c_void],
    ) -> Result<()> {
        Err(raw_kernels_unsupported())
    }

    fn event_create(&self, timing: bool) -> Result<Raw> {
        let flag = if timing {
            acl::EVENT_SYNC | acl::EVENT_TIME_LINE
        } else {
            acl::EVENT_SYNC
        };
        let mut e = std::ptr::null_mut();
        // SAFETY: an out-pointer to a local and documented flags.
        self.check("aclrtCreateEventWithFlag", unsafe {
            (self.acl.create_event_with_flag)(&mut e, flag)
        })?;
        Ok(Raw(e))
    }

    unsafe fn event_destroy(&self, event: Raw) -> Result<()> {
        // SAFETY: the caller's contract.
        self.check("aclrtDestroyEvent", unsafe {
            (self.acl.destroy_event)(event.0)
        })
    }

    fn event_record(&self, event: Raw, stream: Raw) -> Result<()> {
        // SAFETY: a live event and stream.
        self.check("aclrtRecordEvent", unsafe {
            (self.acl.record_event)(event.0, stream.0)
        })
    }

    fn event_query(&self, event: Raw) -> Result<bool> {
        let mut status = -1;
        // SAFETY: a live event and an out-pointer to a local.
        self.check("aclrtQueryEventStatus", unsafe {
            (self.acl.query_event_status)(event.0, &mut status)
        })?;
        Ok(status == acl::EVENT_RECORDED_STATUS_COMPLETE)
    }

    fn event_synchronize(&self, event: Raw) -> Result<()> {
        // SAFETY: a live event.
        self.check("aclrtSynchronizeEvent", unsafe {
            (self.acl.synchronize_event)(event.0)
        })
    }

    fn event_elapsed(&self, start: Raw, end: Raw) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: two live events and an out-pointer to a local.
        self.check("aclrtEventElapsedTime", unsafe {
            (self.acl.event_elapsed_time)(&mut ms, start.0, end.0)
        })?;
        Ok(ms)
    }

    fn prepare_module(&self, source: &ModuleSource) -> Result<PreparedModule> {
        Err(unsupported_format(
            "Ascend",
            "no modules here (raw AscendC launches are not supported yet; ops run through aclnn)",
            source,
        ))
    }

    fn module_load(&self, _image: &[u8]) -> Result<Raw> {
        Err(raw_kernels_unsupported())
    }

    fn module_function(&self, _module: Raw, _name: &CStr) -> Result<Option<Raw>> {
        Err(raw_kernels_unsupported())
    }

    unsafe fn module_unload(&self, _module: Raw) -> Result<()> {
        Err(raw_kernels_unsupported())
    }

    fn load_library(&self, _device: &Arc<GpuDevice<Self>>) -> Result<Library> {
        Err(HalError::unsupported(
            "the Ascend backend runs every op through aclnn, not the portable kernel library",
        ))
    }

    fn vendor_op(&self, stream: &AscendStream, call: &OpCall) -> Option<Result<()>> {
        Some(crate::ops::run(self, stream, call))
    }

    fn stream_alloc(
        &self,
        stream: &AscendStream,
        len: usize,
    ) -> Option<Result<unihal_hal::Buffer>> {
        Some(crate::ops::stream_alloc(stream, len))
    }
}

/// The error of a raw kernel launch (no AscendC path yet).
pub fn raw_kernels_unsupported() -> HalError {
    HalError::unsupported(
        "raw kernel launches: AscendC binaries are not loaded by this backend yet (module_formats is empty)",
    )
}
