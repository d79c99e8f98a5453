//! One runtime compiler of the NVRTC family. NVIDIA's NVRTC and AMD's hiprtc export the same
//! calls with the same C signatures under two prefixes (`nvrtcCreateProgram`,
//! `hiprtcCreateProgram`, ...), and differ only in where the library is, which options they
//! take and which outputs a compilation gives (PTX and cubin; a code object). So the symbol
//! table, the program's lifetime (always destroyed), the log and the outputs are written once
//! here, and a [`Flavor`] names the rest ([`super::nvrtc::NVRTC`], [`super::hiprtc::HIPRTC`]).
//!
//! Thread safety: a [`Compiler`] is `Send + Sync` (function pointers; both vendors document
//! compiling distinct programs from several threads as safe).

use std::ffi::{c_char, c_int, c_void, CString};
use unihal_dynlib::{c_str, Candidates, Library};
use unihal_hal::{HalError, Result};

/// `*Result`: 0 is success.
type Code = c_int;
/// `*Program`: an opaque pointer.
type Program = *mut c_void;

/// One output a compilation gives: its name in messages and the suffixes of its size and read
/// calls (`GetPTXSize` / `GetPTX`).
#[derive(Debug)]
pub struct Output {
    /// "PTX", "CUBIN", "code".
    pub name: &'static str,
    /// The size call's suffix after the prefix (`GetPTXSize`).
    pub size: &'static str,
    /// The read call's suffix (`GetPTX`).
    pub read: &'static str,
}

/// What tells one compiler of the family from the other.
#[derive(Debug)]
pub struct Flavor {
    /// The library's name in messages and `HalError::Vendor::library` ("NVRTC", "hiprtc").
    pub what: &'static str,
    /// The symbols' prefix ("nvrtc", "hiprtc").
    pub prefix: &'static str,
    /// Where the library is looked for.
    pub candidates: fn() -> Candidates,
    /// The outputs a compilation can give, in the order [`Compiler::compile`] returns them.
    pub outputs: &'static [Output],
}

/// The calls, resolved from the flavor's symbols. Each field's type is the documented C
/// signature of `<prefix><suffix>`, the same in both vendors' headers.
struct Api {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Code,
    error_string: unsafe extern "C" fn(Code) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Code,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Code,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Code,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Code,
    destroy: unsafe extern "C" fn(*mut Program) -> Code,
    /// Per output of the flavor: its size and read calls.
    outputs: Vec<(
        unsafe extern "C" fn(Program, *mut usize) -> Code,
        unsafe extern "C" fn(Program, *mut c_char) -> Code,
    )>,
}

impl Api {
    fn resolve(lib: &Library, flavor: &Flavor) -> Result<Api> {
        let name = |suffix: &str| format!("{}{suffix}", flavor.prefix);
        // SAFETY: for every `get` below, the type is the documented C signature of the symbol
        // of that name, identical in nvrtc.h and hiprtc.h.
        unsafe {
            Ok(Api {
                version: lib.get(&name("Version"))?,
                error_string: lib.get(&name("GetErrorString"))?,
                create: lib.get(&name("CreateProgram"))?,
                compile: lib.get(&name("CompileProgram"))?,
                log_size: lib.get(&name("GetProgramLogSize"))?,
                log: lib.get(&name("GetProgramLog"))?,
                destroy: lib.get(&name("DestroyProgram"))?,
                outputs: flavor
                    .outputs
                    .iter()
                    .map(|o| Ok((lib.get(&name(o.size))?, lib.get(&name(o.read))?)))
                    .collect::<Result<_>>()?,
            })
        }
    }
}

/// A loaded runtime compiler (never unloaded).
pub struct Compiler {
    api: Api,
    flavor: &'static Flavor,
    path: String,
    version: (i32, i32),
}

impl Compiler {
    /// Opens the flavor's library and resolves its calls.
    ///
    /// # Errors
    /// [`HalError::Unavailable`] listing every library tried, or naming a missing symbol.
    pub fn load(flavor: &'static Flavor) -> Result<Compiler> {
        let lib = Library::open(&(flavor.candidates)())?;
        let api = Api::resolve(&lib, flavor)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `*Version` writes two ints.
        unsafe { (api.version)(&mut major, &mut minor) };
        Ok(Compiler {
            api,
            flavor,
            path: lib.path().to_string(),
            version: (major, minor),
        })
    }

    /// `(major, minor)` as the library reports it.
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The library path that was opened.
    pub fn path(&self) -> &str {
        &self.path
    }

    fn vendor(&self, call: &str, code: Code, message: String) -> HalError {
        HalError::Vendor {
            library: self.flavor.what.into(),
            call: format!("{}{call}", self.flavor.prefix),
            code: code as i64,
            // SAFETY: `*GetErrorString` returns a static string for any code.
            name: unsafe { c_str((self.api.error_string)(code)) },
            message,
        }
    }

    /// Compiles `src` (named `name` in messages) with `options`, and reads the first `outputs`
    /// of the flavor's outputs; returns them with the compiler's log. The program is destroyed
    /// whatever happens.
    ///
    /// # Errors
    /// [`HalError::InvalidArgument`] for a NUL byte in the source, name or an option;
    /// [`HalError::Vendor`] with the compiler's log when creation or compilation fails;
    /// [`HalError::Internal`] when an output cannot be read.
    pub fn compile(
        &self,
        src: &str,
        name: &str,
        options: &[String],
        outputs: usize,
    ) -> Result<(Vec<Vec<u8>>, String)> {
        let interior = |what: &str| {
            HalError::invalid(
                "source",
                unihal_hal::Invalid::Other(format!("{what} contains a NUL byte")),
            )
        };
        let csrc = CString::new(src).map_err(|_| interior("source"))?;
        let cname = CString::new(name).map_err(|_| interior("name"))?;
        let copts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| interior("an option"))?;
        let opt_ptrs: Vec<*const c_char> = copts.iter().map(|c| c.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: csrc and cname are NUL-terminated and outlive the call; no headers are passed.
        let rc = unsafe {
            (self.api.create)(
                &mut prog,
                csrc.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(self.vendor("CreateProgram", rc, String::new()));
        }
        /// Destroys the program once, on every path.
        struct Guard<'a>(&'a Api, Program);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                // SAFETY: the program was created above and is destroyed exactly once.
                unsafe { (self.0.destroy)(&mut self.1) };
            }
        }
        let guard = Guard(&self.api, prog);
        // SAFETY: a live program; opt_ptrs holds opt_ptrs.len() NUL-terminated strings.
        let rc = unsafe { (self.api.compile)(guard.1, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
        // SAFETY: a live program; the size and read calls are its log's.
        let log = unsafe {
            read_output(
                "log",
                |n| (self.api.log_size)(guard.1, n),
                |p| (self.api.log)(guard.1, p),
            )
        }
        .map(|b| {
            String::from_utf8_lossy(&b)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default();
        if rc != 0 {
            return Err(self.vendor("CompileProgram", rc, log));
        }
        let read = self
            .api
            .outputs
            .iter()
            .zip(self.flavor.outputs)
            .take(outputs)
            .map(|(&(size, get), o)| {
                // SAFETY: the live, compiled program; the size and read calls are this output's.
                unsafe { read_output(o.name, |n| size(guard.1, n), |p| get(guard.1, p)) }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((read, log))
    }
}

/// Reads a buffer the vendor fills after telling its size.
///
/// # Safety
/// `size` and `fill` must be the vendor's size and fill calls for one output of one live program.
unsafe fn read_output(
    what: &'static str,
    size: impl FnOnce(*mut usize) -> Code,
    fill: impl FnOnce(*mut c_char) -> Code,
) -> Result<Vec<u8>> {
    let mut n = 0usize;
    let rc = size(&mut n);
    if rc != 0 {
        return Err(HalError::Internal(format!(
            "{what}: size query failed with {rc}"
        )));
    }
    let mut buf = vec![0u8; n];
    if n > 0 {
        let rc = fill(buf.as_mut_ptr() as *mut c_char);
        if rc != 0 {
            return Err(HalError::Internal(format!("{what}: read failed with {rc}")));
        }
    }
    Ok(buf)
}
