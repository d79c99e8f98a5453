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
//! * **Collectives** through HCCL ([`ccl`]: HCCL described for the shared engine).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod ccl;
pub mod conv;
pub mod device;
pub mod ffi;
pub mod loader;
pub mod ops;
pub mod runtime;

pub use loader::Cann;
pub use runtime::{AscendDevice, AscendStream};

use std::sync::Arc;
use unihal_gpu::backend::{Loaded, RuntimeBackend, VendorRuntime};
use unihal_hal::{DeviceId, HalError, LibraryInfo, ModuleSource, Result};

/// Registry name of this backend.
pub const NAME: &str = "ascend";

/// The Ascend backend: the shared GPU backend over [`Cann`], operators through aclnn,
/// collectives through HCCL. Devices are opened on first use and live as long as the backend.
pub type AscendBackend = RuntimeBackend<Cann>;

impl VendorRuntime for Cann {
    const NAME: &'static str = NAME;
    const MANIFEST: &'static str = include_str!("../conformance.manifest");
    type Ccl = ccl::HcclEngine;

    fn collective_engine() -> ccl::HcclEngine {
        ccl::engine()
    }

    fn load() -> Result<Loaded<Cann>> {
        let c = loader::cann()?;
        let sim = if c.identity.simulated {
            " (simulated)"
        } else {
            ""
        };
        Ok(Loaded {
            rt: c,
            devices: c.devices,
            line: LibraryInfo::found(
                "runtime",
                &format!("ACL runtime{sim}, {} layout, SoC {}", c.layout, c.soc),
                c.runtime_path.clone(),
                None,
            ),
            identity: c.identity,
        })
    }

    fn missing_line(error: &HalError) -> LibraryInfo {
        let mut l = LibraryInfo::missing("runtime", "ACL runtime", error.to_string());
        if let Some(path) = loader::found() {
            l.path = Some(path.clone());
        }
        l
    }

    fn library_lines(loaded: &Loaded<Cann>) -> Vec<LibraryInfo> {
        let c = loaded.rt;
        vec![LibraryInfo::found(
            "operators",
            "aclnn",
            c.opapi_paths.join(":"),
            Some(format!(
                "{} of {} operators",
                c.aclnn.resolved(),
                ffi::aclnn::AclnnApi::NAMES.len()
            )),
        )]
    }

    fn open_device(loaded: &Loaded<Cann>, id: DeviceId) -> Result<Arc<AscendDevice>> {
        device::open(loaded.rt, id)
    }

    fn test_kernels(_: &AscendDevice) -> Option<ModuleSource> {
        None
    }
}
