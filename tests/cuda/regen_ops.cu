// Setup and forward kernels for regenerable regions on a GPU (tests/gpu/test_regen_gpu.py),
// the CUDA twins of tests/csrc/regen_ops.c. kp_fill_seeded is counter-based (splitmix64 of
// seed + offset + index, as Philox is a pure function of seed, offset and index), rounded
// without contraction so that numpy computes the same floats.
#include <stdint.h>

__device__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

extern "C" __global__ void kp_fill_seeded(float* a, long long n, unsigned long long seed,
                                          long long offset) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    a[i] = __fadd_rn(__fmul_rn((float)(splitmix64(seed + (uint64_t)(offset + i)) >> 40),
                               2.0f / 16777216.0f), -1.0f);
}

extern "C" __global__ void kp_fill(float* a, long long n, float v) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) a[i] = v;
}

extern "C" __global__ void kp_axpby(float* out, const float* x, const float* y, long long n,
                                    float alpha) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = alpha * x[i] + y[i];
}

// One thread per row, a sequential sum: deterministic.
extern "C" __global__ void kp_rowdot(const float* a, const float* b, float* out, int rows,
                                     int cols) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float s = 0.0f;
  for (int c = 0; c < cols; c++) s += a[(long long)r * cols + c] * b[(long long)r * cols + c];
  out[r] = s;
}
