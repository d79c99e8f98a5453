//! The simulated CUDA driver's and NCCL's integration tests, one binary (one link), called in
//! process. Each test runs in a process of its own (the simulator's state is process-wide).

#[path = "../../../../../tests/support/isolation.rs"]
mod isolation;
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

// The graph cases, in deferred mode (graph.rs) and concurrent mode (graph_concurrent.rs).
#[path = "../support/graph_cases.rs"]
mod cases;

mod driver;
mod graph;
mod graph_concurrent;
mod nccl;
mod nccl_graph;
mod nccl_timeout;
mod rccl_flavor;
mod shared_object;
