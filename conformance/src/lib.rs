//! # unihal-conformance: the contract every backend proves
//!
//! The suite is a library of cases plus the harness that runs them, so the same cases run under
//! `cargo test -p unihal-conformance` (one libtest trial per case per device, see [`harness`]) and
//! under `unihal conformance` (a summary table and reports).
//!
//! * **Cases never name a backend.** Each has a stable hierarchical id (`memory.copy.h2d_d2h.async`),
//!   declares the capabilities it needs ([`Need`]) and is skipped, with the reason, on a device that
//!   lacks them; a skip is never counted as a pass. A backend that returns `Unsupported` for
//!   something its capabilities claim fails.
//! * **Manifests** ([`manifest`]) list each backend's `unsupported` and `xfail` cases with reasons,
//!   and `supported` exceptions to wider entries (the most specific entry decides); verify mode
//!   fails on an unexpected pass. The CPU backend's manifest is empty.
//! * **A watchdog per case** turns a hang into a failure; **isolation** runs each case in its own
//!   process (for fault and hang cases, and for bring-up of chips whose errors poison the context).
//! * **One case at a time per device**, unless a case asks for concurrency.
//! * **Ordering is observed, not hoped for**: [`blocker::Blocker`] holds a stream back with a kernel
//!   waiting on a device flag (or, on a backend without the test kernels, a host callback waiting
//!   on a host flag), so cases inspect queued state deterministically. A test with the CPU
//!   backend's fault switch proves that named cases fail under each injected ordering bug.
//! * **Reports** ([`report`]): human summary, JSON (with a `schema_version`) and JUnit XML, each
//!   with the unihal version, the backend and vendor library versions, the device and its
//!   capability snapshot.
//! * **Progress** ([`progress`]) per device on stderr while a run goes on (`UNIHAL_PROGRESS=0`
//!   turns it off).

pub mod blocker;
pub mod case;
pub mod cases;
pub mod dead_rank;
pub mod faults;
pub mod harness;
pub mod manifest;
pub mod progress;
pub mod report;
pub mod runner;
pub mod stress;

pub use case::{expect_invalid, CaptureKind, Case, CaseResult, Ctx, Failure, Need};
pub use manifest::Manifest;
pub use report::{CaseReport, Outcome, Report};
pub use runner::{discover, run, run_case, run_child_if_requested, RunOptions, Target};
