//! Opening a device: its name and capabilities, read from the runtime's attributes. The device
//! itself is the shared GPU layer's ([`crate::NullDevice`]).
//!
//! Capabilities must tell the truth: a capability claimed before its call works makes the
//! conformance cases that rely on it fail, rather than skip. The null device claims nothing.

use crate::runtime::{Null, NullContext, NullDevice};
use std::collections::BTreeMap;
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::runtime::DeviceSetup;
use unihal_hal::{Capabilities, DeviceId, DeviceInfo, MandatoryCaps, OptionalCaps, Result};

/// Opens device `id`.
///
/// # Errors
/// None here; a port's returns the runtime's errors of its attribute queries.
pub(crate) fn open(rt: &'static Null, id: DeviceId) -> Result<Arc<NullDevice>> {
    let caps = Capabilities {
        mandatory: MandatoryCaps {
            // cuDeviceTotalMem / hipDeviceTotalMem / aclrtGetMemInfo(ACL_HBM_MEM)
            memory_bytes: 0,
            // The allocation alignment the runtime guarantees (256 on CUDA and HIP).
            alloc_alignment: 256,
            // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT / hipDeviceAttributeMultiprocessorCount
            compute_units: 1,
            // CU_DEVICE_ATTRIBUTE_WARP_SIZE (1 on a device without SIMT launches)
            warp_size: 1,
            // Launch limits; all zero: the device launches no kernel.
            max_grid: [0, 0, 0],
            max_block: [0, 0, 0],
            max_threads_per_block: 0,
            max_shared_mem_per_block: 0,
            // The module formats `Runtime::prepare_module` accepts (kernels.* cases).
            module_formats: Vec::new(),
        },
        optional: OptionalCaps {
            arch: None,
            event_timing: false,
            pinned_host_memory: false,
            wide_fill: false,
            host_callbacks: false,
            stream_ordered_alloc: false,
            peer_devices: Vec::new(),
            fault_poisons_device: false,
            timer_resolution_ns: None,
            bitwise_rng: false,
            negative_strides_copied: false,
            // The kernel library's ops (`unihal_kernels::support()`) once a runtime compiler
            // builds it, plus BLAS matmul (`unihal_gpu::gemm::ops_with_blas`).
            ops: BTreeMap::new(),
            // Stream capture (`cuStreamBeginCapture`-like calls) once the runtime has them.
            graphs: unihal_hal::GraphCaps::unsupported("the null runtime captures nothing"),
        },
    };
    let info = DeviceInfo {
        id,
        name: format!("null device {}", id.ordinal),
        vendor: "none".into(),
    };
    Ok(GpuDevice::<Null>::new(
        rt,
        DeviceSetup {
            ctx: NullContext { id },
            info,
            caps,
        },
    ))
}
