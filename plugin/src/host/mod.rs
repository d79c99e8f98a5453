//! The host side: loading plugins and wrapping them into the HAL traits.
//!
//! [`load`] opens one library and refuses, with a typed error and nothing else called, anything
//! that is not a plugin of this ABI major: a file the loader cannot open, a library without the
//! entry symbol, a plugin of another major, a table without a required entry, a bad name, a
//! plugin description (`info`, `ccl_caps`) whose counts or pointers do not hold together.
//!
//! The host trusts no value a plugin returns: every handle, pointer, length and count that comes
//! back from an entry is checked before the host keeps or uses it (a NULL handle or pointer on
//! success, a device range that wraps past 2^64, an address off the device's alignment, a length
//! longer than the host's buffer, a rank outside its communicator, an array count out of
//! range). A value that fails refuses the call with [`HalError::AbiMismatch`] naming the entry
//! and the plugin ([`Plugin::broke`]), after releasing whatever valid handle came with it; it
//! never reaches a HAL object. Entries the device's capabilities rely on (`event_elapsed` for
//! event timing, ...) are checked when the device opens, and the device is refused without them.
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
mod node;
mod recycle;
mod stream;

pub use backend::PluginBackend;
pub use node::{callback_nodes, CallbackNodes};

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
    /// The collective engine's capabilities (`ccl_caps`, read and checked at load), when the
    /// plugin has one.
    pub(crate) ccl: Option<unihal_hal::CclCaps>,
}

impl Plugin {
    /// The plugin's table as the host reads it: entries past the plugin's table size, or of a
    /// later minor than the plugin's, are NULL.
    pub fn api(&self) -> &UhPluginApi {
        &self.api
    }

    /// Calls a plugin entry that reports errors in the ABI's record. `name` is the entry's name
    /// in the header (named when the plugin returns a status the ABI does not define); `what`
    /// names the call for an entry the plugin leaves NULL (`Unsupported`).
    #[inline]
    pub(crate) fn call<F: Copy>(
        &self,
        entry: Option<F>,
        name: &str,
        what: &str,
        f: impl FnOnce(F, *mut UhError) -> UhStatus,
    ) -> Result<()> {
        let Some(entry) = entry else {
            return Err(self.unsupported(what));
        };
        with_record(|rec| match f(entry, rec) {
            UH_OK => Ok(()),
            status => {
                // SAFETY: the record is ours and the plugin wrote it (or left it as made).
                let rec = unsafe { &*rec };
                match unknown_status(status, rec) {
                    Some(what) => Err(self.broke(name, what)),
                    None => Err(conv::get_error(status, rec)),
                }
            }
        })
    }

    pub(crate) fn unsupported(&self, what: &str) -> HalError {
        HalError::unsupported(format!("{what} (the plugin {} leaves it out)", self.name))
    }

    /// The error for a value `entry` returned that breaks the ABI's contract (a NULL handle on
    /// success, a range that wraps, a count out of range): [`HalError::AbiMismatch`] naming the
    /// entry and the plugin. The caller has released whatever valid handle came with it.
    pub fn broke(&self, entry: &str, what: impl std::fmt::Display) -> HalError {
        abi(format!(
            "the plugin {} ({}) broke the ABI: `{entry}` {what}",
            self.name, self.path
        ))
    }
}

/// What is wrong with a failed call's status and record when the ABI does not define its code
/// (the status, or the record's code that takes its place): `None` for a defined one.
pub(crate) fn unknown_status(status: UhStatus, rec: &UhError) -> Option<String> {
    let known = |c: UhStatus| (UH_ERR_UNAVAILABLE..=UH_ERR_INTERNAL).contains(&c);
    let message = conv::get_str(&rec.message);
    let said = if message.is_empty() {
        String::new()
    } else {
        format!(" (its message: {message})")
    };
    if !known(status) {
        Some(format!(
            "returned the status {status}, which the ABI does not define (UH_ERR_* is 1 to \
             {UH_ERR_INTERNAL}){said}"
        ))
    } else if rec.code != UH_OK && !known(rec.code) {
        Some(format!(
            "returned status {status} with the error code {} in its record, which the ABI does \
             not define (UH_ERR_* is 1 to {UH_ERR_INTERNAL}){said}",
            rec.code
        ))
    } else {
        None
    }
}

/// The most entries the host reads from an array a plugin returns (libraries, peers, op
/// supports, accumulation types, host kernels, kernel parameters): a larger count is refused as
/// out of range, before any element is read.
pub const MAX_ARRAY_ENTRIES: u64 = 1 << 16;

/// Checks an array a plugin returned: `n` entries at `p`, NULL only when `n` is 0, and at most
/// `max` of them. `Err` says what is wrong (the caller names the entry).
pub(crate) fn check_array<T>(
    p: *const T,
    n: u64,
    max: u64,
    field: &str,
) -> std::result::Result<(), String> {
    if n > max {
        return Err(format!("returned {n} {field} (at most {max})"));
    }
    if n > 0 && p.is_null() {
        return Err(format!("returned {n} {field} at NULL"));
    }
    if (n as u128) * (std::mem::size_of::<T>() as u128) > isize::MAX as u128 {
        return Err(format!(
            "returned {n} {field}: more than the address space holds"
        ));
    }
    Ok(())
}

/// A copy of a size-prefixed struct a plugin returned, reading only the `size` bytes the plugin
/// wrote (header rule 2): fields past them read as zero (absent).
///
/// # Safety
/// `p` points to a struct whose first field is its `uint32_t size`, valid for `size` bytes;
/// an all-zero `T` is a valid value (integers, raw pointers, `Option` of functions).
unsafe fn read_sized<T: Copy>(p: *const T) -> T {
    // SAFETY: the caller's promise: the first four bytes are the struct's size.
    let size = unsafe { *(p as *const u32) } as usize;
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: at most `size` bytes of the plugin's struct (valid by the caller's promise) into
    // a zeroed `T` of ours, which any all-zero or partly copied value leaves valid (the
    // caller's promise: every field is plain data).
    unsafe {
        std::ptr::copy_nonoverlapping(
            p as *const u8,
            out.as_mut_ptr() as *mut u8,
            size.min(std::mem::size_of::<T>()),
        );
        out.assume_init()
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
    /// The backend name the plugin gave, when the load got that far (a plugin refused for its
    /// name has one; a file that is no plugin has none).
    pub backend: Option<String>,
}

static ATTEMPTS: parking_lot::Mutex<Vec<Attempt>> = parking_lot::Mutex::new(Vec::new());

/// Every plugin load attempted in this process, in order, with its outcome.
pub fn attempts() -> Vec<Attempt> {
    ATTEMPTS.lock().clone()
}

fn record(path: &str, outcome: std::result::Result<String, String>, backend: Option<&str>) {
    match &outcome {
        Ok(name) => {
            tracing::info!(target: "unihal::plugin", "loaded plugin {path}: backend {name}")
        }
        Err(why) => tracing::warn!(target: "unihal::plugin", "refused plugin {path}: {why}"),
    }
    ATTEMPTS.lock().push(Attempt {
        path: path.to_string(),
        outcome,
        backend: backend.map(str::to_string),
    });
}

/// Why selecting backend `name` from `registry` (`--backend`, `UNIHAL_BACKENDS`) would not test
/// what the user meant, given the plugin load `attempts` ([`attempts`]): `Some(message)` when
/// * `name` is not registered and a plugin that gave that name was refused: the refusal (the
///   path and why), instead of "not registered";
/// * `name` is not registered and plugins were refused before they gave a name: each of them,
///   since one of them may be the backend asked for;
/// * `name` is registered but no plugin loaded under it (a built-in backend), and a plugin that
///   gave that name was refused (a built-in name without `UNIHAL_PLUGIN_REPLACE`): the built-in
///   backend would be used in the plugin's place, so the message says so and how to choose.
///
/// `None` otherwise (the registry's own answer stands).
pub fn selection_problem(registry: &Registry, name: &str, attempts: &[Attempt]) -> Option<String> {
    let refused = |a: &&Attempt| a.outcome.is_err();
    let named: Vec<&Attempt> = attempts
        .iter()
        .filter(refused)
        .filter(|a| a.backend.as_deref() == Some(name))
        .collect();
    let list = |v: &[&Attempt]| {
        v.iter()
            .map(|a| format!("{}: {}", a.path, a.outcome.as_ref().err().map_or("", |e| e)))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let registered = registry.names().iter().any(|n| n == name);
    if !registered {
        if !named.is_empty() {
            return Some(format!(
                "backend {name:?} is not registered: the plugin that gives that name was \
                 refused: {}",
                list(&named)
            ));
        }
        let unnamed: Vec<&Attempt> = attempts
            .iter()
            .filter(refused)
            .filter(|a| a.backend.is_none())
            .collect();
        if !unnamed.is_empty() {
            return Some(format!(
                "backend {name:?} is not registered (registered: {}); {PATH_ENV} named plugins \
                 that were refused before they gave a name, one of which may be it: {}",
                registry.names().join(", "),
                list(&unnamed)
            ));
        }
        return None;
    }
    let loaded_as_plugin = attempts.iter().any(|a| a.outcome.as_deref() == Ok(name));
    if loaded_as_plugin || named.is_empty() {
        return None;
    }
    Some(format!(
        "backend {name:?} is built into this unihal, and the plugin that gives the same name \
         was refused, so {name:?} would test the built-in backend, not the plugin: {}; or take \
         the plugin out of {PATH_ENV} to test the built-in backend",
        list(&named)
    ))
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
/// checks it, calling nothing but its entry, `info` and `ccl_caps` (and nothing after the entry
/// when the major differs).
///
/// # Errors
/// [`HalError::Unavailable`] when the library cannot be opened (the loader's message);
/// [`HalError::AbiMismatch`] for a library without `unihal_plugin_entry`, and as
/// [`load_entry`]; the plugin's own error when its entry refuses the host.
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
    // SAFETY: the library's entry symbol, which is the header's entry by its name.
    unsafe { load_entry(&shown, entry) }
}

/// The entries a plugin must have (header rule 3, and what the HAL requires of every backend:
/// a fill, memory info, the sticky error).
const REQUIRED: &[&str] = &[
    "info",
    "probe",
    "device_open",
    "device_release",
    "device_props",
    "device_memory_info",
    "device_synchronize",
    "mem_alloc",
    "mem_release",
    "host_alloc",
    "host_release",
    "stream_create",
    "stream_release",
    "copy_h2d",
    "copy_d2h",
    "copy_d2d",
    "fill",
    "stream_synchronize",
    "stream_query",
    "stream_async_error",
    "event_create",
    "event_release",
    "event_record",
    "stream_wait_event",
    "event_query",
    "event_synchronize",
];

/// Whether the table has the entry named `name` (the names of [`REQUIRED`] and of the entries
/// capabilities rely on).
fn has_entry(api: &UhPluginApi, name: &str) -> bool {
    match name {
        "info" => api.info.is_some(),
        "probe" => api.probe.is_some(),
        "device_open" => api.device_open.is_some(),
        "device_release" => api.device_release.is_some(),
        "device_props" => api.device_props.is_some(),
        "device_memory_info" => api.device_memory_info.is_some(),
        "device_synchronize" => api.device_synchronize.is_some(),
        "mem_alloc" => api.mem_alloc.is_some(),
        "mem_release" => api.mem_release.is_some(),
        "host_alloc" => api.host_alloc.is_some(),
        "host_release" => api.host_release.is_some(),
        "stream_create" => api.stream_create.is_some(),
        "stream_release" => api.stream_release.is_some(),
        "copy_h2d" => api.copy_h2d.is_some(),
        "copy_d2h" => api.copy_d2h.is_some(),
        "copy_d2d" => api.copy_d2d.is_some(),
        "copy_peer" => api.copy_peer.is_some(),
        "fill" => api.fill.is_some(),
        "run_op" => api.run_op.is_some(),
        "host_callback" => api.host_callback.is_some(),
        "stream_synchronize" => api.stream_synchronize.is_some(),
        "stream_query" => api.stream_query.is_some(),
        "stream_async_error" => api.stream_async_error.is_some(),
        "event_create" => api.event_create.is_some(),
        "event_release" => api.event_release.is_some(),
        "event_record" => api.event_record.is_some(),
        "stream_wait_event" => api.stream_wait_event.is_some(),
        "event_query" => api.event_query.is_some(),
        "event_synchronize" => api.event_synchronize.is_some(),
        "event_elapsed" => api.event_elapsed.is_some(),
        "module_load" => api.module_load.is_some(),
        "module_release" => api.module_release.is_some(),
        "module_function" => api.module_function.is_some(),
        "function_release" => api.function_release.is_some(),
        "launch" => api.launch.is_some(),
        "ccl_unique_id" => api.ccl_unique_id.is_some(),
        "ccl_init_rank" => api.ccl_init_rank.is_some(),
        "ccl_init_all" => api.ccl_init_all.is_some(),
        "comm_release" => api.comm_release.is_some(),
        "comm_rank_size" => api.comm_rank_size.is_some(),
        "comm_collective" => api.comm_collective.is_some(),
        "comm_group" => api.comm_group.is_some(),
        "comm_split" => api.comm_split.is_some(),
        "comm_abort" => api.comm_abort.is_some(),
        "comm_async_error" => api.comm_async_error.is_some(),
        _ => false,
    }
}

/// The entries of `names` the table leaves NULL.
fn missing<'a>(api: &UhPluginApi, names: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    names.into_iter().filter(|n| !has_entry(api, n)).collect()
}

/// Loads a plugin from its entry point (a plugin linked into the program, or whose library the
/// caller opened itself) and checks it exactly as [`load`] does; `shown` names it in messages
/// and as its [`Plugin::path`]. Calls nothing but the entry, `info` and `ccl_caps`.
///
/// # Safety
/// `entry` is a unihal plugin entry point as `unihal_plugin.h` documents it, whose code stays
/// loaded for the rest of the process.
///
/// # Errors
/// [`HalError::AbiMismatch`] for a plugin of another major version, a table without a required
/// entry, a plugin without a valid name, or an `info` or `ccl_caps` whose counts and pointers
/// do not hold together (or a collective engine without the entries it needs); the plugin's
/// own error when its entry refuses the host.
pub unsafe fn load_entry(shown: &str, entry: UhPluginEntryFn) -> Result<&'static Plugin> {
    let mut rec = Box::new(UhError::new());
    // SAFETY: the entry's contract (the caller's promise): our services (valid forever) and an
    // error record.
    let table = unsafe { entry(&HOST_API, &mut *rec) };
    if table.is_null() {
        if let Some(what) = unknown_status(UH_ERR_INTERNAL, &rec) {
            return Err(abi(format!(
                "{shown} broke the ABI: `unihal_plugin_entry` {what}"
            )));
        }
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
    // SAFETY: the plugin's table holds `size` bytes and begins with its size; an all-zero
    // UhPluginApi is valid (integers and NULL `Option<fn>`s).
    let mut api: UhPluginApi = unsafe { read_sized(table) };
    if head.abi_minor < 2 {
        // Entries of ABI 1.2 only from a plugin that says it has them.
        api.host_callback_node = None;
    }
    let absent = missing(&api, REQUIRED.iter().copied());
    if !absent.is_empty() {
        return Err(abi(format!(
            "{shown} leaves out required entries: {}",
            absent.join(", ")
        )));
    }
    // SAFETY: `info` is present (checked) and returns data valid forever (header rule 5).
    let info = unsafe { (api.info.expect("checked"))() };
    if info.is_null() {
        return Err(abi(format!("{shown}: `info` returned NULL")));
    }
    // SAFETY: non-null, valid forever, beginning with its size; fields past the plugin's size
    // read as absent.
    let info: UhPluginInfo = unsafe { read_sized(info) };
    let broke = |what: String| abi(format!("{shown}: `info` {what}"));
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
    check_array(
        info.libraries,
        info.n_libraries.into(),
        MAX_ARRAY_ENTRIES,
        "libraries",
    )
    .map_err(broke)?;
    // SAFETY: checked above: `n_libraries` entries (valid forever, header rule 5).
    let libraries = unsafe { conv::slice(info.libraries, info.n_libraries as usize) }
        .iter()
        .map(|l| {
            // SAFETY: as above.
            let l: UhLibraryInfo = unsafe { read_sized(l) };
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
        .collect();
    // SAFETY: as above.
    let manifest = unsafe { conv::opt_cstr(info.manifest) }.unwrap_or_default();
    let ccl = match api.ccl_caps {
        // SAFETY: the entry's contract: data valid forever, or NULL (header rule 5).
        Some(f) => match unsafe { f() } {
            c if c.is_null() => None,
            c => {
                // SAFETY: non-null, valid forever, beginning with its size.
                let c: UhCclCaps = unsafe { read_sized(c) };
                Some(check_ccl_caps(shown, &api, &c)?)
            }
        },
        None => None,
    };
    let plugin = Plugin {
        api,
        path: shown.to_string(),
        name: conv::intern(&name),
        info: BackendInfo {
            name: name.clone(),
            version: format!(
                "{} (plugin {shown}, ABI {}.{})",
                // SAFETY: a string valid forever, or NULL (header rule 5).
                unsafe { conv::opt_cstr(info.version) }.unwrap_or_default(),
                head.abi_major,
                head.abi_minor
            ),
            libraries,
            simulated: info.simulated != 0,
            concurrent: info.concurrent != 0,
        },
        manifest: Box::leak(manifest.into_boxed_str()),
        ccl,
    };
    let plugin: &'static Plugin = Box::leak(Box::new(plugin));
    LOADED.lock().push(plugin);
    Ok(plugin)
}

/// The capabilities of a plugin's collective engine, checked: the accumulation array in range,
/// and the entries a collective engine needs present (groups and split when it claims them).
fn check_ccl_caps(shown: &str, api: &UhPluginApi, c: &UhCclCaps) -> Result<unihal_hal::CclCaps> {
    check_array(
        c.accumulation,
        c.n_accumulation.into(),
        MAX_ARRAY_ENTRIES,
        "accumulation types",
    )
    .map_err(|what| abi(format!("{shown}: `ccl_caps` {what}")))?;
    let mut needed = vec![
        "ccl_unique_id",
        "ccl_init_rank",
        "ccl_init_all",
        "comm_release",
        "comm_rank_size",
        "comm_collective",
        "comm_abort",
        "comm_async_error",
    ];
    if c.flags & UH_CCL_GROUPS != 0 {
        needed.push("comm_group");
    }
    if c.flags & UH_CCL_SPLIT != 0 {
        needed.push("comm_split");
    }
    let absent = missing(api, needed);
    if !absent.is_empty() {
        return Err(abi(format!(
            "{shown} has a collective engine (`ccl_caps`) but leaves out entries it needs: {}",
            absent.join(", ")
        )));
    }
    // SAFETY: the array was checked above; the strings are valid forever (header rule 5).
    Ok(unsafe { conv::get_ccl_caps(c) })
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
    let mut named = None;
    let r = load(path).and_then(|p| {
        named = Some(p.name);
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
        named,
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
            Err(why) => record(&shown, Err(why), None),
        }
    }
    names
}
