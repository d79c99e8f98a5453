//! # unihal-cpu: the always-available CPU backend
//!
//! `UNIHAL_CPU_DEVICES` virtual devices (default 4), each with its own memory budget
//! (`UNIHAL_CPU_MEMORY`, so out-of-memory is real) and a compute pool of `UNIHAL_CPU_THREADS` threads
//! for kernel launches. The backend exists so that the whole HAL contract, asynchrony included, is
//! exercised on every machine:
//!
//! * **Every stream is a real worker thread** executing its queue in order, asynchronously to the
//!   host ([`worker`]). It spins for a few microseconds after draining its queue, then sleeps; an idle
//!   process uses no CPU. A synchronous CPU backend would make the conformance suite pass vacuously.
//! * **Device memory is host memory the safe API never exposes**: buffers are opaque addresses,
//!   every access is bounds-checked at enqueue, and queued work holds its buffers, so freeing is
//!   deferred until that work is done.
//! * **Kernels are host functions** in a [`unihal_hal::HostSymbolTable`], called once per block over
//!   the grid on the device's pool, with CUDA's `kernelParams` argument convention.
//! * **Events** are record generations with completion timestamps; waits block the waiting stream's
//!   worker, across streams and devices.
//!
//! Layout: [`config`] (environment), [`memory`] (allocations and accounting), [`worker`] (the
//! queue), [`stream`], [`event`], [`module`] (modules and launch execution), [`device`], [`fault`]
//! (test-only ordering faults behind the `fault-injection` feature).

// The model-checking build (`--cfg loom`, `tests/loom.rs`) compiles only the concurrency protocols
// it checks (the stream worker, the collective rendezvous, the compute pool) and their test entry points
// ([`loom_api`]); the rest of the backend, and the heavy dependencies only it uses, are left out.
#[cfg(not(loom))]
pub mod ccl;
#[cfg(loom)]
#[allow(dead_code)] // The mailboxes (`post`, `take`) are not modelled.
mod ccl {
    pub(crate) mod rendezvous;
}
/// The device's compute pool (kernel blocks and matmul panels; the stream worker takes part).
pub(crate) mod compute;
#[cfg(not(loom))]
pub mod config;
#[cfg(not(loom))]
pub mod device;
#[cfg(not(loom))]
pub mod event;
pub mod fault;
/// Stream capture and graph replay, emulated over the stream workers' operations.
#[cfg(not(loom))]
pub mod graph;
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api;
#[cfg(not(loom))]
pub mod matmul;
#[cfg(not(loom))]
pub mod memory;
#[cfg(not(loom))]
pub mod module;
#[cfg(not(loom))]
pub mod stream;
mod worker;

#[cfg(not(loom))]
pub use config::{CpuConfig, MatmulEngine};
#[cfg(not(loom))]
pub use device::CpuDevice;
pub use fault::Fault;

#[cfg(not(loom))]
use std::any::Any;
#[cfg(not(loom))]
use std::sync::{Arc, OnceLock};
#[cfg(not(loom))]
use unihal_hal::{Backend, BackendInfo, Device, HalError, Invalid, Result};

#[cfg(not(loom))]
/// Registry name of this backend.
pub const NAME: &str = "cpu";

#[cfg(not(loom))]
/// The CPU backend. Devices are created on first probe and live as long as the backend.
pub struct CpuBackend {
    config: Option<CpuConfig>,
    ccl: ccl::CpuCollectives,
    fault: fault::FaultSwitch,
    devices: OnceLock<Result<Vec<Arc<CpuDevice>>>>,
}

#[cfg(not(loom))]
impl CpuBackend {
    /// A backend configured from the environment when first probed.
    pub fn new() -> CpuBackend {
        CpuBackend {
            config: None,
            ccl: ccl::CpuCollectives::new(),
            fault: Default::default(),
            devices: OnceLock::new(),
        }
    }

    /// A backend with an explicit configuration (ignores the environment).
    pub fn with_config(config: CpuConfig) -> CpuBackend {
        CpuBackend {
            config: Some(config),
            ..CpuBackend::new()
        }
    }

    /// A backend with one deliberate ordering fault, for tests of the conformance suite.
    #[cfg(feature = "fault-injection")]
    pub fn with_fault(config: CpuConfig, fault: Fault) -> CpuBackend {
        CpuBackend {
            config: Some(config),
            ccl: ccl::CpuCollectives::new(),
            fault: fault::FaultSwitch::new(Some(fault)),
            devices: OnceLock::new(),
        }
    }

    fn devices(&self) -> Result<&Vec<Arc<CpuDevice>>> {
        self.devices
            .get_or_init(|| {
                let cfg = match &self.config {
                    Some(c) => c.clone(),
                    None => {
                        // Settings this backend honours elsewhere are refused here, at the
                        // probe, so that a bad one fails the run instead of being ignored.
                        unihal_kernels::cpu::Isa::forced()?;
                        ccl::selected()?;
                        unihal_hal::ccl::timeout_from_env()?;
                        CpuConfig::from_env()?
                    }
                };
                tracing::info!(
                    target: "unihal::init",
                    "cpu: {} virtual devices, {} bytes and {} compute threads each, kernels {}, \
                     matmul {:?}",
                    cfg.devices,
                    cfg.memory_per_device,
                    cfg.threads_per_device,
                    unihal_kernels::cpu::Isa::selected().name(),
                    cfg.matmul
                );
                let host = Arc::new(memory::MemAccount::new(u64::MAX / 2));
                (0..cfg.devices as u32)
                    .map(|i| {
                        CpuDevice::new(
                            i,
                            cfg.devices as u32,
                            cfg.memory_per_device,
                            host.clone(),
                            cfg.threads_per_device,
                            cfg.matmul,
                            self.fault,
                        )
                    })
                    .collect()
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(not(loom))]
impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(loom))]
impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn info(&self) -> BackendInfo {
        // The CPU backend's kernels are compiled at build time and its in-process collectives
        // need no library; under `mpirun` (feature `mpi`) the collectives are MPI's.
        #[allow(unused_mut)]
        let mut libraries = Vec::new();
        match ccl::selected() {
            #[cfg(feature = "mpi")]
            Ok(ccl::Engine::Mpi) => libraries.push(match ccl::mpi::engine() {
                Ok(_) => unihal_hal::LibraryInfo::found(
                    "collectives",
                    "MPI",
                    "linked at build time".into(),
                    Some(ccl::mpi::library_version()),
                ),
                Err(e) => unihal_hal::LibraryInfo::missing("collectives", "MPI", e.to_string()),
            }),
            #[cfg(feature = "gloo")]
            Ok(ccl::Engine::Gloo) => libraries.push(unihal_hal::LibraryInfo::found(
                "collectives",
                "gloo",
                "linked at build time".into(),
                Some(ccl::gloo::GLOO_VERSION.into()),
            )),
            Ok(_) => {}
            Err(e) => libraries.push(unihal_hal::LibraryInfo::missing(
                "collectives",
                ccl::ENGINE_ENV,
                e.to_string(),
            )),
        }
        BackendInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libraries,
            simulated: false,
            concurrent: true,
        }
    }

    fn probe(&self) -> Result<usize> {
        Ok(self.devices()?.len())
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        let devices = self.devices()?;
        let d = devices.get(ordinal).ok_or_else(|| {
            HalError::invalid(
                "ordinal",
                Invalid::Value {
                    value: ordinal.to_string(),
                    accepted: format!("0..{}", devices.len()),
                },
            )
        })?;
        Ok(d.clone())
    }

    /// The engine [`ccl::selected`] names. An engine that cannot be had (an unknown
    /// `UNIHAL_CPU_CCL`, an engine not in this build, MPI failing to start) is `None`, with the
    /// reason logged and in [`Backend::info`].
    fn collectives(&self) -> Option<&dyn unihal_hal::Collectives> {
        match ccl::selected() {
            Ok(ccl::Engine::InProcess) => Some(&self.ccl),
            #[cfg(feature = "mpi")]
            Ok(ccl::Engine::Mpi) => match ccl::mpi::engine() {
                Ok(e) => Some(e),
                Err(e) => {
                    tracing::error!(target: "unihal::coll", "the MPI collective engine is unavailable: {e}");
                    None
                }
            },
            #[cfg(feature = "gloo")]
            Ok(ccl::Engine::Gloo) => Some(ccl::gloo::engine()),
            #[allow(unreachable_patterns)]
            Ok(_) => None,
            Err(e) => {
                tracing::error!(target: "unihal::coll", "no CPU collective engine: {e}");
                None
            }
        }
    }

    fn conformance_manifest(&self) -> &'static str {
        include_str!("../conformance.manifest")
    }

    fn test_kernels(&self, device: &dyn unihal_hal::Device) -> Option<unihal_hal::ModuleSource> {
        unihal_kernels::testing::module_for(&device.capabilities().mandatory.module_formats)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(not(loom))]
impl CpuBackend {
    /// The same backend with another collective timeout.
    pub fn with_ccl_timeout(mut self, timeout: std::time::Duration) -> CpuBackend {
        self.ccl = ccl::CpuCollectives::new().with_timeout(timeout);
        self
    }
}
