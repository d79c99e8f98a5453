// The CPU translation unit of the portable kernel library. Compiled once per ISA variant with
// UH_VARIANT set (uh_base, uh_avx2, uh_avx512); each variant exports its entry points under
// `<variant>_<name>` and a table `<variant>_kernels` that the Rust side turns into a host symbol table.
#include <math.h>
#include <stdint.h>
#include <string.h>

// Everything the headers define gets internal linkage, so each ISA variant's translation unit
// keeps its own copy of every template instance. With external linkage the three variants'
// copies of, say, `uh_softmax_k<uh_f32_t, 0, 1>::run` are one COMDAT symbol and the linker keeps
// one of them for all: an AVX-512 entry point then runs the base variant's SSE code for every
// kernel body the compiler did not inline.
namespace {
#include "uh_dialect.h"
#include "uh_ops.h"
#include "uh_nn.h"
#include "uh_attention.h"
#include "uh_gemm.h"
#include "uh_optim.h"
} // namespace

#define UH_CAT2(a, b) a##b
#define UH_CAT(a, b) UH_CAT2(a, b)
#define UH_SYM(name) UH_CAT(UH_CAT(UH_VARIANT, _), name)

// Host kernels follow unihal's host-kernel ABI: one call per block, CUDA-style kernelParams.
#define UH_K(name, ...)                                                                            \
    extern "C" int UH_SYM(name)(const uh_host_ctx *c, void **p) {                                  \
        uh_args a;                                                                                 \
        memcpy(&a, p[0], sizeof a);                                                                \
        uh_fault_status = 0;                                                                       \
        __VA_ARGS__::run(c, a);                                                                    \
        return uh_fault_status;                                                                    \
    }
#include "uh_kernels.def"
#undef UH_K

typedef int (*uh_host_fn)(const uh_host_ctx *, void **);
typedef struct {
    const char *name;
    uh_host_fn fn;
} uh_entry;

#define UH_K(name, ...) {#name, &UH_SYM(name)},
static const uh_entry uh_table[] = {
#include "uh_kernels.def"
};
#undef UH_K

extern "C" const uh_entry *UH_CAT(UH_VARIANT, _kernels)(uh_u64 *count) {
    *count = sizeof uh_table / sizeof uh_table[0];
    return uh_table;
}

// Layout facts checked against the Rust declaration of uh_args.
extern "C" void UH_CAT(UH_VARIANT, _args_layout)(uh_u64 out[8]) {
    uh_args a;
    out[0] = sizeof(uh_args);
    out[1] = (uh_u64)((char *)&a.size - (char *)&a);
    out[2] = (uh_u64)((char *)&a.ptr - (char *)&a);
    out[3] = (uh_u64)((char *)&a.stride - (char *)&a);
    out[4] = (uh_u64)((char *)&a.s - (char *)&a);
    out[5] = (uh_u64)((char *)&a.u - (char *)&a);
    out[6] = (uh_u64)((char *)&a.axis - (char *)&a);
    out[7] = (uh_u64)((char *)&a.mt_ptr - (char *)&a);
}
