// y = 1 / (1 + exp(-x)), float32, one thread per element (block 256).
// KP_OPT 1 is DELIBERATELY WRONG: it skips the last n % 8 elements, as a vectorised
// kernel that forgot its remainder loop would. The demo shows it being excluded.
#ifndef KP_OPT
#define KP_OPT 0
#endif

extern "C" __global__ void kp_sigmoid(const float *x, float *y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
#if KP_OPT == 0
    if (i < n) y[i] = 1.0f / (1.0f + expf(-x[i]));
#else
    if (i < n - n % 8) y[i] = 1.0f / (1.0f + expf(-x[i]));
#endif
}
