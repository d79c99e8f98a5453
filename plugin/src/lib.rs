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

pub use unihal_plugin_abi as abi;

pub mod conv;
pub mod export;
pub mod host;
