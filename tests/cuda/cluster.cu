// Thread-block-cluster kernel (sm_90): each block writes its rank in its cluster and the
// cluster size. Replayed without the captured CLUSTER_DIMENSION attribute, every block
// would report a cluster of one, so a byte-exact replay proves the attribute was applied.
extern "C" __global__ void cluster_rank(unsigned* out) {
  unsigned rank, size;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
  if (threadIdx.x == 0) out[blockIdx.x] = rank | (size << 16);
}
