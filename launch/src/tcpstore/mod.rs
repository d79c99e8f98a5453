//! PyTorch's c10d TCPStore, both sides: [`TcpStore`] is a client (of torchrun's agent store, or
//! of rank 0's), [`TcpStoreServer`] serves one. No Rust crate speaks this protocol; this one is
//! written from PyTorch's `TCPStore` sources and checked against PyTorch
//! [`wire::PYTORCH_VERSION`] itself in both directions (`launch/tests/all/torch_store.rs`).

mod client;
mod server;
pub mod wire;

pub use client::TcpStore;
pub use server::TcpStoreServer;
