//! # A small GPT, trained data-parallel with the same source on every unihal backend
//!
//! The proof of unihal's promise: a training engine's core written once, against the HAL's traits
//! and op catalogue only, running unchanged on the CPU, NVIDIA and AMD GPUs, Hygon DCUs and Ascend
//! NPUs. Nothing in this crate names a backend; the backend is a command-line argument.
//!
//! ## Layout
//!
//! * [`data`]: the character-level corpus (the repository's documentation, so nothing to
//!   download), its held-out split, and the batches, drawn identically on every rank.
//! * [`exec`]: one rank's device, compute stream and caching allocator (every buffer comes from
//!   it), with the few helpers the model needs.
//! * [`model`]: the GPT: embeddings, pre-norm blocks of causal self-attention and a GELU MLP, final
//!   norm, output projection and cross-entropy; forward and a hand-written backward pass that
//!   reports each parameter's gradient the moment it is complete.
//! * [`reducer`]: gradient buckets all-reduced on a communication stream as the backward pass
//!   completes them, ordered by events, with the compute stream's wait measured from event
//!   timestamps.
//! * [`train`]: the step (micro-batches, loss scaling, clipping, AdamW with f32 master weights), one
//!   rank's loop, and data parallelism over the devices of one process.
//! * [`launch`]: one rank per process, started by torchrun-style launchers or `mpirun`.
//!
//! ## Numerics
//!
//! f32, or bf16/f16 compute with f32 master weights (AdamW writes the rounded copies), dynamic
//! loss scaling and skipped steps on overflow. Initial weights come from a host generator, so every
//! backend starts from the same bits and loss curves can be compared step by step.

pub mod data;
pub mod exec;
pub mod launch;
pub mod model;
pub mod reducer;
pub mod train;

pub use data::Corpus;
pub use train::{train_devices, train_rank, Report, StepStats, TrainConfig};

/// What can go wrong in a run. HAL errors are boxed: they are large and rare.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration cannot run (sizes, dtype, or what the backend supports).
    #[error("configuration: {0}")]
    Config(String),
    /// A library op failed.
    #[error("op {op}: {source}")]
    Op {
        op: String,
        source: Box<unihal::HalError>,
    },
    /// Another HAL call failed.
    #[error("{what}: {source}")]
    Hal {
        what: &'static str,
        source: Box<unihal::HalError>,
    },
    /// A rank's thread panicked.
    #[error("a rank's thread panicked")]
    Panic,
}

impl Error {
    /// Whether this is an `Aborted` HAL error: the consequence of an abort, not its cause.
    pub fn is_aborted(&self) -> bool {
        match self {
            Error::Op { source, .. } | Error::Hal { source, .. } => {
                matches!(**source, unihal::HalError::Aborted { .. })
            }
            _ => false,
        }
    }

    /// A mapper from a HAL error of call `what` (for `map_err`).
    pub fn hal(what: &'static str) -> impl FnOnce(unihal::HalError) -> Error {
        move |source| Error::Hal {
            what,
            source: Box::new(source),
        }
    }
}
