//! The portable kernel library as loaded on one device: its module and the entries resolved so
//! far.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use unihal_hal::{Function, Module, Result};

/// The library loaded on one device. Thread-safe; entries are resolved once.
pub struct Library {
    module: Arc<dyn Module>,
    /// Which image loaded and why (e.g. "cubin", "PTX (cubin refused: ...)", "code object").
    pub loaded: String,
    functions: Mutex<HashMap<String, Arc<dyn Function>>>,
}

impl Library {
    /// The library in `module`, described by `loaded`.
    pub fn new(module: Arc<dyn Module>, loaded: impl Into<String>) -> Library {
        Library {
            module,
            loaded: loaded.into(),
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// The entry `name`, resolved once.
    ///
    /// # Errors
    /// As [`Module::function`].
    pub fn function(&self, name: &str) -> Result<Arc<dyn Function>> {
        if let Some(f) = self.functions.lock().get(name) {
            return Ok(f.clone());
        }
        let f = self.module.function(name)?;
        self.functions.lock().insert(name.to_string(), f.clone());
        Ok(f)
    }
}
