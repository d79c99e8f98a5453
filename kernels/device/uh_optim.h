// unihal portable multi-tensor kernels: optimizer steps, AMP gradient unscaling and loss-scale
// update, global-norm clipping. A launch covers a.mt_count groups of dense tensors
// (a.mt_ptr[g][...], a.mt_len[g] elements each); every block takes its share of every group.
#ifndef UH_OPTIM_H
#define UH_OPTIM_H

// The optional low-precision copy of updated parameters.
struct uh_no_copy {
    typedef uh_u16 storage;
    static const bool enabled = false;
    UH_DEV void store(storage *, float) {}
};
template <class T> struct uh_with_copy {
    typedef typename T::storage storage;
    static const bool enabled = true;
    UH_DEV void store(storage *p, float v) { T::store(p, v); }
};

// Groups [param, grad, momentum_buffer, (copy)]. s: lr, momentum, dampening, weight_decay;
// i[0] nesterov, i[1] first step.
template <class G, class Cp> struct uh_sgd_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const float lr = (float)a.s[0], mom = (float)a.s[1], damp = (float)a.s[2], wd = (float)a.s[3];
        const bool nesterov = a.i[0] != 0, first = a.i[1] != 0;
        for (int g = 0; g < (int)a.mt_count; ++g) {
            float *p = (float *)a.mt_ptr[g][0];
            const typename G::storage *gr = (const typename G::storage *)a.mt_ptr[g][1];
            float *buf = (float *)a.mt_ptr[g][2];
            typename Cp::storage *cp = (typename Cp::storage *)a.mt_ptr[g][3];
            UH_LOOP(ctx, i, a.mt_len[g]) {
                const float pi = p[i];
                const float d0 = G::load(gr + i) + wd * pi;
                float d = d0;
                if (mom != 0.0f) {
                    const float b = first ? d0 : mom * buf[i] + (1.0f - damp) * d0;
                    buf[i] = b;
                    d = nesterov ? d0 + mom * b : b;
                }
                const float np = pi - lr * d;
                p[i] = np;
                if (Cp::enabled) Cp::store(cp + i, np);
            }
        }
    }
};

// Groups [param, grad, exp_avg, exp_avg_sq, (copy)]. s: lr, beta1, beta2, eps, weight_decay,
// step_size = lr / (1 - beta1^step), sqrt(1 - beta2^step).
template <class G, class Cp> struct uh_adamw_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const float lr = (float)a.s[0], b1 = (float)a.s[1], b2 = (float)a.s[2], eps = (float)a.s[3];
        const float wd = (float)a.s[4], step_size = (float)a.s[5], bc2 = (float)a.s[6];
        for (int g = 0; g < (int)a.mt_count; ++g) {
            float *p = (float *)a.mt_ptr[g][0];
            const typename G::storage *gr = (const typename G::storage *)a.mt_ptr[g][1];
            float *m = (float *)a.mt_ptr[g][2], *v = (float *)a.mt_ptr[g][3];
            typename Cp::storage *cp = (typename Cp::storage *)a.mt_ptr[g][4];
            UH_LOOP(ctx, i, a.mt_len[g]) {
                const float gi = G::load(gr + i);
                const float mi = b1 * m[i] + (1.0f - b1) * gi;
                const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
                const float denom = sqrtf(vi) / bc2 + eps;
                const float np = p[i] * (1.0f - lr * wd) - step_size * (mi / denom);
                m[i] = mi;
                v[i] = vi;
                p[i] = np;
                if (Cp::enabled) Cp::store(cp + i, np);
            }
        }
    }
};

// grads *= inv_scale (ptr[1][0]); found_inf (ptr[0][0]) = 1 when an element is not finite.
template <class G> struct uh_amp_unscale_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const float inv = *(const float *)a.ptr[1];
        int bad = 0;
        for (int g = 0; g < (int)a.mt_count; ++g) {
            typename G::storage *x = (typename G::storage *)a.mt_ptr[g][0];
            UH_LOOP(ctx, i, a.mt_len[g]) {
                const float v = G::load(x + i);
                bad |= (v - v) != 0.0f; // inf - inf and NaN - NaN are NaN
                G::store(x + i, v * inv);
            }
        }
        if (bad) uh_set_flag((float *)a.ptr[0], 1.0f);
    }
};

// One thread: [scale, growth_tracker, found_inf]; s: growth_factor, backoff_factor; i[0] interval.
struct uh_amp_update_scale_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        if (UH_TID != 0 || uh_block_id(ctx) != 0) return;
        float *scale = (float *)a.ptr[0];
        uh_i32 *tracker = (uh_i32 *)a.ptr[1];
        const float found = *(const float *)a.ptr[2];
        if (found != 0.0f) {
            *scale = *scale * (float)a.s[1];
            *tracker = 0;
        } else {
            uh_i32 t = *tracker + 1;
            if (t >= a.i[0]) {
                const float ns = *scale * (float)a.s[0];
                if (ns - ns == 0.0f) *scale = ns;
                t = 0;
            }
            *tracker = t;
        }
    }
};

// Block g computes the squared L2 norm of group g into ptr[1][i[0] + g] (scratch).
template <class G> struct uh_clip_sumsq_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        for (uh_i64 g = uh_block_id(ctx); g < a.mt_count; g += uh_grid_size(ctx)) {
            const typename G::storage *x = (const typename G::storage *)a.mt_ptr[g][0];
            const float s = uh_row_reduce(a.mt_len[g], 0.0f, uh_red_sum(), [&](uh_i64 j) {
                const float v = G::load(x + j);
                return v * v;
            }, scratch);
            if (UH_TID == 0) ((float *)a.ptr[1])[a.i[0] + g] = s;
        }
    }
};

// One block: total_norm (ptr[0][0]) = sqrt(sum of the i[0] squared norms at ptr[1]).
struct uh_clip_total_k {
    UH_DEV void run(uh_ctx_t, const uh_args &a) {
        UH_SHARED(float, scratch, UH_ROW_THREADS);
        const float *sq = (const float *)a.ptr[1];
        const float s = uh_row_reduce(a.i[0], 0.0f, uh_red_sum(), [&](uh_i64 j) { return sq[j]; }, scratch);
        if (UH_TID == 0) *(float *)a.ptr[0] = sqrtf(s);
    }
};

// grads *= min(1, max_norm / (total_norm + 1e-6)); NaN propagates (as PyTorch's clamp).
template <class G> struct uh_clip_scale_k {
    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const float total = *(const float *)a.ptr[0];
        float c = (float)a.s[0] / (total + 1e-6f);
        c = c > 1.0f ? 1.0f : c;
        for (int g = 0; g < (int)a.mt_count; ++g) {
            typename G::storage *x = (typename G::storage *)a.mt_ptr[g][0];
            UH_LOOP(ctx, i, a.mt_len[g]) { G::store(x + i, G::load(x + i) * c); }
        }
    }
};

#endif // UH_OPTIM_H
