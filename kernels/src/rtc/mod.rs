//! Run-time compilation of the library with the vendors' compilers: NVIDIA's NVRTC ([`nvrtc`]) and
//! AMD's hiprtc ([`hiprtc`]), two flavors of one wrapper ([`compiler`]), both opened at run time through `unihal-dynlib`, so the default build
//! needs neither. A missing library is [`unihal_hal::HalError::Unavailable`] naming every path tried.

pub mod compiler;
pub mod helper;
pub mod hiprtc;
pub mod nvrtc;

use unihal_hal::Result;

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
