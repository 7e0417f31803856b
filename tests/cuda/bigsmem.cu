// Dynamic shared memory above 48 KiB: each block stages `per_block` floats in shared memory
// and writes them back reversed and doubled. Launched with per_block * 4 bytes of dynamic
// shared memory, so the replay must raise MAX_DYNAMIC_SHARED_SIZE_BYTES.
extern "C" __global__ void smem_reverse(const float* in, float* out, int per_block) {
  extern __shared__ float buf[];
  const float* src = in + (size_t)blockIdx.x * per_block;
  float* dst = out + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) buf[i] = src[i];
  __syncthreads();
  for (int i = threadIdx.x; i < per_block; i += blockDim.x)
    dst[i] = 2.f * buf[per_block - 1 - i];
}
