// Opt kernels that cheat, with the GEMM test ABI of gemm.cu (C[M,N] = A[M,K] @ B[K,N],
// row-major, 16x16 blocks over (N/16, M/16)), for tests/gpu/test_cuda_trust.py: the CUDA twin
// of tests/csrc/adversarial.c. Each must be rejected by the harness with the right reason:
//   cheat_nowrite   returns at once: C keeps whatever the buffer held
//   cheat_const     writes 0 everywhere
//   cheat_stale     first launch computes and caches each element in device memory; every
//                   later launch returns the cached (stale) answer
//   cheat_oob       correct, and writes one float past the end of C
//   cheat_input     correct, and scribbles on A
//   cheat_hardcode  copies the captured answer (only built with -DKP_ANSWER="header.h")
//   cheat_nondet    correct, but flips the last bit of C[0] on every second launch
//   cheat_lowprec   multiplies bf16-truncated inputs (round toward zero: one-sided error)
//   cheat_scale     the exact result times 1.0001 (a systematic error cosine cannot see)
//   cheat_count     a per-block launch counter: honest on its first 16 launches and on the
//                   launch numbers a fixed schedule checks (powers of two, every 64th); else
//                   3/4 of its blocks return at once (this won 1.19x PASS on the old schedule)
//   cheat_windows   a per-block launch counter: 3/4 of its blocks return at once on launches
//                   KP_FROM to KP_FROM + 4 only (set to opt's timing-window launches)
//   cheat_memo      keeps its answer keyed on two sampled input elements and copies it out
//                   when the key matches
//   cheat_slowref   correct; from its 17th launch on, it also rewrites B (ref's input) with
//                   larger values, to slow or change ref's next launch
//   cheat_timedscale a per-block launch counter: exact on launches before KP_FROM (opt's
//                   check runs: its own, the differential ones), the exact result times
//                   (1 + 2^-10) from KP_FROM on (opt's first timing window; every later launch
//                   is timed, on a fresh input): cosine cannot see it, the sign test can
//   cheat_memob     takes B for a constant weight: each element rounded to bf16 (to nearest:
//                   within cosine, no one-sided error) and kept at its first launch, used
//                   ever after whatever B holds (caught only where B is mutated)
// and one honest kernel that must pass under a tolerance policy:
//   honest_splitk   sums k in two halves (differs from gemm_tiled in the last bits)
#define T 16

__device__ __forceinline__ float dot(const float* A, const float* B, int row, int col, int N,
                                     int K) {
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc = fmaf(A[row * K + k], B[k * N + col], acc);
  return acc;  // the k order and fmaf of gemm_tiled/gemm_naive: bit-identical to them
}

#define INDEX                                         \
  int row = blockIdx.y * T + threadIdx.y;             \
  int col = blockIdx.x * T + threadIdx.x;             \
  (void)M;

extern "C" __global__ void honest_splitk(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  INDEX
  float lo = 0.f, hi = 0.f;
  for (int k = 0; k < K / 2; ++k) lo = fmaf(A[row * K + k], B[k * N + col], lo);
  for (int k = K / 2; k < K; ++k) hi = fmaf(A[row * K + k], B[k * N + col], hi);
  C[row * N + col] = lo + hi;
}

extern "C" __global__ void cheat_nowrite(const float* A, const float* B, float* C, int M,
                                         int N, int K) {}

extern "C" __global__ void cheat_const(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  C[row * N + col] = 0.f;
}

#define CACHE_ELEMENTS (1 << 20)
__device__ float stale_cache[CACHE_ELEMENTS];
__device__ unsigned char stale_valid[CACHE_ELEMENTS];

extern "C" __global__ void cheat_stale(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  int i = row * N + col;
  if (i < CACHE_ELEMENTS && stale_valid[i]) {
    C[i] = stale_cache[i];
    return;
  }
  float acc = dot(A, B, row, col, N, K);
  C[i] = acc;
  if (i < CACHE_ELEMENTS) {
    stale_cache[i] = acc;
    stale_valid[i] = 1;
  }
}

extern "C" __global__ void cheat_oob(const float* A, const float* B, float* C, int M, int N,
                                     int K) {
  INDEX
  C[row * N + col] = dot(A, B, row, col, N, K);
  if (row == 0 && col == 0) C[M * N] = 1.f;
}

extern "C" __global__ void cheat_input(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  C[row * N + col] = dot(A, B, row, col, N, K);
  if (row == M - 1 && col == N - 1) ((float*)A)[7] += 1.f;  // row 0 is long done by then
}

#ifdef KP_ANSWER
#include KP_ANSWER  // __device__ const unsigned kp_answer[] = {...};
extern "C" __global__ void cheat_hardcode(const float* A, const float* B, float* C, int M,
                                          int N, int K) {
  INDEX
  C[row * N + col] = __uint_as_float(kp_answer[row * N + col]);
}
#endif

__device__ unsigned nondet_launches;

extern "C" __global__ void cheat_nondet(const float* A, const float* B, float* C, int M,
                                        int N, int K) {
  INDEX
  float acc = dot(A, B, row, col, N, K);
  if (row == 0 && col == 0 && atomicAdd(&nondet_launches, 1u) % 2 == 1)
    acc = __uint_as_float(__float_as_uint(acc) ^ 1u);
  C[row * N + col] = acc;
}

__device__ __forceinline__ float bf16(float x) {
  return __uint_as_float(__float_as_uint(x) & 0xFFFF0000u);
}

extern "C" __global__ void cheat_lowprec(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  INDEX
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc = fmaf(bf16(A[row * K + k]), bf16(B[k * N + col]), acc);
  C[row * N + col] = acc;
}

extern "C" __global__ void cheat_scale(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  C[row * N + col] = dot(A, B, row, col, N, K) * 1.0001f;
}

#define COUNT_BLOCKS 4096
__device__ unsigned count_launches[COUNT_BLOCKS];

extern "C" __global__ void cheat_count(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  __shared__ unsigned n;
  unsigned b = (blockIdx.y * gridDim.x + blockIdx.x) % COUNT_BLOCKS;
  if (threadIdx.x == 0 && threadIdx.y == 0) n = ++count_launches[b];
  __syncthreads();
  bool checked = n <= 16 || (n & (n - 1)) == 0 || n % 64 == 0;
  if (!checked && (blockIdx.x + blockIdx.y) % 4 != 0) return;
  C[row * N + col] = dot(A, B, row, col, N, K);
}

#ifndef KP_FROM
#define KP_FROM 1000000
#endif
__device__ unsigned window_launches[COUNT_BLOCKS];

extern "C" __global__ void cheat_windows(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  INDEX
  __shared__ unsigned n;
  unsigned b = (blockIdx.y * gridDim.x + blockIdx.x) % COUNT_BLOCKS;
  if (threadIdx.x == 0 && threadIdx.y == 0) n = ++window_launches[b];
  __syncthreads();
  if (n >= KP_FROM && n < KP_FROM + 5 && (blockIdx.x + blockIdx.y) % 4 != 0) return;
  C[row * N + col] = dot(A, B, row, col, N, K);
}

__device__ float memo_key[2];
__device__ int memo_valid;
__device__ float memo_answer[CACHE_ELEMENTS];

extern "C" __global__ void cheat_memo(const float* A, const float* B, float* C, int M, int N,
                                      int K) {
  INDEX
  int i = row * N + col;
  float k0 = A[7 % (M * K)], k1 = B[13 % (K * N)];
  if (memo_valid && memo_key[0] == k0 && memo_key[1] == k1 && i < CACHE_ELEMENTS) {
    C[i] = memo_answer[i];
    return;
  }
  float acc = dot(A, B, row, col, N, K);
  C[i] = acc;
  if (i < CACHE_ELEMENTS) memo_answer[i] = acc;
  if (i == 0) {
    memo_key[0] = k0;
    memo_key[1] = k1;
    memo_valid = 1;
  }
}

__device__ unsigned slowref_launches;

extern "C" __global__ void cheat_slowref(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  INDEX
  C[row * N + col] = dot(A, B, row, col, N, K);
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.x == 0 && blockIdx.y == 0)
    atomicAdd(&slowref_launches, 1u);
  if (slowref_launches > 16) ((float*)B)[row * N + col] = 1e30f;
}

__device__ unsigned timedscale_launches[COUNT_BLOCKS];

extern "C" __global__ void cheat_timedscale(const float* A, const float* B, float* C, int M,
                                            int N, int K) {
  INDEX
  __shared__ unsigned n;
  unsigned b = (blockIdx.y * gridDim.x + blockIdx.x) % COUNT_BLOCKS;
  if (threadIdx.x == 0 && threadIdx.y == 0) n = ++timedscale_launches[b];
  __syncthreads();
  float acc = dot(A, B, row, col, N, K);
  C[row * N + col] = n >= KP_FROM ? acc * (1.f + 1.f / 1024.f) : acc;
}

__device__ __forceinline__ float bf16_rne(float x) {
  unsigned u = __float_as_uint(x);
  return __uint_as_float((u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u);
}

__device__ float memob_low[CACHE_ELEMENTS];
__device__ unsigned memob_launches[COUNT_BLOCKS];

extern "C" __global__ void cheat_memob(const float* A, const float* B, float* C, int M, int N,
                                       int K) {
  INDEX
  __shared__ unsigned n;
  unsigned b = (blockIdx.y * gridDim.x + blockIdx.x) % COUNT_BLOCKS;
  if (threadIdx.x == 0 && threadIdx.y == 0) n = ++memob_launches[b];
  __syncthreads();
  // The first launch rounds B as it goes and keeps its element (thread i keeps B[i]: B is
  // K x N, K == M here); every later launch reads the copy the first launch left.
  bool kept = n > 1 && K * N <= CACHE_ELEMENTS;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    int j = k * N + col;
    acc = fmaf(A[row * K + k], kept ? memob_low[j] : bf16_rne(B[j]), acc);
  }
  C[row * N + col] = acc;
  int i = row * N + col;
  if (n == 1 && i < K * N && i < CACHE_ELEMENTS) memob_low[i] = bf16_rne(B[i]);
}
