//! The aclnn descriptor API (`libnnopbase.so`): the one place its symbols are declared, written
//! from opbase's `acl_meta.h` documentation (the op map's section A.2). Descriptors are opaque:
//! an `aclTensor*`, `aclScalar*`, `aclIntArray*`, `aclBoolArray*` or `aclTensorList*` is a
//! [`Desc`] here, never dereferenced.

use std::ffi::c_void;
use unihal_dynlib::Library;
use unihal_hal::Result;

/// An opaque descriptor pointer (`aclTensor*`, `aclScalar*`, `aclIntArray*`, ...).
pub type Desc = *mut c_void;
/// `aclnnStatus`.
pub type Status = i32;

/// `aclCreateTensor(viewDims, viewDimsNum, dataType, stride, offset, format, storageDims,
/// storageDimsNum, tensorData)`: strides and offset in elements, `tensorData` the storage base.
pub type CreateTensor = unsafe extern "C" fn(
    *const i64,
    u64,
    i32,
    *const i64,
    i64,
    i32,
    *const i64,
    u64,
    *mut c_void,
) -> Desc;

/// The resolved entry points (valid for the process: the library is never unloaded).
pub struct NnopApi {
    pub create_tensor: CreateTensor,
    /// `aclCreateScalar(void *value, aclDataType)`: the value is copied.
    pub create_scalar: unsafe extern "C" fn(*mut c_void, i32) -> Desc,
    /// `aclCreateIntArray(const int64_t *value, uint64_t size)`: copied.
    pub create_int_array: unsafe extern "C" fn(*const i64, u64) -> Desc,
    /// `aclCreateBoolArray(const bool *value, uint64_t size)`: copied.
    pub create_bool_array: unsafe extern "C" fn(*const bool, u64) -> Desc,
    /// `aclCreateTensorList(const aclTensor *const *value, uint64_t size)`: the list owns the
    /// member descriptors from then on.
    pub create_tensor_list: unsafe extern "C" fn(*const Desc, u64) -> Desc,
    pub destroy_tensor: unsafe extern "C" fn(Desc) -> Status,
    pub destroy_scalar: unsafe extern "C" fn(Desc) -> Status,
    pub destroy_int_array: unsafe extern "C" fn(Desc) -> Status,
    pub destroy_bool_array: unsafe extern "C" fn(Desc) -> Status,
    /// Also destroys every member.
    pub destroy_tensor_list: unsafe extern "C" fn(Desc) -> Status,
    /// `aclDestroyAclOpExecutor`: abandons an executor phase 2 will not run (optional: the
    /// docs describe it for repeatable executors only).
    pub destroy_executor: Option<unsafe extern "C" fn(*mut c_void) -> Status>,
}

impl NnopApi {
    /// Resolves the table.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::Unavailable`] naming a missing required symbol.
    pub fn resolve(lib: &Library) -> Result<NnopApi> {
        // SAFETY: each type is the C signature of the symbol of that name in acl_meta.h.
        unsafe {
            Ok(NnopApi {
                create_tensor: lib.get("aclCreateTensor")?,
                create_scalar: lib.get("aclCreateScalar")?,
                create_int_array: lib.get("aclCreateIntArray")?,
                create_bool_array: lib.get("aclCreateBoolArray")?,
                create_tensor_list: lib.get("aclCreateTensorList")?,
                destroy_tensor: lib.get("aclDestroyTensor")?,
                destroy_scalar: lib.get("aclDestroyScalar")?,
                destroy_int_array: lib.get("aclDestroyIntArray")?,
                destroy_bool_array: lib.get("aclDestroyBoolArray")?,
                destroy_tensor_list: lib.get("aclDestroyTensorList")?,
                destroy_executor: lib.optional("aclDestroyAclOpExecutor"),
            })
        }
    }
}
