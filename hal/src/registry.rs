//! The open, string-keyed backend registry.
//!
//! Backends register under a name; nothing in the HAL enumerates device kinds. The facade crate
//! registers the compiled-in backends; out-of-tree backends register the same way. Selection at run
//! time follows `UNIHAL_BACKENDS` (comma-separated names, order = preference).

use crate::backend::Backend;
use crate::error::{HalError, Invalid, Result};
use parking_lot::RwLock;
use std::sync::{Arc, OnceLock};

/// Environment variable selecting and ordering backends, e.g. `UNIHAL_BACKENDS=cuda,cpu`.
pub const BACKENDS_ENV: &str = "UNIHAL_BACKENDS";

type Factory = Box<dyn Fn() -> Arc<dyn Backend> + Send + Sync>;

/// What [`Registry::set_layer`] wraps every backend in.
pub type Layer = Box<dyn Fn(Arc<dyn Backend>) -> Arc<dyn Backend> + Send + Sync>;

struct Entry {
    name: String,
    factory: Factory,
    instance: OnceLock<Arc<dyn Backend>>,
}

/// A set of backends by name. Backends are constructed lazily, once, on first use.
///
/// Thread safety: registration and lookup from any thread.
#[derive(Default)]
pub struct Registry {
    entries: RwLock<Vec<Arc<Entry>>>,
    layer: OnceLock<Layer>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a backend factory under `name` (constructing a backend must not load vendor
    /// libraries; `Backend::probe` does).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] when the name is taken or empty.
    pub fn register(
        &self,
        name: &str,
        factory: impl Fn() -> Arc<dyn Backend> + Send + Sync + 'static,
    ) -> Result<()> {
        let mut entries = self.entries.write();
        if name.is_empty() || name.contains(',') || entries.iter().any(|e| e.name == name) {
            return Err(HalError::invalid(
                "name",
                Invalid::Other(format!(
                    "backend name {name:?} is empty, has a comma or is taken"
                )),
            ));
        }
        entries.push(Arc::new(Entry {
            name: name.to_string(),
            factory: Box::new(factory),
            instance: OnceLock::new(),
        }));
        Ok(())
    }

    /// Registers `factory` under `name`, replacing the backend registered under it, if any (its
    /// instance, if made, lives on with whoever holds it). For a plugin the user chose over a
    /// built-in backend of the same name (`UNIHAL_PLUGIN_REPLACE`).
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for an empty name or one with a comma.
    pub fn replace(
        &self,
        name: &str,
        factory: impl Fn() -> Arc<dyn Backend> + Send + Sync + 'static,
    ) -> Result<()> {
        let mut entries = self.entries.write();
        if name.is_empty() || name.contains(',') {
            return Err(HalError::invalid(
                "name",
                Invalid::Other(format!("backend name {name:?} is empty or has a comma")),
            ));
        }
        let entry = Arc::new(Entry {
            name: name.to_string(),
            factory: Box::new(factory),
            instance: OnceLock::new(),
        });
        match entries.iter().position(|e| e.name == name) {
            Some(i) => entries[i] = entry,
            None => entries.push(entry),
        }
        Ok(())
    }

    /// Registered names, in registration order.
    pub fn names(&self) -> Vec<String> {
        self.entries.read().iter().map(|e| e.name.clone()).collect()
    }

    /// Wraps every backend this registry constructs from now on in `layer` (a validation layer,
    /// see `unihal-validate`): callers get the wrapped backend. Set it before the first lookup;
    /// backends already constructed stay unwrapped.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] when a layer is already set.
    pub fn set_layer(&self, layer: Layer) -> Result<()> {
        self.layer.set(layer).map_err(|_| {
            HalError::invalid(
                "layer",
                Invalid::Other("this registry already wraps its backends in a layer".into()),
            )
        })
    }

    /// The backend registered under `name`.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] naming the registered backends when `name` is unknown.
    pub fn get(&self, name: &str) -> Result<Arc<dyn Backend>> {
        let entry = self.entries.read().iter().find(|e| e.name == name).cloned();
        match entry {
            Some(e) => Ok(e
                .instance
                .get_or_init(|| {
                    let backend = (e.factory)();
                    match self.layer.get() {
                        Some(layer) => layer(backend),
                        None => backend,
                    }
                })
                .clone()),
            None => Err(HalError::Unavailable {
                what: format!("backend {name:?}"),
                reason: format!(
                    "not registered in this build; registered: {}",
                    self.names().join(", ")
                ),
            }),
        }
    }

    /// The backends named by `spec` (comma-separated, order kept), or all registered backends in
    /// registration order when `spec` is `None` or blank.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] for an unknown name.
    pub fn select(&self, spec: Option<&str>) -> Result<Vec<Arc<dyn Backend>>> {
        match spec.map(str::trim).filter(|s| !s.is_empty()) {
            None => self.names().iter().map(|n| self.get(n)).collect(),
            Some(spec) => spec
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|n| self.get(n))
                .collect(),
        }
    }

    /// [`Registry::select`] with the value of `UNIHAL_BACKENDS`.
    ///
    /// # Errors
    /// As [`Registry::select`].
    pub fn select_from_env(&self) -> Result<Vec<Arc<dyn Backend>>> {
        self.select(crate::settings::get(BACKENDS_ENV).as_deref())
    }
}
