//! unihal's collective engine: one engine for every vendor collective library that enqueues its
//! calls on device streams — NVIDIA's NCCL, AMD's RCCL (both through the NCCL C API, [`nccl`]),
//! Huawei's HCCL (described in the Ascend backend) and whatever library a port adds next.
//!
//! A library is a [`CollectiveLib`]: a description (names, unique-id size, capabilities, and
//! what it lacks: an abort, a split, an out-of-place broadcast, an average) and its raw calls,
//! each an `unsafe fn` whose contract the engine keeps. A backend is a [`Platform`] (make a
//! device current, submit library calls on its native stream while keeping the buffers they
//! use, fail a stream, defer a release). Everything else lives here once:
//!
//! * [`track`]: the checks every operation makes before it touches its library ([`Operands`]:
//!   the sticky error, the HAL's and the platform's checks, addresses, in-place rules), the
//!   operations in flight with their completion events and deadlines, and the watchdog thread;
//! * [`comm`]: one rank ([`LibComm`]): the six collectives and grouped sends and receives over
//!   the library's raw calls; **never hang** (a watchdog fails the communicator past a deadline
//!   or on the library's asynchronous error); **one caller at a time** (every call holds the
//!   communicator's lock; an abort never waits for a call blocked on its peers); the library's
//!   abort where it has one, else stand-ins for what in-process peers wait for ([`group`]) and
//!   a reaper; the root's copy before an in-place-only broadcast; a sum and a division for an
//!   average the library lacks;
//! * [`split`]: the split of a library without one (two all-gathers on the parent, then one
//!   blocking init per child);
//! * [`engine`]: [`Engine`], the HAL's `Collectives`: unique ids, `init_rank` (and a native
//!   split) bounded by the timeout on a helper thread ([`engine::bounded`]: such calls cannot be
//!   cancelled), `init_all` in one library call or one thread per rank.

pub mod comm;
pub mod engine;
pub mod group;
pub mod library;
pub mod nccl;
pub mod platform;
pub mod split;
pub mod track;

pub use comm::LibComm;
pub use engine::Engine;
pub use library::CollectiveLib;
pub use nccl::{Flavor, InstallRoot, NCCL, RCCL};
pub use platform::Platform;
pub use track::Operands;

/// The engine of the NCCL C API (NCCL, RCCL).
pub type NcclEngine = Engine<nccl::ffi::Nccl>;
