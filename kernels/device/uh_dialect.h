// unihal kernel dialect: one kernel source for the CPU (any C++ compiler), CUDA (NVRTC) and HIP
// (hiprtc).
//
// The compiling side defines exactly one of UH_CPU, UH_CUDA, UH_HIP (UH_GPU is derived). The header
// provides:
//   * fixed-width integer types (uh_i32, uh_u64, ...) without system headers on GPUs;
//   * UH_DEV for device functions (and static members), UH_MEMBER for non-static members, and uh_ctx_t, the launch context every kernel body receives;
//   * UH_LOOP(ctx, i, n): a loop over [0, n) in which each i is visited exactly once by the whole
//     launch. GPUs: a grid-stride loop. CPU: each block (one call of the host kernel) walks one
//     contiguous chunk, so the compiler can vectorise it;
//   * block-level primitives for row kernels (UH_TID, UH_LANES, UH_SHARED, uh_block_reduce), a
//     kernel fault report (uh_fault), and a vectorisable exp and tanh (uh_exp_fast, uh_tanh_fast);
//   * f16 and bf16 as raw 16-bit patterns with exact widening and round-to-nearest-even narrowing,
//     so every compiler accepts them (hiprtc 5.2 breaks on hip_fp16.h; NVRTC needs no header);
//   * the Philox4x32-10 counter-based generator and the float math used by the random ops, written
//     with plain IEEE operations so that, compiled without contraction, every backend gives the same
//     bits.
#ifndef UH_DIALECT_H
#define UH_DIALECT_H

#if defined(UH_CUDA) || defined(UH_HIP)
#define UH_GPU 1
#elif !defined(UH_CPU)
#error "define one of UH_CPU, UH_CUDA, UH_HIP"
#endif

#ifdef UH_CPU
#include <math.h>
#include <stdint.h>
#include <string.h>
typedef int8_t uh_i8;
typedef uint8_t uh_u8;
typedef int16_t uh_i16;
typedef uint16_t uh_u16;
typedef int32_t uh_i32;
typedef uint32_t uh_u32;
typedef int64_t uh_i64;
typedef uint64_t uh_u64;
#define UH_DEV static inline
#define UH_MEMBER inline
// Element math that loops must inline to vectorise (a call in the loop body stops GCC).
#define UH_DEV_INLINE static inline __attribute__((always_inline))
#else
typedef signed char uh_i8;
typedef unsigned char uh_u8;
typedef short uh_i16;
typedef unsigned short uh_u16;
typedef int uh_i32;
typedef unsigned int uh_u32;
typedef long long uh_i64;
typedef unsigned long long uh_u64;
#define UH_DEV static __device__ __forceinline__
#define UH_MEMBER __device__ __forceinline__
#define UH_DEV_INLINE UH_DEV
#endif

// ---------------------------------------------------------------------------------------------
// Launch context and loops.

#ifdef UH_CPU
// Must match unihal_hal::HostLaunchCtx.
typedef struct {
    uh_u32 grid[3];
    uh_u32 block[3];
    uh_u32 block_idx[3];
    uh_u8 *shared;
    uh_u64 shared_bytes;
} uh_host_ctx;
typedef const uh_host_ctx *uh_ctx_t;

// This block's chunk of [0, n): contiguous, a multiple of `g` elements except at the end.
UH_DEV void uh_chunk_g(uh_ctx_t c, uh_i64 n, uh_i64 g, uh_i64 *lo, uh_i64 *hi) {
    uh_i64 blocks = (uh_i64)c->grid[0] * c->grid[1] * c->grid[2];
    uh_i64 b = c->block_idx[0] + (uh_i64)c->grid[0] * (c->block_idx[1] + (uh_i64)c->grid[1] * c->block_idx[2]);
    uh_i64 per = (n + blocks - 1) / blocks;
    per = (per + g - 1) / g * g;
    uh_i64 l = b * per;
    *lo = l < n ? l : n;
    *hi = l + per < n ? l + per : n;
}
UH_DEV void uh_chunk(uh_ctx_t c, uh_i64 n, uh_i64 *lo, uh_i64 *hi) { uh_chunk_g(c, n, 64, lo, hi); }
#define UH_LOOP(ctx, i, n)                                                                         \
    uh_i64 uh_lo_##i, uh_hi_##i;                                                                  \
    uh_chunk(ctx, (n), &uh_lo_##i, &uh_hi_##i);                                                   \
    for (uh_i64 i = uh_lo_##i; i < uh_hi_##i; ++i)
#else
typedef struct {
    int unused;
} uh_ctx_t;
#define UH_LOOP(ctx, i, n)                                                                         \
    for (uh_i64 i = (uh_i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                       \
         i += (uh_i64)blockDim.x * gridDim.x)
#endif

// Block-level primitives of the row kernels (softmax, norms, reductions):
//   * UH_TID / UH_NTHREADS: this thread's index in its block and the block's thread count (a CPU
//     block is one thread: 0 and 1);
//   * UH_LANES: independent accumulators per thread. On the CPU a thread keeps 16 partial results
//     so that a row reduction vectorises without reassociating floating-point sums; on GPUs 1;
//   * UH_SHARED(T, name, n): an array shared by the block (a local array on the CPU);
//   * uh_block_reduce(v, scratch, op): combines one value per thread over the block and returns
//     the result to every thread (a shared-memory tree; the block size must be a power of two and
//     `scratch` hold one T per thread). On the CPU the value is already the block's result;
//   * uh_block_id / uh_grid_size: the linear block index and block count.
#define UH_ROW_THREADS 256
#ifdef UH_CPU
#define UH_TID 0
#define UH_NTHREADS 1
#define UH_LANES 16
#define UH_SHARED(T, name, n) T name[1]
#define UH_SYNC() ((void)0)
UH_DEV uh_i64 uh_block_id(uh_ctx_t c) {
    return c->block_idx[0] + (uh_i64)c->grid[0] * (c->block_idx[1] + (uh_i64)c->grid[1] * c->block_idx[2]);
}
UH_DEV uh_i64 uh_grid_size(uh_ctx_t c) { return (uh_i64)c->grid[0] * c->grid[1] * c->grid[2]; }
template <class T, class Op> UH_DEV T uh_block_reduce(T v, T *, Op) { return v; }
#else
#define UH_TID ((uh_i64)threadIdx.x)
#define UH_NTHREADS ((uh_i64)blockDim.x)
#define UH_LANES 1
#define UH_SHARED(T, name, n) __shared__ T name[n]
#define UH_SYNC() __syncthreads()
UH_DEV uh_i64 uh_block_id(uh_ctx_t) { return blockIdx.x + (uh_i64)gridDim.x * (blockIdx.y + (uh_i64)gridDim.y * blockIdx.z); }
UH_DEV uh_i64 uh_grid_size(uh_ctx_t) { return (uh_i64)gridDim.x * gridDim.y * gridDim.z; }
template <class T, class Op> __device__ T uh_block_reduce(T v, T *scratch, Op op) {
    int t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) scratch[t] = op(scratch[t], scratch[t + s]);
        __syncthreads();
    }
    T r = scratch[0];
    __syncthreads();
    return r;
}
#endif

// Reports a fault found by a kernel (an out-of-range index): the launch fails with an error on
// its stream and the kernel must not perform the faulty access. CPU: the host kernel returns a
// non-zero status. GPUs: the thread traps (a sticky launch failure, like a device assert).
#ifdef UH_CPU
static thread_local int uh_fault_status;
UH_DEV void uh_fault(uh_ctx_t) { uh_fault_status = 1; }
#elif defined(UH_CUDA)
UH_DEV void uh_fault(uh_ctx_t) { __trap(); }
#else
UH_DEV void uh_fault(uh_ctx_t) { __builtin_trap(); }
#endif

// Sets a 32-bit flag that many threads may set at once (all write the same value).
#ifdef UH_CPU
UH_DEV void uh_set_flag(float *p, float v) {
    uh_u32 bits;
    memcpy(&bits, &v, 4);
    __atomic_store_n((uh_u32 *)p, bits, __ATOMIC_RELAXED);
}
#else
UH_DEV void uh_set_flag(float *p, float v) { *(volatile float *)p = v; }
#endif

// ---------------------------------------------------------------------------------------------
// Bit casts.

#ifdef UH_CPU
UH_DEV uh_u32 uh_f2u(float f) { uh_u32 u; memcpy(&u, &f, 4); return u; }
UH_DEV float uh_u2f(uh_u32 u) { float f; memcpy(&f, &u, 4); return f; }
UH_DEV uh_u64 uh_d2u(double d) { uh_u64 u; memcpy(&u, &d, 8); return u; }
UH_DEV double uh_u2d(uh_u64 u) { double d; memcpy(&d, &u, 8); return d; }
#else
UH_DEV uh_u32 uh_f2u(float f) { return __float_as_uint(f); }
UH_DEV float uh_u2f(uh_u32 u) { return __uint_as_float(u); }
UH_DEV uh_u64 uh_d2u(double d) { return (uh_u64)__double_as_longlong(d); }
UH_DEV double uh_u2d(uh_u64 u) { return __longlong_as_double((long long)u); }
#endif

// ---------------------------------------------------------------------------------------------
// f16 and bf16 as raw bits.

// Exact widening of an IEEE binary16 pattern.
UH_DEV float uh_f16_to_float(uh_u16 h) {
    uh_u32 sign = (uh_u32)(h & 0x8000u) << 16;
    uh_u32 exp = (h >> 10) & 0x1fu;
    uh_u32 man = h & 0x3ffu;
    if (exp == 0x1fu) return uh_u2f(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f; // man * 2^-24, exact
        return sign ? -f : f;
    }
    return uh_u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

// Exact widening of a bfloat16 pattern.
UH_DEV float uh_bf16_to_float(uh_u16 h) { return uh_u2f((uh_u32)h << 16); }

// Round-to-nearest-even narrowing of a double to a 16-bit float with `ebits` exponent and `mbits`
// mantissa bits (f16: 5/10, bf16: 8/7), in one rounding step from any source type. NaN keeps the
// sign and top payload bits and is made quiet.
UH_DEV uh_u16 uh_round16(double x, int ebits, int mbits) {
    uh_u64 b = uh_d2u(x);
    uh_u16 sign = (uh_u16)((b >> 48) & 0x8000u);
    int dexp = (int)((b >> 52) & 0x7ff);
    uh_u64 dman = b & 0xfffffffffffffull;
    uh_u16 expmask = (uh_u16)(((1u << ebits) - 1u) << mbits);
    if (dexp == 0x7ff) {
        if (dman == 0) return (uh_u16)(sign | expmask);
        return (uh_u16)(sign | expmask | (1u << (mbits - 1)) | (uh_u16)(dman >> (52 - mbits)));
    }
    if (dexp == 0) return sign; // below 2^-1022: far under both formats' smallest subnormal
    int bias = (1 << (ebits - 1)) - 1;
    int e = dexp - 1023 + bias;
    uh_u64 mant = dman | (1ull << 52);
    int shift = e >= 1 ? 52 - mbits : 53 - mbits - e;
    if (shift > 53) return sign;
    uh_u64 keep = mant >> shift;
    uh_u64 rem = mant & ((1ull << shift) - 1);
    uh_u64 half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (keep & 1))) keep += 1;
    if (e >= 1) {
        if (keep >> (mbits + 1)) {
            keep >>= 1;
            e += 1;
        }
        if (e >= (1 << ebits) - 1) return (uh_u16)(sign | expmask);
        return (uh_u16)(sign | ((uh_u32)e << mbits) | (uh_u32)(keep & ((1u << mbits) - 1)));
    }
    return (uh_u16)(sign | (uh_u32)keep); // subnormal (or the smallest normal after rounding up)
}
UH_DEV uh_u16 uh_float_to_f16(double x) { return uh_round16(x, 5, 10); }
UH_DEV uh_u16 uh_float_to_bf16(double x) { return uh_round16(x, 8, 7); }

// ---------------------------------------------------------------------------------------------
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").

typedef struct {
    uh_u32 v[4];
} uh_philox_out;

UH_DEV uh_philox_out uh_philox(uh_u64 counter, uh_u64 key) {
    uh_u32 c0 = (uh_u32)counter, c1 = (uh_u32)(counter >> 32), c2 = 0, c3 = 0;
    uh_u32 k0 = (uh_u32)key, k1 = (uh_u32)(key >> 32);
    for (int r = 0; r < 10; ++r) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        uh_u64 p0 = (uh_u64)0xD2511F53u * c0;
        uh_u64 p1 = (uh_u64)0xCD9E8D57u * c2;
        uh_u32 n0 = (uh_u32)(p1 >> 32) ^ c1 ^ k0;
        uh_u32 n2 = (uh_u32)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uh_u32)p1;
        c3 = (uh_u32)p0;
        c0 = n0;
        c2 = n2;
    }
    uh_philox_out o;
    o.v[0] = c0; o.v[1] = c1; o.v[2] = c2; o.v[3] = c3;
    return o;
}

// A uniform float in [0, 1) from the top 24 bits of a word (exact).
UH_DEV float uh_uniform24(uh_u32 w) { return (float)(w >> 8) * 5.9604644775390625e-8f; }

// Natural logarithm of u in (0, 1], from IEEE operations only (about 1 ulp).
UH_DEV float uh_log_unit(float u) {
    uh_u32 b = uh_f2u(u);
    int e = (int)((b >> 23) & 0xffu) - 127;
    float m = uh_u2f((b & 0x7fffffu) | 0x3f800000u); // [1, 2)
    if (m > 1.41421356f) {
        m = m * 0.5f;
        e += 1;
    }
    float s = (m - 1.0f) / (m + 1.0f);
    float s2 = s * s;
    float p = 1.0f / 11.0f;
    p = p * s2 + 1.0f / 9.0f;
    p = p * s2 + 1.0f / 7.0f;
    p = p * s2 + 1.0f / 5.0f;
    p = p * s2 + 1.0f / 3.0f;
    p = p * s2 + 1.0f;
    return (float)e * 0.693147180559945f + 2.0f * s * p;
}

// cos(2 pi u) for u in [0, 1), from IEEE operations only.
UH_DEV float uh_cos_2pi(float u) {
    float q4 = u * 4.0f;
    int q = (int)q4;
    float t = (q4 - (float)q) * 1.57079632679489662f; // [0, pi/2)
    float t2 = t * t;
    float c = 1.0f / 479001600.0f;
    c = c * t2 - 1.0f / 3628800.0f;
    c = c * t2 + 1.0f / 40320.0f;
    c = c * t2 - 1.0f / 720.0f;
    c = c * t2 + 1.0f / 24.0f;
    c = c * t2 - 0.5f;
    c = c * t2 + 1.0f;
    float s = -1.0f / 39916800.0f;
    s = s * t2 + 1.0f / 362880.0f;
    s = s * t2 - 1.0f / 5040.0f;
    s = s * t2 + 1.0f / 120.0f;
    s = s * t2 - 1.0f / 6.0f;
    s = s * t2 + 1.0f;
    s = s * t;
    return q == 0 ? c : q == 1 ? -s : q == 2 ? -c : s;
}

// A standard normal value from one Philox block (Box-Muller on words 0 and 1).
UH_DEV float uh_normal(uh_philox_out r) {
    float u1 = (float)((r.v[0] >> 8) + 1u) * 5.9604644775390625e-8f; // (0, 1]
    float u2 = uh_uniform24(r.v[1]);                                  // [0, 1)
    return sqrtf(-2.0f * uh_log_unit(u1)) * uh_cos_2pi(u2);
}

// exp(x) in f32 from IEEE operations only, without branches so that it vectorises (about 1 ulp):
// x = n ln2 + r with |r| <= ln2/2 (Cody-Waite), a degree-7 polynomial for e^r, then two exact
// power-of-two scalings so that results from subnormal to overflow come out right.
UH_DEV_INLINE float uh_exp_fast(float x) {
    float c = x < -104.0f ? -104.0f : x;
    c = c > 89.0f ? 89.0f : c;
    float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f; // round to nearest
    float r = (c - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int ni = (int)n;
    int h = ni / 2;
    float s1 = uh_u2f((uh_u32)(h + 127) << 23);
    float s2 = uh_u2f((uh_u32)(ni - h + 127) << 23);
    float y = p * s1 * s2;
    return x != x ? x : y;
}

// tanh(x) in f32 from IEEE operations only, without branches so that it vectorises (a few ulp):
// for |x| < 0.4 the odd Taylor series to x^13 (the next term is below 4e-9 relative), otherwise
// 1 - 2 / (e^(2|x|) + 1) with the sign restored (no cancellation there: |tanh| > 0.37).
// Saturates to +-1 (uh_exp_fast clamps), NaN propagates.
UH_DEV_INLINE float uh_tanh_fast(float x) {
    float a = uh_u2f(uh_f2u(x) & 0x7fffffffu);
    float x2 = x * x;
    float p = 21844.0f / 6081075.0f;
    p = p * x2 - 1382.0f / 155925.0f;
    p = p * x2 + 62.0f / 2835.0f;
    p = p * x2 - 17.0f / 315.0f;
    p = p * x2 + 2.0f / 15.0f;
    p = p * x2 - 1.0f / 3.0f;
    float small = x + x * x2 * p;
    float big = 1.0f - 2.0f / (uh_exp_fast(2.0f * a) + 1.0f);
    big = uh_u2f(uh_f2u(big) | (uh_f2u(x) & 0x80000000u));
    float r = a < 0.4f ? small : big;
    return x != x ? x : r;
}

#endif // UH_DIALECT_H
