// unihal portable op kernels (row part): reductions, softmax, cross-entropy, layer/RMS norm and
// row gather/scatter. Included after uh_ops.h.
//
// A row kernel walks rows with UH_ROWS_BEGIN/END (a block per row on GPUs, a chunk of rows per
// block on the CPU) and reduces within a row with uh_row_reduce (UH_LANES partial results per
// thread, so the CPU build vectorises without reassociating sums) followed by uh_block_reduce
// (threads of a GPU block cooperate on one row). Half types compute in f32, f64 in f64.
#ifndef UH_NN_H
#define UH_NN_H

struct uh_red_sum {
    template <class A> UH_MEMBER A operator()(A x, A y) const { return x + y; }
};
// NaN-propagating max and min.
struct uh_red_max {
    template <class A> UH_MEMBER A operator()(A x, A y) const { return x != x ? x : y != y ? y : x > y ? x : y; }
};
struct uh_red_min {
    template <class A> UH_MEMBER A operator()(A x, A y) const { return x != x ? x : y != y ? y : x < y ? x : y; }
};

// A value and its index, for argmax/argmin.
template <class A> struct uh_vi {
    A v;
    uh_i64 i;
};
// First index of the largest (Max = 1) or smallest value; NaN is the extreme.
template <int Max> struct uh_red_arg {
    template <class A> UH_MEMBER uh_vi<A> operator()(uh_vi<A> x, uh_vi<A> y) const {
        bool xn = x.v != x.v, yn = y.v != y.v;
        if (xn || yn) return (xn && (!yn || x.i < y.i)) ? x : y;
        if (x.v == y.v) return x.i < y.i ? x : y;
        return (Max ? x.v > y.v : x.v < y.v) ? x : y;
    }
};

UH_DEV float uh_expc(float x) { return uh_exp_fast(x); }
UH_DEV double uh_expc(double x) { return exp(x); }
UH_DEV float uh_inf(float) { return uh_u2f(0x7f800000u); }
UH_DEV double uh_inf(double) { return uh_u2d(0x7ff0000000000000ull); }

// This thread's partial reduction of val(j) over j in [0, len), then the block's.
template <class A, class Op, class F>
UH_DEV A uh_row_reduce(uh_i64 len, A init, Op op, F val, A *scratch) {
    A acc[UH_LANES];
    for (int l = 0; l < UH_LANES; ++l) acc[l] = init;
    uh_i64 j = UH_TID * UH_LANES;
    for (; j + UH_LANES <= len; j += UH_NTHREADS * UH_LANES)
        for (int l = 0; l < UH_LANES; ++l) acc[l] = op(acc[l], val(j + l));
#ifdef UH_CPU
    for (int l = 0; j + l < len; ++l) acc[l] = op(acc[l], val(j + l));
#endif
    A r = acc[0];
    for (int l = 1; l < UH_LANES; ++l) r = op(r, acc[l]);
    return uh_block_reduce(r, scratch, op);
}

// Calls f(j) for this thread's share of [0, len).
#define UH_ROW_FOR(j, len) for (uh_i64 j = UH_TID; j < (len); j += UH_NTHREADS)

// ---------------------------------------------------------------------------------------------
// Reductions along one axis: [x, out]; rows are the output elements, `len` the axis length at
// stride axis[0].

// Kind: 0 sum, 1 mean, 2 max, 3 min.
#ifdef UH_CPU
// CPU: a reduction along a strided axis whose consecutive outputs are consecutive in x and in out
// (a leading-axis reduction such as a bias gradient over [rows, k]). Instead of walking each
// output's strided column, tiles of UH_COLS outputs walk x row by row with contiguous, vectorised
// loads. Each output keeps uh_row_reduce's lane partials (value j goes to lane j % UH_LANES, in
// increasing j) and combines them in the same order, so the results are bit-identical to the
// column walk. Returns false (nothing done) when the layout does not fit.
#define UH_COLS 16
template <class T, class Op>
UH_DEV bool uh_reduce_cols(uh_ctx_t ctx, const uh_args &a, typename T::compute init, Op op, bool mean) {
    typedef typename T::storage S;
    typedef typename T::compute A;
    const uh_i64 len = a.len, st = a.axis[0];
    if (st == 1 || a.ndim < 1 || a.stride[0][a.ndim - 1] != 1 || a.stride[1][a.ndim - 1] != 1) return false;
    const S *x = (const S *)a.ptr[0];
    S *out = (S *)a.ptr[1];
    const uh_i64 inner = a.size[a.ndim - 1];
    uh_i64 lo, hi;
    uh_chunk_g(ctx, a.n, 1, &lo, &hi);
    A acc[UH_LANES][UH_COLS];
    for (uh_i64 i = lo; i < hi;) {
        uh_i64 off[2];
        uh_offsets(a, 2, i, off);
        uh_i64 w = inner - i % inner;
        if (w > hi - i) w = hi - i;
        if (w > UH_COLS) w = UH_COLS;
        for (int l = 0; l < UH_LANES; ++l)
            for (int t = 0; t < UH_COLS; ++t) acc[l][t] = init;
        const S *xr = x + off[0];
        for (uh_i64 j = 0; j < len; ++j, xr += st) {
            A *lane = acc[j % UH_LANES];
            for (uh_i64 t = 0; t < w; ++t) lane[t] = op(lane[t], T::load(xr + t));
        }
        for (uh_i64 t = 0; t < w; ++t) {
            A r = acc[0][t];
            for (int l = 1; l < UH_LANES; ++l) r = op(r, acc[l][t]);
            if (mean) r = r / (A)len;
            T::store(out + off[1] + t, r);
        }
        i += w;
    }
    return true;
}
#endif

template <class T, int Kind> struct uh_reduce_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        const S *x = (const S *)a.ptr[0];
        S *out = (S *)a.ptr[1];
        const uh_i64 len = a.len, st = a.axis[0];
#ifdef UH_CPU
        if (Kind <= 1 ? uh_reduce_cols<T>(ctx, a, (A)0, uh_red_sum(), Kind == 1)
            : Kind == 2 ? uh_reduce_cols<T>(ctx, a, -uh_inf(A()), uh_red_max(), false)
                        : uh_reduce_cols<T>(ctx, a, uh_inf(A()), uh_red_min(), false))
            return;
#endif
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, 2, o)
            const S *xr = x + o[0];
            A r;
            if (Kind <= 1) {
                if (st == 1) r = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(xr + j); }, scratch);
                else r = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(xr + j * st); }, scratch);
                if (Kind == 1) r = r / (A)len;
            } else if (Kind == 2) {
                if (st == 1) r = uh_row_reduce(len, -uh_inf(A()), uh_red_max(), [&](uh_i64 j) { return T::load(xr + j); }, scratch);
                else r = uh_row_reduce(len, -uh_inf(A()), uh_red_max(), [&](uh_i64 j) { return T::load(xr + j * st); }, scratch);
            } else {
                if (st == 1) r = uh_row_reduce(len, uh_inf(A()), uh_red_min(), [&](uh_i64 j) { return T::load(xr + j); }, scratch);
                else r = uh_row_reduce(len, uh_inf(A()), uh_red_min(), [&](uh_i64 j) { return T::load(xr + j * st); }, scratch);
            }
            if (UH_TID == 0) T::store(out + o[1], r);
        UH_ROWS_END(a, 2, o)
    }
};

template <class T, int Max> struct uh_arg_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        const S *x = (const S *)a.ptr[0];
        uh_i64 *out = (uh_i64 *)a.ptr[1];
        const uh_i64 len = a.len, st = a.axis[0];
        UH_SHARED(uh_vi<A>, scratch, UH_ROW_THREADS);
        uh_vi<A> init;
        init.v = Max ? -uh_inf(A()) : uh_inf(A());
        init.i = 0x7fffffffffffffffll;
        UH_ROWS_BEGIN(ctx, a, 2, o)
            const S *xr = x + o[0];
            uh_vi<A> r = uh_row_reduce(len, init, uh_red_arg<Max>(), [&](uh_i64 j) {
                uh_vi<A> p;
                p.v = T::load(xr + j * st);
                p.i = j;
                return p;
            }, scratch);
            if (UH_TID == 0) out[o[1]] = r.i;
        UH_ROWS_END(a, 2, o)
    }
};

// ---------------------------------------------------------------------------------------------
// Softmax along the last axis (dense): [x, (mask,) y]. The mask's stride along the row is axis[1]
// (1, or 0 when broadcast).

template <class T, int Log, int Masked> struct uh_softmax_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        const S *x = (const S *)a.ptr[0];
        const S *mask = (const S *)a.ptr[1];
        S *y = (S *)a.ptr[1 + Masked];
        const uh_i64 len = a.len, mst = a.axis[1];
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, 2 + Masked, o)
            const S *xr = x + o[0];
            const S *mr = mask + (Masked ? o[1] : 0);
            S *yr = y + o[1 + Masked];
            auto v = [&](uh_i64 j) -> A {
                A t = T::load(xr + j);
                if (Masked) t = t + T::load(mr + j * mst);
                return t;
            };
            const A m = uh_row_reduce(len, -uh_inf(A()), uh_red_max(), v, scratch);
            // f32 and f64 store e^(x-m) and rescale it; half types recompute (no double rounding).
            // The store runs in its own loop: a reduction loop with stores does not vectorise.
            const bool keep = !Log && sizeof(S) == sizeof(A);
            A s;
            if (keep) {
                UH_ROW_FOR(j, len) yr[j] = (S)uh_expc(v(j) - m);
                s = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return (A)yr[j]; }, scratch);
            } else {
                s = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return uh_expc(v(j) - m); }, scratch);
            }
            if (Log) {
                const A lse = m + uh_log(s);
                UH_ROW_FOR(j, len) T::store(yr + j, v(j) - lse);
            } else if (keep) {
                const A inv = (A)1 / s;
                UH_ROW_FOR(j, len) yr[j] = (S)(T::load(yr + j) * inv);
            } else {
                const A inv = (A)1 / s;
                UH_ROW_FOR(j, len) T::store(yr + j, uh_expc(v(j) - m) * inv);
            }
        UH_ROWS_END(a, 2 + Masked, o)
    }
};

// [y, dy, dx]: softmax: dx = y (dy - sum(dy y)); log-softmax: dx = dy - e^y sum(dy).
template <class T, int Log> struct uh_softmax_backward_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        const S *y = (const S *)a.ptr[0], *dy = (const S *)a.ptr[1];
        S *dx = (S *)a.ptr[2];
        const uh_i64 len = a.len;
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, 3, o)
            const S *yr = y + o[0], *dyr = dy + o[1];
            S *dxr = dx + o[2];
            if (Log) {
                const A s = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(dyr + j); }, scratch);
                UH_ROW_FOR(j, len) T::store(dxr + j, T::load(dyr + j) - uh_expc(T::load(yr + j)) * s);
            } else {
                const A s = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(dyr + j) * T::load(yr + j); }, scratch);
                UH_ROW_FOR(j, len) T::store(dxr + j, T::load(yr + j) * (T::load(dyr + j) - s));
            }
        UH_ROWS_END(a, 3, o)
    }
};

// ---------------------------------------------------------------------------------------------
// Cross-entropy. Scalars: i[0] reduction (0 mean, 1 sum, 2 none), i[1] ignore_index, i[2] C,
// s[0] label smoothing.

// Log-sum-exp of a dense row (every thread gets it).
template <class T> UH_DEV float uh_lse(const typename T::storage *xr, uh_i64 len, float *scratch) {
    const float m = uh_row_reduce(len, -uh_inf(0.0f), uh_red_max(), [&](uh_i64 j) { return T::load(xr + j); }, scratch);
    const float s = uh_row_reduce(len, 0.0f, uh_red_sum(), [&](uh_i64 j) { return uh_expc(T::load(xr + j) - m); }, scratch);
    return m + uh_log(s);
}

// Rows: [logits, target, loss, row_loss (scratch), row_weight (scratch)]. With reduction none the
// row's loss goes to `loss`, else to the scratch arrays (index = row) for uh_ce_reduce_k.
template <class T, class I> struct uh_ce_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *x = (const S *)a.ptr[0];
        const I *target = (const I *)a.ptr[1];
        float *loss = (float *)a.ptr[2];
        float *row_loss = (float *)a.ptr[3], *row_w = (float *)a.ptr[4];
        const uh_i64 len = a.len, red = a.i[0], ignore = a.i[1];
        const float eps = (float)a.s[0];
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, 3, o)
            const S *xr = x + o[0];
            const uh_i64 t = (uh_i64)target[o[1]];
            float l = 0.0f, w = 0.0f;
            if (t != ignore) {
                if (t < 0 || t >= len) {
                    uh_fault(ctx);
                } else {
                    const float lse = uh_lse<T>(xr, len, scratch);
                    l = (1.0f - eps) * (lse - T::load(xr + t));
                    if (eps != 0.0f) {
                        const float sx = uh_row_reduce(len, 0.0f, uh_red_sum(), [&](uh_i64 j) { return T::load(xr + j); }, scratch);
                        l += eps * (lse - sx / (float)len);
                    }
                    w = 1.0f;
                }
            }
            if (UH_TID == 0) {
                if (red == 2) loss[o[2]] = l;
                else {
                    row_loss[uh_i] = l;
                    row_w[uh_i] = w;
                }
            }
        UH_ROWS_END(a, 3, o)
    }
};

// One block: loss = sum(row_loss) (/ sum(row_weight) for mean). Operands as uh_ce_k; i[3] = N.
struct uh_ce_reduce_k {
    UH_DEV void run(uh_ctx_t, const uh_args &a) {
        const float *row_loss = (const float *)a.ptr[3], *row_w = (const float *)a.ptr[4];
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        const uh_i64 n = a.i[3];
        const float s = uh_row_reduce(n, 0.0f, uh_red_sum(), [&](uh_i64 j) { return row_loss[j]; }, scratch);
        const float w = uh_row_reduce(n, 0.0f, uh_red_sum(), [&](uh_i64 j) { return row_w[j]; }, scratch);
        if (UH_TID == 0) *(float *)a.ptr[2] = a.i[0] == 0 ? s / w : s;
    }
};

// One block: the number of counted rows (target != ignore_index) into ptr[4][0]. i[3] = N.
template <class I> struct uh_ce_count_k {
    UH_DEV void run(uh_ctx_t, const uh_args &a) {
        const I *target = (const I *)a.ptr[1];
        const uh_i64 ts = a.axis[1], ignore = a.i[1];
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        const float c = uh_row_reduce(a.i[3], 0.0f, uh_red_sum(), [&](uh_i64 j) { return (uh_i64)target[j * ts] != ignore ? 1.0f : 0.0f; }, scratch);
        if (UH_TID == 0) *(float *)a.ptr[4] = c;
    }
};

// Rows: [logits, target, dloss, dlogits, count (scratch)].
template <class T, class I> struct uh_ce_backward_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *x = (const S *)a.ptr[0];
        const I *target = (const I *)a.ptr[1];
        const float *dloss = (const float *)a.ptr[2];
        S *dx = (S *)a.ptr[3];
        const uh_i64 len = a.len, red = a.i[0], ignore = a.i[1];
        const float eps = (float)a.s[0], u = eps / (float)len;
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, 4, o)
            const S *xr = x + o[0];
            S *dxr = dx + o[3];
            const uh_i64 t = (uh_i64)target[o[1]];
            float g = red == 2 ? dloss[o[2]] : red == 1 ? dloss[0] : dloss[0] / *(const float *)a.ptr[4];
            bool skip = t == ignore;
            if (!skip && (t < 0 || t >= len)) {
                uh_fault(ctx);
                skip = true;
            }
            if (skip) {
                UH_ROW_FOR(j, len) T::store(dxr + j, 0.0f);
            } else {
                const float lse = uh_lse<T>(xr, len, scratch);
                UH_ROW_FOR(j, len) {
                    const float q = (j == t ? 1.0f - eps : 0.0f) + u;
                    T::store(dxr + j, g * (uh_expc(T::load(xr + j) - lse) - q));
                }
            }
        UH_ROWS_END(a, 4, o)
    }
};

// ---------------------------------------------------------------------------------------------
// Layer norm (Rms = 0) and RMS norm (Rms = 1) over the dense last axis. Operand indices:
//   forward  layer: x w b y mean rstd      rms: x w y rstd
//   backward layer: x dy w mean rstd dx dw db   rms: x dy w rstd dx dw
// The weight/bias operands have row stride 0. Statistics are in the accumulation type A.

// One row of layer norm (Rms = 0) or RMS norm: y from xr, and the row's mean and rstd.
template <class T, int Rms>
UH_DEV void uh_norm_row(const typename T::storage *xr, const typename T::storage *w, const typename T::storage *b,
                        typename T::storage *yr, typename T::compute *mean, typename T::compute *rstd, uh_i64 len,
                        typename T::compute eps, typename T::compute *scratch) {
    typedef typename T::compute A;
    A mu = 0;
    if (!Rms) mu = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(xr + j); }, scratch) / (A)len;
    const A var = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) {
        A d = T::load(xr + j) - mu;
        return d * d;
    }, scratch) / (A)len;
    const A r = (A)1 / uh_sqrt(var + eps);
    if (Rms) {
        UH_ROW_FOR(j, len) T::store(yr + j, T::load(xr + j) * r * T::load(w + j));
    } else {
        UH_ROW_FOR(j, len) T::store(yr + j, (T::load(xr + j) - mu) * r * T::load(w + j) + T::load(b + j));
    }
    if (UH_TID == 0) {
        if (!Rms) *mean = mu;
        *rstd = r;
    }
}

template <class T, int Rms> struct uh_norm_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        enum { X = 0, W = 1, B = 2, Y = Rms ? 2 : 3, MEAN = 4, RSTD = Rms ? 3 : 5, NOPS = Rms ? 4 : 6 };
        const S *x = (const S *)a.ptr[X], *w = (const S *)a.ptr[W], *b = (const S *)a.ptr[B];
        S *y = (S *)a.ptr[Y];
        A *mean = (A *)a.ptr[MEAN], *rstd = (A *)a.ptr[RSTD];
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, NOPS, o)
            uh_norm_row<T, Rms>(x + o[X], w, b, y + o[Y], Rms ? 0 : mean + o[MEAN], rstd + o[RSTD], a.len, (A)a.s[0],
                                scratch);
        UH_ROWS_END(a, NOPS, o)
    }
};

// Residual add + norm: [x, residual, weight, (bias,) h, y, (mean,) rstd]. h = x + residual is
// stored (rounded to T) first and the norm reads it back, so the result equals the unfused add
// followed by the norm bit for bit.
template <class T, int Rms> struct uh_add_norm_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        enum { X = 0, R = 1, W = 2, B = 3, H = Rms ? 3 : 4, Y = Rms ? 4 : 5, MEAN = 6, RSTD = Rms ? 5 : 7,
               NOPS = Rms ? 6 : 8 };
        const S *x = (const S *)a.ptr[X], *res = (const S *)a.ptr[R], *w = (const S *)a.ptr[W];
        const S *b = (const S *)a.ptr[B];
        S *h = (S *)a.ptr[H], *y = (S *)a.ptr[Y];
        A *mean = (A *)a.ptr[MEAN], *rstd = (A *)a.ptr[RSTD];
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, NOPS, o)
            const S *xr = x + o[X], *rr = res + o[R];
            S *hr = h + o[H];
            UH_ROW_FOR(j, a.len) T::store(hr + j, T::load(xr + j) + T::load(rr + j));
            UH_SYNC();
            uh_norm_row<T, Rms>(hr, w, b, y + o[Y], Rms ? 0 : mean + o[MEAN], rstd + o[RSTD], a.len, (A)a.s[0],
                                scratch);
        UH_ROWS_END(a, NOPS, o)
    }
};

template <class T, int Rms> struct uh_norm_backward_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        enum { X = 0, DY = 1, W = 2, MEAN = 3, RSTD = Rms ? 3 : 4, DX = Rms ? 4 : 5, NOPS = DX + 1 };
        const S *x = (const S *)a.ptr[X], *dy = (const S *)a.ptr[DY], *w = (const S *)a.ptr[W];
        const A *mean = (const A *)a.ptr[MEAN], *rstd = (const A *)a.ptr[RSTD];
        S *dx = (S *)a.ptr[DX];
        const uh_i64 len = a.len;
        UH_SHARED(A, scratch, UH_ROW_THREADS);
        UH_ROWS_BEGIN(ctx, a, NOPS, o)
            const S *xr = x + o[X], *dyr = dy + o[DY];
            S *dxr = dx + o[DX];
            const A mu = Rms ? (A)0 : mean[o[MEAN]], r = rstd[o[RSTD]];
            const A n = (A)len;
            const A c2 = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) {
                return T::load(dyr + j) * T::load(w + j) * ((T::load(xr + j) - mu) * r);
            }, scratch) / n;
            A c1 = 0;
            if (!Rms) c1 = uh_row_reduce(len, (A)0, uh_red_sum(), [&](uh_i64 j) { return T::load(dyr + j) * T::load(w + j); }, scratch) / n;
            UH_ROW_FOR(j, len) {
                const A g = T::load(dyr + j) * T::load(w + j);
                const A xh = (T::load(xr + j) - mu) * r;
                T::store(dxr + j, r * (g - c1 - xh * c2));
            }
        UH_ROWS_END(a, NOPS, o)
    }
};

// Row-offset odometer over the rows described by a.size/a.stride (for column kernels).
struct uh_odo {
    uh_i64 c[UH_MAX_DIMS];
    uh_i64 off[UH_MAX_OPERANDS];
    UH_MEMBER void init(const uh_args &a, int nops) {
        for (int d = 0; d < UH_MAX_DIMS; ++d) c[d] = 0;
        for (int k = 0; k < UH_MAX_OPERANDS; ++k) off[k] = 0;
        (void)nops;
    }
    UH_MEMBER void next(const uh_args &a, int nops) {
        for (int d = (int)a.ndim - 1; d >= 0; --d) {
            ++c[d];
            for (int k = 0; k < nops; ++k) off[k] += a.stride[k][d];
            if (c[d] < a.size[d]) break;
            for (int k = 0; k < nops; ++k) off[k] -= a.stride[k][d] * a.size[d];
            c[d] = 0;
        }
    }
};

// Weight (and bias) gradients: columns j of [0, len), each summing over all a.n rows in order.
template <class T, int Rms> struct uh_norm_backward_weight_k {
    enum { X = 0, DY = 1, MEAN = 3, RSTD = Rms ? 3 : 4, DW = Rms ? 5 : 6, DB = 7, NOPS = RSTD + 1 };
    typedef typename T::storage S;
    typedef typename T::compute A;
    // Adds column j's terms of the row at `o` into (gw, gb).
    UH_DEV void term(const uh_args &a, const uh_i64 *o, uh_i64 j, A &gw, A &gb) {
        const S *x = (const S *)a.ptr[X], *dy = (const S *)a.ptr[DY];
        const A *mean = (const A *)a.ptr[MEAN], *rstd = (const A *)a.ptr[RSTD];
        const A mu = Rms ? (A)0 : mean[o[MEAN]];
        const A d = T::load(dy + o[DY] + j);
        gw += d * ((T::load(x + o[X] + j) - mu) * rstd[o[RSTD]]);
        gb += d;
    }
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        S *dw = (S *)a.ptr[DW], *db = (S *)a.ptr[DB];
        const uh_i64 len = a.len, rows = a.n;
#ifdef UH_CPU
        uh_i64 lo, hi;
        uh_chunk_g(ctx, len, 64, &lo, &hi);
        for (uh_i64 j0 = lo; j0 < hi; j0 += 64) {
            const int nj = (int)(hi - j0 < 64 ? hi - j0 : 64);
            A gw[64], gb[64];
            for (int j = 0; j < 64; ++j) gw[j] = gb[j] = 0;
            uh_odo od;
            od.init(a, NOPS);
            for (uh_i64 r = 0; r < rows; ++r) {
                for (int j = 0; j < nj; ++j) term(a, od.off, j0 + j, gw[j], gb[j]);
                od.next(a, NOPS);
            }
            for (int j = 0; j < nj; ++j) {
                T::store(dw + j0 + j, gw[j]);
                if (!Rms) T::store(db + j0 + j, gb[j]);
            }
        }
#else
        UH_LOOP(ctx, j, len) {
            A gw = 0, gb = 0;
            uh_odo od;
            od.init(a, NOPS);
            for (uh_i64 r = 0; r < rows; ++r) {
                term(a, od.off, j, gw, gb);
                od.next(a, NOPS);
            }
            T::store(dw + j, gw);
            if (!Rms) T::store(db + j, gb);
        }
#endif
    }
};

// ---------------------------------------------------------------------------------------------
// Row gather and scatter-add along axis 0 of dense tensors. [table|src, index, out]; rows have
// `len` elements; i[0] = V (rows of the table / of out); index stride axis[1].

template <class T, class I> struct uh_index_select_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *table = (const S *)a.ptr[0];
        const I *index = (const I *)a.ptr[1];
        S *out = (S *)a.ptr[2];
        const uh_i64 len = a.len, rows = a.i[0];
        UH_ROWS_BEGIN(ctx, a, 3, o)
            const uh_i64 v = (uh_i64)index[o[1]];
            if (v < 0 || v >= rows) {
                uh_fault(ctx);
            } else {
                const S *src = table + v * len;
                S *dst = out + o[2];
                UH_ROW_FOR(j, len) dst[j] = src[j];
            }
        UH_ROWS_END(a, 3, o)
    }
};

// Each column is owned by one thread, which adds the rows in index order: deterministic, no atomics.
template <class T, class I> struct uh_index_add_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        const S *src = (const S *)a.ptr[0];
        const I *index = (const I *)a.ptr[1];
        S *out = (S *)a.ptr[2];
        const uh_i64 len = a.len, rows = a.i[0], n = a.i[1], ist = a.axis[1];
#ifdef UH_CPU
        uh_i64 lo, hi;
        uh_chunk_g(ctx, len, 64, &lo, &hi);
        for (uh_i64 i = 0; i < n && lo < hi; ++i) {
            const uh_i64 v = (uh_i64)index[i * ist];
            if (v < 0 || v >= rows) {
                uh_fault(ctx);
                continue;
            }
            const S *s = src + i * len;
            S *d = out + v * len;
            for (uh_i64 j = lo; j < hi; ++j) T::store(d + j, T::load(d + j) + T::load(s + j));
        }
#else
        UH_LOOP(ctx, j, len) {
            for (uh_i64 i = 0; i < n; ++i) {
                const uh_i64 v = (uh_i64)index[i * ist];
                if (v < 0 || v >= rows) {
                    uh_fault(ctx);
                    continue;
                }
                T::store(out + v * len + j, T::load(out + v * len + j) + T::load(src + i * len + j));
            }
        }
#endif
    }
};

#endif // UH_NN_H
