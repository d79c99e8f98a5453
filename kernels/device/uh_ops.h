// unihal portable op kernels (elementwise part): dtype traits, op functors and kernel templates.
// Included after uh_dialect.h. Entry points are instantiated from the generated list
// (uh_kernels.def) by the per-target translation unit.
#ifndef UH_OPS_H
#define UH_OPS_H

#define UH_MAX_DIMS 8
#define UH_MAX_OPERANDS 8
#define UH_MT_GROUPS 24
#define UH_MT_WIDTH 5

// The one argument of every library kernel. Must match unihal_kernels::args::UhArgs.
// Elementwise kernels iterate `n` elements over `size`/`stride`; row kernels iterate `n` rows the
// same way (each row's first element), with `len` elements per row at stride `axis[k]` for
// operand k; multi-tensor kernels walk `mt_count` groups of up to UH_MT_WIDTH dense tensors.
typedef struct {
    uh_i64 ndim;                               // dims after collapsing (0 for a scalar)
    uh_i64 n;                                  // elements (or rows)
    uh_i64 contiguous;                         // 1: every operand is dense with stride 1
    uh_i64 size[UH_MAX_DIMS];                  // row-major sizes
    uh_u64 ptr[UH_MAX_OPERANDS];               // address of element 0 of each operand
    uh_i64 stride[UH_MAX_OPERANDS][UH_MAX_DIMS]; // strides in elements
    double s[8];                               // float scalars
    uh_i64 i[4];                               // integer scalars
    uh_u64 u[2];                               // raw scalars (fill bits, seed, offset)
    uh_i64 len;                                // row length (reduced axis, K of a matmul)
    uh_i64 axis[UH_MAX_OPERANDS];              // per-operand stride along the row
    uh_i64 mt_count;                           // multi-tensor groups in this launch
    uh_i64 mt_len[UH_MT_GROUPS];               // elements per group
    uh_u64 mt_ptr[UH_MT_GROUPS][UH_MT_WIDTH];  // tensors of each group
} uh_args;

// Offsets of element `idx` (row-major) of each of the first `nops` operands.
UH_DEV void uh_offsets(const uh_args &a, int nops, uh_i64 idx, uh_i64 *off) {
    for (int k = 0; k < nops; ++k) off[k] = 0;
    for (int d = (int)a.ndim - 1; d >= 0; --d) {
        uh_i64 c = idx % a.size[d];
        idx /= a.size[d];
        for (int k = 0; k < nops; ++k) off[k] += c * a.stride[k][d];
    }
}

#ifdef UH_CPU
// CPU: decompose the chunk start once, then step an odometer. Rows (UH_ROWS_BEGIN) are chunked
// one by one rather than in multiples of 64.
#define UH_STRIDED_BEGIN(ctx, a, nops, off) UH_STRIDED_BEGIN_G(ctx, a, nops, off, 64)
#define UH_ROWS_BEGIN(ctx, a, nops, off) UH_STRIDED_BEGIN_G(ctx, a, nops, off, 1)
#define UH_ROWS_END(a, nops, off) UH_STRIDED_END(a, nops, off)
#define UH_STRIDED_BEGIN_G(ctx, a, nops, off, g)                                                   \
    {                                                                                              \
        uh_i64 uh_lo, uh_hi, uh_c[UH_MAX_DIMS], off[UH_MAX_OPERANDS];                              \
        uh_chunk_g(ctx, (a).n, g, &uh_lo, &uh_hi);                                                 \
        {                                                                                          \
            uh_i64 r = uh_lo;                                                                      \
            for (int d = (int)(a).ndim - 1; d >= 0; --d) {                                         \
                uh_c[d] = r % (a).size[d];                                                         \
                r /= (a).size[d];                                                                  \
            }                                                                                      \
            uh_offsets(a, nops, uh_lo, off);                                                       \
        }                                                                                          \
        for (uh_i64 uh_i = uh_lo; uh_i < uh_hi; ++uh_i) {
#define UH_STRIDED_END(a, nops, off)                                                               \
        for (int d = (int)(a).ndim - 1; d >= 0; --d) {                                             \
            ++uh_c[d];                                                                             \
            for (int k = 0; k < (nops); ++k) off[k] += (a).stride[k][d];                           \
            if (uh_c[d] < (a).size[d]) break;                                                      \
            for (int k = 0; k < (nops); ++k) off[k] -= (a).stride[k][d] * (a).size[d];             \
            uh_c[d] = 0;                                                                           \
        }                                                                                          \
        }                                                                                          \
    }
#else
#define UH_STRIDED_BEGIN(ctx, a, nops, off)                                                        \
    UH_LOOP(ctx, uh_i, (a).n) {                                                                    \
        uh_i64 off[UH_MAX_OPERANDS];                                                               \
        uh_offsets(a, nops, uh_i, off);
#define UH_STRIDED_END(a, nops, off) }
// GPU rows: a block per row (grid-stride over rows); the block's threads share the row.
#define UH_ROWS_BEGIN(ctx, a, nops, off)                                                           \
    for (uh_i64 uh_i = uh_block_id(ctx); uh_i < (a).n; uh_i += uh_grid_size(ctx)) {               \
        uh_i64 off[UH_MAX_OPERANDS];                                                               \
        uh_offsets(a, nops, uh_i, off);
#define UH_ROWS_END(a, nops, off) }
#endif

// ---------------------------------------------------------------------------------------------
// Dtype traits: storage type, compute type, loads and stores, conversions for casts.

#define UH_INT_TRAITS(NAME, T, UT)                                                                 \
    struct NAME {                                                                                  \
        typedef T storage;                                                                         \
        typedef T compute;                                                                         \
        static const bool is_int = true;                                                           \
        UH_DEV compute load(const storage *p) { return *p; }                                       \
        UH_DEV void store(storage *p, compute v) { *p = v; }                                       \
        UH_DEV compute scalar(const uh_args &a, int k) { return (T)a.i[k]; }                       \
        UH_DEV double to_double(compute v) { return (double)v; }                                   \
        UH_DEV uh_i64 to_i64_or_0(compute v) { return (uh_i64)v; }                                 \
        UH_DEV storage from_i64(uh_i64 v) { return (T)(UT)(uh_u64)v; }                             \
        UH_DEV storage from_double(double v) { /* truncate, saturate, NaN -> 0 (Rust's `as`) */    \
            if (v != v) return 0;                                                                  \
            if (v <= -9223372036854775808.0) return sat(-9223372036854775807ll - 1);               \
            if (v >= 9223372036854775808.0) return sat(9223372036854775807ll);                     \
            return sat((uh_i64)v);                                                                 \
        }                                                                                          \
        UH_DEV storage sat(uh_i64 v) {                                                             \
            const T lo = (T)((UT)1 << (sizeof(T) * 8 - 1));                                       \
            const T hi = (T)~(UT)lo;                                                               \
            return v < (uh_i64)lo ? lo : v > (uh_i64)hi ? hi : (T)v;                               \
        }                                                                                          \
    };
UH_INT_TRAITS(uh_i32_t, uh_i32, uh_u32)
UH_INT_TRAITS(uh_i64_t, uh_i64, uh_u64)

struct uh_f32_t {
    typedef float storage;
    typedef float compute;
    static const bool is_int = false;
    UH_DEV compute load(const storage *p) { return *p; }
    UH_DEV void store(storage *p, compute v) { *p = v; }
    UH_DEV compute scalar(const uh_args &a, int k) { return (float)a.s[k]; }
    UH_DEV double to_double(compute v) { return (double)v; }
    UH_DEV uh_i64 to_i64_or_0(compute) { return 0; }
    UH_DEV storage from_double(double v) { return (float)v; }
    UH_DEV storage from_i64(uh_i64 v) { return (float)v; }
};
struct uh_f64_t {
    typedef double storage;
    typedef double compute;
    static const bool is_int = false;
    UH_DEV compute load(const storage *p) { return *p; }
    UH_DEV void store(storage *p, compute v) { *p = v; }
    UH_DEV compute scalar(const uh_args &a, int k) { return a.s[k]; }
    UH_DEV double to_double(compute v) { return v; }
    UH_DEV uh_i64 to_i64_or_0(compute) { return 0; }
    UH_DEV storage from_double(double v) { return v; }
    UH_DEV storage from_i64(uh_i64 v) { return (double)v; }
};
struct uh_f16_t {
    typedef uh_u16 storage;
    typedef float compute;
    static const bool is_int = false;
    UH_DEV compute load(const storage *p) { return uh_f16_to_float(*p); }
    UH_DEV void store(storage *p, compute v) { *p = uh_float_to_f16((double)v); }
    UH_DEV compute scalar(const uh_args &a, int k) { return (float)a.s[k]; }
    UH_DEV double to_double(compute v) { return (double)v; }
    UH_DEV uh_i64 to_i64_or_0(compute) { return 0; }
    UH_DEV storage from_double(double v) { return uh_float_to_f16(v); }
    UH_DEV storage from_i64(uh_i64 v) { return uh_float_to_f16((double)v); }
};
struct uh_bf16_t {
    typedef uh_u16 storage;
    typedef float compute;
    static const bool is_int = false;
    UH_DEV compute load(const storage *p) { return uh_bf16_to_float(*p); }
    UH_DEV void store(storage *p, compute v) { *p = uh_float_to_bf16((double)v); }
    UH_DEV compute scalar(const uh_args &a, int k) { return (float)a.s[k]; }
    UH_DEV double to_double(compute v) { return (double)v; }
    UH_DEV uh_i64 to_i64_or_0(compute) { return 0; }
    UH_DEV storage from_double(double v) { return uh_float_to_bf16(v); }
    UH_DEV storage from_i64(uh_i64 v) { return uh_float_to_bf16((double)v); }
};

// ---------------------------------------------------------------------------------------------
// Math overloads (float and double), from the platform's libm or device library.

UH_DEV float uh_exp(float x) { return expf(x); }
UH_DEV double uh_exp(double x) { return exp(x); }
UH_DEV float uh_log(float x) { return logf(x); }
UH_DEV double uh_log(double x) { return log(x); }
UH_DEV float uh_sqrt(float x) { return sqrtf(x); }
UH_DEV double uh_sqrt(double x) { return sqrt(x); }
UH_DEV_INLINE float uh_tanh(float x) { return uh_tanh_fast(x); }
UH_DEV double uh_tanh(double x) { return tanh(x); }
UH_DEV float uh_erf(float x) { return erff(x); }
UH_DEV double uh_erf(double x) { return erf(x); }
UH_DEV float uh_pow(float x, float y) { return powf(x, y); }
UH_DEV double uh_pow(double x, double y) { return pow(x, y); }

// Wrapping integer arithmetic (no signed overflow).
template <class T> UH_DEV T uh_wrap_add(T a, T b) { return (T)((uh_u64)a + (uh_u64)b); }
template <class T> UH_DEV T uh_wrap_sub(T a, T b) { return (T)((uh_u64)a - (uh_u64)b); }
template <class T> UH_DEV T uh_wrap_mul(T a, T b) { return (T)((uh_u64)a * (uh_u64)b); }
UH_DEV float uh_wrap_add(float a, float b) { return a + b; }
UH_DEV double uh_wrap_add(double a, double b) { return a + b; }
UH_DEV float uh_wrap_sub(float a, float b) { return a - b; }
UH_DEV double uh_wrap_sub(double a, double b) { return a - b; }
UH_DEV float uh_wrap_mul(float a, float b) { return a * b; }
UH_DEV double uh_wrap_mul(double a, double b) { return a * b; }

// ---------------------------------------------------------------------------------------------
// Op functors. C is the compute type.

#define UH_GELU_K 0.7978845608028654 // sqrt(2/pi)
#define UH_SQRT1_2 0.7071067811865476
#define UH_INV_SQRT_2PI 0.3989422804014327

// Negation and absolute value: wrapping for integers, sign-bit operations for floats (so -0.0 and
// NaN behave).
template <class T> UH_DEV T uh_neg(T x) { return (T)((uh_u64)0 - (uh_u64)x); }
UH_DEV float uh_neg(float x) { return -x; }
UH_DEV double uh_neg(double x) { return -x; }
template <class T> UH_DEV T uh_abs(T x) { return x < 0 ? uh_neg(x) : x; }
UH_DEV float uh_abs(float x) { return uh_u2f(uh_f2u(x) & 0x7fffffffu); }
UH_DEV double uh_abs(double x) { return uh_u2d(uh_d2u(x) & 0x7fffffffffffffffull); }

struct uh_op_neg { template <class C> UH_DEV C f(C x) { return uh_neg(x); } };
struct uh_op_abs { template <class C> UH_DEV C f(C x) { return uh_abs(x); } };
struct uh_op_exp { template <class C> UH_DEV C f(C x) { return uh_exp(x); } };
struct uh_op_log { template <class C> UH_DEV C f(C x) { return uh_log(x); } };
struct uh_op_sqrt { template <class C> UH_DEV C f(C x) { return uh_sqrt(x); } };
struct uh_op_rsqrt { template <class C> UH_DEV C f(C x) { return (C)1 / uh_sqrt(x); } };
struct uh_op_tanh { template <class C> UH_DEV C f(C x) { return uh_tanh(x); } };
struct uh_op_sigmoid { template <class C> UH_DEV C f(C x) { return (C)1 / ((C)1 + uh_exp(-x)); } };
struct uh_op_relu { template <class C> UH_DEV C f(C x) { return (x > (C)0 || x != x) ? x : (C)0; } };
// The GELU functors are forced inline: they are large enough that GCC would call them from the
// loop, which then does not vectorise.
struct uh_op_gelu_tanh {
    template <class C> UH_DEV_INLINE C f(C x) {
        C u = (C)UH_GELU_K * (x + (C)0.044715 * x * x * x);
        return (C)0.5 * x * ((C)1 + uh_tanh(u));
    }
};
struct uh_op_gelu_erf {
    template <class C> UH_DEV C f(C x) { return (C)0.5 * x * ((C)1 + uh_erf(x * (C)UH_SQRT1_2)); }
};
struct uh_op_silu { template <class C> UH_DEV C f(C x) { return x / ((C)1 + uh_exp(-x)); } };

// Backward functors: dx = g(x, dy).
struct uh_op_relu_backward { template <class C> UH_DEV C f(C x, C dy) { return x > (C)0 ? dy : (C)0; } };
struct uh_op_gelu_tanh_backward {
    template <class C> UH_DEV_INLINE C f(C x, C dy) {
        C x2 = x * x;
        C t = uh_tanh((C)UH_GELU_K * (x + (C)0.044715 * x2 * x));
        C sech2 = (C)1 - t * t;
        // The second term through x clamped to [-10, 10]: beyond, tanh is exactly +-1 so sech2 is
        // 0 and the term exactly 0, and the clamp keeps x*x from overflowing into 0 * inf. No
        // branch, so the loop vectorises.
        C xc = x < (C)-10 ? (C)-10 : x > (C)10 ? (C)10 : x;
        C d = (C)0.5 * ((C)1 + t) + (C)0.5 * xc * sech2 * (C)UH_GELU_K * ((C)1 + (C)0.134145 * xc * xc);
        return dy * d;
    }
};
struct uh_op_gelu_erf_backward {
    template <class C> UH_DEV C f(C x, C dy) {
        C d = (C)0.5 * ((C)1 + uh_erf(x * (C)UH_SQRT1_2)) + x * uh_exp((C)-0.5 * x * x) * (C)UH_INV_SQRT_2PI;
        return dy * d;
    }
};
struct uh_op_silu_backward {
    template <class C> UH_DEV C f(C x, C dy) {
        C s = (C)1 / ((C)1 + uh_exp(-x));
        return dy * (s * ((C)1 + x * ((C)1 - s)));
    }
};

// Binary functors.
struct uh_op_add { template <class C> UH_DEV C f(C a, C b) { return uh_wrap_add(a, b); } };
struct uh_op_sub { template <class C> UH_DEV C f(C a, C b) { return uh_wrap_sub(a, b); } };
struct uh_op_mul { template <class C> UH_DEV C f(C a, C b) { return uh_wrap_mul(a, b); } };
struct uh_op_div { template <class C> UH_DEV C f(C a, C b) { return a / b; } };
struct uh_op_maximum { template <class C> UH_DEV C f(C a, C b) { return a != a ? a : b != b ? b : a > b ? a : b; } };
struct uh_op_minimum { template <class C> UH_DEV C f(C a, C b) { return a != a ? a : b != b ? b : a < b ? a : b; } };
struct uh_op_pow { template <class C> UH_DEV C f(C a, C b) { return uh_pow(a, b); } };

// ---------------------------------------------------------------------------------------------
// Kernel templates. Each has `static run(ctx, args)`; operands are in OpCall order.

template <class T, class Op> struct uh_unary_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *x = (const S *)a.ptr[0];
        S *y = (S *)a.ptr[1];
        Op op;
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(y + i, op.f(T::load(x + i))); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 2, o) T::store(y + o[1], op.f(T::load(x + o[0])));
            UH_STRIDED_END(a, 2, o)
        }
    }
};

template <class T, class Op> struct uh_unary_backward_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *x = (const S *)a.ptr[0], *dy = (const S *)a.ptr[1];
        S *dx = (S *)a.ptr[2];
        Op op;
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(dx + i, op.f(T::load(x + i), T::load(dy + i))); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 3, o) T::store(dx + o[2], op.f(T::load(x + o[0]), T::load(dy + o[1])));
            UH_STRIDED_END(a, 3, o)
        }
    }
};

#ifdef UH_CPU
// CPU rows of a binary op whose output is dense along the innermost dim and whose inputs are dense
// (stride 1) or broadcast (stride 0) along it: a bias added to every row, a row scaled by a
// column. The rows are this block's; each row is a plain loop the compiler vectorises, where the
// element-by-element odometer is several times slower. Same op on the same values: results are
// identical to the odometer's. Returns false (nothing done) for other layouts.
template <class T, class Op>
UH_DEV bool uh_binary_rows(uh_ctx_t ctx, const uh_args &a, const typename T::storage *x,
                           const typename T::storage *y, typename T::storage *z) {
    typedef typename T::compute C;
    if (a.ndim < 1) return false;
    const int in = (int)a.ndim - 1;
    const uh_i64 sx = a.stride[0][in], sy = a.stride[1][in], cols = a.size[in];
    if (a.stride[2][in] != 1 || (sx != 0 && sx != 1) || (sy != 0 && sy != 1)) return false;
    Op op;
    uh_i64 lo, hi, off[3];
    uh_chunk_g(ctx, a.n / cols, 1, &lo, &hi);
    for (uh_i64 r = lo; r < hi; ++r) {
        uh_offsets(a, 3, r * cols, off);
        const typename T::storage *xr = x + off[0], *yr = y + off[1];
        typename T::storage *zr = z + off[2];
        if (sx == 1 && sy == 1) {
            for (uh_i64 j = 0; j < cols; ++j) T::store(zr + j, op.f(T::load(xr + j), T::load(yr + j)));
        } else if (sx == 1) {
            const C b = T::load(yr);
            for (uh_i64 j = 0; j < cols; ++j) T::store(zr + j, op.f(T::load(xr + j), b));
        } else if (sy == 1) {
            const C b = T::load(xr);
            for (uh_i64 j = 0; j < cols; ++j) T::store(zr + j, op.f(b, T::load(yr + j)));
        } else {
            const C v = op.f(T::load(xr), T::load(yr));
            for (uh_i64 j = 0; j < cols; ++j) T::store(zr + j, v);
        }
    }
    return true;
}
#endif

template <class T, class Op> struct uh_binary_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *x = (const S *)a.ptr[0], *y = (const S *)a.ptr[1];
        S *z = (S *)a.ptr[2];
        Op op;
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(z + i, op.f(T::load(x + i), T::load(y + i))); }
#ifdef UH_CPU
        } else if (uh_binary_rows<T, Op>(ctx, a, x, y, z)) {
#endif
        } else {
            UH_STRIDED_BEGIN(ctx, a, 3, o) T::store(z + o[2], op.f(T::load(x + o[0]), T::load(y + o[1])));
            UH_STRIDED_END(a, 3, o)
        }
    }
};

template <class T, class Op> struct uh_binary_scalar_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute C;
        const S *x = (const S *)a.ptr[0];
        S *z = (S *)a.ptr[1];
        const C b = T::scalar(a, 0);
        Op op;
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(z + i, op.f(T::load(x + i), b)); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 2, o) T::store(z + o[1], op.f(T::load(x + o[0]), b));
            UH_STRIDED_END(a, 2, o)
        }
    }
};

template <class T> struct uh_axpy_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute C;
        const S *x = (const S *)a.ptr[0];
        S *y = (S *)a.ptr[1];
        const C alpha = T::scalar(a, 0);
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(y + i, alpha * T::load(x + i) + T::load(y + i)); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 2, o) T::store(y + o[1], alpha * T::load(x + o[0]) + T::load(y + o[1]));
            UH_STRIDED_END(a, 2, o)
        }
    }
};

template <class Src, class Dst> struct uh_cast_k {
    // Integers convert exactly through i64, floats through double: one rounding step either way.
    UH_DEV typename Dst::storage conv(typename Src::compute v) {
        return Src::is_int ? Dst::from_i64(Src::to_i64_or_0(v)) : Dst::from_double(Src::to_double(v));
    }
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const typename Src::storage *x = (const typename Src::storage *)a.ptr[0];
        typename Dst::storage *y = (typename Dst::storage *)a.ptr[1];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { y[i] = conv(Src::load(x + i)); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 2, o) y[o[1]] = conv(Src::load(x + o[0]));
            UH_STRIDED_END(a, 2, o)
        }
    }
};

// Width-generic kernels: fill, copy and where move bits, so one kernel per element width serves
// every dtype.
template <class W> struct uh_fill_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        W *y = (W *)a.ptr[0];
        const W v = (W)a.u[0];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { y[i] = v; }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 1, o) y[o[0]] = v;
            UH_STRIDED_END(a, 1, o)
        }
    }
};
template <class W> struct uh_copy_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const W *x = (const W *)a.ptr[0];
        W *y = (W *)a.ptr[1];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { y[i] = x[i]; }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 2, o) y[o[1]] = x[o[0]];
            UH_STRIDED_END(a, 2, o)
        }
    }
};
template <class W> struct uh_where_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const uh_u8 *c = (const uh_u8 *)a.ptr[0];
        const W *x = (const W *)a.ptr[1], *y = (const W *)a.ptr[2];
        W *z = (W *)a.ptr[3];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { z[i] = c[i] ? x[i] : y[i]; }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 4, o) z[o[3]] = c[o[0]] ? x[o[1]] : y[o[2]];
            UH_STRIDED_END(a, 4, o)
        }
    }
};

// Random ops. Element i (row-major) uses Philox block (offset + i) under key seed, so results do
// not depend on the launch shape or the backend.
template <class T> struct uh_uniform_k {
    UH_DEV typename T::compute value(const uh_args &a, uh_i64 i) {
        uh_philox_out r = uh_philox(a.u[1] + (uh_u64)i, a.u[0]);
        typedef typename T::compute C;
        C u = sizeof(C) == 8 ? (C)((double)(((uh_u64)r.v[0] << 21) | (r.v[1] >> 11)) * 1.1102230246251565e-16)
                             : (C)uh_uniform24(r.v[0]);
        return (C)a.s[0] + ((C)a.s[1] - (C)a.s[0]) * u;
    }
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typename T::storage *y = (typename T::storage *)a.ptr[0];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(y + i, value(a, i)); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 1, o) T::store(y + o[0], value(a, uh_i));
            UH_STRIDED_END(a, 1, o)
        }
    }
};
template <class T> struct uh_normal_k {
    UH_DEV typename T::compute value(const uh_args &a, uh_i64 i) {
        typedef typename T::compute C;
        float z = uh_normal(uh_philox(a.u[1] + (uh_u64)i, a.u[0]));
        return (C)a.s[0] + (C)a.s[1] * (C)z;
    }
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typename T::storage *y = (typename T::storage *)a.ptr[0];
        if (a.contiguous) {
            UH_LOOP(ctx, i, a.n) { T::store(y + i, value(a, i)); }
        } else {
            UH_STRIDED_BEGIN(ctx, a, 1, o) T::store(y + o[0], value(a, uh_i));
            UH_STRIDED_END(a, 1, o)
        }
    }
};
// Operands [x, out, mask]; keep when uniform >= p.
template <class T> struct uh_dropout_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute C;
        const S *x = (const S *)a.ptr[0];
        S *y = (S *)a.ptr[1];
        uh_u8 *m = (uh_u8 *)a.ptr[2];
        const float p = (float)a.s[0];
        const C scale = (C)(1.0 / (1.0 - a.s[0]));
        UH_STRIDED_BEGIN(ctx, a, 3, o)
            uh_u8 keep = uh_uniform24(uh_philox(a.u[1] + (uh_u64)uh_i, a.u[0]).v[0]) >= p ? 1 : 0;
            m[o[2]] = keep;
            T::store(y + o[1], keep ? T::load(x + o[0]) * scale : (C)0);
        UH_STRIDED_END(a, 3, o)
    }
};
// Operands [dy, mask, dx].
template <class T> struct uh_dropout_backward_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute C;
        const S *dy = (const S *)a.ptr[0];
        const uh_u8 *m = (const uh_u8 *)a.ptr[1];
        S *dx = (S *)a.ptr[2];
        const C scale = (C)(1.0 / (1.0 - a.s[0]));
        UH_STRIDED_BEGIN(ctx, a, 3, o)
            T::store(dx + o[2], m[o[1]] ? T::load(dy + o[0]) * scale : (C)0);
        UH_STRIDED_END(a, 3, o)
    }
};

#endif // UH_OPS_H
