//! unihal's CPU backend as a plugin: `libunihal_cpu_plugin.so`, backend name `cpu`.
//!
//! The conformance suite runs whole through it from a host without the linked-in CPU backend
//! (`plugin/tests/cpu_plugin.rs`); a host that has the CPU backend built in loads it only with
//! `UNIHAL_PLUGIN_REPLACE=cpu`.

unihal_plugin::export_backend!(|| std::sync::Arc::new(unihal_cpu::CpuBackend::new()));
