// C[n x n] = A * B, float32, row-major, n a multiple of 32. One thread per output in both
// builds, block (32, 32). KP_OPT 0: every operand from global memory. KP_OPT 1: 32x32 tiles
// staged in shared memory. Both add the products in k order with the same fused multiply-add,
// so the results are bit-identical.
#ifndef KP_OPT
#define KP_OPT 0
#endif
#define TILE 32

extern "C" __global__ void kp_matmul(const float *a, const float *b, float *c, int n) {
    int row = blockIdx.y * TILE + threadIdx.y, col = blockIdx.x * TILE + threadIdx.x;
    float s = 0.0f;
#if KP_OPT == 0
    for (int k = 0; k < n; k++) s = fmaf(a[row * n + k], b[k * n + col], s);
#else
    __shared__ float ta[TILE][TILE], tb[TILE][TILE];
    for (int t = 0; t < n; t += TILE) {
        ta[threadIdx.y][threadIdx.x] = a[row * n + t + threadIdx.x];
        tb[threadIdx.y][threadIdx.x] = b[(t + threadIdx.y) * n + col];
        __syncthreads();
        for (int k = 0; k < TILE; k++) s = fmaf(ta[threadIdx.y][k], tb[k][threadIdx.x], s);
        __syncthreads();
    }
#endif
    c[row * n + col] = s;
}
