// Row softmax of x[rows x cols] into y, float32. KP_OPT 0: one thread per row, three serial
// passes (launch: 128 threads a block). KP_OPT 1: one 256-thread block per row, tree
// reductions for max and sum in shared memory (launch override: grid rows, block 256).
// The sums are associated differently, so opt agrees with ref to rounding, not bit for bit.
#ifndef KP_OPT
#define KP_OPT 0
#endif

extern "C" __global__ void kp_softmax(const float *x, float *y, int rows, int cols) {
#if KP_OPT == 0
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *in = x + (size_t)r * cols;
    float *out = y + (size_t)r * cols;
    float m = in[0];
    for (int j = 1; j < cols; j++) m = fmaxf(m, in[j]);
    float s = 0.0f;
    for (int j = 0; j < cols; j++) s += expf(in[j] - m);
    for (int j = 0; j < cols; j++) out[j] = expf(in[j] - m) / s;
#else
    __shared__ float red[256];
    const float *in = x + (size_t)blockIdx.x * cols;
    float *out = y + (size_t)blockIdx.x * cols;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < cols; j += 256) m = fmaxf(m, in[j]);
    red[threadIdx.x] = m;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + h]);
        __syncthreads();
    }
    m = red[0];
    __syncthreads();
    float s = 0.0f;
    for (int j = threadIdx.x; j < cols; j += 256) s += expf(in[j] - m);
    red[threadIdx.x] = s;
    __syncthreads();
    for (int h = 128; h > 0; h >>= 1) {
        if (threadIdx.x < h) red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    s = red[0];
    for (int j = threadIdx.x; j < cols; j += 256) out[j] = expf(in[j] - m) / s;
#endif
}
