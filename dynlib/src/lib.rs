//! Opening vendor libraries at run time, one way for every backend.
//!
//! Every vendor library unihal uses (a GPU driver or runtime, a runtime compiler, a collective
//! library, a BLAS) is opened with `dlopen` when first needed, so one binary builds anywhere and
//! runs wherever it lands. This crate holds what all of them share:
//!
//! * **Where to look** ([`Candidates`]): an override variable (`UNIHAL_NCCL_LIB=/path/lib.so`)
//!   that, when set, is the only name tried; else library names for the system loader and paths
//!   under install roots named by variables with defaults (`$ROCM_PATH/lib`, default
//!   `/opt/rocm/lib`).
//! * **What happened** ([`Library::open`]): the first candidate that loads; or
//!   [`HalError::Unavailable`] listing every name tried with the loader's own message and the
//!   override variable to set. A report of the attempts ([`Probe`]) also feeds `unihal devices`.
//! * **Symbols** ([`Library::get`], [`Library::optional`], [`Library::first_of`]): a missing
//!   required symbol is `Unavailable` naming the symbol and the library's path.
//! * **Never unloaded**: vendor libraries start threads and hand out memory that may outlive
//!   every handle of ours; unloading one under them is undefined behaviour. Dropping a
//!   [`Library`] never closes the loader's handle (no `dlclose`), so its function pointers are
//!   valid for the whole process, and nothing is allocated for it (no leak for LeakSanitizer).
//!
//! * **Symbol tables** ([`symbol_table!`]): one declaration per symbol (field, symbol name, C
//!   signature) makes the struct of entry points, its loader and the lists of symbols it
//!   resolves, so a field and the symbol it is resolved from cannot drift apart, and ABI tests
//!   walk the same lists.
//! * **Simulated runtimes say so** ([`Library::identity`]): unihal's simulated vendor runtimes
//!   (`conformance/sim`) export one extra symbol, [`SIMULATED_SYMBOL`], that no vendor library
//!   has. It is the only way product code learns that a runtime is simulated (reports mark it,
//!   and a simulated runtime that runs work only at synchronisation points is not concurrent);
//!   no loader tests a device or library name for it.
//! * **ABI checks** ([`abi`]): the C ABI class of a binding's types, to compare hand-written
//!   declarations with bindgen's reading of the vendor's header.
//!
//! Thread safety: everything here is `Send + Sync`; opening runs the library's initialisers,
//! which vendors document as safe to run from any thread.

pub mod abi;
pub mod elf;

use std::path::{Path, PathBuf};
use unihal_hal::{HalError, Result};

/// Where to look for one vendor library, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidates {
    /// What the library is, for messages ("NCCL", "hiprtc", "HIP runtime").
    pub what: String,
    /// The override variable: when set (non-empty), its value is the only name tried.
    pub env: String,
    /// Names or paths, in order.
    pub names: Vec<String>,
}

impl Candidates {
    /// `what` found through `env`, else through `names` (given to the system loader as they are).
    pub fn new(what: &str, env: &str, names: &[&str]) -> Candidates {
        Candidates {
            what: what.into(),
            env: env.into(),
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// Adds `root/sub/name` for each name, after the current candidates, where `root` is the
    /// value of the first set variable of `root_vars`, else `default_root` (when given).
    pub fn under_root(
        mut self,
        root_vars: &[&str],
        default_root: Option<&str>,
        sub: &str,
        names: &[&str],
    ) -> Candidates {
        let root = root_vars
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
            .or_else(|| default_root.map(str::to_string));
        if let Some(root) = root {
            let dir = PathBuf::from(root.trim()).join(sub);
            for n in names {
                let p = dir.join(n).to_string_lossy().into_owned();
                if !self.names.contains(&p) {
                    self.names.push(p);
                }
            }
        }
        self
    }

    /// The names that will be tried: the override alone when set, else every candidate.
    pub fn to_try(&self) -> Vec<String> {
        match std::env::var(&self.env) {
            Ok(p) if !p.trim().is_empty() => vec![p.trim().to_string()],
            _ => self.names.clone(),
        }
    }
}

/// One attempt to open a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The name or path given to the loader.
    pub name: String,
    /// The loader's message.
    pub error: String,
}

/// The outcome of looking for a library, for reports: where it was found, or every attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Opened from this path (as given to the loader).
    Found(String),
    /// Nothing opened; every attempt with the loader's message.
    Missing(Vec<Attempt>),
}

/// The message of a library that was not found: every attempt and the override variable.
pub fn missing_reason(c: &Candidates, tried: &[Attempt]) -> String {
    let mut seen = std::collections::HashSet::new();
    let list: Vec<String> = tried
        .iter()
        .filter(|a| seen.insert(a.name.as_str()))
        .map(|a| {
            // dlerror starts with the name already ("libx.so: cannot open ..."): say it once.
            let prefix = format!("{}: ", a.name);
            let why = a.error.strip_prefix(&prefix).unwrap_or(&a.error);
            format!("{}: {why}", a.name)
        })
        .collect();
    let over = std::env::var(&c.env).ok().filter(|v| !v.trim().is_empty());
    match over {
        Some(_) => format!("{} (from {})", list.join("; "), c.env),
        None => format!(
            "no {} library found, tried {} (set {} to a path to choose one)",
            c.what,
            list.join("; "),
            c.env
        ),
    }
}

/// An opened vendor library, never unloaded (see the crate docs). Cheap to copy around by
/// reference; `Send + Sync`.
#[derive(Debug)]
pub struct Library {
    /// Never dropped: dropping would `dlclose` the library.
    lib: std::mem::ManuallyDrop<libloading::Library>,
    path: String,
    what: String,
}

impl Library {
    /// Opens the first candidate that loads.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] naming `what`, every name tried with the loader's message, and
    /// the override variable.
    pub fn open(c: &Candidates) -> Result<Library> {
        Library::open_with_attempts(c).map_err(|tried| HalError::Unavailable {
            what: c.what.clone(),
            reason: missing_reason(c, &tried),
        })
    }

    /// As [`Library::open`], returning the attempts themselves when nothing opened.
    ///
    /// # Errors
    /// Every attempt, in order.
    pub fn open_with_attempts(c: &Candidates) -> std::result::Result<Library, Vec<Attempt>> {
        let mut tried = Vec::new();
        for name in c.to_try() {
            // SAFETY: loading a vendor library runs its initialisers; these are the vendors' own
            // libraries (or unihal's simulated ones) loaded as their documentation prescribes.
            match unsafe { libloading::Library::new(&name) } {
                Ok(lib) => {
                    return Ok(Library {
                        lib: std::mem::ManuallyDrop::new(lib),
                        path: name,
                        what: c.what.clone(),
                    })
                }
                Err(e) => tried.push(Attempt {
                    error: elf::explain(Path::new(&name), e.to_string()),
                    name,
                }),
            }
        }
        Err(tried)
    }

    /// The name or path the library was opened from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What the library is ("NCCL").
    pub fn what(&self) -> &str {
        &self.what
    }

    /// A required symbol.
    ///
    /// # Safety
    /// `T` must be the C type of `name` (a function pointer type with its exact signature).
    ///
    /// # Errors
    /// [`HalError::Unavailable`] naming the symbol and the library.
    pub unsafe fn get<T: Copy>(&self, name: &str) -> Result<T> {
        // SAFETY: the caller's contract; the library is never unloaded (ManuallyDrop), so the
        // value stays valid for the process.
        unsafe { self.lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| HalError::Unavailable {
                what: self.what.clone(),
                reason: format!("symbol {name} missing from {}: {e}", self.path),
            })
    }

    /// An optional symbol (None when the library lacks it: an older version).
    ///
    /// # Safety
    /// As [`Library::get`].
    pub unsafe fn optional<T: Copy>(&self, name: &str) -> Option<T> {
        // SAFETY: the caller's contract.
        unsafe { self.get(name) }.ok()
    }

    /// The first of `names` the library has, with the name found (one entry point spelled
    /// differently by two vendors, e.g. `ncclAlltoAll` and RCCL's `ncclAllToAll`).
    ///
    /// # Safety
    /// `T` must be the C type of every name.
    pub unsafe fn first_of<T: Copy>(&self, names: &[&'static str]) -> Option<(T, &'static str)> {
        names
            .iter()
            // SAFETY: the caller's contract.
            .find_map(|n| unsafe { self.optional(n) }.map(|f| (f, *n)))
    }
}

/// The result type [`symbol_table!`]'s loaders return (an implementation detail of the macro).
#[doc(hidden)]
pub type SymbolResult<T> = Result<T>;

/// Declares a vendor library's symbol table once, one line per symbol:
///
/// ```
/// use std::ffi::c_int;
/// unihal_dynlib::symbol_table! {
///     /// The entry points of libexample.
///     pub struct ExampleApi;
///     required {
///         /// `exampleInit(flags)`.
///         init = "exampleInit": unsafe extern "C" fn(c_int) -> c_int;
///     }
///     optional {
///         /// Newer versions only.
///         shutdown = "exampleShutdown": unsafe extern "C" fn() -> c_int;
///     }
/// }
/// assert_eq!(ExampleApi::REQUIRED_SYMBOLS, ["exampleInit"]);
/// assert_eq!(ExampleApi::OPTIONAL_SYMBOLS, ["exampleShutdown"]);
/// ```
///
/// makes the struct (required entries as function pointers, optional ones as `Option`s),
/// `new(&Library)`, which resolves every entry (a missing required symbol is
/// `HalError::Unavailable` naming it and the library), and `REQUIRED_SYMBOLS` /
/// `OPTIONAL_SYMBOLS` in declaration order. Each signature must be the symbol's C type from the
/// vendor's documentation: that is the whole safety argument of the resolution, and the ABI
/// tests compare the lists with bindgen's reading of the vendor's header. The entry points stay
/// valid for the process (libraries are never unloaded); the struct is `Send + Sync`.
#[macro_export]
macro_rules! symbol_table {
    (
        $(#[$sm:meta])*
        $vis:vis struct $name:ident;
        required { $( $(#[$rm:meta])* $rf:ident = $rs:literal : $rt:ty; )* }
        optional { $( $(#[$om:meta])* $of:ident = $os:literal : $ot:ty; )* }
    ) => {
        $(#[$sm])*
        #[allow(clippy::type_complexity)] // the C signatures, as they are
        $vis struct $name {
            $( $(#[$rm])* pub $rf: $rt, )*
            $( $(#[$om])* pub $of: Option<$ot>, )*
        }

        impl $name {
            /// The symbols of the required entries, in declaration order.
            pub const REQUIRED_SYMBOLS: &'static [&'static str] = &[$($rs),*];
            /// The symbols of the optional entries, in declaration order.
            pub const OPTIONAL_SYMBOLS: &'static [&'static str] = &[$($os),*];

            /// Resolves every entry from `lib`.
            ///
            /// # Errors
            /// `HalError::Unavailable` naming a missing required symbol and the library.
            pub fn new(lib: &$crate::Library) -> $crate::SymbolResult<$name> {
                Ok($name {
                    // SAFETY: each field's type is its symbol's C signature, as declared.
                    $( $rf: unsafe { lib.get::<$rt>($rs) }?, )*
                    // SAFETY: as above.
                    $( $of: unsafe { lib.optional::<$ot>($os) }, )*
                })
            }
        }
    };
}

/// The symbol a simulated runtime exports: `const char *unihal_simulated_runtime(void)`,
/// returning a static NUL-terminated description whose words include `concurrent` when device
/// work runs while the host goes on (otherwise only at synchronisation points).
pub const SIMULATED_SYMBOL: &str = "unihal_simulated_runtime";

/// What a runtime library says of itself ([`Library::identity`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// True for unihal's simulated runtimes (they export [`SIMULATED_SYMBOL`]).
    pub simulated: bool,
    /// False for a simulated runtime that runs device work only at synchronisation points.
    pub concurrent: bool,
}

impl Default for Identity {
    /// A vendor's runtime: not simulated, device work concurrent with the host.
    fn default() -> Identity {
        Identity {
            simulated: false,
            concurrent: true,
        }
    }
}

impl Identity {
    /// The identity a simulated runtime's description states.
    pub fn simulated(description: &str) -> Identity {
        Identity {
            simulated: true,
            concurrent: description
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == "concurrent"),
        }
    }
}

impl Library {
    /// Whether this library is a simulated runtime, and how it runs work ([`SIMULATED_SYMBOL`]);
    /// a vendor's library is [`Identity::default`].
    pub fn identity(&self) -> Identity {
        type Describe = unsafe extern "C" fn() -> *const std::ffi::c_char;
        // SAFETY: the symbol's documented C type (SIMULATED_SYMBOL).
        let Some(describe) = (unsafe { self.optional::<Describe>(SIMULATED_SYMBOL) }) else {
            return Identity::default();
        };
        // SAFETY: the simulated runtime returns a static NUL-terminated string (or null).
        let text = unsafe { describe() };
        if text.is_null() {
            return Identity::simulated("");
        }
        // SAFETY: non-null, NUL-terminated and static (the symbol's contract).
        Identity::simulated(&unsafe { c_str(text) })
    }

    /// The library mapped from `file` (already loaded by another loader, or loaded now).
    ///
    /// # Errors
    /// [`HalError::Unavailable`] when it does not load.
    pub fn of_file(what: &str, file: &str) -> Result<Library> {
        Library::open(&Candidates::new(what, "", &[file]))
    }
}

/// The file mapped at `addr` in this process (from `/proc/self/maps`): where a resolved symbol
/// really lives, whatever name or link the library was opened through (`libamdhip64.so` may be a
/// link to Hygon DTK's `libgalaxyhip.so.5`). `None` off Linux or when no file maps it.
pub fn mapped_file(addr: usize) -> Option<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let (lo, hi) = fields.next()?.split_once('-')?;
        let (lo, hi) = (
            usize::from_str_radix(lo, 16).ok()?,
            usize::from_str_radix(hi, 16).ok()?,
        );
        let path = fields.nth(4)?;
        (lo <= addr && addr < hi && path.starts_with('/')).then(|| path.to_string())
    })
}

/// Reads a NUL-terminated C string a vendor returned (NULL gives "").
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that stays valid during the call.
pub unsafe fn c_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_lists_every_path_tried_with_the_loaders_message() {
        let c = Candidates::new(
            "Example",
            "UNIHAL_DYNLIB_TEST_UNSET",
            &["libunihal-none-1.so", "/nonexistent/libunihal-none-2.so"],
        );
        let Err(HalError::Unavailable { what, reason }) = Library::open(&c) else {
            panic!("a library that does not exist opened");
        };
        assert_eq!(what, "Example");
        assert!(reason.contains("no Example library found"), "{reason}");
        assert!(reason.contains("libunihal-none-1.so: "), "{reason}");
        assert!(
            reason.contains("/nonexistent/libunihal-none-2.so: "),
            "{reason}"
        );
        // The loader's own words for a missing file.
        assert!(reason.contains("No such file"), "{reason}");
        assert!(reason.contains("set UNIHAL_DYNLIB_TEST_UNSET"), "{reason}");
    }

    #[test]
    fn a_symbol_maps_to_the_file_it_lives_in() {
        let lib = Library::open(&Candidates::new(
            "C library",
            "UNIHAL_DYNLIB_TEST_UNSET",
            &["libc.so.6"],
        ))
        .expect("libc opens");
        // SAFETY: getpid's C signature.
        let f: unsafe extern "C" fn() -> i32 = unsafe { lib.get("getpid") }.expect("getpid");
        let file = mapped_file(f as usize).expect("a mapped file");
        assert!(file.contains("libc"), "{file}");
        assert_eq!(mapped_file(0), None);
    }

    #[test]
    fn the_override_is_the_only_name_tried() {
        std::env::set_var("UNIHAL_DYNLIB_TEST_OVERRIDE", " /nonexistent/override.so ");
        let c = Candidates::new("Example", "UNIHAL_DYNLIB_TEST_OVERRIDE", &["libc.so.6"]);
        assert_eq!(c.to_try(), vec!["/nonexistent/override.so".to_string()]);
        let tried = Library::open_with_attempts(&c).unwrap_err();
        assert_eq!(tried.len(), 1);
        let reason = missing_reason(&c, &tried);
        assert!(
            reason.contains("(from UNIHAL_DYNLIB_TEST_OVERRIDE)"),
            "{reason}"
        );
        std::env::remove_var("UNIHAL_DYNLIB_TEST_OVERRIDE");
    }

    #[test]
    fn install_roots_come_from_the_first_set_variable_else_the_default() {
        std::env::set_var("UNIHAL_DYNLIB_TEST_ROOT_B", "/opt/b");
        let c = Candidates::new("X", "UNIHAL_DYNLIB_TEST_UNSET", &["libx.so"])
            .under_root(
                &["UNIHAL_DYNLIB_TEST_ROOT_A", "UNIHAL_DYNLIB_TEST_ROOT_B"],
                Some("/opt/default"),
                "lib",
                &["libx.so.1"],
            )
            .under_root(
                &["UNIHAL_DYNLIB_TEST_UNSET"],
                Some("/opt/dtk"),
                "hip/lib",
                &["liby.so"],
            )
            .under_root(&["UNIHAL_DYNLIB_TEST_UNSET"], None, "lib", &["never.so"]);
        assert_eq!(
            c.names,
            vec![
                "libx.so",
                "/opt/b/lib/libx.so.1",
                "/opt/dtk/hip/lib/liby.so"
            ]
        );
        std::env::remove_var("UNIHAL_DYNLIB_TEST_ROOT_B");
    }

    #[test]
    fn symbols_required_optional_and_spelled_two_ways() {
        let c = Candidates::new("C library", "UNIHAL_DYNLIB_TEST_UNSET", &["libc.so.6"]);
        let lib = Library::open(&c).expect("glibc is loadable");
        assert_eq!(lib.path(), "libc.so.6");
        type Strlen = unsafe extern "C" fn(*const std::ffi::c_char) -> usize;
        // SAFETY: strlen's C signature.
        let f: Strlen = unsafe { lib.get("strlen") }.unwrap();
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { f(c"four".as_ptr()) }, 4);
        // SAFETY: as above (never called).
        let missing = unsafe { lib.get::<Strlen>("unihal_no_such_symbol") }.unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("symbol unihal_no_such_symbol missing from libc.so.6"),
            "{missing}"
        );
        // SAFETY: as above.
        assert!(unsafe { lib.optional::<Strlen>("unihal_no_such_symbol") }.is_none());
        // SAFETY: as above.
        let (_, found) = unsafe { lib.first_of::<Strlen>(&["unihal_nope", "strlen"]) }.unwrap();
        assert_eq!(found, "strlen");
    }
}

#[cfg(test)]
mod identity_tests {
    use super::*;

    #[test]
    fn a_vendor_library_is_not_simulated_and_a_simulated_one_says_its_mode() {
        // libc exports no SIMULATED_SYMBOL: a vendor's library reads as one.
        let libc = Library::open(&Candidates::new("C library", "", &["libc.so.6"])).unwrap();
        assert_eq!(libc.identity(), Identity::default());
        assert!(!Identity::default().simulated && Identity::default().concurrent);
        let c = Identity::simulated("unihal simulated runtime, concurrent mode");
        assert!(c.simulated && c.concurrent);
        let d = Identity::simulated("unihal simulated runtime, deferred mode");
        assert!(d.simulated && !d.concurrent);
        assert!(!Identity::simulated("nonconcurrent").concurrent);
    }
}
