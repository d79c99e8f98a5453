//! Run-time compilation of the library with the vendors' compilers: NVIDIA's NVRTC ([`nvrtc`]) and
//! AMD's hiprtc ([`hiprtc`]), both opened at run time with `libloading`, so the default build needs
//! neither. A missing library is [`unihal_hal::HalError::Unavailable`] naming every path tried.

pub mod hiprtc;
mod hiprtc_sys;
pub mod nvrtc;
mod nvrtc_sys;

use libloading::Library;
use unihal_hal::{HalError, Result};

/// Opens the first library of `candidates` that loads (`env` overrides with a path), or reports
/// every attempt.
pub(crate) fn open_first(what: &str, env: &str, candidates: &[&str]) -> Result<(Library, String)> {
    let mut tried = Vec::new();
    let over = std::env::var(env).ok().filter(|v| !v.is_empty());
    let list: Vec<String> = match &over {
        Some(p) => vec![p.clone()],
        None => candidates.iter().map(|s| s.to_string()).collect(),
    };
    for name in list {
        // SAFETY: loading a vendor library runs its initialisers; these are the vendors' own
        // compiler libraries, loaded as their documentation prescribes.
        match unsafe { Library::new(&name) } {
            Ok(lib) => return Ok((lib, name)),
            Err(e) => tried.push(format!("{name}: {e}")),
        }
    }
    Err(HalError::Unavailable {
        what: what.to_string(),
        reason: format!(
            "tried {} (set {env} to a path to override)",
            tried.join("; ")
        ),
    })
}

/// Reads a NUL-terminated C string the vendor returned (NULL gives "").
///
/// # Safety
/// `p` must be NULL or point to a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn c_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
}

/// Entry names declared in PTX text (`.entry <name>(` / `.visible .entry <name>(`).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let l = l.trim();
            let rest = l.strip_prefix(".visible ").unwrap_or(l);
            let rest = rest.strip_prefix(".entry ")?;
            Some(
                rest.split(|c: char| c == '(' || c.is_whitespace())
                    .next()?
                    .to_string(),
            )
        })
        .collect()
}

/// The calls NVRTC and hiprtc share (same shapes, different symbols).
pub(crate) trait RtcApi {
    /// Library name for messages.
    const WHAT: &'static str;
    /// # Safety
    /// As the vendor's `*CreateProgram` with no headers.
    unsafe fn create(
        &self,
        prog: *mut *mut std::ffi::c_void,
        src: *const std::ffi::c_char,
        name: *const std::ffi::c_char,
    ) -> i32;
    /// # Safety
    /// As the vendor's `*CompileProgram`.
    unsafe fn compile(
        &self,
        prog: *mut std::ffi::c_void,
        n: i32,
        opts: *const *const std::ffi::c_char,
    ) -> i32;
    /// # Safety
    /// As the vendor's `*GetProgramLogSize` / `*GetProgramLog`.
    unsafe fn log(&self, prog: *mut std::ffi::c_void) -> String;
    /// # Safety
    /// As the vendor's `*DestroyProgram`.
    unsafe fn destroy(&self, prog: *mut *mut std::ffi::c_void);
    /// The vendor's name for a result code.
    fn error_name(&self, code: i32) -> String;
}

/// Compiles `src` with `options`, hands the compiled program to `collect`, and always destroys it.
///
/// # Errors
/// [`HalError::Vendor`] with the compiler log when creation or compilation fails; whatever
/// `collect` returns.
pub(crate) fn compile_program<A: RtcApi, T>(
    api: &A,
    src: &str,
    name: &str,
    options: &[String],
    collect: impl FnOnce(*mut std::ffi::c_void) -> Result<T>,
) -> Result<(T, String)> {
    use std::ffi::CString;
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
    let opt_ptrs: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let vendor = |call: &str, code: i32, message: String| HalError::Vendor {
        library: A::WHAT.into(),
        call: call.into(),
        code: code as i64,
        name: api.error_name(code),
        message,
    };
    let mut prog: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: csrc and cname are NUL-terminated and outlive the call; no headers are passed.
    let rc = unsafe { api.create(&mut prog, csrc.as_ptr(), cname.as_ptr()) };
    if rc != 0 {
        return Err(vendor("CreateProgram", rc, String::new()));
    }
    struct Guard<'a, A: RtcApi>(&'a A, *mut std::ffi::c_void);
    impl<A: RtcApi> Drop for Guard<'_, A> {
        fn drop(&mut self) {
            // SAFETY: the program was created above and is destroyed exactly once.
            unsafe { self.0.destroy(&mut self.1) };
        }
    }
    let guard = Guard(api, prog);
    // SAFETY: prog is a live program; opt_ptrs holds opt_ptrs.len() NUL-terminated strings.
    let rc = unsafe { api.compile(guard.1, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    // SAFETY: prog is a live program.
    let log = unsafe { api.log(guard.1) };
    if rc != 0 {
        return Err(vendor("CompileProgram", rc, log));
    }
    let out = collect(guard.1)?;
    Ok((out, log))
}

/// Reads a buffer the vendor fills after telling its size.
///
/// # Safety
/// `size` and `fill` must be the vendor's size and fill calls for one output of one live program.
pub(crate) unsafe fn read_output(
    what: &'static str,
    size: impl FnOnce(*mut usize) -> i32,
    fill: impl FnOnce(*mut std::ffi::c_char) -> i32,
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
        let rc = fill(buf.as_mut_ptr() as *mut std::ffi::c_char);
        if rc != 0 {
            return Err(HalError::Internal(format!("{what}: read failed with {rc}")));
        }
    }
    Ok(buf)
}
