// unihal portable kernels of the transformer block: fused attention (forward, backward) and rotary
// position embeddings. Included after uh_nn.h. Semantics: unihal_hal::op::transformer.
//
// Attention is FlashAttention-2's algorithm written for the dialect. A work item is a tile of
// UH_ATT_QT query rows of one (batch, head); key/value blocks of UH_ATT_KB rows stream past an
// online softmax (running max m, running sum l, rescaled accumulator), so no score matrix is ever
// stored. Each block of keys is converted to the compute type once per tile and transposed
// (kt[d][j]) so that the score loop runs along keys with independent accumulators: it vectorises
// on the CPU without reassociating any sum. The backward pass is two kernels and no atomics:
// uh_attention_dq_k walks query tiles (dq summed over keys in order), uh_attention_dkv_k walks key
// tiles (dk, dv summed over the group's query heads, then queries, in order); both recompute the
// probabilities from the saved log-sum-exp, and uh_attention_delta_k first stores each query row's
// (lse, D = rowsum(dout * out)) pair in scratch memory.
//
// Arguments (kernels/src/plan_attention.rs): size = [B, Hq, S, Sk, Hkv], len = D; s[0] = scale,
// s[1] = dropout p; i[0] = has bias, i[1] = causal; u = Philox (key, offset). stride[k][0..3] are
// the (batch, head, row) strides of operand k, stride[bias][0..4] its broadcast strides.
#ifndef UH_ATTENTION_H
#define UH_ATTENTION_H

#define UH_ATT_MAXD 256
#ifdef UH_CPU
// Query rows per work item: each key block is converted and transposed once per tile, so a tall
// tile amortises that over more rows.
#define UH_ATT_QT 64
#define UH_ATT_KB 64
// The tiles' rows start on cache lines (no vector load splits across two).
#define UH_ATT_ALIGN __attribute__((aligned(64)))
// Query rows per step of the dk/dv kernel: its products sum over them, so a longer step keeps
// the dk/dv accumulators in registers longer.
#define UH_ATT_QB 64
// Register tile of uh_att_mm: 16 columns (two AVX2 or one AVX-512 vector) by 4 rows, or by 8 rows
// with AVX-512's 32 registers: 8 independent accumulator chains, enough to hide the add latency
// (no contraction: a multiply then an add per step).
#ifdef __AVX512F__
#define UH_ATT_MR 8
#else
#define UH_ATT_MR 4
#endif
#define UH_ATT_NR 16
// Work items go to the pool's blocks round-robin: tiles near the diagonal of a causal mask cost
// less than the last ones, so contiguous chunks would leave blocks idle.
#define UH_ATT_LOOP(ctx, w, n) for (uh_i64 w = uh_block_id(ctx); w < (n); w += uh_grid_size(ctx))
#else
#define UH_ATT_QT 1
#define UH_ATT_KB 4
#define UH_ATT_QB 1
#define UH_ATT_ALIGN
#define UH_ATT_MR 1
#define UH_ATT_NR 4
#define UH_ATT_LOOP(ctx, w, n) UH_LOOP(ctx, w, n)
#endif

UH_DEV uh_i64 uh_att_round(uh_i64 n, uh_i64 m) { return (n + m - 1) / m * m; }

// An explicit fused multiply-add: one rounding, the same bits on every ISA variant and GPU (the
// library compiles without contraction; a variant without FMA instructions calls libm's fma).
UH_DEV_INLINE float uh_fma(float a, float b, float c) { return fmaf(a, b, c); }
UH_DEV_INLINE double uh_fma(double a, double b, double c) { return fma(a, b, c); }

// op over x[0..n) with UH_LANES independent partial results combined in a fixed order: the loop
// vectorises without reassociating (a sum or max carried through one variable would not).
template <class A, class Op> UH_DEV A uh_att_reduce(const A *x, uh_i64 n, A init, Op op) {
    A acc[UH_LANES];
    for (int l = 0; l < UH_LANES; ++l) acc[l] = init;
    uh_i64 j = 0;
    for (; j + UH_LANES <= n; j += UH_LANES)
        for (int l = 0; l < UH_LANES; ++l) acc[l] = op(acc[l], x[j + l]);
    for (int l = 0; j + l < n; ++l) acc[l] = op(acc[l], x[j + l]);
    A r = acc[0];
    for (int l = 1; l < UH_LANES; ++l) r = op(r, acc[l]);
    return r;
}

// The geometry and options every attention kernel reads from its arguments.
struct uh_att_geom {
    uh_i64 B, Hq, S, Sk, Hkv, D, Dp, group;
    bool bias, causal;
    double p;
    UH_MEMBER void read(const uh_args &a) {
        B = a.size[0];
        Hq = a.size[1];
        S = a.size[2];
        Sk = a.size[3];
        Hkv = a.size[4];
        D = a.len;
        Dp = uh_att_round(D, UH_ATT_NR);
        group = Hkv > 0 ? Hq / Hkv : 1;
        bias = a.i[0] != 0;
        causal = a.i[1] != 0;
        p = a.s[1];
    }
    // Dropout keep decision of probability (b, h, i, j).
    UH_MEMBER bool keep(const uh_args &a, uh_i64 b, uh_i64 h, uh_i64 i, uh_i64 j) const {
        uh_u64 c = (uh_u64)(((b * Hq + h) * S + i) * Sk + j);
        return uh_uniform24(uh_philox(a.u[1] + c, a.u[0]).v[0]) >= (float)p;
    }
    // One past the last key query row i may see.
    UH_MEMBER uh_i64 key_end(uh_i64 i) const { return causal ? (i + 1 < Sk ? i + 1 : Sk) : Sk; }
};

// Row r of a (batch, head) slice of operand k: its base plus b, h and row strides.
template <class S> UH_DEV const S *uh_att_row(const uh_args &a, int k, uh_i64 b, uh_i64 h, uh_i64 r) {
    return (const S *)a.ptr[k] + b * a.stride[k][0] + h * a.stride[k][1] + r * a.stride[k][2];
}

// c[r][j] (+)= sum over k < K, in increasing k, of a[r * ars + k * aks] * b[k][j] (each term
// fused into the sum: uh_fma), for r < rows (a multiple of UH_ATT_MR) and j < cols (a multiple of
// UH_ATT_NR); c and b have row strides ldc and ldb. Each output is one accumulator summed in
// order, so blocking changes no result; the register tile reuses every loaded b vector for
// UH_ATT_MR rows.
template <class A>
UH_DEV void uh_att_mm(const A *a, uh_i64 ars, uh_i64 aks, const A *b, uh_i64 ldb, A *c, uh_i64 ldc, uh_i64 rows,
                      uh_i64 cols, uh_i64 K, bool accumulate) {
    for (uh_i64 j0 = 0; j0 < cols; j0 += UH_ATT_NR)
        for (uh_i64 r0 = 0; r0 < rows; r0 += UH_ATT_MR) {
            UH_ATT_ALIGN A acc[UH_ATT_MR][UH_ATT_NR];
            for (int r = 0; r < UH_ATT_MR; ++r)
                for (int j = 0; j < UH_ATT_NR; ++j) acc[r][j] = accumulate ? c[(r0 + r) * ldc + j0 + j] : (A)0;
            for (uh_i64 k = 0; k < K; ++k) {
                const A *br = b + k * ldb + j0;
                for (int r = 0; r < UH_ATT_MR; ++r) {
                    const A av = a[(r0 + r) * ars + k * aks];
                    for (int j = 0; j < UH_ATT_NR; ++j) acc[r][j] = uh_fma(av, br[j], acc[r][j]);
                }
            }
            for (int r = 0; r < UH_ATT_MR; ++r)
                for (int j = 0; j < UH_ATT_NR; ++j) c[(r0 + r) * ldc + j0 + j] = acc[r][j];
        }
}

// Keys j0..j0+nk of a (batch, kv head), transposed into t[d][jj] for d < D and jj < nkp (zero
// past nk), and, when `rows` is set, as rows[jj][d] for jj < nk and d < Dp (zero past D).
template <class T>
UH_DEV void uh_att_load_block(const uh_args &a, const uh_att_geom &g, int k, uh_i64 b, uh_i64 h, uh_i64 j0, uh_i64 nk,
                              typename T::compute (*t)[UH_ATT_KB], typename T::compute (*rows)[UH_ATT_MAXD]) {
    typedef typename T::storage S;
    typedef typename T::compute A;
    const uh_i64 nkp = uh_att_round(nk, UH_ATT_NR);
    for (uh_i64 jj = 0; jj < nkp; ++jj) {
        if (jj < nk) {
            const S *src = uh_att_row<S>(a, k, b, h, j0 + jj);
            for (uh_i64 d = 0; d < g.D; ++d) {
                const A x = T::load(src + d);
                t[d][jj] = x;
                if (rows) rows[jj][d] = x;
            }
            if (rows)
                for (uh_i64 d = g.D; d < g.Dp; ++d) rows[jj][d] = 0;
        } else {
            for (uh_i64 d = 0; d < g.D; ++d) t[d][jj] = 0;
        }
    }
}

// Query-side rows i0..i0+nq of operand k into dst[r][d] for r < round(nq, MR), d < Dp (zero
// outside the data).
template <class T>
UH_DEV void uh_att_load_rows(const uh_args &a, const uh_att_geom &g, int k, uh_i64 b, uh_i64 h, uh_i64 i0, uh_i64 nq,
                             typename T::compute (*dst)[UH_ATT_MAXD]) {
    typedef typename T::storage S;
    const uh_i64 nqp = uh_att_round(nq, UH_ATT_MR);
    for (uh_i64 r = 0; r < nqp; ++r) {
        const S *src = r < nq ? uh_att_row<S>(a, k, b, h, i0 + r) : 0;
        for (uh_i64 d = 0; d < g.Dp; ++d) dst[r][d] = src && d < g.D ? T::load(src + d) : (typename T::compute)0;
    }
}

// The scaled, biased and masked scores of query row i against keys j0.. (-inf where masked).
template <class T>
UH_DEV void uh_att_scores(const uh_args &a, const uh_att_geom &g, uh_i64 b, uh_i64 h, uh_i64 i, uh_i64 j0, uh_i64 nk,
                          typename T::compute *sc) {
    typedef typename T::storage S;
    typedef typename T::compute A;
    const A scale = (A)a.s[0];
    const A ninf = -uh_inf((A)0);
    const S *bias = g.bias ? (const S *)a.ptr[3] + b * a.stride[3][0] + h * a.stride[3][1] + i * a.stride[3][2] : 0;
    const uh_i64 jend = g.key_end(i);
    for (uh_i64 jj = 0; jj < nk; ++jj) {
        A s = sc[jj] * scale;
        if (bias) s += T::load(bias + (j0 + jj) * a.stride[3][3]);
        sc[jj] = j0 + jj < jend ? s : ninf;
    }
}

// Forward: [q, k, v, bias, out, lse].
template <class T> struct uh_attention_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        uh_att_geom g;
        g.read(a);
        const uh_i64 D = g.D, Dp = g.Dp, tiles = (g.S + UH_ATT_QT - 1) / UH_ATT_QT;
        const A ninf = -uh_inf((A)0);
        const A kscale = g.p > 0 ? (A)(1.0 / (1.0 - g.p)) : (A)1;
        UH_ATT_LOOP(ctx, w, g.B * g.Hq * tiles) {
            const uh_i64 t = w % tiles, h = (w / tiles) % g.Hq, b = w / tiles / g.Hq, hk = h / g.group;
            const uh_i64 i0 = t * UH_ATT_QT, nq = g.S - i0 < UH_ATT_QT ? g.S - i0 : UH_ATT_QT;
            const uh_i64 nqp = uh_att_round(nq, UH_ATT_MR);
            UH_ATT_ALIGN A qf[UH_ATT_QT][UH_ATT_MAXD], acc[UH_ATT_QT][UH_ATT_MAXD], m[UH_ATT_QT], l[UH_ATT_QT];
            UH_ATT_ALIGN A kt[UH_ATT_MAXD][UH_ATT_KB], vf[UH_ATT_KB][UH_ATT_MAXD], sc[UH_ATT_QT][UH_ATT_KB];
            uh_att_load_rows<T>(a, g, 0, b, h, i0, nq, qf);
            for (uh_i64 r = 0; r < nqp; ++r) {
                for (uh_i64 d = 0; d < Dp; ++d) acc[r][d] = 0;
                m[r] = ninf;
                l[r] = 0;
            }
            const uh_i64 kend = g.key_end(i0 + nq - 1);
            for (uh_i64 j0 = 0; j0 < kend; j0 += UH_ATT_KB) {
                const uh_i64 nk = kend - j0 < UH_ATT_KB ? kend - j0 : UH_ATT_KB;
                uh_att_load_block<T>(a, g, 1, b, hk, j0, nk, kt, (A(*)[UH_ATT_MAXD])0);
                for (uh_i64 jj = 0; jj < nk; ++jj) {
                    const S *v = uh_att_row<S>(a, 2, b, hk, j0 + jj);
                    for (uh_i64 d = 0; d < Dp; ++d) vf[jj][d] = d < D ? T::load(v + d) : (A)0;
                }
                uh_att_mm(qf[0], UH_ATT_MAXD, 1, kt[0], UH_ATT_KB, sc[0], UH_ATT_KB, nqp,
                          uh_att_round(nk, UH_ATT_NR), D, false);
                for (uh_i64 r = 0; r < nq; ++r) {
                    const uh_i64 i = i0 + r;
                    A *sr = sc[r];
                    uh_att_scores<T>(a, g, b, h, i, j0, nk, sr);
                    A mx = uh_att_reduce(sr, nk, m[r], uh_red_max());
                    if (mx == ninf) { // every key so far is masked: nothing to add
                        for (uh_i64 jj = 0; jj < nk; ++jj) sr[jj] = 0;
                        continue;
                    }
                    const A alpha = m[r] == ninf ? (A)0 : uh_expc(m[r] - mx);
                    for (uh_i64 jj = 0; jj < nk; ++jj) sr[jj] = sr[jj] == ninf ? (A)0 : uh_expc(sr[jj] - mx);
                    const A sum = uh_att_reduce(sr, nk, (A)0, uh_red_sum());
                    l[r] = l[r] * alpha + sum;
                    m[r] = mx;
                    if (g.p > 0)
                        for (uh_i64 jj = 0; jj < nk; ++jj) sr[jj] = g.keep(a, b, h, i, j0 + jj) ? sr[jj] * kscale : (A)0;
                    for (uh_i64 d = 0; d < Dp; ++d) acc[r][d] *= alpha;
                }
                // Padding rows (r >= nq) have zero queries, so zero scores: they add nothing.
                for (uh_i64 r = nq; r < nqp; ++r)
                    for (uh_i64 jj = 0; jj < nk; ++jj) sc[r][jj] = 0;
                uh_att_mm(sc[0], UH_ATT_KB, 1, vf[0], UH_ATT_MAXD, acc[0], UH_ATT_MAXD, nqp, Dp, nk, true);
            }
            for (uh_i64 r = 0; r < nq; ++r) {
                S *o = (S *)uh_att_row<S>(a, 4, b, h, i0 + r);
                const A inv = l[r] > 0 ? (A)1 / l[r] : (A)0;
                for (uh_i64 d = 0; d < D; ++d) T::store(o + d, acc[r][d] * inv);
                A *lse = (A *)a.ptr[5] + b * a.stride[5][0] + h * a.stride[5][1] + (i0 + r) * a.stride[5][2];
                *lse = l[r] > 0 ? m[r] + uh_log(l[r]) : ninf;
            }
        }
    }
};

// Backward, step 1: [out, dout, lse, stats]: stats[row] = (lse, rowsum(dout * out)) per query row
// (dense, rows in (b, h, i) order).
template <class T> struct uh_attention_delta_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        uh_att_geom g;
        g.read(a);
        A *stats = (A *)a.ptr[3];
        UH_LOOP(ctx, w, g.B * g.Hq * g.S) {
            const uh_i64 i = w % g.S, h = (w / g.S) % g.Hq, b = w / g.S / g.Hq;
            const S *o = uh_att_row<S>(a, 0, b, h, i), *dout = uh_att_row<S>(a, 1, b, h, i);
            A acc[UH_LANES];
            for (int l = 0; l < UH_LANES; ++l) acc[l] = 0;
            uh_i64 d = 0;
            for (; d + UH_LANES <= g.D; d += UH_LANES)
                for (int l = 0; l < UH_LANES; ++l) acc[l] += T::load(o + d + l) * T::load(dout + d + l);
            for (int l = 0; d + l < g.D; ++l) acc[l] += T::load(o + d + l) * T::load(dout + d + l);
            A delta = acc[0];
            for (int l = 1; l < UH_LANES; ++l) delta += acc[l];
            stats[2 * w] = *((const A *)a.ptr[2] + b * a.stride[2][0] + h * a.stride[2][1] + i * a.stride[2][2]);
            stats[2 * w + 1] = delta;
        }
    }
};

// The probabilities and score gradients of query row i against keys j0..j0+nk: on entry sc holds
// q·k and dp holds dout·v; on return sc[jj] is the dropped-out probability (what multiplied v)
// and dp[jj] the gradient of the (pre-scale) score. A fully masked row (lse -inf) gets zeros.
template <class T>
UH_DEV void uh_att_grads(const uh_args &a, const uh_att_geom &g, uh_i64 b, uh_i64 h, uh_i64 i, uh_i64 j0, uh_i64 nk,
                         typename T::compute lse, typename T::compute delta, typename T::compute *sc,
                         typename T::compute *dp) {
    typedef typename T::compute A;
    const A ninf = -uh_inf((A)0);
    if (lse == ninf) {
        for (uh_i64 jj = 0; jj < nk; ++jj) sc[jj] = dp[jj] = 0;
        return;
    }
    uh_att_scores<T>(a, g, b, h, i, j0, nk, sc);
    if (g.p > 0) {
        const A kscale = (A)(1.0 / (1.0 - g.p));
        for (uh_i64 jj = 0; jj < nk; ++jj) {
            const A pj = sc[jj] == ninf ? (A)0 : uh_expc(sc[jj] - lse);
            const A z = g.keep(a, b, h, i, j0 + jj) ? kscale : (A)0;
            dp[jj] = pj * (dp[jj] * z - delta);
            sc[jj] = pj * z;
        }
        return;
    }
    // Without dropout the loop has no call: it vectorises.
    for (uh_i64 jj = 0; jj < nk; ++jj) {
        const A pj = sc[jj] == ninf ? (A)0 : uh_expc(sc[jj] - lse);
        dp[jj] = pj * (dp[jj] - delta);
        sc[jj] = pj;
    }
}

// Backward, step 2: [q, k, v, bias, dout, stats, dq]: per query tile, dq over every key in order.
template <class T> struct uh_attention_dq_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        uh_att_geom g;
        g.read(a);
        const uh_i64 D = g.D, Dp = g.Dp, tiles = (g.S + UH_ATT_QT - 1) / UH_ATT_QT;
        const A scale = (A)a.s[0];
        const A *stats = (const A *)a.ptr[5];
        UH_ATT_LOOP(ctx, w, g.B * g.Hq * tiles) {
            const uh_i64 t = w % tiles, h = (w / tiles) % g.Hq, b = w / tiles / g.Hq, hk = h / g.group;
            const uh_i64 i0 = t * UH_ATT_QT, nq = g.S - i0 < UH_ATT_QT ? g.S - i0 : UH_ATT_QT;
            const uh_i64 nqp = uh_att_round(nq, UH_ATT_MR);
            UH_ATT_ALIGN A qf[UH_ATT_QT][UH_ATT_MAXD], dof[UH_ATT_QT][UH_ATT_MAXD], acc[UH_ATT_QT][UH_ATT_MAXD];
            UH_ATT_ALIGN A kt[UH_ATT_MAXD][UH_ATT_KB], vt[UH_ATT_MAXD][UH_ATT_KB], kf[UH_ATT_KB][UH_ATT_MAXD];
            UH_ATT_ALIGN A sc[UH_ATT_QT][UH_ATT_KB], dp[UH_ATT_QT][UH_ATT_KB];
            uh_att_load_rows<T>(a, g, 0, b, h, i0, nq, qf);
            uh_att_load_rows<T>(a, g, 4, b, h, i0, nq, dof);
            for (uh_i64 r = 0; r < nqp; ++r)
                for (uh_i64 d = 0; d < Dp; ++d) acc[r][d] = 0;
            const uh_i64 row0 = (b * g.Hq + h) * g.S + i0;
            const uh_i64 kend = g.key_end(i0 + nq - 1);
            for (uh_i64 j0 = 0; j0 < kend; j0 += UH_ATT_KB) {
                const uh_i64 nk = kend - j0 < UH_ATT_KB ? kend - j0 : UH_ATT_KB;
                const uh_i64 nkp = uh_att_round(nk, UH_ATT_NR);
                uh_att_load_block<T>(a, g, 1, b, hk, j0, nk, kt, kf);
                uh_att_load_block<T>(a, g, 2, b, hk, j0, nk, vt, (A(*)[UH_ATT_MAXD])0);
                uh_att_mm(qf[0], UH_ATT_MAXD, 1, kt[0], UH_ATT_KB, sc[0], UH_ATT_KB, nqp, nkp, D, false);
                uh_att_mm(dof[0], UH_ATT_MAXD, 1, vt[0], UH_ATT_KB, dp[0], UH_ATT_KB, nqp, nkp, D, false);
                for (uh_i64 r = 0; r < nq; ++r)
                    uh_att_grads<T>(a, g, b, h, i0 + r, j0, nk, stats[2 * (row0 + r)], stats[2 * (row0 + r) + 1], sc[r],
                                    dp[r]);
                uh_att_mm(dp[0], UH_ATT_KB, 1, kf[0], UH_ATT_MAXD, acc[0], UH_ATT_MAXD, nqp, Dp, nk, true);
            }
            for (uh_i64 r = 0; r < nq; ++r) {
                S *dq = (S *)uh_att_row<S>(a, 6, b, h, i0 + r);
                for (uh_i64 d = 0; d < D; ++d) T::store(dq + d, acc[r][d] * scale);
            }
        }
    }
};

// Backward, step 3: [q, k, v, bias, dout, stats, dk, dv]: per key tile of a kv head, dk and dv
// over the group's query heads in order, then their query rows in order.
template <class T> struct uh_attention_dkv_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        uh_att_geom g;
        g.read(a);
        const uh_i64 D = g.D, Dp = g.Dp, tiles = (g.Sk + UH_ATT_KB - 1) / UH_ATT_KB;
        const A scale = (A)a.s[0];
        const A *stats = (const A *)a.ptr[5];
        UH_ATT_LOOP(ctx, w, g.B * g.Hkv * tiles) {
            const uh_i64 t = w % tiles, hk = (w / tiles) % g.Hkv, b = w / tiles / g.Hkv;
            const uh_i64 j0 = t * UH_ATT_KB, nk = g.Sk - j0 < UH_ATT_KB ? g.Sk - j0 : UH_ATT_KB;
            const uh_i64 nkp = uh_att_round(nk, UH_ATT_NR);
            UH_ATT_ALIGN A kt[UH_ATT_MAXD][UH_ATT_KB], vt[UH_ATT_MAXD][UH_ATT_KB];
            UH_ATT_ALIGN A dk[UH_ATT_KB][UH_ATT_MAXD], dv[UH_ATT_KB][UH_ATT_MAXD];
            UH_ATT_ALIGN A qf[UH_ATT_QB][UH_ATT_MAXD], dof[UH_ATT_QB][UH_ATT_MAXD], sc[UH_ATT_QB][UH_ATT_KB], dp[UH_ATT_QB][UH_ATT_KB];
            // sc and dp transposed (keys by query rows), the left operands of the dv and dk products.
            UH_ATT_ALIGN A pt[UH_ATT_KB][UH_ATT_QB], dst[UH_ATT_KB][UH_ATT_QB];
            uh_att_load_block<T>(a, g, 1, b, hk, j0, nk, kt, (A(*)[UH_ATT_MAXD])0);
            uh_att_load_block<T>(a, g, 2, b, hk, j0, nk, vt, (A(*)[UH_ATT_MAXD])0);
            for (uh_i64 jj = 0; jj < nkp; ++jj)
                for (uh_i64 d = 0; d < Dp; ++d) dk[jj][d] = dv[jj][d] = 0;
            // Causal: query i sees key j only when j <= i.
            const uh_i64 istart = g.causal ? j0 : 0;
            for (uh_i64 hh = 0; hh < g.group; ++hh) {
                const uh_i64 h = hk * g.group + hh;
                for (uh_i64 i0 = istart; i0 < g.S; i0 += UH_ATT_QB) {
                    const uh_i64 nq = g.S - i0 < UH_ATT_QB ? g.S - i0 : UH_ATT_QB;
                    const uh_i64 nqp = uh_att_round(nq, UH_ATT_MR);
                    uh_att_load_rows<T>(a, g, 0, b, h, i0, nq, qf);
                    uh_att_load_rows<T>(a, g, 4, b, h, i0, nq, dof);
                    uh_att_mm(qf[0], UH_ATT_MAXD, 1, kt[0], UH_ATT_KB, sc[0], UH_ATT_KB, nqp, nkp, D, false);
                    uh_att_mm(dof[0], UH_ATT_MAXD, 1, vt[0], UH_ATT_KB, dp[0], UH_ATT_KB, nqp, nkp, D, false);
                    const uh_i64 row0 = (b * g.Hq + h) * g.S + i0;
                    for (uh_i64 r = 0; r < nq; ++r)
                        uh_att_grads<T>(a, g, b, h, i0 + r, j0, nk, stats[2 * (row0 + r)], stats[2 * (row0 + r) + 1],
                                        sc[r], dp[r]);
                    // Columns past nk hold scores of zero keys, unused: dv and dk rows past nk
                    // are not stored. Padding rows (r >= nq) have zero q and dout: they add 0.
                    for (uh_i64 jj = 0; jj < nkp; ++jj)
                        for (uh_i64 r = 0; r < nq; ++r) {
                            pt[jj][r] = sc[r][jj];
                            dst[jj][r] = dp[r][jj];
                        }
                    uh_att_mm(pt[0], UH_ATT_QB, 1, dof[0], UH_ATT_MAXD, dv[0], UH_ATT_MAXD, nkp, Dp, nq, true);
                    uh_att_mm(dst[0], UH_ATT_QB, 1, qf[0], UH_ATT_MAXD, dk[0], UH_ATT_MAXD, nkp, Dp, nq, true);
                }
            }
            for (uh_i64 jj = 0; jj < nk; ++jj) {
                S *dkr = (S *)uh_att_row<S>(a, 6, b, hk, j0 + jj), *dvr = (S *)uh_att_row<S>(a, 7, b, hk, j0 + jj);
                for (uh_i64 d = 0; d < D; ++d) {
                    T::store(dkr + d, dk[jj][d] * scale);
                    T::store(dvr + d, dv[jj][d]);
                }
            }
        }
    }
};

// ---------------------------------------------------------------------------------------------
// Rotary position embedding: [x, cos, sin, y] as rows of len D (row strides per operand).
// Forward (Bwd = 0): y = x * cos + rotate(x) * sin. Backward (Bwd = 1): dx = dy * cos +
// rotateᵀ(dy * sin). rotate pairs element e with its partner: e + D/2 (halves) or e ^ 1
// (interleaved, a.i[0]).
template <class T, int Bwd> struct uh_rope_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        const S *x = (const S *)a.ptr[0], *c = (const S *)a.ptr[1], *s = (const S *)a.ptr[2];
        S *y = (S *)a.ptr[3];
        const uh_i64 half = a.len / 2;
        const bool inter = a.i[0] != 0;
        UH_ROWS_BEGIN(ctx, a, 4, o)
            const S *xr = x + o[0], *cr = c + o[1], *sr = s + o[2];
            S *yr = y + o[3];
            UH_ROW_FOR(e, half) {
                // The pair (lo, hi): rotate(x)[lo] = -x[hi], rotate(x)[hi] = x[lo].
                const uh_i64 lo = inter ? 2 * e : e, hi = inter ? 2 * e + 1 : e + half;
                const A xl = T::load(xr + lo), xh = T::load(xr + hi);
                const A cl = T::load(cr + lo), ch = T::load(cr + hi), sl = T::load(sr + lo), sh = T::load(sr + hi);
                if (Bwd) {
                    T::store(yr + lo, xl * cl + xh * sh);
                    T::store(yr + hi, xh * ch - xl * sl);
                } else {
                    T::store(yr + lo, xl * cl - xh * sl);
                    T::store(yr + hi, xh * ch + xl * sh);
                }
            }
        UH_ROWS_END(a, 4, o)
    }
};

#endif // UH_ATTENTION_H
