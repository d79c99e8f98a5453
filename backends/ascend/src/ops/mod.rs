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
//! reports are its SoC's table ([`crate::ops::soc`]) intersected with [`probe`]: each op run once in
//! phase 1 only, at device open.

pub mod desc;
mod fused;
pub mod map;
pub mod probe;
pub mod soc;

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

/// `len` bytes in `stream`'s order (the HAL's `alloc_async` on ACL, which has no stream-ordered
/// pools): a block of the device's caching allocator, reusable on this stream as soon as its
/// handles are gone and on others once the work using it completed (memory rule 11).
///
/// # Errors
/// The allocator's (out of memory after releasing its cache).
pub fn stream_alloc(stream: &AscendStream, len: usize) -> Result<Buffer> {
    let handle = stream
        .handle()
        .ok_or_else(|| HalError::Internal("stream used while being dropped".into()))?;
    allocator(stream)?.alloc(&handle, len)
}

/// Fills `count` elements of `value`'s width at `dst` on `stream` (the 16- and 32-bit fills
/// ACL's byte memset cannot do): `aclnnInplaceFillScalar` over an INT16 or INT32 tensor at the
/// address, the pattern as that integer, so every bit pattern is written as it is.
///
/// # Errors
/// The operator's; [`HalError::Internal`] if it asks for a workspace (a fill needs none).
///
/// # Safety
/// `dst` is device memory of the current device, valid and aligned for `count` elements until
/// the fill ran.
pub unsafe fn fill_raw(
    cann: &Cann,
    dst: u64,
    value: unihal_hal::FillValue,
    count: usize,
    stream: unihal_gpu::runtime::Raw,
) -> Result<()> {
    let (dtype, bits) = match value {
        unihal_hal::FillValue::U16(v) => (DType::I16, v as i16 as i64),
        unihal_hal::FillValue::U32(v) => (DType::I32, v as i32 as i64),
        unihal_hal::FillValue::U8(v) => (DType::U8, v as i64),
    };
    let op = cann.aclnn.inplace_fill_scalar.ok_or_else(|| {
        HalError::unsupported("aclnnInplaceFillScalar is not in this CANN's operator libraries")
    })?;
    let dims = [count as i64];
    let strides = [1i64];
    let n = &cann.nnop;
    // SAFETY: arrays of the lengths passed; `dst` per the caller's contract (not dereferenced on
    // the host).
    let t = unsafe {
        (n.create_tensor)(
            dims.as_ptr(),
            1,
            conv::acl_dtype(dtype),
            strides.as_ptr(),
            0,
            conv::FORMAT_ND,
            dims.as_ptr(),
            1,
            dst as *mut std::ffi::c_void,
        )
    };
    let mut b = unihal_hal::Scalar::I64(bits).bits(dtype).to_le_bytes();
    // SAFETY: 8 readable bytes holding the value in the dtype's encoding; copied by the call.
    let v = unsafe {
        (n.create_scalar)(
            b.as_mut_ptr() as *mut std::ffi::c_void,
            conv::acl_dtype(dtype),
        )
    };
    let r = (|| {
        if t.is_null() || v.is_null() {
            return Err(HalError::Internal(
                "aclCreateTensor/aclCreateScalar returned NULL".into(),
            ));
        }
        let (mut ws, mut exec): (u64, Executor) = (0, std::ptr::null_mut());
        // SAFETY: live descriptors and out-pointers to locals.
        let rc = unsafe { (op.ws)(t, v, &mut ws, &mut exec) };
        if rc != 0 {
            return Err(conv::vendor_of(
                ACLNN,
                "aclnnInplaceFillScalarGetWorkspaceSize",
                rc,
                cann.recent_message(),
            ));
        }
        if ws > 0 {
            if let Some(f) = n.destroy_executor {
                // SAFETY: an executor phase 2 will not run.
                unsafe { f(exec) };
            }
            return Err(HalError::Internal(format!(
                "aclnnInplaceFillScalar asked for a {ws}-byte workspace"
            )));
        }
        // SAFETY: the executor of phase 1, run once on a live stream of the current context.
        let rc = unsafe { (op.run)(std::ptr::null_mut(), 0, exec, stream.0) };
        if rc != 0 {
            return Err(conv::vendor_of(
                ACLNN,
                "aclnnInplaceFillScalar",
                rc,
                cann.recent_message(),
            ));
        }
        Ok(())
    })();
    // SAFETY: descriptors made above, destroyed once, after phase 2 returned.
    unsafe {
        if !t.is_null() {
            (n.destroy_tensor)(t);
        }
        if !v.is_null() {
            (n.destroy_scalar)(v);
        }
    }
    r
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

    /// A dense copy of `t`, which has negative strides: its memory seen with positive strides,
    /// flipped back along those dims (`aclnnIndexSelect` with a reversed index per dim).
    fn unflip(&mut self, t: &TensorView) -> Result<TensorView> {
        let (pos, dims) = positive(t);
        let mut cur = pos;
        for d in dims {
            let next = self.temp(t.dtype, &t.shape)?;
            self.reverse(&cur, d, &next)?;
            cur = next;
        }
        if cur.strides.iter().any(|&s| s < 0) {
            return Err(HalError::Internal("unflip left a negative stride".into()));
        }
        Ok(cur)
    }

    /// Writes the dense `tmp` into `t` (negative strides): the inverse of [`Exec::unflip`].
    fn flip_into(&mut self, tmp: &TensorView, t: &TensorView) -> Result<()> {
        let (pos, dims) = positive(t);
        let mut cur = tmp.clone();
        for (k, &d) in dims.iter().enumerate() {
            let next = if k + 1 == dims.len() {
                pos.clone()
            } else {
                self.temp(t.dtype, &t.shape)?
            };
            self.reverse(&cur, d, &next)?;
            cur = next;
        }
        Ok(())
    }

    /// `out = x` reversed along dim `d`. `aclnnIndexSelect` gathers float tables: other dtypes
    /// are moved as the float type of their width (a gather copies bits); one-byte types,
    /// which have no float of their width, element by element with device copies (slow, and
    /// only for views with negative strides, which PyTorch never makes).
    fn reverse(&mut self, x: &TensorView, d: usize, out: &TensorView) -> Result<()> {
        let as_dtype = |t: &TensorView, dt: DType| TensorView {
            dtype: dt,
            ..t.clone()
        };
        match x.dtype.size() {
            _ if matches!(x.dtype, DType::F32 | DType::F64 | DType::F16 | DType::Bf16) => {}
            8 => return self.reverse(&as_dtype(x, DType::F64), d, &as_dtype(out, DType::F64)),
            4 => return self.reverse(&as_dtype(x, DType::F32), d, &as_dtype(out, DType::F32)),
            2 => return self.reverse(&as_dtype(x, DType::F16), d, &as_dtype(out, DType::F16)),
            _ => return self.reverse_bytes(x, d, out),
        }
        let n = x.shape[d];
        let idx = self.temp(DType::I64, &[n])?;
        if self.probe.is_none() {
            let bytes: Vec<u8> = (0..n as i64).rev().flat_map(|i| i.to_le_bytes()).collect();
            self.stream
                .copy_h2d_staged(&bytes, &idx.buffer, idx.offset)?;
        }
        let mut ds = Descs::new(self.cann);
        let (xd, id, od) = (ds.tensor(x), ds.tensor(&idx), ds.tensor(out));
        let op = self.cann.aclnn.index_select;
        // SAFETY: live descriptors of `ds`, the out-pointers of `call`, the operator's row.
        self.call(op, "IndexSelect", ds, |f, w, e| unsafe {
            f(xd, d as i64, id, od, w, e)
        })
    }

    /// [`Exec::reverse`] of one-byte elements: one device copy per element.
    fn reverse_bytes(&mut self, x: &TensorView, d: usize, out: &TensorView) -> Result<()> {
        if self.probe.is_some() {
            return Ok(());
        }
        let n: u64 = x.shape.iter().product();
        let mut idx = vec![0u64; x.shape.len()];
        for _ in 0..n {
            let at = |v: &TensorView, flip: bool| -> u64 {
                let mut off = v.offset as i64;
                for (k, &i) in idx.iter().enumerate() {
                    let i = if flip && k == d {
                        v.shape[k] - 1 - i
                    } else {
                        i
                    };
                    off += i as i64 * v.strides[k];
                }
                off as u64
            };
            self.stream
                .copy_d2d(&x.buffer, at(x, true), &out.buffer, at(out, false), 1)?;
            for k in (0..idx.len()).rev() {
                idx[k] += 1;
                if idx[k] < x.shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        Ok(())
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
        let ws_ptr = workspace.as_ref().map_or(std::ptr::null_mut(), |b| {
            b.device_addr() as *mut std::ffi::c_void
        });
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

/// `t` seen with positive strides over the same memory, and the dims (of size above 1) that
/// were negative, along which it is reversed.
fn positive(t: &TensorView) -> (TensorView, Vec<usize>) {
    let mut v = t.clone();
    let mut dims = Vec::new();
    let es = t.dtype.size() as i64;
    for (d, s) in v.strides.iter_mut().enumerate() {
        if *s < 0 {
            let n = t.shape[d] as i64;
            v.offset = (v.offset as i64 + (n - 1) * *s * es) as u64;
            *s = -*s;
            if n > 1 {
                dims.push(d);
            }
        }
    }
    (v, dims)
}

/// The index of the first operand `call` writes (operands from there on are outputs, or
/// updated in place).
fn first_output(call: &OpCall) -> usize {
    use unihal_hal::OpClass as C;
    let class = call.op.class();
    if class.is_elementwise() {
        return class.arity().3;
    }
    match class {
        C::Reduce | C::Softmax => 1,
        C::SoftmaxMasked | C::SoftmaxBackward | C::CrossEntropy | C::RmsNorm | C::Matmul => 2,
        C::IndexSelect | C::IndexAdd => 2,
        C::Attention | C::AttentionBackward | C::Rope | C::AddLayerNorm | C::AddRmsNorm => {
            class.arity().3
        }
        C::CrossEntropyBackward | C::LayerNorm => 3,
        C::RmsNormBackward => 4,
        C::LayerNormBackward => 5,
        _ => 0,
    }
}

/// Runs (or probes) `call`. aclnn takes no negative stride: an operand with one is copied into
/// a contiguous temporary first (flipped along those dims by `aclnnIndexSelect`), and written
/// back the same way when the op writes it. Every other view goes to aclnn as it is.
pub(crate) fn execute(mut ex: Exec<'_>, call: &OpCall) -> Result<()> {
    let out_shape = call.validate()?;
    ex.uses
        .extend(call.tensors.iter().map(|t| t.buffer.clone()));
    // Multi-tensor ops skip their empty tensors themselves; any other op whose output has no
    // elements has nothing to compute.
    let multi = matches!(
        call.op.class(),
        unihal_hal::OpClass::Optimizer
            | unihal_hal::OpClass::AmpUnscale
            | unihal_hal::OpClass::ClipGradNorm
    );
    if ex.probe.is_none() && !multi && out_shape.contains(&0) {
        return map::empty(&mut ex, call);
    }
    let dev = ex.stream.gpu_device().clone();
    dev.call("aclnn", || {
        let first_out = first_output(call);
        let mut run = call.clone();
        let mut back = Vec::new();
        for (k, t) in call.tensors.iter().enumerate() {
            if t.numel() == 0 {
                run.tensors[k] = positive(t).0; // no element to move
            } else if t.strides.iter().any(|&s| s < 0) {
                let tmp = ex.unflip(t)?;
                if k >= first_out {
                    back.push((tmp.clone(), t.clone()));
                }
                run.tensors[k] = tmp;
            }
        }
        map::run(&mut ex, &run, &out_shape)?;
        for (tmp, t) in back {
            ex.flip_into(&tmp, &t)?;
        }
        Ok(())
    })
}
