//! # unihal-kernels: one kernel source for every backend
//!
//! The portable kernel library is written once in a small C++ dialect (`device/uh_dialect.h`:
//! indexing, loops, block reductions, f16/bf16 as raw bits, Philox) and compiled three ways:
//!
//! * for the CPU backend at build time by the system C++ compiler (`build.rs`: -O3 in every
//!   profile, -O2 for the x86-64 baseline only a machine without AVX2 runs; no fast-math, no
//!   contraction; one object per ISA level, chosen at run time: [`cpu`]);
//! * by NVRTC for CUDA and by hiprtc for HIP at run time, from the sources embedded in the binary
//!   ([`source`], [`rtc`]).
//!
//! Every kernel has a stable entry name (`uh_add_f32`) listed in [`catalogue`]. Ops reach the
//! library as plain data (`unihal_hal::OpCall`); [`plan`] turns a call into a kernel launch the
//! same way for every backend. [`testing`] holds the conformance suite's raw-launch test kernels.

pub mod args;
pub mod catalogue;
pub mod cpu;
pub mod plan;
pub mod plan_attention;
pub mod plan_nn;
pub mod rtc;
pub mod source;
pub mod testing;

use std::collections::{BTreeMap, HashSet};
use std::sync::OnceLock;
use unihal_hal::{DType, OpId};

/// True when the library has an entry point named `name`.
pub fn has_kernel(name: &str) -> bool {
    static NAMES: OnceLock<HashSet<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            catalogue::kernel_entries()
                .into_iter()
                .map(|e| e.name)
                .collect()
        })
        .contains(name)
}

/// The ops and dtypes the library implements, for a backend's capabilities.
pub fn support() -> BTreeMap<OpId, Vec<DType>> {
    let arith = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::Bf16,
        DType::I32,
        DType::I64,
    ];
    let mut m = BTreeMap::new();
    for op in OpId::ALL {
        let dtypes: Vec<DType> = match op {
            OpId::Fill | OpId::Copy | OpId::Where => DType::ALL.to_vec(),
            OpId::Cast => arith.to_vec(),
            _ if !op.class().is_elementwise() => [DType::F32, DType::F64, DType::F16, DType::Bf16]
                .into_iter()
                .filter(|&d| has_kernel(&plan_nn::support_kernel(op, d)))
                .collect(),
            _ => arith
                .iter()
                .copied()
                .filter(|d| has_kernel(&format!("uh_{}_{}", op.name(), d.name())))
                .collect(),
        };
        if !dtypes.is_empty() {
            m.insert(op, dtypes);
        }
    }
    m
}
