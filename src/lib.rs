//! # unihal
//!
//! A heterogeneous device abstraction layer for distributed deep-learning training engines: one
//! framework core runs unchanged on NVIDIA GPUs, AMD GPUs and Hygon DCUs, Huawei Ascend NPUs and CPUs.
//!
//! This crate is the facade a framework links. It re-exports the HAL ([`hal`]: traits, buffers,
//! errors, capabilities) and registers the backends compiled into this build in [`registry`]; the
//! `unihal` binary lists devices and runs the conformance suite.
//!
//! ```no_run
//! // The first available accelerator, else the CPU (`UNIHAL_BACKENDS=cuda,cpu` chooses).
//! let device = unihal::open_preferred()?;
//! println!("running on {} ({})", device.id(), device.info().name);
//! let stream = device.create_stream()?;
//! let buf = device.alloc(1024)?;
//! stream.write(&buf, 0, &[1u8; 1024])?;
//! # Ok::<(), unihal::HalError>(())
//! ```
//!
//! Backends in this build: `cuda` (NVIDIA GPUs), `hip` (AMD GPUs and Hygon DCUs), `ascend` (Huawei
//! Ascend NPUs) and `cpu` (always available); each opens its vendor libraries at run time
//! (`UNIHAL_CUDA_LIB`, `UNIHAL_HIP_LIB`, `UNIHAL_ASCEND_LIB` choose them), so one binary runs
//! wherever it lands. Out-of-tree backends join at run time as plugins (`UNIHAL_PLUGIN_PATH`,
//! [`plugin`]; docs/PORTING.md).

pub mod bench;
pub mod bootstrap;
mod logging;

pub use logging::{init_logging, init_logging_or_exit};

pub use unihal_alloc as alloc;
pub use unihal_dlpack as dlpack;
pub use unihal_hal as hal;
pub use unihal_hal::*;
pub use unihal_layer as layer;
/// The validation layer's names, as before the layer also traced.
pub use unihal_layer as validate;
pub use unihal_plugin as plugin;

use std::sync::OnceLock;

/// Build information: version, git commit, target and profile.
pub const BUILD_INFO: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("UNIHAL_BUILD_COMMIT"),
    ", ",
    env!("UNIHAL_BUILD_TARGET"),
    ", ",
    env!("UNIHAL_BUILD_PROFILE"),
    ")"
);

/// The registry of the backends compiled into this build, in default preference order:
/// accelerators first, then the plugins `UNIHAL_PLUGIN_PATH` names (out-of-tree backends, see
/// [`plugin`]), the always-available CPU last. Adding a backend to this build is one more
/// `register` call here. With `UNIHAL_VALIDATE=1` (or `error`) or `UNIHAL_TRACE=FILE` every
/// backend comes wrapped in the [`layer`] (an unknown validation value is logged and taken as `1`).
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let r = Registry::new();
        let observers = layer::Observers::from_env().unwrap_or_else(|why| {
            tracing::error!(target: "unihal::env", "{why}; validating in report mode");
            layer::Observers {
                validate: Some(layer::Mode::Report),
                trace: layer::Trace::from_env(),
            }
        });
        if !observers.is_empty() {
            r.set_layer(Box::new(move |b| layer::wrap_with(b, observers.clone())))
                .expect("a fresh registry has no layer");
        }
        r.register(unihal_cuda::NAME, || {
            std::sync::Arc::new(unihal_cuda::CudaBackend::new())
        })
        .expect("built-in backend names are unique");
        r.register(unihal_hip::NAME, || {
            std::sync::Arc::new(unihal_hip::HipBackend::new())
        })
        .expect("built-in backend names are unique");
        r.register(unihal_ascend::NAME, || {
            std::sync::Arc::new(unihal_ascend::AscendBackend::new())
        })
        .expect("built-in backend names are unique");
        // Out-of-tree backends (UNIHAL_PLUGIN_PATH) come after the built-in accelerators and
        // before the CPU; one may take a built-in name only with UNIHAL_PLUGIN_REPLACE.
        let builtin = [
            unihal_cuda::NAME,
            unihal_hip::NAME,
            unihal_ascend::NAME,
            unihal_cpu::NAME,
        ];
        let plugins = unihal_plugin::host::register_from_env(&r, &builtin);
        if !plugins.contains(&unihal_cpu::NAME) {
            r.register(unihal_cpu::NAME, || {
                std::sync::Arc::new(unihal_cpu::CpuBackend::new())
            })
            .expect("built-in backend names are unique");
        }
        r
    })
}

/// Device 0 of the first backend, in preference order (`UNIHAL_BACKENDS`, else the registry's:
/// accelerators first, the CPU last), that has one. Backends passed over are logged at INFO with
/// their reason, so a run that fell back to the CPU says why.
///
/// # Errors
/// [`HalError::InvalidArgument`] for an unknown name in `UNIHAL_BACKENDS`;
/// [`HalError::Unavailable`] listing every backend's reason when none has a device.
pub fn open_preferred() -> Result<std::sync::Arc<dyn Device>> {
    let mut why = Vec::new();
    for b in registry().select_from_env()? {
        match b.probe().and_then(|_| b.open(0)) {
            Ok(d) => {
                if !why.is_empty() {
                    tracing::info!(target: "unihal::init", "using {}: passed over {}", d.id(), why.join("; "));
                }
                return Ok(d);
            }
            Err(e) => why.push(format!("{}: {e}", b.name())),
        }
    }
    Err(HalError::Unavailable {
        what: "any backend".into(),
        reason: why.join("; "),
    })
}

/// Checks the process-wide settings the library reads lazily (`UNIHAL_VALIDATE`,
/// `UNIHAL_TRACE_MAX_EVENTS`, `UNIHAL_ALLOC_CONF`, `UNIHAL_BACKENDS`), so that a program fails at
/// its start on one it cannot honour instead of running without it. Backend settings
/// (`UNIHAL_CPU_*`, `UNIHAL_CCL_TIMEOUT`) are refused by the backend's probe.
///
/// # Errors
/// [`HalError::InvalidArgument`] naming the variable, its value and what is accepted.
pub fn check_settings() -> Result<()> {
    if let Err(why) = layer::Mode::from_env() {
        let v = settings::get(layer::VALIDATE_ENV).unwrap_or_default();
        return Err(settings::refuse_with(layer::VALIDATE_ENV, &v, why));
    }
    settings::parse(layer::trace::MAX_EVENTS_ENV, |v| {
        v.parse::<usize>().ok().filter(|n| *n >= 1)
    })?;
    alloc::AllocatorConfig::parse(&settings::get("UNIHAL_ALLOC_CONF").unwrap_or_default())?;
    unihal_conformance::progress::Mode::check_env()?;
    if registry().select_from_env().is_err() {
        let v = settings::get(BACKENDS_ENV).unwrap_or_default();
        let names = registry().names().join(", ");
        let accepted = format!("a comma-separated list of the registered backends: {names}");
        return Err(settings::refuse_with(BACKENDS_ENV, &v, accepted));
    }
    Ok(())
}
