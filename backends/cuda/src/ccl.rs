//! The CUDA side of the collective engine: [`CudaPlatform`], the shared GPU layer's
//! `unihal-nccl-api` platform on CUDA devices and streams (NCCL, or any library of the NCCL API).

/// CUDA devices and streams for the NCCL-API engine (`CudaPlatform::default()`).
pub type CudaPlatform = unihal_gpu::platform::GpuPlatform<crate::runtime::Cuda>;
