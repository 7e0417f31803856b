// Pointer-array kernel: srcs is a device array of device pointers. Relocated replay works
// only if the pointers stored in memory move with the regions.
extern "C" __global__ void sum_ptrs(const float* const* srcs, int nsrc, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float acc = 0.f;
  for (int s = 0; s < nsrc; ++s) acc += srcs[s][i];
  out[i] = acc;
}
