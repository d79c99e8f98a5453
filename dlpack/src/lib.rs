//! # unihal-dlpack: tensors exchanged with the Python ecosystem without copies
//!
//! [DLPack](https://dmlc.github.io/dlpack/latest/) is how numpy, PyTorch, JAX and CuPy hand
//! tensors to each other. This crate speaks both of its structs, the versioned
//! `DLManagedTensorVersioned` (DLPack 1.0, `__dlpack__(max_version=(1, 0))`) and the legacy
//! `DLManagedTensor`, for device memory of every backend (device types: CPU 1, CUDA 2, ROCm 10
//! for AMD and Hygon, Ascend as the extension device 12) and for HAL host buffers (CUDA host 3,
//! ROCm host 11, else CPU).
//!
//! * **Export** ([`export`], [`export_host`]): the consumer gets the view's data pointer, shape,
//!   strides and byte offset; the export keeps a handle of the buffer (or a loan of the host
//!   buffer) until the consumer's deleter runs, so the tensor outlives every handle its producer
//!   drops. The consumer's stream is ordered after the producer's queued work by an event where
//!   it is a unihal stream of the same backend, else by synchronising the producer
//!   ([`ConsumerStream`]).
//! * **Import** ([`import_versioned`], [`import_legacy`]): the producer's memory becomes a
//!   [`unihal_hal::Buffer`] through `Device::import_memory`, spanning exactly the elements'
//!   bytes, with a view that keeps the producer's strides (negative ones too); the deleter runs
//!   when the last handle and the last queued use are gone. Memory that is not 256-byte aligned
//!   is accepted and said so ([`Imported::is_aligned`]).
//!
//! Declarations of the C structs are in [`ffi`], conversions in [`conv`].

pub mod conv;
mod export;
pub mod ffi;
mod import;

pub use export::{export, export_host, ConsumerStream, Exported};
pub use import::{import_legacy, import_versioned, Imported, DLPACK_ALIGN};
