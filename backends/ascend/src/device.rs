//! Opening an Ascend device: `aclrtSetDevice` once (it creates the device's default context,
//! which every later call makes current on its thread), memory from `aclrtGetMemInfo`, compute
//! units from `aclrtGetDeviceInfo` where the runtime has it, and the op × dtype capabilities:
//! the SoC's table ([`crate::ops::soc`]) intersected with a phase-1 probe ([`crate::ops::probe`]).

use crate::ffi::acl::{dev_attr, AclApi};
use crate::loader::Cann;
use crate::runtime::{AscendContext, AscendDevice};
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::runtime::{DeviceSetup, Runtime};
use unihal_hal::{Capabilities, DeviceId, DeviceInfo, MandatoryCaps, OptionalCaps, Result};

/// The simulated runtime's name of device `ordinal` (`None` on CANN, which names no device).
pub fn sim_name(acl: &AclApi, ordinal: i32) -> Option<String> {
    let f = acl.sim_device_name?;
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: a buffer of the length passed.
    if unsafe { f(ordinal, buf.as_mut_ptr(), buf.len()) } != 0 {
        return None;
    }
    buf[255] = 0;
    // SAFETY: NUL-terminated within the buffer (the last byte was forced to NUL).
    Some(unsafe { unihal_dynlib::c_str(buf.as_ptr()) })
}

/// Opens device `id`.
///
/// # Errors
/// Vendor errors of the runtime's calls.
pub(crate) fn open(cann: &'static Cann, id: DeviceId) -> Result<Arc<AscendDevice>> {
    let o = id.ordinal as i32;
    // SAFETY: a valid device id (below the runtime's count).
    cann.check("aclrtSetDevice", unsafe { (cann.acl.set_device)(o) })?;
    let mut raw = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    cann.check("aclrtGetCurrentContext", unsafe {
        (cann.acl.get_current_context)(&mut raw)
    })?;
    let ctx = AscendContext { id, raw };
    let (_, total) = cann.mem_info()?;
    let attr = |a: i32| -> Option<i64> {
        let f = cann.acl.get_device_info?;
        let mut v = 0i64;
        // SAFETY: an out-pointer to a local and a valid device id.
        (unsafe { f(id.ordinal, a, &mut v) } == 0).then_some(v)
    };
    let cores = attr(dev_attr::AICORE_CORE_NUM).unwrap_or(1).max(1) as u32;
    let class = crate::ops::soc::classify(&cann.soc);
    let name = sim_name(&cann.acl, o).unwrap_or_else(|| format!("Huawei {} NPU", cann.soc));
    let caps = Capabilities {
        mandatory: MandatoryCaps {
            memory_bytes: total,
            alloc_alignment: 32,
            compute_units: cores,
            warp_size: 1,
            max_grid: [0, 0, 0],
            max_block: [0, 0, 0],
            max_threads_per_block: 0,
            max_shared_mem_per_block: 0,
            module_formats: Vec::new(),
        },
        optional: OptionalCaps {
            arch: Some(cann.soc.clone()),
            event_timing: true,
            pinned_host_memory: true,
            wide_fill: true,
            host_callbacks: true,
            stream_ordered_alloc: true,
            peer_devices: cann.peers(&ctx)?,
            fault_poisons_device: true,
            timer_resolution_ns: Some(1000),
            ops: crate::ops::soc::table(class),
            bitwise_rng: false,
            negative_strides_copied: true,
            graphs: unihal_hal::GraphCaps::unsupported(
                "aclmdlRI stream capture is not implemented by this backend yet",
            ),
        },
    };
    let info = DeviceInfo {
        id,
        name,
        vendor: "Huawei".into(),
    };
    // The chip's table, intersected with what phase 1 of each operator accepts here: probed
    // on a device of the table's capabilities, then the device is made with the result.
    let probing = GpuDevice::<Cann>::new(
        cann,
        DeviceSetup {
            ctx: AscendContext { id, raw },
            info: info.clone(),
            caps: caps.clone(),
        },
    );
    let ops = crate::ops::probe::supported(cann, &probing)?;
    drop(probing);
    let mut caps = caps;
    caps.optional.ops = ops;
    Ok(GpuDevice::<Cann>::new(
        cann,
        DeviceSetup { ctx, info, caps },
    ))
}
