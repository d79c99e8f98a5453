//! Conversions between unihal's types and DLPack's: element types and device types.

use crate::ffi::{device_type, type_code, DLDataType};
use unihal_hal::{DType, DeviceId, HalError, Invalid, Result};

/// DLPack's data type of a unihal dtype (one lane).
pub fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F64 => (type_code::FLOAT, 64),
        DType::F32 => (type_code::FLOAT, 32),
        DType::F16 => (type_code::FLOAT, 16),
        DType::Bf16 => (type_code::BFLOAT, 16),
        DType::I8 => (type_code::INT, 8),
        DType::I16 => (type_code::INT, 16),
        DType::I32 => (type_code::INT, 32),
        DType::I64 => (type_code::INT, 64),
        DType::U8 => (type_code::UINT, 8),
        DType::U32 => (type_code::UINT, 32),
        DType::U64 => (type_code::UINT, 64),
        DType::Bool => (type_code::BOOL, 8),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// The unihal dtype of a DLPack data type.
///
/// # Errors
/// [`HalError::Unsupported`] for types unihal has no dtype for (vectors, complex, fp8, ...).
pub fn dtype_of(t: DLDataType) -> Result<DType> {
    let d = match (t.code, t.bits, t.lanes) {
        (type_code::FLOAT, 64, 1) => DType::F64,
        (type_code::FLOAT, 32, 1) => DType::F32,
        (type_code::FLOAT, 16, 1) => DType::F16,
        (type_code::BFLOAT, 16, 1) => DType::Bf16,
        (type_code::INT, 8, 1) => DType::I8,
        (type_code::INT, 16, 1) => DType::I16,
        (type_code::INT, 32, 1) => DType::I32,
        (type_code::INT, 64, 1) => DType::I64,
        (type_code::UINT, 8, 1) => DType::U8,
        (type_code::UINT, 32, 1) => DType::U32,
        (type_code::UINT, 64, 1) => DType::U64,
        (type_code::BOOL, 8, 1) => DType::Bool,
        _ => {
            return Err(HalError::unsupported(format!(
                "DLPack data type code {} with {} bits and {} lanes",
                t.code, t.bits, t.lanes
            )))
        }
    };
    Ok(d)
}

/// DLPack's device type for device memory of a unihal device: CPU 1, CUDA 2, ROCm 10 (AMD and
/// Hygon through HIP), and Ascend as the extension device 12.
///
/// # Errors
/// [`HalError::Unsupported`] for a backend DLPack has no device type for.
pub fn device_type_of(id: DeviceId) -> Result<i32> {
    match id.backend {
        "cpu" => Ok(device_type::CPU),
        "cuda" => Ok(device_type::CUDA),
        "hip" => Ok(device_type::ROCM),
        "ascend" => Ok(device_type::EXT_DEV),
        b => Err(HalError::unsupported(format!(
            "DLPack device type for backend {b}"
        ))),
    }
}

/// DLPack's device type for a unihal device's host memory (`alloc_host`): the vendor's pinned
/// host type where DLPack has one, else CPU.
pub fn host_device_type_of(id: DeviceId) -> i32 {
    match id.backend {
        "cuda" => device_type::CUDA_HOST,
        "hip" => device_type::ROCM_HOST,
        _ => device_type::CPU,
    }
}

/// The checks of an imported tensor's device against the device importing it.
///
/// # Errors
/// [`Invalid::WrongDevice`]-like [`HalError::InvalidArgument`] naming both.
pub fn check_device(id: DeviceId, device_type: i32, device_id: i32) -> Result<()> {
    let want = device_type_of(id)?;
    let ordinal_ok = device_type == device_type::CPU || device_id == id.ordinal as i32;
    if device_type != want || !ordinal_ok {
        return Err(HalError::invalid(
            "tensor",
            Invalid::Value {
                value: format!("DLPack device ({device_type}, {device_id})"),
                accepted: format!("({want}, {}) for {id}", id.ordinal),
            },
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips() {
        for d in DType::ALL {
            assert_eq!(dtype_of(dl_dtype(d)).unwrap(), d);
            assert_eq!(dl_dtype(d).bits as usize, d.size() * 8);
        }
        assert!(dtype_of(DLDataType {
            code: type_code::FLOAT,
            bits: 32,
            lanes: 4
        })
        .is_err());
        assert!(dtype_of(DLDataType {
            code: type_code::COMPLEX,
            bits: 64,
            lanes: 1
        })
        .is_err());
    }

    #[test]
    fn device_types_are_dlpack_numbers() {
        let id = |backend| DeviceId {
            backend,
            ordinal: 1,
        };
        assert_eq!(device_type_of(id("cpu")).unwrap(), 1);
        assert_eq!(device_type_of(id("cuda")).unwrap(), 2);
        assert_eq!(device_type_of(id("hip")).unwrap(), 10);
        assert_eq!(device_type_of(id("ascend")).unwrap(), 12);
        assert!(device_type_of(id("other")).is_err());
        assert!(check_device(id("cuda"), 2, 1).is_ok());
        assert!(check_device(id("cuda"), 2, 0).is_err());
        assert!(check_device(id("cuda"), 10, 1).is_err());
    }
}
