// unihal portable tiled GEMM: c = alpha * a @ b + beta * c for every batch, any strides, half
// types accumulating in f32. Used where a device has no vendor BLAS (and by simulated runtimes);
// the CPU backend normally uses an optimised GEMM library and runs this kernel on request.
//
// Arguments: operands a, b, c; batches iterate like rows (a.n batches over size/stride); i[0] = M,
// i[1] = N, len = K; axis[0..5] = row/column strides of a, b, c; s[0] = alpha, s[1] = beta.
// Grid: x = tiles of N, y = tiles of M, z = batches (a grid-stride loop covers more batches).
// Each block computes one 64x64 tile of c. On GPUs 256 threads each own a 4x4 sub-tile and stage
// 16-deep slices of a and b in shared memory; on the CPU the block's one thread walks the tile.
#ifndef UH_GEMM_H
#define UH_GEMM_H

#define UH_GEMM_TILE 64
#define UH_GEMM_DEPTH 16

template <class T> struct uh_gemm_k {
    typedef typename T::storage S;
    typedef typename T::compute A;

    UH_DEV void finish(const uh_args &a, S *c, uh_i64 i, uh_i64 j, A acc) {
        const A alpha = (A)a.s[0], beta = (A)a.s[1];
        S *p = c + i * a.axis[4] + j * a.axis[5];
        A v = alpha * acc;
        if (beta != (A)0) v = v + beta * T::load(p);
        T::store(p, v);
    }

    UH_DEV void run(uh_ctx_t ctx, const uh_args &a) {
        const uh_i64 M = a.i[0], N = a.i[1], K = a.len;
        const uh_i64 ars = a.axis[0], acs = a.axis[1], brs = a.axis[2], bcs = a.axis[3];
#ifdef UH_CPU
        const uh_i64 tx = ctx->block_idx[0], ty = ctx->block_idx[1], bz0 = ctx->block_idx[2], bzn = ctx->grid[2];
#else
        const uh_i64 tx = blockIdx.x, ty = blockIdx.y, bz0 = blockIdx.z, bzn = gridDim.z;
#endif
        const uh_i64 i0 = ty * UH_GEMM_TILE, j0 = tx * UH_GEMM_TILE;
        for (uh_i64 bz = bz0; bz < a.n; bz += bzn) {
            uh_i64 off[UH_MAX_OPERANDS];
            uh_offsets(a, 3, bz, off);
            const S *pa = (const S *)a.ptr[0] + off[0];
            const S *pb = (const S *)a.ptr[1] + off[1];
            S *pc = (S *)a.ptr[2] + off[2];
#ifdef UH_CPU
            const int mi = (int)(M - i0 < UH_GEMM_TILE ? M - i0 : UH_GEMM_TILE);
            const int nj = (int)(N - j0 < UH_GEMM_TILE ? N - j0 : UH_GEMM_TILE);
            A acc[UH_GEMM_TILE][UH_GEMM_TILE];
            for (int r = 0; r < mi; ++r) {
                for (int q = 0; q < UH_GEMM_TILE; ++q) acc[r][q] = 0;
                for (uh_i64 k = 0; k < K; ++k) {
                    const A av = T::load(pa + (i0 + r) * ars + k * acs);
                    const S *brow = pb + k * brs + j0 * bcs;
                    if (bcs == 1) {
                        for (int q = 0; q < nj; ++q) acc[r][q] += av * T::load(brow + q);
                    } else {
                        for (int q = 0; q < nj; ++q) acc[r][q] += av * T::load(brow + q * bcs);
                    }
                }
                for (int q = 0; q < nj; ++q) finish(a, pc, i0 + r, j0 + q, acc[r][q]);
            }
#else
            __shared__ A as[UH_GEMM_DEPTH][UH_GEMM_TILE + 1];
            __shared__ A bs[UH_GEMM_DEPTH][UH_GEMM_TILE + 1];
            const int t = threadIdx.x, tr = t / 16, tc = t % 16;
            A acc[4][4];
            for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) acc[r][q] = 0;
            for (uh_i64 k0 = 0; k0 < K; k0 += UH_GEMM_DEPTH) {
                for (int e = t; e < UH_GEMM_DEPTH * UH_GEMM_TILE; e += blockDim.x) {
                    const int kk = e / UH_GEMM_TILE, mm = e % UH_GEMM_TILE;
                    const uh_i64 k = k0 + kk;
                    as[kk][mm] = (i0 + mm < M && k < K) ? T::load(pa + (i0 + mm) * ars + k * acs) : (A)0;
                    bs[kk][mm] = (j0 + mm < N && k < K) ? T::load(pb + k * brs + (j0 + mm) * bcs) : (A)0;
                }
                __syncthreads();
                for (int kk = 0; kk < UH_GEMM_DEPTH; ++kk) {
                    A av[4], bv[4];
                    for (int r = 0; r < 4; ++r) av[r] = as[kk][tr + 16 * r];
                    for (int q = 0; q < 4; ++q) bv[q] = bs[kk][tc + 16 * q];
                    for (int r = 0; r < 4; ++r)
                        for (int q = 0; q < 4; ++q) acc[r][q] += av[r] * bv[q];
                }
                __syncthreads();
            }
            for (int r = 0; r < 4; ++r)
                for (int q = 0; q < 4; ++q) {
                    const uh_i64 i = i0 + tr + 16 * r, j = j0 + tc + 16 * q;
                    if (i < M && j < N) finish(a, pc, i, j, acc[r][q]);
                }
#endif
        }
    }
};

#endif // UH_GEMM_H
