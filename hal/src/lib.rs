//! # unihal-hal: the hardware abstraction every unihal backend implements
//!
//! A training engine links unihal once and runs unchanged on NVIDIA GPUs, AMD GPUs and Hygon DCUs,
//! Huawei Ascend NPUs and CPUs. This crate is the contract between the two sides: it holds the traits,
//! types, errors and capabilities, and no vendor code.
//!
//! ## Object model
//!
//! ```text
//! Registry ──name──▶ Backend ──open(n)──▶ Device ─┬─ alloc / alloc_host ─▶ Buffer / HostBuffer
//!   (UNIHAL_BACKENDS)   probe()               ├─ create_stream ────────▶ Stream  (in-order queue)
//!                                             ├─ create_event ─────────▶ Event
//!                                             └─ load_module ──────────▶ Module ─▶ Function
//! ```
//!
//! * **`dyn` at the boundary.** Backends are chosen at run time and also arrive as plugins (shared
//!   libraries loaded at run time, `unihal-plugin`), so every trait is object-safe and is used as
//!   `Arc<dyn Trait>`. Calls are coarse (slices, not iterators or generics); each trait has
//!   `as_any` for a backend's own fast paths.
//! * **An open registry.** [`Registry`] maps names to backend factories; nothing enumerates device
//!   kinds. `UNIHAL_BACKENDS=cuda,cpu` selects and orders them.
//! * **Errors say what failed.** [`HalError`] separates `Unavailable`/`Unsupported` (fall back, skip)
//!   from failures; vendor failures keep library, call, code and name; misuse is `InvalidArgument`
//!   with the offending values in a typed [`Invalid`]. Asynchronous errors are sticky on their stream.
//! * **Capabilities are data.** [`Capabilities`] is serialisable, split into mandatory limits and
//!   optional features; the conformance suite decides what to run from it.
//! * **Everything is stream-ordered.** Copies, fills, launches, event record/wait, host callbacks and
//!   stream-ordered free all enqueue on a [`Stream`] and run asynchronously, in order.
//!
//! ## Memory safety rules (they hold on every backend)
//!
//! 1. A [`Buffer`] is RAII: an opaque device address, a length and the owning device, with checked
//!    sub-ranges ([`Buffer::slice`]); a view is a handle like a clone, so memory (a caching
//!    allocator's block included) stays its owner's until every clone and view is gone. Safe code never gets a Rust reference into device memory, also
//!    on the CPU backend, so code written against the CPU backend runs on a GPU.
//! 2. Asynchronous host↔device copies take a [`HostBuffer`] (HAL-owned, pinned where possible), or
//!    stage the data at enqueue (`Stream::copy_h2d_staged`). A borrowed `&[u8]` / `&mut [u8]` is only
//!    accepted by calls that complete before returning (`Stream::write`, `Stream::read`). A host
//!    buffer cannot be mapped by the host while queued work uses it, nor used by new work while
//!    mapped ([`Invalid::Busy`]).
//! 3. Dropping a `Buffer` while queued work still uses it is safe: queued work holds its own handle,
//!    so the free is deferred until that work is done. `Stream::free_async` frees in stream order and
//!    makes every handle unusable ([`Invalid::FreeEnqueued`]).
//! 4. Launching a raw kernel is `unsafe` (the HAL cannot check what a kernel does with its arguments);
//!    everything else is safe, and misuse returns an error, never undefined behaviour or a panic.
//! 5. Every HAL object is `Send + Sync` and usable from any host thread; a backend makes its
//!    device or context current itself.
//!
//! ## Logging and settings
//!
//! Backends emit `tracing` events whose targets are [`log::Subsystem`]s. `UNIHAL_LOG` (`WARN`,
//! `INFO`, `TRACE`, as NCCL_DEBUG), `UNIHAL_LOG_SUBSYS` and `UNIHAL_LOG_FILE` configure the
//! subscriber `unihal::init_logging` installs, whose lines read as NCCL's
//! (`host:pid:tid [rank] unihal INFO COLL ...`). Every `UNIHAL_*` variable is in
//! [`settings::SETTINGS`] and is read through [`settings::get`]; a value that cannot be honoured
//! is refused ([`settings::refuse`]), never ignored.

pub mod backend;
pub mod buffer;
pub mod caps;
pub mod ccl;
pub mod clock;
pub mod counters;
pub mod deadline;
pub mod device;
pub mod dtype;
pub mod error;
pub mod event;
pub mod graph;
pub mod host;
pub mod host_reduce;
pub mod launch;
pub mod log;
pub mod module;
pub mod op;
#[cfg(feature = "planted-defects")]
pub mod planted;
pub mod registry;
pub mod retention;
pub mod settings;
pub mod stream;
pub mod sync;

pub use backend::{Backend, BackendInfo, LibraryInfo};
pub use buffer::{BlockOwner, Buffer, DeviceAllocation, PendingUses, Reclaim, Segment};
pub use caps::{Capabilities, MandatoryCaps, OptionalCaps};
pub use ccl::{
    CclCaps, CollectiveOp, Collectives, CommConfig, Communicator, GroupCall, ReduceOp, UniqueId,
};
pub use device::{Device, DeviceId, DeviceInfo, MemoryInfo, NativeHandle};
pub use dtype::{DType, Element};
pub use error::{check_range, panic_message, HalError, Invalid, OomReport, Result};
pub use event::{Event, EventFlags};
pub use graph::{CaptureId, CaptureMode, CaptureStatus, Graph, GraphCaps, GraphSupport};
pub use host::{
    observe_maps, HostAllocation, HostBuffer, HostLoan, HostMap, HostUse, MapObserver, UseHolder,
};
pub use launch::{Dim3, KernelArgs, LaunchConfig};
pub use module::{
    Function, HostKernel, HostKernelFn, HostLaunchCtx, HostSymbolTable, Module, ModuleFormat,
    ModuleSource,
};
pub use op::args::{AmpScaleUpdate, OptimizerStep};
pub use op::nn::{AdamWOptions, CeOptions, CeReduction, ParamGroup, SgdOptions};
pub use op::transformer::AttentionOptions;
pub use op::{OpCall, OpClass, OpId, RngState, Scalar, TensorView};
pub use registry::{Registry, BACKENDS_ENV};
pub use stream::{check_peer_copy, FillValue, Keep, Stream, StreamId};

/// Version of the HAL crate (and of unihal: the workspace shares one version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
