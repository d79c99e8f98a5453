//! The launch crate's integration tests, one binary (one link): the launchers' variables, the c10d
//! store and PyTorch's own TCPStore against ours.

mod launchers;
mod store;
mod torch_store;
