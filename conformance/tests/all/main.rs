//! The conformance crate's integration tests, one binary (one link): the harness, the fault
//! switch's guard, the matmul dialect, the statistical RNG checks and the stream-hold cases.

mod fault_switch;
mod harness;
mod matmul_dialect;
mod statistical_rng;
mod stream_hold;
