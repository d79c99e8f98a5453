//! The aclnn descriptor API (`libnnopbase.so`): the one place its symbols are declared, written
//! from opbase's `acl_meta.h` documentation (the op map's section A.2). Descriptors are opaque:
//! an `aclTensor*`, `aclScalar*`, `aclIntArray*`, `aclBoolArray*` or `aclTensorList*` is a
//! [`Desc`] here, never dereferenced.

use std::ffi::c_void;

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

unihal_dynlib::symbol_table! {
    /// The resolved entry points (valid for the process: the library is never unloaded).
    pub struct NnopApi;
    required {
        create_tensor = "aclCreateTensor": CreateTensor;
        /// `aclCreateScalar(void *value, aclDataType)`: the value is copied.
        create_scalar = "aclCreateScalar": unsafe extern "C" fn(*mut c_void, i32) -> Desc;
        /// `aclCreateIntArray(const int64_t *value, uint64_t size)`: copied.
        create_int_array = "aclCreateIntArray": unsafe extern "C" fn(*const i64, u64) -> Desc;
        /// `aclCreateBoolArray(const bool *value, uint64_t size)`: copied.
        create_bool_array = "aclCreateBoolArray": unsafe extern "C" fn(*const bool, u64) -> Desc;
        /// `aclCreateTensorList(const aclTensor *const *value, uint64_t size)`: the list owns the
        /// member descriptors from then on.
        create_tensor_list = "aclCreateTensorList": unsafe extern "C" fn(*const Desc, u64) -> Desc;
        destroy_tensor = "aclDestroyTensor": unsafe extern "C" fn(Desc) -> Status;
        destroy_scalar = "aclDestroyScalar": unsafe extern "C" fn(Desc) -> Status;
        destroy_int_array = "aclDestroyIntArray": unsafe extern "C" fn(Desc) -> Status;
        destroy_bool_array = "aclDestroyBoolArray": unsafe extern "C" fn(Desc) -> Status;
        /// Also destroys every member.
        destroy_tensor_list = "aclDestroyTensorList": unsafe extern "C" fn(Desc) -> Status;
    }
    optional {
        /// `aclDestroyAclOpExecutor`: abandons an executor phase 2 will not run (optional: the
        /// docs describe it for repeatable executors only).
        destroy_executor = "aclDestroyAclOpExecutor": unsafe extern "C" fn(*mut c_void) -> Status;
    }
}
