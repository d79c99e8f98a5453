//! # unihal-ascend: the Ascend backend (Huawei NPUs through CANN)
//!
//! Huawei Ascend NPUs through CANN's ACL runtime, the aclnn operator library and HCCL, all
//! opened at run time, so one unihal binary builds with no CANN and runs wherever it lands.
//!
//! * **Loading** ([`loader`], symbol tables in [`ffi`]): both CANN layouts, the classic one
//!   (`libascendcl.so`, one `libopapi.so`) and the split one of recent CANN (`libacl_rt.so`,
//!   `libopapi_math.so`, `libopapi_nn.so`, ...), from `ASCEND_TOOLKIT_HOME`,
//!   `ASCEND_HOME_PATH`, the default toolkit, `UNIHAL_ASCEND_LIB` or one override per library.
//!   `aclInit` once per process, `aclFinalize` never.
//! * **The shared GPU layer**: devices, memory, streams, events, retention and sticky errors are
//!   `unihal_gpu`'s (the same code as the CUDA and HIP backends') over [`loader::Cann`], this
//!   backend's implementation of its `Runtime` trait ([`runtime`]): each ACL call once, failures
//!   named with ACL's call name, code name and `aclGetRecentErrMsg` ([`conv`]). What ACL lacks
//!   is an honest capability: byte fills only, no stream-ordered allocation, no raw kernels.
//! * **Host callbacks** ([`report`]): ACL delivers them to a thread subscribed to the stream;
//!   each stream that gets one has such a thread.
//! * **Ops** ([`ops`]): every catalogue op through aclnn's two phases, descriptors made from the
//!   views as they are, workspaces and intermediates from the caching allocator in stream
//!   order, compositions where aclnn has no single operator. Capabilities: the SoC's table
//!   ([`soc`]) intersected with a phase-1 probe at device open. Random numbers come from the
//!   NPU's generator (`bitwise_rng` is false): statistically checked, never bit-compared.
//! * **Collectives** through HCCL ([`hccl`]).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod conv;
pub mod device;
pub mod ffi;
pub mod hccl;
pub mod loader;
pub mod ops;
pub mod report;
pub mod runtime;
pub mod soc;

pub use loader::Cann;
pub use runtime::{AscendDevice, AscendStream};

use std::any::Any;
use std::sync::Arc;
use unihal_gpu::backend::Devices;
use unihal_hal::{Backend, BackendInfo, Device, LibraryInfo, Result};

/// Registry name of this backend.
pub const NAME: &str = "ascend";

/// The Ascend backend. Devices are opened on first use and live as long as the backend.
#[derive(Default)]
pub struct AscendBackend {
    devices: Devices<Cann>,
    ccl: hccl::Engine,
}

impl AscendBackend {
    /// A backend that opens CANN on first probe (and HCCL on first use of collectives).
    pub fn new() -> AscendBackend {
        AscendBackend::default()
    }
}

impl Backend for AscendBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn info(&self) -> BackendInfo {
        let mut libraries = Vec::new();
        let (simulated, concurrent) = match loader::cann() {
            Ok(c) => {
                let sim = if c.simulated { " (simulated)" } else { "" };
                libraries.push(LibraryInfo::found(
                    "runtime",
                    &format!("ACL runtime{sim}, {} layout, SoC {}", c.layout, c.soc),
                    c.runtime_path.clone(),
                    None,
                ));
                libraries.push(LibraryInfo::found(
                    "operators",
                    "aclnn",
                    c.opapi_paths.join(":"),
                    Some(format!(
                        "{} of {} operators",
                        c.aclnn.resolved(),
                        ffi::aclnn::AclnnApi::NAMES.len()
                    )),
                ));
                libraries.push(self.ccl.info());
                (c.simulated, c.concurrent)
            }
            Err(e) => {
                let mut l = LibraryInfo::missing("runtime", "ACL runtime", e.to_string());
                if let Some(path) = loader::found() {
                    l.path = Some(path.clone());
                }
                libraries.push(l);
                (false, true)
            }
        };
        BackendInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            libraries,
            simulated,
            concurrent,
        }
    }

    fn probe(&self) -> Result<usize> {
        Ok(loader::cann()?.devices)
    }

    fn open(&self, ordinal: usize) -> Result<Arc<dyn Device>> {
        let c = loader::cann()?;
        self.devices
            .get(NAME, ordinal, c.devices, |id| device::open(c, id))
    }

    fn collectives(&self) -> Option<&dyn unihal_hal::Collectives> {
        self.ccl.available()
    }

    fn conformance_manifest(&self) -> &'static str {
        include_str!("../conformance.manifest")
    }

    fn test_kernels(&self, _device: &dyn Device) -> Option<unihal_hal::ModuleSource> {
        None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
