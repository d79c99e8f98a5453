//! The simulated HIP runtime's integration tests, one binary (one link): the runtime, graphs and
//! rocBLAS.

#[path = "../../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

mod graph;
mod rocblas;
mod runtime;
