//! The caching allocator's integration tests, one binary (one link): the model-based test, graph
//! pools and capture, stress, traces and PyTorch's memory tools.

// The planted defects' tests each run in a process of their own (the switches are process-wide).
#[cfg(feature = "planted-defects")]
#[path = "../../../tests/support/isolation.rs"]
mod isolation;
#[cfg(feature = "planted-defects")]
use isolation::own_process;

#[path = "../support/mod.rs"]
mod support;

mod graph_capture;
mod graph_pools;
mod model;
mod stress;
mod torch_memory;
mod traces;
