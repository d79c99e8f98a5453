//! # unihal-codeobj: vendor module formats, read as their vendors document them
//!
//! A ground-floor crate (it depends on the HAL's error types alone), so both a backend and a
//! simulated vendor runtime read module images without either linking the other's code:
//!
//! * [`amdgpu`]: AMDGPU code objects and clang offload bundles (architecture, kernel
//!   descriptors, explicit argument sizes from the msgpack metadata), read by the HIP backend
//!   to size-check launches and by the simulated HIP runtime as AMD's loader reads them.
//!
//! Everything here is a pure function of its bytes: thread-safe, and a malformed image is an
//! `InvalidArgument` naming the source, never a panic (the fuzzable boundary).

pub mod amdgpu;
