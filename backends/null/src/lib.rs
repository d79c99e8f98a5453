//! # unihal-null: the template for a new in-tree backend
//!
//! The in-tree route for a new chip: implement the shared GPU layer's
//! [`unihal_gpu::runtime::Runtime`] (the raw calls of the vendor's runtime) and
//! [`unihal_gpu::backend::VendorRuntime`] (its name, loader, report lines and collective engine),
//! and [`unihal_gpu::backend::RuntimeBackend`] is the whole `unihal_hal::Backend`: argument
//! checks, what queued work keeps, host callbacks, sticky errors, deferred releases, the caching
//! allocator's stream-ordered uses, the kernel library's plan and the collective engine's
//! platform are the shared layer's, the same code the CUDA, HIP and Ascend backends run.
//!
//! This crate is that seam with nothing behind it. Its runtime, [`Null`], opens one device whose
//! capabilities claim nothing, and every raw call is `Unsupported`, naming the vendor call it
//! maps to (CUDA driver, HIP and ACL spellings) and the conformance cases that check it. Its
//! manifest declares every case unsupported, so the suite runs end to end with every case
//! skipped for the template's reason. A port copies the crate (`backends/mychip`), renames
//! [`NAME`] and the package, registers the backend in `src/lib.rs`'s registry, and replaces the
//! calls milestone by milestone, narrowing the manifest (docs/PORTING.md).
//!
//! The files are the ones every in-tree backend has:
//!
//! * [`ffi`]: the vendor library's symbol table (one declaration per symbol);
//! * [`loader`]: opening the library at run time (`unihal_dynlib`), the device count, whether it
//!   is a simulated runtime;
//! * [`conv`]: the vendor's error codes as `HalError::Vendor` naming the call;
//! * [`runtime`]: the [`Runtime`](unihal_gpu::runtime::Runtime) implementation;
//! * [`device`]: opening a device (its capabilities, read from the runtime's attributes).
//!
//! Thread safety: as the shared layer requires, every type here is `Send + Sync`.

pub mod conv;
pub mod device;
pub mod ffi;
pub mod loader;
pub mod runtime;

pub use runtime::{Null, NullDevice};

use std::sync::Arc;
use unihal_gpu::backend::{Loaded, NoCollectives, RuntimeBackend, VendorRuntime};
use unihal_hal::{DeviceId, HalError, LibraryInfo, ModuleSource, Result};

/// Registry name of this backend: a port renames it (`[a-z0-9_-]+`).
pub const NAME: &str = "null";

/// The null backend: the shared GPU backend over [`Null`].
pub type NullBackend = RuntimeBackend<Null>;

impl VendorRuntime for Null {
    const NAME: &'static str = NAME;
    const MANIFEST: &'static str = include_str!("../conformance.manifest");
    /// A port with a collective library puts its engine here (an NCCL-API library:
    /// `unihal_gpu::platform::nccl_api_engine`); until then the backend has no collectives.
    type Ccl = NoCollectives;

    fn collective_engine() -> NoCollectives {
        NoCollectives::new(
            "the null runtime has no collective library yet (ccl.* cases are skipped)",
        )
    }

    fn load() -> Result<Loaded<Null>> {
        let l = loader::runtime()?;
        Ok(Loaded {
            rt: &runtime::NULL,
            devices: l.devices,
            line: LibraryInfo::found("runtime", "null runtime", l.path.clone(), None),
            identity: l.identity,
        })
    }

    fn missing_line(error: &HalError) -> LibraryInfo {
        LibraryInfo::missing("runtime", "null runtime", error.to_string())
    }

    fn library_lines(_: &Loaded<Null>) -> Vec<LibraryInfo> {
        // A port lists its runtime compiler (`unihal_gpu::backend::compiler_info`), BLAS and
        // operator libraries here.
        Vec::new()
    }

    fn open_device(loaded: &Loaded<Null>, id: DeviceId) -> Result<Arc<NullDevice>> {
        device::open(loaded.rt, id)
    }

    fn test_kernels(_: &NullDevice) -> Option<ModuleSource> {
        // A port that loads modules returns `unihal_kernels::testing::module_for` its formats.
        None
    }
}
