//! Capabilities: a typed, serialisable description of what a device can do.
//!
//! Split in two: [`MandatoryCaps`] every backend must fill in truthfully (limits and formats a caller
//! needs before it can do anything), and [`OptionalCaps`], features a backend may lack. The
//! conformance suite reads these to decide which cases apply: a case whose needs are missing is
//! skipped with the reason, and a backend that claims a feature and then returns
//! [`crate::HalError::Unsupported`] for it fails.

use crate::dtype::DType;
use crate::graph::GraphCaps;
use crate::module::ModuleFormat;
use crate::op::OpId;
use serde::Serialize;
use std::collections::BTreeMap;

/// Everything a caller may ask about a device before using it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capabilities {
    pub mandatory: MandatoryCaps,
    pub optional: OptionalCaps,
}

/// Limits every backend reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MandatoryCaps {
    /// Device memory in bytes (the capacity allocations are accounted against).
    pub memory_bytes: u64,
    /// Alignment in bytes guaranteed for the start of every allocation.
    pub alloc_alignment: u64,
    /// Number of compute units (SMs, CUs, AI cores, pool threads).
    pub compute_units: u32,
    /// SIMT width: 32 on NVIDIA, 64 on most AMD and Hygon parts, 1 on the CPU.
    pub warp_size: u32,
    /// Largest grid per dimension.
    pub max_grid: [u32; 3],
    /// Largest block per dimension.
    pub max_block: [u32; 3],
    /// Largest product of the block dimensions.
    pub max_threads_per_block: u32,
    /// Largest dynamic shared memory per block, in bytes.
    pub max_shared_mem_per_block: u32,
    /// Kernel module formats `Device::load_module` accepts, in order of preference.
    pub module_formats: Vec<ModuleFormat>,
}

/// Features a backend may or may not have.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptionalCaps {
    /// Device architecture (`sm_90`, `gfx90a`, `Ascend910B`, the CPU's ISA level).
    pub arch: Option<String>,
    /// Events can measure elapsed time.
    pub event_timing: bool,
    /// Page-locked host memory from `Device::alloc_host` is real pinned memory (on the CPU backend
    /// it is ordinary aligned memory, which is equivalent there).
    pub pinned_host_memory: bool,
    /// Fills with 16- and 32-bit patterns (a byte fill is always available).
    pub wide_fill: bool,
    /// `Stream::host_callback` is available.
    pub host_callbacks: bool,
    /// `Stream::alloc_async` / `free_async` are real stream-ordered calls.
    pub stream_ordered_alloc: bool,
    /// Ordinals of the devices of the same backend this device can copy to and from directly.
    pub peer_devices: Vec<u32>,
    /// A fault inside a kernel poisons the whole device context (CUDA, HIP): cases that provoke
    /// faults must run each in its own process.
    pub fault_poisons_device: bool,
    /// Resolution of event timestamps in nanoseconds, when events can time.
    pub timer_resolution_ns: Option<u64>,
    /// Random ops (`random_uniform`, `random_normal`, `dropout_forward`) produce the kernel
    /// library's Philox4x32-10 stream bit for bit, so results equal every other such backend's for
    /// the same seed and offset; false: the device's own generator (e.g. Ascend's aclnn), checked
    /// statistically.
    pub bitwise_rng: bool,
    /// Library ops run an operand with a negative stride through a dense copy (the vendor's
    /// operator library takes no negative stride, e.g. aclnn's descriptors): the same results, at
    /// the cost of a temporary and two extra passes. Views with non-negative strides (transposes,
    /// broadcasts, offsets) always go to the operators as they are.
    pub negative_strides_copied: bool,
    /// Library ops `Stream::run_op` runs, each with the dtypes it runs in (the dtype of the op's
    /// first output; for `cast`, every listed dtype converts to every other).
    pub ops: BTreeMap<OpId, Vec<DType>>,
    /// Stream capture and graph replay (see [`crate::graph`]): native, emulated or unsupported, and
    /// which operations may be captured.
    pub graphs: GraphCaps,
}

impl Capabilities {
    /// True when `op` runs in `dtype` on this device.
    pub fn supports(&self, op: OpId, dtype: DType) -> bool {
        self.optional
            .ops
            .get(&op)
            .is_some_and(|d| d.contains(&dtype))
    }
}
