//! The HIP side of the collective engine: [`HipPlatform`], the shared GPU layer's
//! `unihal-nccl-api` platform on HIP devices and streams, on which RCCL runs.

/// HIP devices and streams for the NCCL-API engine (`HipPlatform::default()`).
pub type HipPlatform = unihal_gpu::platform::GpuPlatform<crate::loader::Hip>;
