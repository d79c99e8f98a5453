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
//! The collective engine over the NCCL API lives in `unihal-nccl-api`, library loading in
//! `unihal-dynlib`.

pub mod gemm;
pub mod kernel_cache;
pub mod retention;
