//! unihal's collective engine over the NCCL C API, for every backend whose collective library
//! speaks it: NVIDIA's NCCL on CUDA, AMD's RCCL on ROCm and Hygon DTK.
//!
//! NCCL and RCCL export the same C API (RCCL keeps the `nccl` prefix), with two differences
//! the engine knows: the library's names and override variable, and the all-to-all entry
//! (`ncclAlltoAll` in NCCL >= 2.28.3, `ncclAllToAll` in RCCL). A [`Flavor`] holds them, and
//! the error label ("NCCL"/"RCCL") of [`unihal_hal::HalError::Vendor`]s. Nothing here names a
//! GPU runtime: a backend implements [`Platform`] (make a device current, submit library calls
//! on its native stream while keeping the buffers they use, fail a stream, defer a release) and
//! gets the whole engine:
//!
//! * [`ffi`]: the symbol table, opened through `unihal-dynlib` and never unloaded (NCCL's
//!   threads and memory may outlive every handle of ours).
//! * [`conv`]: dtypes, reductions and result codes (NCCL 2.30 added `ncclTimeout = 8`; RCCL and
//!   older NCCL stop at `ncclInProgress = 7`).
//! * [`comm`]: one rank of a communicator and its watchdog. **Never hang**: each operation has a
//!   completion event and a deadline; the watchdog polls them and `ncclCommGetAsyncError`, aborts
//!   the library's communicator past the deadline (ending its kernels) and fails the streams and
//!   the communicator with `Timeout`; a peer's abort (`ncclRemoteError`) aborts this rank with
//!   `Aborted`. **One caller at a time**: every call on a communicator holds its lock (the
//!   library's communicators are not thread-safe); abort never waits for a call blocked on its
//!   peers. Dropping the last handle destroys the communicator, or aborts it when operations are
//!   in flight or it failed.
//! * [`engine`]: [`Engine`], the HAL's `Collectives`: unique ids (128 bytes), `init_rank` and
//!   `ncclCommSplit` bounded by the timeout on a helper thread (they cannot be cancelled),
//!   `init_all`, and the capabilities (ten dtypes, five reductions in the element type, groups,
//!   split when the library has it).
//! * [`track`]: what any engine that enqueues a library's calls on device streams shares, with
//!   no library in it (operand addresses after the HAL's checks, operations in flight and the
//!   watchdog thread); the Ascend backend's HCCL engine uses it and [`engine::bounded`] too.

pub mod comm;
pub mod conv;
pub mod engine;
pub mod ffi;
pub mod platform;
pub mod track;

pub use engine::{Engine, Flavor, InstallRoot, NCCL, RCCL};
pub use platform::Platform;
