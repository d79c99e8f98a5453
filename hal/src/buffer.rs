//! Device memory: the RAII [`Buffer`] and the backend-side [`DeviceAllocation`].
//!
//! A `Buffer` is a cheap, clonable handle to a range of one allocation: an opaque device address, a
//! length and the owning device. Safe code never gets a Rust reference into device memory. The
//! allocation is released when the last handle is dropped; queued work holds handles of its own, so
//! dropping a buffer whose data a queued operation still uses is safe (the free waits for that work).
//! `Stream::free_async` frees earlier, in stream order, and marks every handle of the allocation as
//! unusable.

use crate::device::DeviceId;
use crate::error::{check_range, HalError, Invalid, Result};
use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One device allocation, implemented by a backend. Dropping it returns the memory to the device.
///
/// Thread safety: shared between host threads and stream workers, hence `Send + Sync`.
///
/// # Safety
/// Implementers promise that `addr()..addr()+len()` is device memory owned by this object for its
/// whole life, and that `device`, `addr` and `len` never change. Backends trust these values when
/// they touch memory.
pub unsafe trait DeviceAllocation: Send + Sync + 'static {
    /// The device that owns the memory.
    fn device(&self) -> DeviceId;
    /// Device address of the first byte (opaque to the HAL; a host address on the CPU backend).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> u64;
    /// True for a zero-length allocation.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

struct Shared {
    alloc: Box<dyn DeviceAllocation>,
    free_enqueued: AtomicBool,
}

/// A handle to a range of device memory. Clones share the allocation.
///
/// Ownership: the memory lives while any handle lives (including handles held by queued work), or
/// until `Stream::free_async` runs. Thread safety: `Send + Sync`; use from any thread.
#[derive(Clone)]
pub struct Buffer {
    shared: Arc<Shared>,
    offset: u64,
    len: u64,
}

impl Buffer {
    /// Wraps a backend allocation into a buffer covering all of it. For backends.
    pub fn from_allocation(alloc: Box<dyn DeviceAllocation>) -> Buffer {
        let len = alloc.len();
        Buffer {
            shared: Arc::new(Shared {
                alloc,
                free_enqueued: AtomicBool::new(false),
            }),
            offset: 0,
            len,
        }
    }

    /// The owning device.
    pub fn device(&self) -> DeviceId {
        self.shared.alloc.device()
    }

    /// Length of this view in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of this view inside its allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Device address of the first byte of this view, for interop with vendor libraries. Using it
    /// after the buffer is freed is the caller's responsibility (it is only a number).
    pub fn device_addr(&self) -> u64 {
        self.shared.alloc.addr() + self.offset
    }

    /// A checked sub-range `[offset, offset+len)` of this view, sharing the allocation.
    ///
    /// # Errors
    /// [`Invalid::OutOfRange`] when the range does not fit.
    pub fn slice(&self, offset: u64, len: u64) -> Result<Buffer> {
        check_range("slice", offset, len, self.len)?;
        Ok(Buffer {
            shared: self.shared.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// The backend allocation behind this view (for the owning backend).
    pub fn allocation(&self) -> &dyn DeviceAllocation {
        &*self.shared.alloc
    }

    /// Downcasts the allocation to the backend's type.
    ///
    /// # Errors
    /// [`Invalid::ForeignHandle`] when the buffer was made by another backend.
    pub fn downcast_allocation<T: DeviceAllocation>(&self, arg: &'static str) -> Result<&T> {
        self.shared
            .alloc
            .as_any()
            .downcast_ref::<T>()
            .ok_or_else(|| {
                HalError::invalid(
                    arg,
                    Invalid::ForeignHandle {
                        expected: std::any::type_name::<T>().to_string(),
                        found: format!(
                            "buffer [{:#x}, +{}) of {}",
                            self.shared.alloc.addr(),
                            self.shared.alloc.len(),
                            self.device()
                        ),
                    },
                )
            })
    }

    /// True when both handles view the same allocation.
    pub fn same_allocation(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// True once `Stream::free_async` has been called for this allocation.
    pub fn is_free_enqueued(&self) -> bool {
        self.shared.free_enqueued.load(Ordering::Acquire)
    }

    /// Marks the allocation freed-in-stream-order. For backends implementing `free_async`.
    ///
    /// # Errors
    /// [`Invalid::FreeEnqueued`] when it was already marked.
    pub fn mark_free_enqueued(&self, arg: &'static str) -> Result<()> {
        if self.shared.free_enqueued.swap(true, Ordering::AcqRel) {
            return Err(self.free_enqueued_error(arg));
        }
        Ok(())
    }

    fn free_enqueued_error(&self, arg: &'static str) -> HalError {
        HalError::invalid(
            arg,
            Invalid::FreeEnqueued {
                addr: self.shared.alloc.addr(),
                len: self.shared.alloc.len(),
            },
        )
    }

    /// The checks every stream operation makes on a buffer argument: it belongs to `device`, its
    /// free is not enqueued, and `[offset, offset+len)` fits the view. Returns the device address of
    /// the range's first byte.
    ///
    /// # Errors
    /// [`Invalid::WrongDevice`], [`Invalid::FreeEnqueued`] or [`Invalid::OutOfRange`].
    pub fn check_use(
        &self,
        arg: &'static str,
        device: DeviceId,
        offset: u64,
        len: u64,
    ) -> Result<u64> {
        let found = self.device();
        if found != device {
            return Err(HalError::invalid(
                arg,
                Invalid::WrongDevice {
                    expected: device,
                    found,
                },
            ));
        }
        if self.is_free_enqueued() {
            return Err(self.free_enqueued_error(arg));
        }
        check_range(arg, offset, len, self.len)?;
        Ok(self.device_addr() + offset)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer({} @ {:#x}, {} bytes)",
            self.device(),
            self.device_addr(),
            self.len
        )
    }
}
