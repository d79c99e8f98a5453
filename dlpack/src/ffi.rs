//! The DLPack C ABI (`dlpack.h`, version 1.0), declared from the specification
//! (<https://dmlc.github.io/dlpack/latest/c_api.html>): the structs, the device type numbers and
//! the data type codes.

use std::ffi::c_void;

/// The DLPack version these declarations follow.
pub const VERSION: DLPackVersion = DLPackVersion { major: 1, minor: 0 };

/// `DLDeviceType` values (`kDL...`).
pub mod device_type {
    pub const CPU: i32 = 1;
    pub const CUDA: i32 = 2;
    pub const CUDA_HOST: i32 = 3;
    pub const ROCM: i32 = 10;
    pub const ROCM_HOST: i32 = 11;
    /// Reserved for extension devices; unihal's Ascend backend uses it.
    pub const EXT_DEV: i32 = 12;
    pub const CUDA_MANAGED: i32 = 13;
}

/// `DLDataTypeCode` values (`kDL...`).
pub mod type_code {
    pub const INT: u8 = 0;
    pub const UINT: u8 = 1;
    pub const FLOAT: u8 = 2;
    pub const OPAQUE_HANDLE: u8 = 3;
    pub const BFLOAT: u8 = 4;
    pub const COMPLEX: u8 = 5;
    pub const BOOL: u8 = 6;
}

/// `DLPACK_FLAG_BITMASK_READ_ONLY`: the consumer must not write the data.
pub const FLAG_READ_ONLY: u64 = 1 << 0;
/// `DLPACK_FLAG_BITMASK_IS_COPIED`: the producer copied the data for this export.
pub const FLAG_IS_COPIED: u64 = 1 << 1;

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`: strides are in elements; a null `strides` means compact row-major.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLManagedTensor`, the legacy (unversioned) managed tensor.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLManagedTensorVersioned`: `version`, `manager_ctx` and `deleter` stay where they are in
/// every major version, so a consumer can refuse another major version and still free it.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The layout dlpack.h gives on 64-bit targets.
    #[test]
    fn layout_matches_the_c_abi() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(offset_of!(DLTensor, device), 8);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLManagedTensor, manager_ctx), 48);
        assert_eq!(offset_of!(DLManagedTensor, deleter), 56);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
    }
}
