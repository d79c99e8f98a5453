//! The GPT's integration tests, one binary (one link): gradients, held-out loss, launches that must
//! fail, processes, and the backend-under-test tests (ignored in the test command; CI runs them on
//! a simulated stack by rotation). The MPI, torchrun and vendor-process tests (features) have
//! binaries of their own.

#[path = "../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod backends;
mod failures;
mod gradients;
mod heldout;
mod launches;
mod processes;
mod trace;
