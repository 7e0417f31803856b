// y[batch x n] = relu(x[batch x k] * w[k x n] + bias[n]), float32; dimensions multiples of 32.
// One thread per output, block (32, 32). KP_OPT 0: operands from global memory; KP_OPT 1:
// shared-memory tiles with the bias and ReLU fused into the epilogue. Same k order, same
// fused multiply-adds: bit-identical.
#ifndef KP_OPT
#define KP_OPT 0
#endif
#define TILE 32

extern "C" __global__ void kp_gemm_add_relu(const float *x, const float *w, const float *bias,
                                            float *y, int batch, int k, int n) {
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float s = 0.0f;
#if KP_OPT == 0
    for (int i = 0; i < k; i++) s = fmaf(x[row * k + i], w[i * n + col], s);
#else
    __shared__ float tx[TILE][TILE], tw[TILE][TILE];
    for (int t = 0; t < k; t += TILE) {
        tx[threadIdx.y][threadIdx.x] = x[row * k + t + threadIdx.x];
        tw[threadIdx.y][threadIdx.x] = w[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int i = 0; i < TILE; i++) s = fmaf(tx[threadIdx.y][i], tw[i][threadIdx.x], s);
        __syncthreads();
    }
#endif
    s += bias[col];
    y[row * n + col] = s > 0.0f ? s : 0.0f;
}
