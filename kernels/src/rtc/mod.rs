//! Run-time compilation of the library with the vendors' compilers: NVIDIA's NVRTC ([`nvrtc`]) and
//! AMD's hiprtc ([`hiprtc`]), both opened at run time through `unihal-dynlib`, so the default build
//! needs neither. A missing library is [`unihal_hal::HalError::Unavailable`] naming every path tried.

pub mod hiprtc;
mod hiprtc_sys;
pub mod nvrtc;
mod nvrtc_sys;

use unihal_hal::{HalError, Result};

/// Entry names declared in PTX text (empty when the text cannot be read; see [`ptx_signatures`]).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx_signatures(ptx)
        .map(|v| v.into_iter().map(|e| e.name).collect())
        .unwrap_or_default()
}

/// An entry of a PTX module: its name and the size in bytes of each parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtxEntry {
    pub name: String,
    pub param_sizes: Vec<usize>,
}

/// Size of one PTX parameter declaration such as `.param .u64 p` or `.param .align 8 .b8 p[2008]`.
fn param_size(decl: &str) -> Result<usize, String> {
    let bad = || format!("PTX parameter `{decl}`");
    let width = decl
        .split_whitespace()
        .find_map(|t| match t {
            ".u8" | ".s8" | ".b8" => Some(1),
            ".u16" | ".s16" | ".b16" | ".f16" => Some(2),
            ".u32" | ".s32" | ".b32" | ".f32" => Some(4),
            ".u64" | ".s64" | ".b64" | ".f64" => Some(8),
            _ => None,
        })
        .ok_or_else(bad)?;
    let count = match (decl.find('['), decl.rfind(']')) {
        (Some(a), Some(b)) if a < b => decl[a + 1..b].trim().parse::<usize>().map_err(|_| bad())?,
        _ => 1,
    };
    Ok(width * count)
}

/// The entries of PTX text with their parameter sizes (what a launch must pass in `kernelParams`).
///
/// # Errors
/// A message naming the entry or parameter declaration that cannot be read.
pub fn ptx_signatures(text: &str) -> Result<Vec<PtxEntry>, String> {
    let mut entries = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + ".entry".len()..];
        let open = rest
            .find('(')
            .ok_or_else(|| "`.entry` without parameters".to_string())?;
        let name = rest[..open].trim().to_string();
        let close = rest[open..]
            .find(')')
            .ok_or_else(|| format!("entry {name}: unterminated parameters"))?;
        let params = &rest[open + 1..open + close];
        let param_sizes = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(param_size)
            .collect::<Result<Vec<_>, String>>()?;
        entries.push(PtxEntry { name, param_sizes });
        rest = &rest[open + close..];
    }
    Ok(entries)
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
