// The conformance suite's test kernels for AMD GPUs and Hygon DCUs (and the simulated HIP
// runtime, which runs the host kernels of the same names). Same entry names and parameter lists
// as the host versions in kernels/src/testing.rs and the CUDA versions in uh_testing.cu; compiled
// by hiprtc for the device's architecture at run time (no include: hiprtc provides the HIP
// device functions).

struct Pair {
    unsigned a;
    float b;
};

extern "C" __global__ void unihal_test_iota_u32(unsigned *out, unsigned n) {
    unsigned long long g = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < n) out[g] = (unsigned)g;
}

extern "C" __global__ void unihal_test_coords(unsigned *out) {
    unsigned long long threads = (unsigned long long)blockDim.x * blockDim.y * blockDim.z;
    unsigned long long block =
        blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long t = threadIdx.x + (unsigned long long)blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned long long g = block * threads + t;
    out[g] = (unsigned)g + 1;
}

extern "C" __global__ void unihal_test_axpy_f32(unsigned n, float a, const float *x, float *y) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __fadd_rn(__fmul_rn(a, x[i]), y[i]);
}

__device__ static void put_le(unsigned char *out, unsigned long long v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(v >> (8 * i));
}

extern "C" __global__ void unihal_test_args_probe(unsigned char *out, unsigned char a, unsigned short b,
                                                  unsigned c, unsigned long long d, float e, double f,
                                                  Pair s) {
    if (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) return;
    put_le(out, a, 1);
    put_le(out + 1, b, 2);
    put_le(out + 3, c, 4);
    put_le(out + 7, d, 8);
    put_le(out + 15, __float_as_uint(e), 4);
    put_le(out + 19, (unsigned long long)__double_as_longlong(f), 8);
    put_le(out + 27, s.a, 4);
    put_le(out + 31, __float_as_uint(s.b), 4);
}

extern "C" __global__ void unihal_test_mul_add_u32(unsigned *buf, unsigned n, unsigned mul, unsigned add) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) buf[i] = buf[i] * mul + add;
}

// The constant 100 MHz real-time counter of gfx9 and later (s_memrealtime).
__device__ static unsigned long long now_ns() {
    return __builtin_amdgcn_s_memrealtime() * 10ull;
}

extern "C" __global__ void unihal_test_wait_flag(const volatile unsigned *flag, volatile unsigned *out,
                                                 unsigned value, unsigned timeout_ms) {
    if (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) return;
    *out = 1;
    __threadfence_system();
    unsigned long long start = now_ns();
    while (*flag == 0) {
        if (now_ns() - start > (unsigned long long)timeout_ms * 1000000ull) __builtin_trap();
        __builtin_amdgcn_s_sleep(127);
    }
    __threadfence_system();
    *out = value;
}

extern "C" __global__ void unihal_test_fail(int status) {
    if (status != 0) __builtin_trap();
}

// HIP gives a kernel no query of its dynamic shared memory size (the CUDA version checks it).
extern "C" __global__ void unihal_test_block_sum_u32(const unsigned *x, unsigned *out) {
    extern __shared__ unsigned shared[];
    unsigned b = blockDim.x;
    unsigned long long base = (unsigned long long)blockIdx.x * b;
    shared[threadIdx.x] = x[base + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned sum = 0;
        for (unsigned t = 0; t < b; t++) sum += shared[t];
        out[blockIdx.x] = sum;
    }
}
