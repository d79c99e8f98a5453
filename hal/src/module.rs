//! Kernel modules and functions, and the host-kernel ABI shared by the CPU backend and simulators.

use crate::device::DeviceId;
use crate::error::Result;
use serde::Serialize;
use std::any::Any;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// Formats of kernel modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ModuleFormat {
    /// A table of host functions (CPU backend, simulated runtimes).
    HostSymbols,
    /// NVIDIA PTX text.
    Ptx,
    /// NVIDIA cubin (ELF for one SM architecture).
    Cubin,
    /// AMD code object (ELF for one gfx architecture), also Hygon DCU.
    HipCodeObject,
    /// Huawei Ascend kernel binary.
    AscendBinary,
}

/// A module to load, in one of the [`ModuleFormat`]s.
#[derive(Clone)]
#[non_exhaustive]
pub enum ModuleSource {
    HostSymbols(Arc<HostSymbolTable>),
    Ptx(String),
    Cubin(Vec<u8>),
    HipCodeObject(Vec<u8>),
    AscendBinary(Vec<u8>),
}

impl ModuleSource {
    /// The format of this source.
    pub fn format(&self) -> ModuleFormat {
        match self {
            ModuleSource::HostSymbols(_) => ModuleFormat::HostSymbols,
            ModuleSource::Ptx(_) => ModuleFormat::Ptx,
            ModuleSource::Cubin(_) => ModuleFormat::Cubin,
            ModuleSource::HipCodeObject(_) => ModuleFormat::HipCodeObject,
            ModuleSource::AscendBinary(_) => ModuleFormat::AscendBinary,
        }
    }
}

impl fmt::Debug for ModuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModuleSource::{:?}", self.format())
    }
}

/// What a host kernel sees of its launch: one call runs one block.
///
/// `#[repr(C)]` because host kernels are `extern "C"` functions, possibly written in C or C++.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostLaunchCtx {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub block_idx: [u32; 3],
    /// Dynamic shared memory of this block (zeroed before the block runs), `shared_bytes` long.
    pub shared: *mut u8,
    pub shared_bytes: u64,
}

/// A host kernel: runs one block of a launch. `params` follows CUDA's `kernelParams` convention (one
/// pointer per parameter, pointing at the parameter's value). Returns 0 on success; any other value
/// is a kernel fault, sticky on the stream.
pub type HostKernelFn =
    unsafe extern "C" fn(ctx: *const HostLaunchCtx, params: *const *mut c_void) -> i32;

/// One entry of a [`HostSymbolTable`].
#[derive(Clone, Copy)]
pub struct HostKernel {
    pub func: HostKernelFn,
    /// Size in bytes of each parameter, checked against the launch arguments.
    pub param_sizes: &'static [usize],
}

/// A module of host kernels by name: the CPU backend's module format.
#[derive(Clone, Default)]
pub struct HostSymbolTable {
    entries: BTreeMap<String, HostKernel>,
}

impl HostSymbolTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a kernel under `name`.
    pub fn insert(&mut self, name: impl Into<String>, kernel: HostKernel) -> &mut Self {
        self.entries.insert(name.into(), kernel);
        self
    }

    /// Looks a kernel up.
    pub fn get(&self, name: &str) -> Option<&HostKernel> {
        self.entries.get(name)
    }

    /// Names in the table, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }
}

/// A loaded module. Ownership: functions keep their module alive. Thread safety: `Send + Sync`.
pub trait Module: Send + Sync {
    /// The device the module is loaded on.
    fn device_id(&self) -> DeviceId;
    /// The format it was loaded from.
    fn format(&self) -> ModuleFormat;
    /// Looks up a kernel entry point.
    ///
    /// # Errors
    /// [`crate::HalError::InvalidArgument`] when the module has no such entry.
    fn function(&self, name: &str) -> Result<Arc<dyn Function>>;
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}

/// A kernel entry point of a loaded [`Module`].
pub trait Function: Send + Sync {
    /// The device the function runs on.
    fn device_id(&self) -> DeviceId;
    /// Entry name.
    fn name(&self) -> &str;
    /// Parameter sizes when the module format records them (host symbols, PTX), for checking.
    fn param_sizes(&self) -> Option<&[usize]>;
    /// Downcast for the owning backend.
    fn as_any(&self) -> &dyn Any;
}
