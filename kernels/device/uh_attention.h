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
#define UH_ATT_QT 8
#define UH_ATT_KB 64
// Work items go to the pool's blocks round-robin: tiles near the diagonal of a causal mask cost
// less than the last ones, so contiguous chunks would leave blocks idle.
#define UH_ATT_LOOP(ctx, w, n) for (uh_i64 w = uh_block_id(ctx); w < (n); w += uh_grid_size(ctx))
#else
#define UH_ATT_QT 1
#define UH_ATT_KB 4
#define UH_ATT_LOOP(ctx, w, n) UH_LOOP(ctx, w, n)
#endif

// The geometry and options every attention kernel reads from its arguments.
struct uh_att_geom {
    uh_i64 B, Hq, S, Sk, Hkv, D, group;
    bool bias, causal;
    double p;
    UH_MEMBER void read(const uh_args &a) {
        B = a.size[0];
        Hq = a.size[1];
        S = a.size[2];
        Sk = a.size[3];
        Hkv = a.size[4];
        D = a.len;
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

// Keys j0..j0+nk of a (batch, kv head) into dst[d][jj] (transposed; zero past nk) and, when
// `rows` is set, into rows[jj][d] too.
template <class T>
UH_DEV void uh_att_load_block(const uh_args &a, int k, uh_i64 b, uh_i64 h, uh_i64 j0, uh_i64 nk, uh_i64 D,
                              typename T::compute (*dst)[UH_ATT_KB], typename T::compute (*rows)[UH_ATT_MAXD]) {
    typedef typename T::storage S;
    for (uh_i64 jj = 0; jj < UH_ATT_KB; ++jj) {
        if (jj < nk) {
            const S *src = uh_att_row<S>(a, k, b, h, j0 + jj);
            for (uh_i64 d = 0; d < D; ++d) {
                typename T::compute x = T::load(src + d);
                dst[d][jj] = x;
                if (rows) rows[jj][d] = x;
            }
        } else {
            for (uh_i64 d = 0; d < D; ++d) dst[d][jj] = 0;
        }
    }
}

// sc[jj] = sum over d of x[d] * kt[d][jj], d in order (one accumulator per key).
template <class A> UH_DEV void uh_att_dots(const A *x, A (*kt)[UH_ATT_KB], uh_i64 D, A *sc) {
    for (int jj = 0; jj < UH_ATT_KB; ++jj) sc[jj] = 0;
    for (uh_i64 d = 0; d < D; ++d) {
        const A xd = x[d];
        for (int jj = 0; jj < UH_ATT_KB; ++jj) sc[jj] += xd * kt[d][jj];
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
        const uh_i64 D = g.D, tiles = (g.S + UH_ATT_QT - 1) / UH_ATT_QT;
        const A ninf = -uh_inf((A)0);
        const A kscale = g.p > 0 ? (A)(1.0 / (1.0 - g.p)) : (A)1;
        UH_ATT_LOOP(ctx, w, g.B * g.Hq * tiles) {
            const uh_i64 t = w % tiles, h = (w / tiles) % g.Hq, b = w / tiles / g.Hq, hk = h / g.group;
            const uh_i64 i0 = t * UH_ATT_QT, nq = g.S - i0 < UH_ATT_QT ? g.S - i0 : UH_ATT_QT;
            A qf[UH_ATT_QT][UH_ATT_MAXD], acc[UH_ATT_QT][UH_ATT_MAXD], m[UH_ATT_QT], l[UH_ATT_QT];
            A kt[UH_ATT_MAXD][UH_ATT_KB], vf[UH_ATT_KB][UH_ATT_MAXD], sc[UH_ATT_KB];
            for (uh_i64 r = 0; r < nq; ++r) {
                const S *q = uh_att_row<S>(a, 0, b, h, i0 + r);
                for (uh_i64 d = 0; d < D; ++d) {
                    qf[r][d] = T::load(q + d);
                    acc[r][d] = 0;
                }
                m[r] = ninf;
                l[r] = 0;
            }
            const uh_i64 kend = g.key_end(i0 + nq - 1);
            for (uh_i64 j0 = 0; j0 < kend; j0 += UH_ATT_KB) {
                const uh_i64 nk = kend - j0 < UH_ATT_KB ? kend - j0 : UH_ATT_KB;
                uh_att_load_block<T>(a, 1, b, hk, j0, nk, D, kt, (A(*)[UH_ATT_MAXD])0);
                for (uh_i64 jj = 0; jj < nk; ++jj) {
                    const S *v = uh_att_row<S>(a, 2, b, hk, j0 + jj);
                    for (uh_i64 d = 0; d < D; ++d) vf[jj][d] = T::load(v + d);
                }
                for (uh_i64 r = 0; r < nq; ++r) {
                    const uh_i64 i = i0 + r;
                    uh_att_dots(qf[r], kt, D, sc);
                    uh_att_scores<T>(a, g, b, h, i, j0, nk, sc);
                    A mx = m[r];
                    for (uh_i64 jj = 0; jj < nk; ++jj) mx = sc[jj] > mx ? sc[jj] : mx;
                    if (mx == ninf) continue; // every key so far is masked
                    const A alpha = m[r] == ninf ? (A)0 : uh_expc(m[r] - mx);
                    A sum = 0;
                    for (uh_i64 jj = 0; jj < nk; ++jj) {
                        const A pj = sc[jj] == ninf ? (A)0 : uh_expc(sc[jj] - mx);
                        sum += pj;
                        sc[jj] = pj;
                    }
                    l[r] = l[r] * alpha + sum;
                    m[r] = mx;
                    if (g.p > 0)
                        for (uh_i64 jj = 0; jj < nk; ++jj) sc[jj] = g.keep(a, b, h, i, j0 + jj) ? sc[jj] * kscale : (A)0;
                    for (uh_i64 d = 0; d < D; ++d) acc[r][d] *= alpha;
                    for (uh_i64 jj = 0; jj < nk; ++jj) {
                        const A pj = sc[jj];
                        for (uh_i64 d = 0; d < D; ++d) acc[r][d] += pj * vf[jj][d];
                    }
                }
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

// The probabilities and score gradients of query row i against keys j0..j0+nk: p[jj] the
// dropped-out probability (what multiplied v), ds[jj] the gradient of the scaled score.
// sc holds q·k, dp holds dout·v on entry.
template <class T>
UH_DEV void uh_att_grads(const uh_args &a, const uh_att_geom &g, uh_i64 b, uh_i64 h, uh_i64 i, uh_i64 j0, uh_i64 nk,
                         typename T::compute lse, typename T::compute delta, typename T::compute *sc,
                         typename T::compute *dp) {
    typedef typename T::compute A;
    const A ninf = -uh_inf((A)0);
    const A kscale = g.p > 0 ? (A)(1.0 / (1.0 - g.p)) : (A)1;
    uh_att_scores<T>(a, g, b, h, i, j0, nk, sc);
    for (uh_i64 jj = 0; jj < nk; ++jj) {
        const A pj = sc[jj] == ninf ? (A)0 : uh_expc(sc[jj] - lse);
        A z = 1;
        if (g.p > 0) z = g.keep(a, b, h, i, j0 + jj) ? kscale : (A)0;
        dp[jj] = pj * (dp[jj] * z - delta);
        sc[jj] = pj * z;
    }
}

// Backward, step 2: [q, k, v, bias, dout, stats, dq]: per query tile, dq over every key in order.
template <class T> struct uh_attention_dq_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        typedef typename T::storage S;
        typedef typename T::compute A;
        uh_att_geom g;
        g.read(a);
        const uh_i64 D = g.D, tiles = (g.S + UH_ATT_QT - 1) / UH_ATT_QT;
        const A ninf = -uh_inf((A)0), scale = (A)a.s[0];
        const A *stats = (const A *)a.ptr[5];
        UH_ATT_LOOP(ctx, w, g.B * g.Hq * tiles) {
            const uh_i64 t = w % tiles, h = (w / tiles) % g.Hq, b = w / tiles / g.Hq, hk = h / g.group;
            const uh_i64 i0 = t * UH_ATT_QT, nq = g.S - i0 < UH_ATT_QT ? g.S - i0 : UH_ATT_QT;
            A qf[UH_ATT_QT][UH_ATT_MAXD], dof[UH_ATT_QT][UH_ATT_MAXD], acc[UH_ATT_QT][UH_ATT_MAXD];
            A kt[UH_ATT_MAXD][UH_ATT_KB], vt[UH_ATT_MAXD][UH_ATT_KB], kf[UH_ATT_KB][UH_ATT_MAXD];
            A sc[UH_ATT_KB], dp[UH_ATT_KB];
            for (uh_i64 r = 0; r < nq; ++r) {
                const S *q = uh_att_row<S>(a, 0, b, h, i0 + r), *dout = uh_att_row<S>(a, 4, b, h, i0 + r);
                for (uh_i64 d = 0; d < D; ++d) {
                    qf[r][d] = T::load(q + d);
                    dof[r][d] = T::load(dout + d);
                    acc[r][d] = 0;
                }
            }
            const uh_i64 row0 = (b * g.Hq + h) * g.S + i0;
            const uh_i64 kend = g.key_end(i0 + nq - 1);
            for (uh_i64 j0 = 0; j0 < kend; j0 += UH_ATT_KB) {
                const uh_i64 nk = kend - j0 < UH_ATT_KB ? kend - j0 : UH_ATT_KB;
                uh_att_load_block<T>(a, 1, b, hk, j0, nk, D, kt, kf);
                uh_att_load_block<T>(a, 2, b, hk, j0, nk, D, vt, (A(*)[UH_ATT_MAXD])0);
                for (uh_i64 r = 0; r < nq; ++r) {
                    const A lse = stats[2 * (row0 + r)], delta = stats[2 * (row0 + r) + 1];
                    if (lse == ninf) continue; // a fully masked row has no gradient
                    uh_att_dots(qf[r], kt, D, sc);
                    uh_att_dots(dof[r], vt, D, dp);
                    uh_att_grads<T>(a, g, b, h, i0 + r, j0, nk, lse, delta, sc, dp);
                    for (uh_i64 jj = 0; jj < nk; ++jj) {
                        const A ds = dp[jj];
                        for (uh_i64 d = 0; d < D; ++d) acc[r][d] += ds * kf[jj][d];
                    }
                }
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
        const uh_i64 D = g.D, tiles = (g.Sk + UH_ATT_KB - 1) / UH_ATT_KB;
        const A ninf = -uh_inf((A)0), scale = (A)a.s[0];
        const A *stats = (const A *)a.ptr[5];
        UH_ATT_LOOP(ctx, w, g.B * g.Hkv * tiles) {
            const uh_i64 t = w % tiles, hk = (w / tiles) % g.Hkv, b = w / tiles / g.Hkv;
            const uh_i64 j0 = t * UH_ATT_KB, nk = g.Sk - j0 < UH_ATT_KB ? g.Sk - j0 : UH_ATT_KB;
            A kt[UH_ATT_MAXD][UH_ATT_KB], vt[UH_ATT_MAXD][UH_ATT_KB];
            A dk[UH_ATT_KB][UH_ATT_MAXD], dv[UH_ATT_KB][UH_ATT_MAXD];
            A qf[UH_ATT_MAXD], dof[UH_ATT_MAXD], sc[UH_ATT_KB], dp[UH_ATT_KB];
            uh_att_load_block<T>(a, 1, b, hk, j0, nk, D, kt, (A(*)[UH_ATT_MAXD])0);
            uh_att_load_block<T>(a, 2, b, hk, j0, nk, D, vt, (A(*)[UH_ATT_MAXD])0);
            for (uh_i64 jj = 0; jj < nk; ++jj)
                for (uh_i64 d = 0; d < D; ++d) dk[jj][d] = dv[jj][d] = 0;
            // Causal: query i sees key j only when j <= i.
            const uh_i64 istart = g.causal ? j0 : 0;
            for (uh_i64 hh = 0; hh < g.group; ++hh) {
                const uh_i64 h = hk * g.group + hh;
                for (uh_i64 i = istart; i < g.S; ++i) {
                    const uh_i64 row = (b * g.Hq + h) * g.S + i;
                    const A lse = stats[2 * row], delta = stats[2 * row + 1];
                    if (lse == ninf) continue;
                    const S *q = uh_att_row<S>(a, 0, b, h, i), *dout = uh_att_row<S>(a, 4, b, h, i);
                    for (uh_i64 d = 0; d < D; ++d) {
                        qf[d] = T::load(q + d);
                        dof[d] = T::load(dout + d);
                    }
                    uh_att_dots(qf, kt, D, sc);
                    uh_att_dots(dof, vt, D, dp);
                    uh_att_grads<T>(a, g, b, h, i, j0, nk, lse, delta, sc, dp);
                    for (uh_i64 jj = 0; jj < nk; ++jj) {
                        const A pj = sc[jj], ds = dp[jj];
                        for (uh_i64 d = 0; d < D; ++d) {
                            dv[jj][d] += pj * dof[d];
                            dk[jj][d] += ds * qf[d];
                        }
                    }
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
