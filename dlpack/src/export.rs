//! Export: a unihal tensor handed to a DLPack consumer without a copy.

use crate::conv::{device_type_of, dl_dtype, host_device_type_of};
use crate::ffi::{
    DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, DLTensor, FLAG_READ_ONLY,
    VERSION,
};
use crate::import::checked_contiguous_strides;
use std::ffi::c_void;
use std::sync::Arc;
use unihal_hal::{
    Buffer, DType, EventFlags, HalError, HostBuffer, HostLoan, Invalid, Result, Stream, TensorView,
};

/// The stream on which the consumer will use an exported tensor (`__dlpack__(stream=...)`).
#[derive(Clone, Copy)]
pub enum ConsumerStream<'a> {
    /// A unihal stream of the same backend: it waits for the producer's queued work through an
    /// event, and the host does not wait. A stream of another backend is treated as
    /// [`ConsumerStream::Foreign`].
    Hal(&'a Arc<dyn Stream>),
    /// A stream unihal cannot order (a vendor stream handle from the Python protocol, or none,
    /// the host): the producer stream is synchronised before the export returns.
    Foreign,
    /// The consumer asked for no synchronisation (`stream=-1`): it orders the work itself.
    NoSync,
}

/// What an exported tensor keeps alive until the consumer's deleter runs.
enum Owner {
    /// A handle of the device buffer (a caching allocator's block stays allocated).
    Device(#[allow(dead_code)] Buffer),
    /// A host buffer lent to the consumer (queued work refuses it meanwhile).
    Host(#[allow(dead_code)] HostLoan),
}

struct Ctx {
    _owner: Owner,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// A tensor ready to hand to a DLPack consumer: it owns what the consumer's deleter will
/// release. Dropping it unconverted releases at once.
///
/// Ownership: [`Exported::into_versioned`] or [`Exported::into_legacy`] moves everything into
/// the returned struct, which the consumer frees with its `deleter` (exactly once, from any
/// thread). Thread safety: `Send`.
pub struct Exported {
    ctx: Box<Ctx>,
    data: u64,
    byte_offset: u64,
    device: DLDevice,
    dtype: DLDataType,
    read_only: bool,
}

fn to_i64(v: u64, arg: &'static str) -> Result<i64> {
    i64::try_from(v).map_err(|_| {
        HalError::invalid(
            arg,
            Invalid::Value {
                value: v.to_string(),
                accepted: "at most i64::MAX (DLPack's int64_t)".into(),
            },
        )
    })
}

/// Exports a view of device memory. `producer` is the stream whose queued work writes the
/// tensor; the consumer's stream is ordered after it as [`ConsumerStream`] says. The consumer
/// sees the view's dtype, shape, strides (in elements) and offset (`byte_offset`); the data
/// pointer is the view's buffer's first byte.
///
/// # Errors
/// [`HalError::InvalidArgument`] for a view that does not fit its buffer (an empty view too:
/// its offset must lie in the buffer), a freed buffer, a buffer or producer of another device,
/// or dimensions beyond `int64_t`;
/// [`HalError::Unsupported`] for a backend without a DLPack device type; the producer's
/// errors from recording, waiting or synchronising.
pub fn export(
    view: &TensorView,
    producer: &Arc<dyn Stream>,
    consumer: ConsumerStream<'_>,
) -> Result<Exported> {
    let id = producer.device_id();
    view.byte_span("view")?;
    view.buffer.check_use("view", id, 0, view.buffer.len())?;
    // A view without elements has no span to check: its offset must still lie in its buffer,
    // so that the consumer's `data + byte_offset` is an address of it.
    let data = view.buffer.device_addr();
    if view.offset > view.buffer.len() || data.checked_add(view.offset).is_none() {
        return Err(HalError::out_of_range(
            "view",
            view.offset,
            0,
            view.buffer.len(),
        ));
    }
    let device_type = device_type_of(id)?;
    let shape = view
        .shape
        .iter()
        .map(|&d| to_i64(d, "view"))
        .collect::<Result<Vec<_>>>()?;
    order(producer, consumer)?;
    Ok(Exported {
        data,
        byte_offset: view.offset,
        device: DLDevice {
            device_type,
            device_id: id.ordinal as i32,
        },
        dtype: dl_dtype(view.dtype),
        read_only: false,
        ctx: Box::new(Ctx {
            _owner: Owner::Device(view.buffer.clone()),
            shape,
            strides: view.strides.clone(),
        }),
    })
}

/// Orders the consumer after the producer's queued work.
fn order(producer: &Arc<dyn Stream>, consumer: ConsumerStream<'_>) -> Result<()> {
    match consumer {
        ConsumerStream::NoSync => Ok(()),
        ConsumerStream::Hal(c) if c.device_id().backend == producer.device_id().backend => {
            if Arc::ptr_eq(c, producer) {
                return Ok(());
            }
            let e = producer.device().create_event(EventFlags::default())?;
            producer.record_event(&e)?;
            c.wait_event(&e)
        }
        ConsumerStream::Hal(_) | ConsumerStream::Foreign => producer.synchronize(),
    }
}

/// Exports a host buffer as a contiguous tensor of `dtype` and `shape` (the buffer must hold
/// exactly its bytes). The buffer is lent to the consumer until the deleter runs: queued work
/// refuses it and the host cannot map it meanwhile. Device type: the vendor's pinned host type
/// (CUDA host 3, ROCm host 11), else CPU.
///
/// # Errors
/// [`HalError::InvalidArgument`] when the shape does not match the buffer's length (its
/// element count and byte size are computed with checked arithmetic), its row-major strides
/// overflow `int64_t`, or the buffer is busy (queued work, or mapped).
pub fn export_host(buffer: &HostBuffer, dtype: DType, shape: &[u64]) -> Result<Exported> {
    let numel = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size() as u64));
    if numel != Some(buffer.len() as u64) {
        return Err(HalError::invalid(
            "shape",
            Invalid::Value {
                value: format!("{shape:?} of {dtype}"),
                accepted: format!("a shape of exactly {} bytes", buffer.len()),
            },
        ));
    }
    let strides = checked_contiguous_strides(shape)?;
    let loan = buffer.lend()?;
    let shape = shape
        .iter()
        .map(|&d| to_i64(d, "shape"))
        .collect::<Result<Vec<_>>>()?;
    Ok(Exported {
        data: loan.addr() as u64,
        byte_offset: 0,
        device: DLDevice {
            device_type: host_device_type_of(buffer.device()),
            device_id: buffer.device().ordinal as i32,
        },
        dtype: dl_dtype(dtype),
        read_only: false,
        ctx: Box::new(Ctx {
            _owner: Owner::Host(loan),
            shape,
            strides,
        }),
    })
}

impl Exported {
    /// Marks the export read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`, versioned struct only).
    pub fn read_only(mut self) -> Exported {
        self.read_only = true;
        self
    }

    /// The device DLPack will name.
    pub fn device(&self) -> DLDevice {
        self.device
    }

    fn tensor(&mut self) -> DLTensor {
        DLTensor {
            data: self.data as *mut c_void,
            device: self.device,
            ndim: self.ctx.shape.len() as i32,
            dtype: self.dtype,
            shape: self.ctx.shape.as_mut_ptr(),
            strides: self.ctx.strides.as_mut_ptr(),
            byte_offset: self.byte_offset,
        }
    }

    /// The versioned managed tensor (DLPack 1.0). The consumer owns it and frees it with its
    /// `deleter`.
    pub fn into_versioned(mut self) -> *mut DLManagedTensorVersioned {
        let dl_tensor = self.tensor();
        let flags = if self.read_only { FLAG_READ_ONLY } else { 0 };
        let m = Box::new(DLManagedTensorVersioned {
            version: VERSION,
            manager_ctx: Box::into_raw(self.ctx) as *mut c_void,
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        });
        Box::into_raw(m)
    }

    /// The legacy managed tensor (DLPack before 1.0, `__dlpack__()` without `max_version`).
    /// The consumer owns it and frees it with its `deleter`.
    pub fn into_legacy(mut self) -> *mut DLManagedTensor {
        let dl_tensor = self.tensor();
        let m = Box::new(DLManagedTensor {
            dl_tensor,
            manager_ctx: Box::into_raw(self.ctx) as *mut c_void,
            deleter: Some(delete_legacy),
        });
        Box::into_raw(m)
    }
}

/// The deleter of [`Exported::into_versioned`]'s struct.
unsafe extern "C" fn delete_versioned(p: *mut DLManagedTensorVersioned) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` came from `Box::into_raw` in `into_versioned`, and DLPack's consumer calls the
    // deleter once; `manager_ctx` is the `Box<Ctx>` leaked there.
    unsafe {
        let m = Box::from_raw(p);
        drop(Box::from_raw(m.manager_ctx as *mut Ctx));
    }
}

/// The deleter of [`Exported::into_legacy`]'s struct.
unsafe extern "C" fn delete_legacy(p: *mut DLManagedTensor) {
    if p.is_null() {
        return;
    }
    // SAFETY: as in `delete_versioned`, for `into_legacy`'s boxes.
    unsafe {
        let m = Box::from_raw(p);
        drop(Box::from_raw(m.manager_ctx as *mut Ctx));
    }
}
