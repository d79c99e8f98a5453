//! Import: a DLPack producer's tensor used by unihal streams without a copy.

use crate::conv::{check_device, dtype_of};
use crate::ffi::{
    DLManagedTensor, DLManagedTensorVersioned, DLTensor, FLAG_IS_COPIED, FLAG_READ_ONLY, VERSION,
};
use std::ptr::NonNull;
use std::sync::Arc;
use unihal_hal::op::MAX_DIMS;
use unihal_hal::{Buffer, DType, Device, HalError, Invalid, Result, TensorView};

/// The alignment DLPack asks of data pointers (as `cudaMalloc` gives).
pub const DLPACK_ALIGN: u64 = 256;

/// A tensor imported from a DLPack producer: a view of a [`Buffer`] every stream of the
/// importing device accepts.
///
/// Ownership: the producer's memory stays valid until the last handle of the buffer and the
/// last queued use of it are gone; then the producer's deleter runs (on whichever thread drops
/// last). Thread safety: `Send + Sync`.
pub struct Imported {
    view: TensorView,
    aligned: bool,
    read_only: bool,
    copied: bool,
}

impl Imported {
    /// The view: dtype, shape and strides as the producer gave them, over a buffer spanning
    /// exactly the elements' bytes.
    pub fn view(&self) -> &TensorView {
        &self.view
    }

    /// The buffer behind the view.
    pub fn buffer(&self) -> &Buffer {
        &self.view.buffer
    }

    /// False when the producer's data pointer is not 256-byte aligned, as DLPack asks (the
    /// offset of the first element is `byte_offset`'s business). Such memory is accepted;
    /// vendor libraries that assume the alignment may run slower paths on it.
    pub fn is_aligned(&self) -> bool {
        self.aligned
    }

    /// True when the producer marked the tensor read-only (`DLPACK_FLAG_BITMASK_READ_ONLY`):
    /// writing it (as an op's output or a copy's destination) breaks the producer's contract,
    /// which unihal does not check.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// True when the producer copied the data for this exchange (`DLPACK_FLAG_BITMASK_IS_COPIED`).
    pub fn is_copied(&self) -> bool {
        self.copied
    }
}

/// Calls a managed tensor's deleter when dropped: on every error path of an import, and with
/// the imported buffer's memory otherwise.
struct Deleter<T: 'static>(NonNull<T>, Option<unsafe extern "C" fn(*mut T)>);

// SAFETY: the import functions' contract: the producer's deleter may be called from any thread
// (numpy and PyTorch take the locks they need), and nothing else touches the struct.
unsafe impl<T> Send for Deleter<T> {}
// SAFETY: as above; the owner is only dropped, never shared for access.
unsafe impl<T> Sync for Deleter<T> {}

impl<T> Drop for Deleter<T> {
    fn drop(&mut self) {
        if let Some(d) = self.1 {
            // SAFETY: the producer's deleter for its own struct, called once (this owner is
            // dropped once and never cloned).
            unsafe { d(self.0.as_ptr()) }
        }
    }
}

fn null() -> HalError {
    HalError::invalid(
        "managed",
        Invalid::Other("a null DLPack managed tensor".into()),
    )
}

/// Imports a versioned DLPack tensor (`DLManagedTensorVersioned`, a `"dltensor_versioned"`
/// capsule) into `device`. Ownership passes to unihal in every case: on an error the
/// producer's deleter has run before this returns.
///
/// # Safety
/// `managed` must be a valid managed tensor its producer handed over (not used by anyone else
/// afterwards) whose data, described by its `dl_tensor`, stays valid until the deleter runs, and
/// whose deleter may be called from any thread.
///
/// # Errors
/// [`HalError::AbiMismatch`] for another major version; [`HalError::InvalidArgument`] for a
/// tensor of another device or a malformed description; [`HalError::Unsupported`] for a data
/// type unihal has no dtype for, or a backend that cannot wrap foreign memory.
pub unsafe fn import_versioned(
    device: &Arc<dyn Device>,
    managed: *mut DLManagedTensorVersioned,
) -> Result<Imported> {
    let p = NonNull::new(managed).ok_or_else(null)?;
    // SAFETY: the caller hands over a valid struct; `version` and `deleter` are where they are
    // in every major version.
    let m = unsafe { p.as_ref() };
    let owner = Deleter(p, m.deleter);
    if m.version.major != VERSION.major {
        return Err(HalError::AbiMismatch {
            what: format!(
                "DLPack {}.{} tensor; unihal reads major version {}",
                m.version.major, m.version.minor, VERSION.major
            ),
        });
    }
    let (read_only, copied) = (m.flags & FLAG_READ_ONLY != 0, m.flags & FLAG_IS_COPIED != 0);
    // SAFETY: the caller's contract covers the description.
    let mut imported = unsafe { import_tensor(device, &m.dl_tensor, Box::new(owner)) }?;
    imported.read_only = read_only;
    imported.copied = copied;
    Ok(imported)
}

/// Imports a legacy DLPack tensor (`DLManagedTensor`, a `"dltensor"` capsule) into `device`.
/// Ownership passes to unihal in every case, as for [`import_versioned`].
///
/// # Safety
/// As [`import_versioned`].
///
/// # Errors
/// As [`import_versioned`], without the version check.
pub unsafe fn import_legacy(
    device: &Arc<dyn Device>,
    managed: *mut DLManagedTensor,
) -> Result<Imported> {
    let p = NonNull::new(managed).ok_or_else(null)?;
    // SAFETY: the caller hands over a valid struct.
    let m = unsafe { p.as_ref() };
    let owner = Deleter(p, m.deleter);
    // SAFETY: the caller's contract covers the description.
    unsafe { import_tensor(device, &m.dl_tensor, Box::new(owner)) }
}

/// The parts of a `DLTensor` unihal needs, checked.
struct Described {
    dtype: DType,
    shape: Vec<u64>,
    strides: Vec<i64>,
    /// Address of element `[0, 0, ...]`.
    origin: u64,
    /// Lowest and one-past-highest byte of the elements, relative to `origin`.
    lo: i128,
    hi: i128,
}

fn bad(what: String) -> HalError {
    HalError::invalid("tensor", Invalid::Other(what))
}

/// Reads and checks a `DLTensor`.
///
/// # Safety
/// `shape` and `strides` (when not null) must point to `ndim` values.
unsafe fn describe(t: &DLTensor) -> Result<Described> {
    let dtype = dtype_of(t.dtype)?;
    let ndim = usize::try_from(t.ndim)
        .ok()
        .filter(|&n| n <= MAX_DIMS)
        .ok_or_else(|| bad(format!("ndim {} (unihal takes 0 to {MAX_DIMS})", t.ndim)))?;
    let read = |p: *mut i64, what: &str| -> Result<Vec<i64>> {
        if ndim == 0 {
            return Ok(Vec::new());
        }
        if p.is_null() {
            return Err(bad(format!("a null {what} for {ndim} dims")));
        }
        // SAFETY: the caller's contract: `ndim` values.
        Ok(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec())
    };
    let shape = read(t.shape, "shape")?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(bad(format!("negative dimension {d} in shape {shape:?}")));
    }
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let strides = if t.strides.is_null() {
        unihal_hal::op::contiguous_strides(&shape)
    } else {
        read(t.strides, "strides")?
    };
    let es = dtype.size() as i128;
    let origin = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| bad("data + byte_offset overflows".into()))?;
    let (lo, hi) = if shape.contains(&0) {
        (0, 0)
    } else {
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in shape.iter().zip(&strides) {
            let reach = (d as i128 - 1) * s as i128;
            if reach < 0 {
                lo += reach;
            } else {
                hi += reach;
            }
        }
        (lo * es, (hi + 1) * es)
    };
    if (origin as i128) + lo < 0 || (origin as i128) + hi > u64::MAX as i128 {
        return Err(bad(format!(
            "shape {shape:?} with strides {strides:?} reaches outside the address space"
        )));
    }
    Ok(Described {
        dtype,
        shape,
        strides,
        origin,
        lo,
        hi,
    })
}

/// # Safety
/// As [`import_versioned`], for `t` and the `owner` that frees it.
unsafe fn import_tensor(
    device: &Arc<dyn Device>,
    t: &DLTensor,
    owner: unihal_hal::Keep,
) -> Result<Imported> {
    check_device(device.id(), t.device.device_type, t.device.device_id)?;
    // SAFETY: the caller's contract covers shape and strides.
    let d = unsafe { describe(t) }?;
    let start = (d.origin as i128 + d.lo) as u64;
    let len = (d.hi - d.lo) as u64;
    let aligned = (t.data as u64) % DLPACK_ALIGN == 0;
    if !aligned {
        tracing::info!(
            target: "unihal::dlpack",
            addr = t.data as u64,
            "imported DLPack data is not {DLPACK_ALIGN}-byte aligned; accepted"
        );
    }
    // SAFETY: the producer's memory covers every element (the DLPack contract the caller
    // vouches for), i.e. `[start, start + len)`, until `owner` runs the deleter.
    let buffer = unsafe { device.import_memory(start, len, owner) }?;
    Ok(Imported {
        view: TensorView {
            buffer,
            offset: (-d.lo) as u64,
            dtype: d.dtype,
            shape: d.shape,
            strides: d.strides,
        },
        aligned,
        read_only: false,
        copied: false,
    })
}
