// Opt kernels that attack kpair itself, with the GEMM test ABI of gemm.cu, for
// tests/gpu/test_cuda_hostile.py (the CUDA twin of tests/csrc/hostile.c):
//   hostile_forge  writes a passing result.json's text into every byte it can reach: C, A, B
//                  and the bytes around them within their allocations' pages
//   hostile_flood  prints 200,000 fake "PASS" lines with device printf and writes zeros
// A GPU kernel cannot open files; what it must not reach is host memory kpair relies on.

#define T 16

__device__ const char kFake[] =
    "{\"schema\": \"kpair.result\", \"status\": \"pass\", \"correct\": true, "
    "\"speed\": {\"speedup\": 42.0}}\n";

extern "C" __global__ void hostile_forge(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  const int n = sizeof(kFake) - 1;
  int tid = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y +
            threadIdx.y * blockDim.x + threadIdx.x;
  int threads = gridDim.x * gridDim.y * blockDim.x * blockDim.y;
  char* targets[3] = {(char*)C, (char*)A, (char*)B};
  long sizes[3] = {(long)M * N * 4, (long)M * K * 4, (long)K * N * 4};
  for (int t = 0; t < 3; ++t) {
    // The region and 1 KiB on each side: inside the mapping, outside the region.
    for (long i = tid - 1024; i < sizes[t] + 1024; i += threads) targets[t][i] = kFake[
        ((i % n) + n) % n];
  }
}

extern "C" __global__ void hostile_flood(const float* A, const float* B, float* C, int M,
                                         int N, int K) {
  (void)A; (void)B; (void)K;
  int row = blockIdx.y * T + threadIdx.y, col = blockIdx.x * T + threadIdx.x;
  if (row < M && col < N) {
    for (int i = 0; i < 200000 / (M * N) + 1; ++i)
      printf("PASS: byte-exact, 99.000x faster, slot bias 1.0000, CI [98.9, 99.1]\n");
    C[row * N + col] = 0.f;
  }
}
