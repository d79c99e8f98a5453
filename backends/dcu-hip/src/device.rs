//! Opening a HIP device: name, memory and capabilities from `hipDeviceGetAttribute` in the
//! numbering the loader probed, the architecture from the properties' `gcnArchName`. The device
//! itself is the shared GPU layer's ([`crate::HipDevice`]).

use crate::conv::{arch_of, vendor, vendor_of};
use crate::loader::{device_name, Hip};
use crate::runtime::{HipContext, HipDevice};
use std::collections::BTreeMap;
use std::ffi::c_int;
use std::sync::Arc;
use unihal_gpu::device::GpuDevice;
use unihal_gpu::kernel_cache::CacheKey;
use unihal_gpu::library::{self, Library};
use unihal_gpu::module::GpuModule;
use unihal_gpu::runtime::{DeviceSetup, Runtime};
use unihal_hal::{
    Capabilities, DeviceId, DeviceInfo, HalError, MandatoryCaps, ModuleFormat, ModuleSource,
    OptionalCaps, Result,
};
use unihal_kernels::rtc::helper;
use unihal_kernels::rtc::hiprtc::{Hiprtc, SAFE_ARCHS};
use unihal_kernels::source::{fnv1a, library_source, GpuTarget};

/// Bytes of the zeroed buffer the properties struct is read into (both layouts are smaller:
/// 792 bytes for ROCm 5's, 1472 for ROCm 6's `R0600`).
const PROPS_BUFFER: usize = 4096;
/// Offset of `gcnArchName[256]` in ROCm 6's `hipDeviceProp_tR0600`.
pub const ARCH_OFFSET_R0600: usize = 1160;
/// Offset of `gcnArchName[256]` in ROCm 5's `hipDeviceProp_t` (what the plain symbol fills).
pub const ARCH_OFFSET_R0000: usize = 396;

/// The `gcnArchName` of device `ordinal` (`"gfx90a:sramecc+:xnack-"`), from the R0600 entry
/// when the runtime has it, else the plain one; the name is validated, so a layout mismatch is
/// an error, never a garbage architecture.
fn gcn_arch_name(rt: &Hip, ordinal: c_int) -> Result<String> {
    let entries = [
        (
            rt.api.get_device_properties_r0600,
            ARCH_OFFSET_R0600,
            "hipGetDevicePropertiesR0600",
        ),
        (
            rt.api.get_device_properties,
            ARCH_OFFSET_R0000,
            "hipGetDeviceProperties",
        ),
    ];
    let mut tried = Vec::new();
    for (f, offset, call) in entries {
        let Some(f) = f else { continue };
        let mut buf = vec![0u8; PROPS_BUFFER];
        // SAFETY: a zeroed buffer larger than either layout of the struct, and a valid ordinal.
        let rc = unsafe { f(buf.as_mut_ptr() as *mut _, ordinal) };
        if rc != 0 {
            tried.push(vendor(&rt.api, call, rc).to_string());
            continue;
        }
        let field = &buf[offset..offset + 256];
        let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
        let name = String::from_utf8_lossy(&field[..end]).into_owned();
        match arch_of(&name) {
            Ok(_) => return Ok(name),
            Err(e) => tried.push(format!("{call}: {e}")),
        }
    }
    Err(HalError::Unavailable {
        what: "HIP device architecture".into(),
        reason: if tried.is_empty() {
            "the runtime exports no hipGetDeviceProperties entry".into()
        } else {
            tried.join("; ")
        },
    })
}

/// Whether the current device allocates in stream order: one 256-byte `hipMallocAsync` on the
/// null stream, freed at once (false without the entry points or when it fails).
fn probe_pools(rt: &Hip) -> bool {
    let (Some(malloc_async), Some(free_async)) = (rt.api.malloc_async, rt.api.free_async) else {
        return false;
    };
    let null = std::ptr::null_mut();
    let mut p = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local, a non-zero size and the null stream.
    if unsafe { malloc_async(&mut p, 256, null) } != 0 || p.is_null() {
        return false;
    }
    // SAFETY: memory just allocated on the null stream, unused, freed once; then that stream is
    // waited for (it holds nothing else of ours).
    unsafe { free_async(p, null) == 0 && (rt.api.stream_synchronize)(null) == 0 }
}

/// Opens device `id`.
///
/// # Errors
/// Vendor errors of the runtime's queries; [`HalError::Unavailable`] when the architecture
/// cannot be read.
pub(crate) fn open(rt: &'static Hip, id: DeviceId) -> Result<Arc<HipDevice>> {
    rt.enter(&HipContext { id }, "open device", || {
        let ctx = HipContext { id };
        let o = id.ordinal as c_int;
        let name = device_name(&rt.api, o)?;
        let mut total = 0usize;
        // SAFETY: an out-pointer to a local and a valid ordinal.
        rt.check("hipDeviceTotalMem", unsafe { (rt.api.device_total_mem)(&mut total, o) })?;
        let attribute = |a: i32| -> Result<i32> {
            let mut v = 0;
            // SAFETY: an out-pointer to a local and a valid ordinal.
            rt.check("hipDeviceGetAttribute", unsafe {
                (rt.api.device_get_attribute)(&mut v, a, o)
            })?;
            Ok(v)
        };
        let at = rt.numbering.attributes();
        let dims = |xs: [i32; 3]| -> Result<[u32; 3]> {
            Ok([attribute(xs[0])? as u32, attribute(xs[1])? as u32, attribute(xs[2])? as u32])
        };
        let warp = attribute(at.warp_size)? as u32;
        let arch = arch_of(&gcn_arch_name(rt, o)?).map_err(|e| HalError::Unavailable {
            what: "HIP device architecture".into(),
            reason: e,
        })?;
        let pools = match at.memory_pools {
            Some(a) => attribute(a).unwrap_or(0) != 0,
            // The legacy numbering has no attribute for it: a small stream-ordered allocation
            // on the null stream tells.
            None => probe_pools(rt),
        };
        let kernel_ops = match crate::loader::hiprtc() {
            Ok(_) if SAFE_ARCHS.contains(&arch.as_str()) || helper::helper_path().is_ok() =>
            {
                unihal_kernels::support()
            }
            Ok(_) => {
                tracing::info!(target: "unihal::kernel", "no kernel library ops on {arch}: this hiprtc compiles it only in the helper, which is not found");
                BTreeMap::new()
            }
            Err(e) => {
                tracing::info!(target: "unihal::kernel", "no kernel library ops: {e}");
                BTreeMap::new()
            }
        };
        // Captured ops run the kernel library (never rocBLAS), so they are captured only with it.
        let graphs = unihal_gpu::graph::caps(rt, !kernel_ops.is_empty());
        // rocBLAS runs matmul with or without the kernel library.
        let ops = unihal_gpu::gemm::ops_with_blas(kernel_ops, crate::loader::rocblas().is_ok());
        let mut caps = Capabilities {
            mandatory: MandatoryCaps {
                memory_bytes: total as u64,
                alloc_alignment: 256,
                compute_units: attribute(at.multiprocessor_count)? as u32,
                warp_size: warp,
                max_grid: dims(at.max_grid)?,
                max_block: dims(at.max_block)?,
                max_threads_per_block: attribute(at.max_threads_per_block)? as u32,
                max_shared_mem_per_block: attribute(at.max_shared_per_block)? as u32,
                module_formats: vec![ModuleFormat::HipCodeObject],
            },
            optional: OptionalCaps {
                arch: Some(arch.clone()),
                event_timing: true,
                pinned_host_memory: true,
                wide_fill: true,
                host_callbacks: true,
                stream_ordered_alloc: pools
                    && rt.api.malloc_async.is_some()
                    && rt.api.free_async.is_some(),
                peer_devices: rt.peers(&ctx)?,
                fault_poisons_device: true,
                timer_resolution_ns: Some(1000),
                bitwise_rng: true,
                negative_strides_copied: false,
                ops,
                // HIP's graphs when the runtime exports every entry they need.
                graphs,
            },
        };
        // Memory nodes come from the device's default pool: captured only where it has one.
        caps.optional.graphs.stream_alloc &= caps.optional.stream_ordered_alloc;
        let info = DeviceInfo {
            id,
            name,
            vendor: vendor_of(&arch, rt.dtk).into(),
        };
        Ok(GpuDevice::<Hip>::new(rt, DeviceSetup { ctx, info, caps }))
    })
}

/// A code object of `src` (file name `name`) for `arch`, from the shared cache (keyed on the
/// source hash, the architecture, hiprtc's version, path and options), hiprtc in this process
/// (the architectures it is known to handle) or the helper process (every other one:
/// `unihal_kernels::rtc::helper`).
///
/// # Errors
/// [`HalError::Unavailable`] without hiprtc (or the helper when it is needed); the compiler's
/// log; a crash of the helper naming the architecture.
pub fn code_object(src: &str, name: &str, arch: &str) -> Result<Vec<u8>> {
    let rtc = crate::loader::hiprtc()?;
    let (major, minor) = rtc.version();
    let version = format!("{major}.{minor}");
    let key = CacheKey {
        source_hash: fnv1a(src),
        target: arch.to_string(),
        compiler: format!("hiprtc {version} ({})", rtc.path()),
        options: Hiprtc::options(arch),
        runtime: String::new(),
    };
    let what = format!("hiprtc {version} compiled {name}");
    let parts = library::compiled(&key, &what, || {
        let code = if SAFE_ARCHS.contains(&arch) {
            rtc.compile(src, name, arch)?.code
        } else {
            helper::compile_in_helper(src, name, arch, &version)?
        };
        Ok(vec![("code".to_string(), code)])
    })?;
    Ok(library::part(&parts, "code"))
}

/// The portable kernel library on `dev`, compiled by hiprtc for its exact architecture and
/// loaded as a code object.
///
/// # Errors
/// As [`code_object`]; the runtime's error loading it.
pub(crate) fn load_library(dev: &Arc<HipDevice>) -> Result<Library> {
    let arch = library::device_arch(dev.as_ref());
    let code = code_object(&library_source(GpuTarget::Hip), "unihal_kernels.hip", &arch)?;
    let module = GpuModule::load(dev.clone(), &ModuleSource::HipCodeObject(code))?;
    Ok(Library::new(module, format!("code object for {arch}")))
}

/// The conformance suite's test kernels compiled for `dev`'s architecture.
///
/// # Errors
/// As [`code_object`].
pub fn test_kernels(dev: &HipDevice) -> Result<ModuleSource> {
    let arch = library::device_arch(dev);
    let code = code_object(unihal_kernels::testing::HIP_SOURCE, "uh_testing.hip", &arch)?;
    Ok(ModuleSource::HipCodeObject(code))
}
