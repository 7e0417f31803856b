// GEMM test kernels, one ABI: C[M,N] = A[M,K] @ B[K,N], row-major, launched with 16x16
// blocks over (N/16, M/16). M, N, K are multiples of 16. Both correct kernels accumulate
// fmaf in the same k order, so their outputs are bit-identical.
#define T 16

extern "C" __global__ void gemm_naive(const float* A, const float* B, float* C,
                                      int M, int N, int K) {
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc = fmaf(A[row * K + k], B[k * N + col], acc);
  C[row * N + col] = acc;
}

extern "C" __global__ void gemm_tiled(const float* A, const float* B, float* C,
                                      int M, int N, int K) {
  __shared__ float As[T][T], Bs[T][T];
  int ty = threadIdx.y, tx = threadIdx.x;
  int row = blockIdx.y * T + ty, col = blockIdx.x * T + tx;
  float acc = 0.f;
  for (int k0 = 0; k0 < K; k0 += T) {
    As[ty][tx] = A[row * K + k0 + tx];
    Bs[ty][tx] = B[(k0 + ty) * N + col];
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < T; ++kk) acc = fmaf(As[ty][kk], Bs[kk][tx], acc);
    __syncthreads();
  }
  C[row * N + col] = acc;
}

// Same ABI, but writes 16 TiB past C: an illegal address (the fault-isolation test's opt).
extern "C" __global__ void gemm_fault(const float* A, const float* B, float* C,
                                      int M, int N, int K) {
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  float* bad = C + ((size_t)1 << 42);
  bad[row * N + col] = A[row * K] + B[col];
}

// Same ABI, never finishes (A[0] is never 12345): the watchdog test's opt.
extern "C" __global__ void gemm_hang(const float* A, const float* B, float* C,
                                     int M, int N, int K) {
  volatile const float* a = A;
  while (a[0] != 12345.f) {
  }
  C[0] = B[0];
}
