//! # unihal-gpu: what backends over vendor GPU runtimes share
//!
//! CUDA, HIP (AMD ROCm and Hygon DTK) and the next GPU-like runtimes differ in their C APIs, not
//! in what a backend must build on top of them. What does not name a vendor lives here, once:
//!
//! * [`kernel_cache`]: the portable kernel library compiled by a runtime compiler (NVRTC,
//!   hiprtc) for a device's exact architecture, cached in memory for the process and on disk.
//!   An entry is keyed on everything that changes the result (source hash, target architecture,
//!   compiler version, compile options, driver or runtime version) and carries a checksum: a
//!   corrupt or foreign file is recompiled, never trusted.
//! * [`gemm`]: row-major `C = A·B` over the HAL's strided views as one strided-batched
//!   column-major GEMM (`Cᵀ = Bᵀ·Aᵀ`), the form cuBLAS, hipBLAS and rocBLAS take; layouts it
//!   cannot express say so, and the backend runs the portable GEMM instead. A host emulation of
//!   the BLAS indexing checks the mapping in the tests.
//!
//! * [`retention`]: what queued work on a vendor stream uses, kept until an event recorded after
//!   it completes (batched seals, host-buffer uses sealed at once, a synchronisation retires only
//!   what it covered, no error path releases what work still uses, host callbacks end the uses
//!   queued before them, a dropped stream never waits).
//!
//! ## The shared GPU backend
//!
//! Above the raw calls, a GPU backend is the same code whatever the vendor: a backend implements
//! [`runtime::Runtime`] (its symbol table's calls, each mapping the vendor's failure to a
//! [`unihal_hal::HalError::Vendor`] that names the call, plus hooks for what differs: module
//! formats, the kernel library's compiler, BLAS) and opens its devices as
//! [`device::GpuDevice`]s. Everything the HAL's rules need is written once here:
//!
//! * [`device`]: memory (pinned host memory zeroed before safe code sees it), peer access
//!   enabled on first use, the kernel library loaded once per device, a pool of BLAS handles;
//! * [`stream`]: the HAL's argument checks, what queued work keeps (on [`retention`]), sticky
//!   errors after a device fault or a panicking host callback, host callbacks that release the
//!   host-buffer uses queued before them, library ops planned by `unihal_kernels::plan`, and a
//!   drop that never waits;
//! * [`event`], [`module`], [`memory`]: the HAL objects over the runtime's handles;
//! * [`deferred`]: releases triggered inside a host callback (where runtimes forbid their own
//!   calls) run at the next call outside one;
//! * [`platform`]: the `unihal-ccl` platform, so NCCL and RCCL run on any such backend;
//! * [`backend`]: `RuntimeBackend<R>`, the `unihal_hal::Backend` of every vendor runtime.
//!
//! The collective engine over the NCCL API lives in `unihal-ccl`, library loading in
//! `unihal-dynlib`, module formats (AMDGPU code objects) in `unihal-codeobj`.

pub mod backend;
pub mod deferred;
pub mod device;
pub mod event;
pub mod gemm;
pub mod graph;
pub mod kernel_cache;
pub mod library;
pub mod memory;
pub mod module;
pub mod platform;
pub use unihal_hal::retention;
pub mod runtime;
pub mod stream;
pub mod vs_direct;
