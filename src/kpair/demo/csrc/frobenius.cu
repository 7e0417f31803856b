// out[0] = sqrt(sum of x[i]^2), float32, one block (a scalar result from one dispatch).
// KP_OPT 0: 256 threads, scalar loads, thread 0 adds the 256 partial sums in order.
// KP_OPT 1: 1024 threads, float4 loads, warp-shuffle tree (launch override: block 1024;
// n must be a multiple of 4). A different summation order: equal within a relative 1e-6.
#ifndef KP_OPT
#define KP_OPT 0
#endif

extern "C" __global__ void kp_frobenius(const float *x, float *out, long long n) {
#if KP_OPT == 0
    __shared__ float part[256];
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n; i += 256) s = fmaf(x[i], x[i], s);
    part[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.0f;
        for (int j = 0; j < 256; j++) t += part[j];
        out[0] = sqrtf(t);
    }
#else
    __shared__ float warp_sums[32];
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n / 4; i += 1024) {
        float4 v = x4[i];
        s = fmaf(v.x, v.x, s); s = fmaf(v.y, v.y, s); s = fmaf(v.z, v.z, s); s = fmaf(v.w, v.w, s);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = warp_sums[threadIdx.x];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) out[0] = sqrtf(s);
    }
#endif
}
