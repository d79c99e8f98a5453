//! The host side: loading plugins and wrapping them into the HAL traits.
//!
//! [`load`] opens one library and refuses, with a typed error and nothing else called, anything
//! that is not a plugin of this ABI major: a file the loader cannot open, a library without the
//! entry symbol, a plugin of another major, a table without a required entry, a bad name.
//! [`register_from_env`] loads every plugin `UNIHAL_PLUGIN_PATH` names into a registry; every
//! attempt, loaded or refused, is logged and kept for `unihal devices` ([`attempts`]).
//!
//! Plugins are never unloaded: a plugin's code may still run (a stream worker, a host kernel)
//! after the last HAL object is gone, and the HAL hands out `&'static` names.

mod backend;
mod ccl;
mod device;
mod event;
mod module;
mod stream;

pub use backend::PluginBackend;

use crate::conv;
use std::cell::Cell;
use std::ffi::c_char;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use unihal_hal::{BackendInfo, HalError, LibraryInfo, Registry, Result};
use unihal_plugin_abi::*;

/// `UNIHAL_PLUGIN_PATH`: plugin libraries to load, separated by `:`; an entry that is a
/// directory stands for every `*.so` file in it (sorted). Only absolute paths: a relative entry
/// is refused (never loaded from the current directory).
pub const PATH_ENV: &str = "UNIHAL_PLUGIN_PATH";
/// `UNIHAL_PLUGIN_REPLACE`: backend names (comma-separated) a plugin may take from a built-in
/// backend. Without it, a plugin named like a built-in backend is refused.
pub const REPLACE_ENV: &str = "UNIHAL_PLUGIN_REPLACE";

/// A loaded plugin: its table (entries past the plugin's table size read as NULL), where it came
/// from and what it says about itself. Lives for the whole process.
pub struct Plugin {
    pub(crate) api: UhPluginApi,
    /// The library's path.
    pub path: String,
    /// The backend name, as the HAL's `DeviceId` holds it.
    pub name: &'static str,
    /// The plugin's version, libraries and flags.
    pub info: BackendInfo,
    /// The conformance manifest the plugin ships.
    pub manifest: &'static str,
}

impl Plugin {
    /// Calls a plugin entry that reports errors in the ABI's record; `what` names the call for
    /// an entry the plugin leaves NULL (`Unsupported`).
    #[inline]
    pub(crate) fn call<F: Copy>(
        &self,
        entry: Option<F>,
        what: &str,
        f: impl FnOnce(F, *mut UhError) -> UhStatus,
    ) -> Result<()> {
        let Some(entry) = entry else {
            return Err(self.unsupported(what));
        };
        with_record(|rec| match f(entry, rec) {
            UH_OK => Ok(()),
            // SAFETY: the record is ours and the plugin wrote it (or left it as made).
            status => Err(conv::get_error(status, unsafe { &*rec })),
        })
    }

    pub(crate) fn unsupported(&self, what: &str) -> HalError {
        HalError::unsupported(format!("{what} (the plugin {} leaves it out)", self.name))
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plugin({} from {})", self.name, self.path)
    }
}

thread_local! {
    /// One error record per thread, reused (a record is 1.7 KiB: zeroing one per call would
    /// cost more than the call). Taken out for the call, so a nested call makes its own.
    static RECORD: Cell<Option<Box<UhError>>> = const { Cell::new(None) };
}

fn with_record<R>(f: impl FnOnce(*mut UhError) -> R) -> R {
    // `try_with`: a call from a thread-local destructor (a HAL object dropped at thread exit)
    // gets a fresh record instead of a panic.
    let mut rec = RECORD
        .try_with(|c| c.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::new(UhError::new()));
    rec.code = UH_OK;
    let r = f(&mut *rec);
    let _ = RECORD.try_with(|c| c.set(Some(rec)));
    r
}

/// One attempt to load a plugin: the path and the backend it registered, or why it was refused.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub path: String,
    pub outcome: std::result::Result<String, String>,
}

static ATTEMPTS: parking_lot::Mutex<Vec<Attempt>> = parking_lot::Mutex::new(Vec::new());

/// Every plugin load attempted in this process, in order, with its outcome.
pub fn attempts() -> Vec<Attempt> {
    ATTEMPTS.lock().clone()
}

fn record(path: &str, outcome: std::result::Result<String, String>) {
    match &outcome {
        Ok(name) => {
            tracing::info!(target: "unihal::plugin", "loaded plugin {path}: backend {name}")
        }
        Err(why) => tracing::warn!(target: "unihal::plugin", "refused plugin {path}: {why}"),
    }
    ATTEMPTS.lock().push(Attempt {
        path: path.to_string(),
        outcome,
    });
}

/// The host's services for plugins.
static HOST_API: UhHostApi = UhHostApi {
    size: std::mem::size_of::<UhHostApi>() as u32,
    abi_major: UH_ABI_MAJOR,
    abi_minor: UH_ABI_MINOR,
    reserved: 0,
    log: Some(host_log),
};

unsafe extern "C" fn host_log(level: i32, target: *const c_char, message: *const c_char) {
    // SAFETY: NUL-terminated strings or NULL (header); copied here.
    let (t, m) = unsafe { (conv::opt_cstr(target), conv::opt_cstr(message)) };
    let (t, m) = (t.unwrap_or_default(), m.unwrap_or_default());
    match level {
        UH_LOG_ERROR => tracing::error!(target: "unihal::plugin", "{t}: {m}"),
        UH_LOG_WARN => tracing::warn!(target: "unihal::plugin", "{t}: {m}"),
        UH_LOG_INFO => tracing::info!(target: "unihal::plugin", "{t}: {m}"),
        UH_LOG_DEBUG => tracing::debug!(target: "unihal::plugin", "{t}: {m}"),
        _ => tracing::trace!(target: "unihal::plugin", "{t}: {m}"),
    }
}

fn abi(what: String) -> HalError {
    HalError::AbiMismatch { what }
}

/// Loads the plugin library at `path` (never searched for: the path is used as given) and
/// checks it, calling nothing but its entry and `info` (and nothing after the entry when the
/// major differs).
///
/// # Errors
/// [`HalError::Unavailable`] when the library cannot be opened (the loader's message);
/// [`HalError::AbiMismatch`] for a library without `unihal_plugin_entry`, a plugin of another
/// major version, a table without a required entry or a plugin without a valid name; the
/// plugin's own error when its entry refuses the host.
pub fn load(path: &Path) -> Result<&'static Plugin> {
    let shown = path.display().to_string();
    // SAFETY: loading a library runs its initialisers; the user named this file as a unihal
    // plugin (UNIHAL_PLUGIN_PATH or an explicit path), which is the trust the HAL asks for.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| HalError::Unavailable {
        what: format!("plugin {shown}"),
        reason: unihal_dynlib::elf::explain(path, e.to_string()),
    })?;
    // SAFETY: the symbol's type is the header's entry type; a library that exports the name
    // with another type is not a unihal plugin, which the name forbids.
    let entry: libloading::Symbol<UhPluginEntryFn> =
        unsafe { lib.get(UH_PLUGIN_ENTRY_SYMBOL.as_bytes()) }.map_err(|_| {
            abi(format!(
                "{shown} is not a unihal plugin: it exports no `{UH_PLUGIN_ENTRY_SYMBOL}`"
            ))
        })?;
    let entry = *entry;
    // Plugins are never unloaded (module docs).
    std::mem::forget(lib);
    let mut rec = Box::new(UhError::new());
    // SAFETY: the entry's contract: our services (valid forever) and an error record.
    let table = unsafe { entry(&HOST_API, &mut *rec) };
    if table.is_null() {
        let e = conv::get_error(
            if rec.code == UH_OK {
                UH_ERR_INTERNAL
            } else {
                rec.code
            },
            &rec,
        );
        return Err(match e {
            HalError::AbiMismatch { what } => abi(format!("{shown}: {what}")),
            e => e,
        });
    }
    // SAFETY: a non-null table begins with the head frozen across majors.
    let head = unsafe { *(table as *const UhTableHead) };
    if head.abi_major != UH_ABI_MAJOR {
        return Err(abi(format!(
            "{shown} is a plugin of ABI {}.{}; this unihal speaks {UH_ABI_MAJOR}.{UH_ABI_MINOR}",
            head.abi_major, head.abi_minor
        )));
    }
    let size = head.size as usize;
    if size < std::mem::size_of::<UhTableHead>() {
        return Err(abi(format!("{shown}: a table of {size} bytes")));
    }
    // Entries past the plugin's table size read as NULL (header rule 2).
    let mut api = std::mem::MaybeUninit::<UhPluginApi>::zeroed();
    // SAFETY: the plugin's table holds `size` bytes; we copy at most our struct's size into a
    // zeroed struct, and an all-zero UhPluginApi is valid (integers and NULL `Option<fn>`s).
    let api = unsafe {
        std::ptr::copy_nonoverlapping(
            table as *const u8,
            api.as_mut_ptr() as *mut u8,
            size.min(std::mem::size_of::<UhPluginApi>()),
        );
        api.assume_init()
    };
    let required = [
        ("info", api.info.is_some()),
        ("probe", api.probe.is_some()),
        ("device_open", api.device_open.is_some()),
        ("device_release", api.device_release.is_some()),
        ("device_props", api.device_props.is_some()),
        ("device_synchronize", api.device_synchronize.is_some()),
        ("mem_alloc", api.mem_alloc.is_some()),
        ("mem_release", api.mem_release.is_some()),
        ("host_alloc", api.host_alloc.is_some()),
        ("host_release", api.host_release.is_some()),
        ("stream_create", api.stream_create.is_some()),
        ("stream_release", api.stream_release.is_some()),
        ("copy_h2d", api.copy_h2d.is_some()),
        ("copy_d2h", api.copy_d2h.is_some()),
        ("copy_d2d", api.copy_d2d.is_some()),
        ("stream_synchronize", api.stream_synchronize.is_some()),
        ("stream_query", api.stream_query.is_some()),
        ("event_create", api.event_create.is_some()),
        ("event_release", api.event_release.is_some()),
        ("event_record", api.event_record.is_some()),
        ("stream_wait_event", api.stream_wait_event.is_some()),
        ("event_query", api.event_query.is_some()),
        ("event_synchronize", api.event_synchronize.is_some()),
    ];
    let missing: Vec<&str> = required.iter().filter(|r| !r.1).map(|r| r.0).collect();
    if !missing.is_empty() {
        return Err(abi(format!(
            "{shown} leaves out required entries: {}",
            missing.join(", ")
        )));
    }
    // SAFETY: `info` is present (checked) and returns data valid forever (header rule 5).
    let info = unsafe { (api.info.expect("checked"))() };
    if info.is_null() {
        return Err(abi(format!("{shown}: `info` returned NULL")));
    }
    // SAFETY: non-null, valid forever; fields read within its size only.
    let info = unsafe { &*info };
    let has = |end: usize| info.size as usize >= end;
    // SAFETY: strings and arrays valid forever (header rule 5).
    let name = unsafe { conv::opt_cstr(info.name) }.unwrap_or_default();
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    {
        return Err(abi(format!(
            "{shown}: backend name {name:?} is not [a-z0-9_-]+"
        )));
    }
    let libraries = if has(std::mem::size_of::<UhPluginInfo>()) {
        // SAFETY: as above.
        unsafe { conv::slice(info.libraries, info.n_libraries as usize) }
            .iter()
            .map(|l| {
                // SAFETY: as above.
                let s = |p| unsafe { conv::opt_cstr(p) };
                LibraryInfo {
                    role: s(l.role).unwrap_or_default(),
                    name: s(l.name).unwrap_or_default(),
                    path: s(l.path),
                    version: s(l.version),
                    error: s(l.error),
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    // SAFETY: as above.
    let manifest = unsafe { conv::opt_cstr(info.manifest) }.unwrap_or_default();
    let plugin = Plugin {
        api,
        path: shown.clone(),
        name: conv::intern(&name),
        info: BackendInfo {
            name: name.clone(),
            // SAFETY: as above.
            version: format!(
                "{} (plugin {shown}, ABI {}.{})",
                // SAFETY: the entry's contract (unihal_plugin.h): live handles, and every pointer passed outlives the call.
                unsafe { conv::opt_cstr(info.version) }.unwrap_or_default(),
                head.abi_major,
                head.abi_minor
            ),
            libraries,
            simulated: info.simulated != 0,
            concurrent: info.concurrent != 0,
        },
        manifest: Box::leak(manifest.into_boxed_str()),
    };
    let plugin: &'static Plugin = Box::leak(Box::new(plugin));
    LOADED.lock().push(plugin);
    Ok(plugin)
}

/// Every plugin loaded in this process (they are never unloaded, and stay reachable here).
static LOADED: parking_lot::Mutex<Vec<&'static Plugin>> = parking_lot::Mutex::new(Vec::new());

/// The plugins loaded in this process, in load order.
pub fn loaded() -> Vec<&'static Plugin> {
    LOADED.lock().clone()
}

/// The plugin files `UNIHAL_PLUGIN_PATH`'s value names, with the entries refused (relative
/// paths, unreadable directories) and why.
pub fn plugin_files(spec: &str) -> Vec<(String, std::result::Result<PathBuf, String>)> {
    let mut out = Vec::new();
    for entry in spec.split(':').map(str::trim).filter(|e| !e.is_empty()) {
        let p = PathBuf::from(entry);
        if !p.is_absolute() {
            out.push((
                entry.to_string(),
                Err("a relative path: plugins are never loaded from the current directory; give an absolute path".into()),
            ));
        } else if p.is_dir() {
            match std::fs::read_dir(&p) {
                Ok(rd) => {
                    let mut files: Vec<PathBuf> = rd
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|f| f.extension().is_some_and(|x| x == "so") && f.is_file())
                        .collect();
                    files.sort();
                    out.extend(files.into_iter().map(|f| (f.display().to_string(), Ok(f))));
                }
                Err(e) => out.push((
                    entry.to_string(),
                    Err(format!("cannot read the directory: {e}")),
                )),
            }
        } else {
            out.push((entry.to_string(), Ok(p)));
        }
    }
    out
}

/// Loads the plugin at `path` and registers its backend in `registry`. A name `builtin` holds
/// is refused unless `replace` lists it; a name another plugin took is refused. The attempt is
/// logged and recorded ([`attempts`]).
///
/// # Errors
/// As [`load`]; [`HalError::InvalidArgument`] for a name clash.
pub fn register(
    registry: &Registry,
    path: &Path,
    builtin: &[&str],
    replace: &[&str],
) -> Result<&'static str> {
    let shown = path.display().to_string();
    let r = load(path).and_then(|p| {
        let factory = move || Arc::new(PluginBackend::new(p)) as Arc<dyn unihal_hal::Backend>;
        if builtin.contains(&p.name) {
            if !replace.contains(&p.name) {
                return Err(HalError::invalid(
                    "plugin",
                    unihal_hal::Invalid::Other(format!(
                        "backend name {:?} is built into this unihal; set {REPLACE_ENV}={} to use the plugin instead",
                        p.name, p.name
                    )),
                ));
            }
            registry.replace(p.name, factory)?;
        } else {
            registry.register(p.name, factory)?;
        }
        Ok(p.name)
    });
    record(
        &shown,
        r.as_ref().map(|n| n.to_string()).map_err(|e| e.to_string()),
    );
    r
}

/// Loads every plugin `UNIHAL_PLUGIN_PATH` names into `registry` (see [`register`]); refusals
/// are logged and recorded, never fatal. Returns the backend names registered.
pub fn register_from_env(registry: &Registry, builtin: &[&str]) -> Vec<&'static str> {
    let Ok(spec) = std::env::var(PATH_ENV) else {
        return Vec::new();
    };
    let replace_spec = std::env::var(REPLACE_ENV).unwrap_or_default();
    let replace: Vec<&str> = replace_spec.split(',').map(str::trim).collect();
    let mut names = Vec::new();
    for (shown, file) in plugin_files(&spec) {
        match file {
            Ok(path) => {
                if let Ok(n) = register(registry, &path, builtin, &replace) {
                    names.push(n);
                }
            }
            Err(why) => record(&shown, Err(why)),
        }
    }
    names
}
