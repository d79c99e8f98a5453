//! The library's device source, embedded in the binary for the run-time compilers.

use crate::catalogue;

/// The dialect header.
pub const DIALECT: &str = include_str!("../device/uh_dialect.h");
/// The elementwise op kernels.
pub const OPS: &str = include_str!("../device/uh_ops.h");
/// The row kernels (reductions, softmax, losses, norms, gather/scatter).
pub const NN: &str = include_str!("../device/uh_nn.h");
/// The transformer-block kernels (fused attention, rotary embeddings).
pub const ATTENTION: &str = include_str!("../device/uh_attention.h");
/// The tiled GEMM.
pub const GEMM: &str = include_str!("../device/uh_gemm.h");
/// The multi-tensor kernels (optimizers, AMP, clipping).
pub const OPTIM: &str = include_str!("../device/uh_optim.h");

/// A GPU compilation target of the dialect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuTarget {
    Cuda,
    Hip,
}

/// The whole library as one translation unit for `target`: the dialect, the ops and one
/// `extern "C" __global__` entry per catalogue kernel. No `#include` is left, so NVRTC and hiprtc
/// need no include path.
pub fn library_source(target: GpuTarget) -> String {
    let define = match target {
        GpuTarget::Cuda => "#define UH_CUDA 1",
        GpuTarget::Hip => "#define UH_HIP 1",
    };
    let mut s = String::with_capacity(DIALECT.len() + OPS.len() + 64 * 1024);
    s.push_str(define);
    s.push('\n');
    s.push_str(DIALECT);
    s.push('\n');
    for part in [OPS, NN, ATTENTION, GEMM, OPTIM] {
        s.push_str(part);
        s.push('\n');
    }
    s.push_str(
        "\n#define UH_K(name, ...) extern \"C\" __global__ void name(uh_args a) \
         { uh_ctx_t c = {0}; __VA_ARGS__::run(c, a); }\n",
    );
    s.push_str(&catalogue::def_file());
    s
}

/// Every entry name the library source defines.
pub fn entry_names() -> Vec<String> {
    catalogue::kernel_entries()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

/// A stable 64-bit FNV-1a hash of `text` (for compile caches keyed on the source).
pub fn fnv1a(data: impl AsRef<[u8]>) -> u64 {
    data.as_ref().iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}
