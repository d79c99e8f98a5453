//! aclnn descriptors of one operator call, destroyed together when the call is done (the op
//! map's A.3: they must live until phase 2 returned, and may go right after).
//!
//! A tensor descriptor names the storage base (the buffer's device address), the view's shape
//! and strides in elements and its offset in elements, over a 1-D storage of the buffer's
//! length, as torch_npu passes them (A.2). A view whose byte offset is not a multiple of its
//! element size gets its own base instead. Negative strides, which `aclCreateTensor` refuses,
//! are refused here first with a typed error.

use crate::conv::{acl_dtype, FORMAT_ND};
use crate::ffi::nnopbase::Desc;
use crate::loader::Cann;
use std::ffi::CString;
use unihal_hal::{DType, HalError, Invalid, Result, Scalar, TensorView};

enum Kind {
    Tensor,
    Scalar,
    IntArray,
    BoolArray,
    List,
}

/// The descriptors of one call. Not `Send`: built, used and destroyed on one thread.
pub struct Descs<'c> {
    cann: &'c Cann,
    owned: Vec<(Kind, Desc)>,
    strings: Vec<CString>,
    error: Option<HalError>,
}

impl<'c> Descs<'c> {
    pub fn new(cann: &'c Cann) -> Descs<'c> {
        Descs {
            cann,
            owned: Vec::new(),
            strings: Vec::new(),
            error: None,
        }
    }

    fn fail(&mut self, e: HalError) -> Desc {
        self.error.get_or_insert(e);
        std::ptr::null_mut()
    }

    fn keep(&mut self, kind: Kind, d: Desc, what: &str) -> Desc {
        if d.is_null() {
            return self.fail(HalError::Internal(format!(
                "{what} returned NULL{}",
                self.cann
                    .recent_message()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            )));
        }
        self.owned.push((kind, d));
        d
    }

    /// The first error of a descriptor creation, if any (checked before phase 1).
    ///
    /// # Errors
    /// That error.
    pub fn check(&self) -> Result<()> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn raw_tensor(&mut self, t: &TensorView, shape: &[u64], strides: &[i64]) -> Desc {
        if let Some(&s) = strides.iter().find(|&&s| s < 0) {
            return self.fail(HalError::invalid(
                "tensors",
                Invalid::Value {
                    value: format!("stride {s}"),
                    accepted: "non-negative strides (aclnn takes no negative stride)".into(),
                },
            ));
        }
        let es = t.dtype.size() as u64;
        let base = t.buffer.device_addr();
        let (base, offset, storage) = if t.offset % es == 0 {
            (base, t.offset / es, t.buffer.len() / es)
        } else {
            (base + t.offset, 0, (t.buffer.len() - t.offset) / es)
        };
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let storage = [storage.max(1) as i64];
        // SAFETY: arrays of the lengths passed; the address is device memory of a live buffer
        // (the call's or a temporary, kept until the operator ran); nothing is dereferenced on
        // the host.
        let d = unsafe {
            (self.cann.nnop.create_tensor)(
                dims.as_ptr(),
                dims.len() as u64,
                acl_dtype(t.dtype),
                strides.as_ptr(),
                offset as i64,
                FORMAT_ND,
                storage.as_ptr(),
                1,
                base as *mut std::ffi::c_void,
            )
        };
        self.keep(Kind::Tensor, d, "aclCreateTensor")
    }

    /// A tensor descriptor of `t` as it is.
    pub fn tensor(&mut self, t: &TensorView) -> Desc {
        self.raw_tensor(t, &t.shape, &t.strides.clone())
    }

    /// A tensor descriptor of `t` seen with another shape and strides (broadcasts, reshapes).
    pub fn tensor_as(&mut self, t: &TensorView, shape: &[u64], strides: &[i64]) -> Desc {
        self.raw_tensor(t, shape, strides)
    }

    /// A scalar descriptor of `v` in `dtype` (the value is copied by `aclCreateScalar`).
    pub fn scalar(&mut self, v: Scalar, dtype: DType) -> Desc {
        // The value in the dtype's encoding, as `fill` writes it on every backend.
        let mut bytes = v.bits(dtype).to_le_bytes();
        // SAFETY: 8 readable bytes holding the value in the dtype's little-endian encoding
        // (narrower types in the first bytes); copied during the call.
        let d = unsafe {
            (self.cann.nnop.create_scalar)(
                bytes.as_mut_ptr() as *mut std::ffi::c_void,
                acl_dtype(dtype),
            )
        };
        self.keep(Kind::Scalar, d, "aclCreateScalar")
    }

    /// An `aclIntArray` (copied by the call).
    pub fn ints(&mut self, v: &[i64]) -> Desc {
        // SAFETY: an array of the length passed.
        let d = unsafe { (self.cann.nnop.create_int_array)(v.as_ptr(), v.len() as u64) };
        self.keep(Kind::IntArray, d, "aclCreateIntArray")
    }

    /// An `aclBoolArray` (copied by the call).
    pub fn bools(&mut self, v: &[bool]) -> Desc {
        // SAFETY: an array of the length passed.
        let d = unsafe { (self.cann.nnop.create_bool_array)(v.as_ptr(), v.len() as u64) };
        self.keep(Kind::BoolArray, d, "aclCreateBoolArray")
    }

    /// An `aclTensorList` of `ts`: the list owns its members (destroyed with it).
    pub fn list(&mut self, ts: &[TensorView]) -> Desc {
        let start = self.owned.len();
        let members: Vec<Desc> = ts.iter().map(|t| self.tensor(t)).collect();
        // The members now belong to the list (or are destroyed here if it is not made).
        let taken: Vec<(Kind, Desc)> = self.owned.drain(start..).collect();
        if members.iter().any(|m| m.is_null()) {
            self.owned.extend(taken);
            return std::ptr::null_mut();
        }
        // SAFETY: an array of live tensor descriptors of the length passed.
        let d =
            unsafe { (self.cann.nnop.create_tensor_list)(members.as_ptr(), members.len() as u64) };
        if d.is_null() {
            self.owned.extend(taken);
        }
        self.keep(Kind::List, d, "aclCreateTensorList")
    }

    /// A NUL-terminated string that lives as long as these descriptors.
    pub fn string(&mut self, s: &str) -> *const std::ffi::c_char {
        let c = CString::new(s).unwrap_or_default();
        let p = c.as_ptr();
        self.strings.push(c);
        p
    }
}

impl Drop for Descs<'_> {
    fn drop(&mut self) {
        let n = &self.cann.nnop;
        for (kind, d) in self.owned.drain(..).rev() {
            // SAFETY: descriptors created here, destroyed once (list members belong to their
            // list and are not in `owned`).
            unsafe {
                match kind {
                    Kind::Tensor => (n.destroy_tensor)(d),
                    Kind::Scalar => (n.destroy_scalar)(d),
                    Kind::IntArray => (n.destroy_int_array)(d),
                    Kind::BoolArray => (n.destroy_bool_array)(d),
                    Kind::List => (n.destroy_tensor_list)(d),
                }
            };
        }
    }
}
