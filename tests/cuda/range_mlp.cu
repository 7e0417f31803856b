// A CUDA range of three kernels (matmul, bias, ReLU) and candidates that fuse them into one
// kernel with a signature of its own, for tests/gpu/test_range_cheats_gpu.py: the CUDA twin of
// tests/csrc/range_ops.c, and the single-dispatch cheats of adversarial.cu on a plan.
// out = relu(a @ b + bias), float32, n x n row-major (n a multiple of 16), bias of n (one per
// column). kp_matmul, kp_bias: 16x16 blocks over (n/16, n/16); kp_relu: 256 threads a block
// over n*n/256 blocks. The fused kernels: 16x16 blocks over (n/16, n/16), one element each.
// kp_fused computes each element with the same fmaf chain (k ascending from 0), then + bias,
// then max with 0: bit-identical to the range. The cheats (all kp_fused's signature):
//   cheat_skip     returns at once: out keeps whatever the buffer held
//   cheat_stale    first launch computes and caches each element; later launches return it
//   cheat_memo     keeps its answer keyed on two sampled input elements, copies it on a match
//   cheat_oob      correct, and writes one float past the end of out
//   cheat_input    correct, and scribbles on a (a live-in region)
//   cheat_count    a per-block launch counter: honest on its first 16 launches and on the
//                  launch numbers a fixed schedule checks (powers of two, every 64th); else
//                  3/4 of its blocks return at once
//   cheat_windows  a per-block launch counter: 3/4 of its blocks return at once on launches
//                  KP_FROM to KP_FROM + 4 only (set to opt's timing-window launches)
#define T 16

__device__ __forceinline__ float dot(const float* a, const float* b, int row, int col, int n) {
  float acc = 0.f;
  for (int k = 0; k < n; ++k) acc = fmaf(a[row * n + k], b[k * n + col], acc);
  return acc;
}

extern "C" __global__ void kp_matmul(const float* a, const float* b, float* c, int n) {
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  c[row * n + col] = dot(a, b, row, col, n);
}

extern "C" __global__ void kp_bias(float* c, const float* bias, int n) {
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  c[row * n + col] += bias[col];
}

extern "C" __global__ void kp_relu(float* c, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n * n) c[i] = c[i] > 0.f ? c[i] : 0.f;
}

__device__ __forceinline__ float answer(const float* bias, const float* a, const float* b,
                                        int row, int col, int n) {
  float v = dot(a, b, row, col, n);
  v = v + bias[col];
  return v > 0.f ? v : 0.f;
}

#define FUSED(name)                                                                   \
  extern "C" __global__ void name(int n, const float* bias, const float* a, const float* b, \
                                  float* out)
#define INDEX                                                   \
  int row = blockIdx.y * T + threadIdx.y;                       \
  int col = blockIdx.x * T + threadIdx.x;                       \
  int i = row * n + col;

FUSED(kp_fused) {
  INDEX
  out[i] = answer(bias, a, b, row, col, n);
}

FUSED(cheat_skip) {}

#define CACHE_ELEMENTS (1 << 20)
__device__ float stale_cache[CACHE_ELEMENTS];
__device__ unsigned char stale_valid[CACHE_ELEMENTS];

FUSED(cheat_stale) {
  INDEX
  if (i < CACHE_ELEMENTS && stale_valid[i]) {
    out[i] = stale_cache[i];
    return;
  }
  float v = answer(bias, a, b, row, col, n);
  out[i] = v;
  if (i < CACHE_ELEMENTS) {
    stale_cache[i] = v;
    stale_valid[i] = 1;
  }
}

__device__ float memo_key[2];
__device__ int memo_valid;
__device__ float memo_answer[CACHE_ELEMENTS];

FUSED(cheat_memo) {
  INDEX
  float k0 = a[7 % (n * n)], k1 = b[13 % (n * n)];
  if (memo_valid && memo_key[0] == k0 && memo_key[1] == k1 && i < CACHE_ELEMENTS) {
    out[i] = memo_answer[i];
    return;
  }
  float v = answer(bias, a, b, row, col, n);
  out[i] = v;
  if (i < CACHE_ELEMENTS) memo_answer[i] = v;
  if (i == 0) {
    memo_key[0] = k0;
    memo_key[1] = k1;
    memo_valid = 1;
  }
}

FUSED(cheat_oob) {
  INDEX
  out[i] = answer(bias, a, b, row, col, n);
  if (row == 0 && col == 0) out[n * n] = 1.f;
}

FUSED(cheat_input) {
  INDEX
  out[i] = answer(bias, a, b, row, col, n);
  if (row == n - 1 && col == n - 1) ((float*)a)[7] += 1.f;  // row 0 is long done by then
}

#define COUNT_BLOCKS 4096
// c: this launch's number (from 1) in the block's slot of counts[] (every thread of the block)
#define LAUNCH_NUMBER(counts)                                              \
  __shared__ unsigned c;                                                   \
  unsigned blk = (blockIdx.y * gridDim.x + blockIdx.x) % COUNT_BLOCKS;     \
  if (threadIdx.x == 0 && threadIdx.y == 0) c = ++counts[blk];             \
  __syncthreads();

__device__ unsigned count_launches[COUNT_BLOCKS];

FUSED(cheat_count) {
  INDEX
  LAUNCH_NUMBER(count_launches)
  bool checked = c <= 16 || (c & (c - 1)) == 0 || c % 64 == 0;
  if (!checked && (blockIdx.x + blockIdx.y) % 4 != 0) return;
  out[i] = answer(bias, a, b, row, col, n);
}

#ifndef KP_FROM
#define KP_FROM 1000000
#endif
__device__ unsigned window_launches[COUNT_BLOCKS];

FUSED(cheat_windows) {
  INDEX
  LAUNCH_NUMBER(window_launches)
  if (c >= KP_FROM && c < KP_FROM + 5 && (blockIdx.x + blockIdx.y) % 4 != 0) return;
  out[i] = answer(bias, a, b, row, col, n);
}
