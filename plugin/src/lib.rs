//! # unihal-plugin: backends as shared-library plugins
//!
//! A porting team adds a chip to unihal by shipping one shared library; unihal loads it at run
//! time and the framework, and the conformance suite, use it like any built-in backend. The
//! library speaks the C ABI of `abi/include/unihal_plugin.h` (crate [`abi`]), whose rules
//! docs/PLUGIN_ABI.md explains: one entry point that checks the host's ABI major and returns a
//! function table; size-prefixed tables and structs that only grow at the end; NULL entries for
//! what is unsupported; errors as a code, typed details and a message; stable numbers for
//! dtypes, ops and collectives; capabilities and the conformance manifest as data.
//!
//! Both directions live here:
//!
//! ```text
//!   a Rust backend ──export_backend!──▶ unihal_plugin_entry ─┐   (the plugin's .so)
//!   a C/C++ backend ─────────────────▶ unihal_plugin_entry ─┤
//!                                                            ▼
//!   host::load / register_from_env ──▶ PluginBackend: Backend, Device, Stream, Event,
//!   (UNIHAL_PLUGIN_PATH)                Module, Collectives, Communicator   (the host)
//! ```
//!
//! * [`export`]: any `dyn Backend` as a plugin. Handles own HAL handles; panics are caught at
//!   the boundary; the backend's own queued work keeps what it uses, as the HAL requires.
//! * [`host`]: the loader (refusals typed and logged, every attempt kept for `unihal devices`,
//!   never from the current directory, a built-in name only on request) and the wrappers that
//!   turn a table back into the HAL traits. The host makes the HAL's argument checks itself, so
//!   a plugin sees only well-formed calls, and keeps on its side what only the host can track
//!   (host-buffer uses, allocator blocks) behind plugin events, with the HAL's `Retention`.
//! * [`conv`]: the one place HAL values become ABI numbers and structs and back.
//!
//! Thread safety: every wrapper is `Send + Sync` as the HAL requires; the ABI requires the same
//! of plugins (header rule 6).

// The model-checking build (`--cfg loom`, `tests/loom.rs`) compiles only the protocol it checks
// (the recycled nodes' pool, `host/recycle.rs`) and its test entry point ([`loom_api`]); the rest
// of the crate, and the dependencies only it uses (libloading, the ABI), are left out.
#[cfg(not(loom))]
pub use unihal_plugin_abi as abi;

#[cfg(not(loom))]
pub mod conv;
#[cfg(not(loom))]
pub mod export;
#[cfg(not(loom))]
pub mod host;
#[cfg(loom)]
mod host {
    pub(crate) mod recycle;
}

/// Entry points of the loom suite (`tests/loom.rs`), compiled only under `--cfg loom`: the pool
/// of recycled nodes itself (crate-private otherwise), so that the model checker runs the
/// production code. Not an API.
#[cfg(loom)]
#[doc(hidden)]
pub mod loom_api {
    pub use crate::host::recycle::{Link, Pool, Recycle};
}
