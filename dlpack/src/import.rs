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
/// tensor of another device or a malformed description, naming the `DLTensor` field at fault
/// (`ndim`, `shape`, `strides`, `byte_offset`): a null array, a negative dimension, or numbers
/// whose arithmetic overflows (the element count, a stride × (dimension − 1), their sum, its
/// size in bytes, `data + byte_offset`) or whose elements reach outside the address space —
/// every product and sum of the producer's numbers is checked; [`HalError::Unsupported`] for a
/// data type unihal has no dtype for, or a backend that cannot wrap foreign memory.
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

/// A malformed description: `field` names the `DLTensor` field at fault.
fn bad(field: &'static str, what: String) -> HalError {
    HalError::invalid(field, Invalid::Other(what))
}

/// Row-major strides (in elements) of `shape`, as DLPack's null `strides` means; a zero
/// dimension counts as one, as [`unihal_hal::op::contiguous_strides`] counts it.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `shape` when a stride does not fit `int64_t`.
pub(crate) fn checked_contiguous_strides(shape: &[u64]) -> Result<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut s = 1i64;
    for (i, &d) in shape.iter().enumerate().rev() {
        strides[i] = s;
        if i > 0 {
            s = i64::try_from(d.max(1))
                .ok()
                .and_then(|d| s.checked_mul(d))
                .ok_or_else(|| {
                    bad(
                        "shape",
                        format!("the row-major strides of shape {shape:?} overflow int64_t"),
                    )
                })?;
        }
    }
    Ok(strides)
}

/// The lowest and one-past-highest byte of a strided view's elements relative to its first
/// element, `None` for a view without elements. Every product and sum is checked: the numbers
/// come from outside (a producer's shape, strides and dtype).
///
/// # Errors
/// [`HalError::InvalidArgument`] naming `shape` when the element count overflows `u64`, and
/// `strides` when a dimension's reach (`stride × (dim − 1)`), their sum or its size in bytes
/// overflows.
fn byte_span(shape: &[u64], strides: &[i64], elem_size: usize) -> Result<Option<(i128, i128)>> {
    if shape.contains(&0) {
        return Ok(None);
    }
    // The element count itself (not needed for the span, but every consumer of the view
    // multiplies the shape out: it must be a number).
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            bad(
                "shape",
                format!("the element count of shape {shape:?} overflows u64"),
            )
        })?;
    let overflow = || {
        bad(
            "strides",
            format!(
                "shape {shape:?} with strides {strides:?} (elements of {elem_size} bytes) spans \
                 more than 2^127 bytes"
            ),
        )
    };
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        // d >= 1 here (no zero dimension).
        let reach = i128::from(d - 1)
            .checked_mul(i128::from(s))
            .ok_or_else(overflow)?;
        if reach < 0 {
            lo = lo.checked_add(reach).ok_or_else(overflow)?;
        } else {
            hi = hi.checked_add(reach).ok_or_else(overflow)?;
        }
    }
    let es = i128::try_from(elem_size).map_err(|_| overflow())?;
    let lo = lo.checked_mul(es).ok_or_else(overflow)?;
    let hi = hi
        .checked_add(1)
        .and_then(|h| h.checked_mul(es))
        .ok_or_else(overflow)?;
    Ok(Some((lo, hi)))
}

/// Reads and checks a `DLTensor`.
///
/// # Safety
/// `shape` and `strides` (when not null) must point to `ndim` values.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming the field at fault (`ndim`, `shape`, `strides`,
/// `byte_offset`): a count out of range, a null array, a negative dimension, or a shape,
/// strides, element size and data address whose arithmetic overflows or whose elements reach
/// outside the address space.
unsafe fn describe(t: &DLTensor) -> Result<Described> {
    let dtype = dtype_of(t.dtype)?;
    let ndim = usize::try_from(t.ndim)
        .ok()
        .filter(|&n| n <= MAX_DIMS)
        .ok_or_else(|| {
            bad(
                "ndim",
                format!("ndim {} (unihal takes 0 to {MAX_DIMS})", t.ndim),
            )
        })?;
    let read = |p: *mut i64, what: &'static str| -> Result<Vec<i64>> {
        if ndim == 0 {
            return Ok(Vec::new());
        }
        if p.is_null() {
            return Err(bad(what, format!("a null {what} for {ndim} dims")));
        }
        // SAFETY: the caller's contract: `ndim` values.
        Ok(unsafe { std::slice::from_raw_parts(p, ndim) }.to_vec())
    };
    let shape = read(t.shape, "shape")?;
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(bad(
            "shape",
            format!("negative dimension {d} in shape {shape:?}"),
        ));
    }
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let strides = if t.strides.is_null() {
        checked_contiguous_strides(&shape)?
    } else {
        read(t.strides, "strides")?
    };
    let origin = (t.data as u64).checked_add(t.byte_offset).ok_or_else(|| {
        bad(
            "byte_offset",
            format!(
                "data {:#x} + byte_offset {} overflows u64",
                t.data as u64, t.byte_offset
            ),
        )
    })?;
    let (lo, hi) = byte_span(&shape, &strides, dtype.size())?.unwrap_or((0, 0));
    let inside = i128::from(origin)
        .checked_add(lo)
        .is_some_and(|start| start >= 0)
        && i128::from(origin)
            .checked_add(hi)
            .is_some_and(|end| end <= i128::from(u64::MAX));
    if !inside {
        return Err(bad(
            "strides",
            format!(
                "shape {shape:?} with strides {strides:?} from address {origin:#x} reaches \
                 outside the address space"
            ),
        ));
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
    // Both within [0, u64::MAX] (checked by `describe`): the casts are exact.
    let start = (i128::from(d.origin) + d.lo) as u64;
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
