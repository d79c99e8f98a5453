//! The op catalogue through aclnn: every `OpCall` becomes one or more aclnn operator calls on
//! the stream, in the two phases the library prescribes (the op map's A.1 to A.3):
//!
//! 1. descriptors from the call's `TensorView`s ([`desc`]): the storage base address, the view's
//!    shape, strides and offset in elements, so strided and transposed views go to the operator
//!    as they are (no copy to make a tensor contiguous);
//! 2. phase 1 (`aclnnXxxGetWorkspaceSize`, host only) on the calling thread;
//! 3. the workspace, when the operator asks for one, from the device's caching allocator on
//!    this stream (`unihal-alloc`: reused in stream order once dropped, never an
//!    `aclrtMalloc`/`aclrtFree` or a synchronisation per op);
//! 4. phase 2 (`aclnnXxx`) enqueued through the shared stream, which keeps the buffers the
//!    operator uses (the workspace and temporaries included) until it ran;
//! 5. the descriptors destroyed right after phase 2 returned (A.3).
//!
//! Ops aclnn has no single operator for are compositions ([`map`], the op map's A.5); their
//! intermediates are caching-allocator blocks of the same stream. The op × dtype pairs a device
//! reports are its SoC's table ([`crate::soc`]) intersected with [`probe`]: each op run once in
//! phase 1 only, at device open.

pub mod desc;
pub mod map;
pub mod probe;

use crate::conv::{self, ACLNN};
use crate::ffi::aclnn::{Executor, Op};
use crate::loader::Cann;
use crate::runtime::AscendStream;
use desc::Descs;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use unihal_alloc::{AllocatorConfig, CachingAllocator};
use unihal_hal::{Buffer, DType, Device, HalError, Keep, OpCall, Result, Stream, TensorView};

/// The caching allocator of each device's workspaces and temporaries, by ordinal (created on
/// first use, kept for the process as the devices are).
fn allocator(stream: &AscendStream) -> Result<Arc<CachingAllocator>> {
    static ALLOCATORS: OnceLock<Mutex<HashMap<u32, Arc<CachingAllocator>>>> = OnceLock::new();
    let dev = stream.gpu_device();
    let ordinal = dev.id().ordinal;
    let mut map = ALLOCATORS.get_or_init(Default::default).lock();
    if let Some(a) = map.get(&ordinal) {
        return Ok(a.clone());
    }
    let d: Arc<dyn Device> = dev.arc()?;
    let a = Arc::new(CachingAllocator::new(d, AllocatorConfig::default())?);
    map.insert(ordinal, a.clone());
    Ok(a)
}

/// One op's execution: the stream, what its operators use, and, for a probe, the scratch
/// memory its temporaries are carved from (phase 1 only: executors destroyed, nothing
/// enqueued).
pub struct Exec<'a> {
    pub cann: &'a Cann,
    pub stream: &'a AscendStream,
    handle: Option<Arc<dyn Stream>>,
    /// A probe's scratch buffer and the next free byte.
    probe: Option<(Buffer, u64)>,
    /// Buffers the operators use (the call's, temporaries): kept by each enqueue.
    uses: Vec<Buffer>,
}

impl<'a> Exec<'a> {
    /// An execution on `stream`.
    pub fn new(cann: &'a Cann, stream: &'a AscendStream) -> Exec<'a> {
        Exec {
            cann,
            stream,
            handle: stream.handle(),
            probe: None,
            uses: Vec::new(),
        }
    }

    /// A probe on `stream`, its temporaries carved from `scratch`.
    pub fn probe(cann: &'a Cann, stream: &'a AscendStream, scratch: Buffer) -> Exec<'a> {
        Exec {
            probe: Some((scratch, 0)),
            ..Exec::new(cann, stream)
        }
    }

    /// A temporary tensor of `shape` in `dtype`, from the caching allocator on this stream.
    ///
    /// # Errors
    /// The allocator's.
    pub fn temp(&mut self, dtype: DType, shape: &[u64]) -> Result<TensorView> {
        let n: u64 = shape.iter().product::<u64>().max(1);
        let bytes = n
            .checked_mul(dtype.size() as u64)
            .ok_or_else(|| HalError::Internal("temporary too large".into()))?;
        let b = self.block(bytes as usize)?;
        Ok(TensorView::contiguous(&b, dtype, shape))
    }

    /// `len` bytes from the caching allocator on this stream, used by the op's operators.
    fn block(&mut self, len: usize) -> Result<Buffer> {
        if let Some((scratch, next)) = &mut self.probe {
            let off = *next;
            *next += (len as u64).div_ceil(256) * 256;
            return scratch.slice(off, (len as u64).min(scratch.len().saturating_sub(off)));
        }
        let handle = self
            .handle
            .clone()
            .ok_or_else(|| HalError::Internal("stream used while being dropped".into()))?;
        let b = allocator(self.stream)?.alloc(&handle, len.max(1))?;
        self.uses.push(b.clone());
        Ok(b)
    }

    /// Runs one operator: phase 1 through `phase1(entry, &mut workspace_size, &mut executor)`,
    /// then (not in a probe) the workspace and phase 2 on the stream. `d` holds the descriptors
    /// phase 1 was given; they are destroyed when this returns (A.3: right after phase 2).
    ///
    /// # Errors
    /// [`HalError::Unsupported`] when no operator library has the operator; the vendor error
    /// of either phase; the allocator's.
    pub fn call<F: Copy>(
        &mut self,
        op: Option<Op<F>>,
        name: &'static str,
        d: Descs<'_>,
        phase1: impl FnOnce(F, *mut u64, *mut Executor) -> i32,
    ) -> Result<()> {
        let op = op.ok_or_else(|| {
            HalError::unsupported(format!(
                "aclnn{name} is not in this CANN's operator libraries"
            ))
        })?;
        d.check()?;
        let mut ws = 0u64;
        let mut exec: Executor = std::ptr::null_mut();
        let rc = phase1(op.ws, &mut ws, &mut exec);
        if rc != 0 {
            return Err(self.aclnn_error(&format!("aclnn{name}GetWorkspaceSize"), rc));
        }
        let abandon = |exec: Executor| {
            if let Some(f) = self.cann.nnop.destroy_executor {
                // SAFETY: an executor phase 1 made that phase 2 will never run.
                unsafe { f(exec) };
            }
        };
        if self.probe.is_some() {
            abandon(exec);
            return Ok(());
        }
        let workspace = if ws > 0 {
            match self.block(ws as usize) {
                Ok(b) => Some(b),
                Err(e) => {
                    abandon(exec);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let sid = self.stream.stream_id();
        let keep: Vec<Keep> = self.uses.iter().map(|b| b.use_on(sid)).collect();
        let ws_ptr = workspace
            .as_ref()
            .map_or(std::ptr::null_mut(), |b| b.device_addr() as *mut std::ffi::c_void);
        let mut ran = false;
        let cann = self.cann;
        let what = format!("aclnn{name}");
        let r = self.stream.submit(&what, keep, |s| {
            ran = true;
            // SAFETY: an executor of phase 1, run once, with a workspace of the size it asked
            // for (device memory of this stream's device, kept with the operands until the
            // operator ran) on a live stream of the current context.
            let rc = unsafe { (op.run)(ws_ptr, ws, exec, s.0) };
            if rc != 0 {
                return Err(conv::vendor_of(ACLNN, &what, rc, cann.recent_message()));
            }
            Ok(())
        });
        if !ran {
            abandon(exec);
        }
        drop(d);
        r
    }

    fn aclnn_error(&self, call: &str, rc: i32) -> HalError {
        conv::vendor_of(ACLNN, call, rc, self.cann.recent_message())
    }
}

/// Runs `call` on `stream` through aclnn.
///
/// # Errors
/// The call's validation ([`OpCall::validate`], as on every backend); vendor errors; the
/// caching allocator's.
pub fn run(cann: &Cann, stream: &AscendStream, call: &OpCall) -> Result<()> {
    execute(Exec::new(cann, stream), call)
}

/// Runs (or probes) `call`.
pub(crate) fn execute(mut ex: Exec<'_>, call: &OpCall) -> Result<()> {
    let out_shape = call.validate()?;
    if ex.probe.is_none() && out_shape.contains(&0) {
        return Ok(()); // no elements
    }
    ex.uses.extend(call.tensors.iter().map(|t| t.buffer.clone()));
    let dev = ex.stream.gpu_device().clone();
    dev.call("aclnn", || map::run(&mut ex, call, &out_shape))
}
