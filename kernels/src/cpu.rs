//! The library compiled for the CPU: ISA variants linked in at build time, chosen at run time.
//!
//! `build.rs` compiles `device/uh_cpu.cpp` once per ISA level (`base`; on x86-64 also `avx2` and
//! `avx512`). [`host_symbols`] picks the widest level the CPU supports (`UNIHAL_CPU_ISA=base|avx2|
//! avx512` forces one) and returns its kernels as a host symbol table, which the CPU backend (and
//! simulated runtimes) load like any module.

use crate::args::PARAM_SIZES;
use std::ffi::{c_char, CStr};
use std::sync::{Arc, OnceLock};
use unihal_hal::{HostKernel, HostKernelFn, HostSymbolTable};

#[repr(C)]
struct Entry {
    name: *const c_char,
    func: HostKernelFn,
}

extern "C" {
    fn uh_base_kernels(count: *mut u64) -> *const Entry;
    fn uh_base_args_layout(out: *mut u64);
}
#[cfg(unihal_x86_variants)]
extern "C" {
    fn uh_avx2_kernels(count: *mut u64) -> *const Entry;
    fn uh_avx512_kernels(count: *mut u64) -> *const Entry;
}

/// An ISA level the library was compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Base,
    Avx2,
    Avx512,
}

impl Isa {
    /// Name as in `UNIHAL_CPU_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Base => "base",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// True when this build has the variant and the running CPU can execute it.
    pub fn available(self) -> bool {
        match self {
            Isa::Base => true,
            #[cfg(unihal_x86_variants)]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
            #[cfg(unihal_x86_variants)]
            Isa::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
            }
            #[cfg(not(unihal_x86_variants))]
            _ => false,
        }
    }

    /// The level `UNIHAL_CPU_ISA` forces, `None` when unset.
    ///
    /// # Errors
    /// [`unihal_hal::HalError::InvalidArgument`] naming the variable for an unknown level
    /// (`avx9000`) or one this build or CPU cannot run (`avx512` without AVX-512), with the
    /// levels that are available.
    pub fn forced() -> unihal_hal::Result<Option<Isa>> {
        const NAME: &str = "UNIHAL_CPU_ISA";
        let Some(v) = unihal_hal::settings::get(NAME) else {
            return Ok(None);
        };
        let all = [Isa::Base, Isa::Avx2, Isa::Avx512];
        match all.iter().find(|i| i.name() == v.to_ascii_lowercase()) {
            Some(isa) if isa.available() => Ok(Some(*isa)),
            found => {
                let here: Vec<&str> = all
                    .iter()
                    .filter(|i| i.available())
                    .map(|i| i.name())
                    .collect();
                let why = if found.is_some() {
                    "; this CPU or build lacks it"
                } else {
                    ""
                };
                Err(unihal_hal::settings::refuse_with(
                    NAME,
                    &v,
                    format!("one of the levels this CPU runs: {}{why}", here.join(", ")),
                ))
            }
        }
    }

    /// The level used: [`Isa::forced`]'s, else the widest available (a refused
    /// `UNIHAL_CPU_ISA` is reported by the CPU backend's probe, which calls [`Isa::forced`]).
    pub fn selected() -> Isa {
        if let Ok(Some(isa)) = Isa::forced() {
            return isa;
        }
        [Isa::Avx512, Isa::Avx2, Isa::Base]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Base)
    }

    fn table(self) -> (*const Entry, u64) {
        let mut n = 0u64;
        // SAFETY: each table function writes the entry count and returns a pointer to a static
        // array of that many entries; it has no other effect.
        let p = unsafe {
            match self {
                #[cfg(unihal_x86_variants)]
                Isa::Avx2 => uh_avx2_kernels(&mut n),
                #[cfg(unihal_x86_variants)]
                Isa::Avx512 => uh_avx512_kernels(&mut n),
                _ => uh_base_kernels(&mut n),
            }
        };
        (p, n)
    }
}

/// The library's kernels for `isa` as a host symbol table.
pub fn symbols_for(isa: Isa) -> HostSymbolTable {
    let (p, n) = isa.table();
    let mut t = HostSymbolTable::new();
    for i in 0..n as usize {
        // SAFETY: i < n, the length of the static table; names are NUL-terminated string literals.
        let e = unsafe { &*p.add(i) };
        // SAFETY: `e.name` is a NUL-terminated string literal of the static table (see above).
        let name = unsafe { CStr::from_ptr(e.name) }
            .to_string_lossy()
            .into_owned();
        t.insert(
            name,
            HostKernel {
                func: e.func,
                param_sizes: &PARAM_SIZES,
            },
        );
    }
    t
}

/// The library's kernels for the selected ISA level, built once.
pub fn host_symbols() -> Arc<HostSymbolTable> {
    static TABLE: OnceLock<Arc<HostSymbolTable>> = OnceLock::new();
    TABLE
        .get_or_init(|| Arc::new(symbols_for(Isa::selected())))
        .clone()
}

/// `sizeof(uh_args)` and the offsets of `size`, `ptr`, `stride`, `s`, `u`, `axis`, `mt_ptr` as the
/// C compiler laid them out.
pub fn c_args_layout() -> [u64; 8] {
    let mut out = [0u64; 8];
    // SAFETY: the function writes exactly eight u64 values.
    unsafe { uh_base_args_layout(out.as_mut_ptr()) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::UhArgs;
    use std::mem::{offset_of, size_of};

    #[test]
    fn rust_and_c_agree_on_the_argument_layout() {
        assert_eq!(
            c_args_layout(),
            [
                size_of::<UhArgs>() as u64,
                offset_of!(UhArgs, size) as u64,
                offset_of!(UhArgs, ptr) as u64,
                offset_of!(UhArgs, stride) as u64,
                offset_of!(UhArgs, s) as u64,
                offset_of!(UhArgs, u) as u64,
                offset_of!(UhArgs, axis) as u64,
                offset_of!(UhArgs, mt_ptr) as u64,
            ]
        );
    }

    #[test]
    fn every_variant_has_every_catalogue_kernel() {
        let names: Vec<String> = crate::catalogue::kernel_entries()
            .into_iter()
            .map(|e| e.name)
            .collect();
        for isa in [Isa::Base, Isa::Avx2, Isa::Avx512] {
            if !isa.available() {
                continue;
            }
            let t = symbols_for(isa);
            assert_eq!(t.names().count(), names.len(), "{isa:?}");
            for n in &names {
                assert!(t.get(n).is_some(), "{isa:?} lacks {n}");
            }
        }
    }
}
