// Elementwise test kernel: y = a * x + y (one thread per element).
extern "C" __global__ void axpy(const float* x, float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// Threshold backward, updated in place (as Inductor's fused threshold_backward kernels do):
// where mask[i] is set the old value is dropped, so which bytes of out are write-only depends
// on the data (thousands of runs). relu_backward_skip leaves those elements as they were.
extern "C" __global__ void relu_backward(const unsigned char* mask, const float* g, float* out,
                                         int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = mask[i] ? 0.0f : out[i] + g[i];
}

extern "C" __global__ void relu_backward_skip(const unsigned char* mask, const float* g,
                                              float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n && !mask[i]) out[i] = out[i] + g[i];
}

// Where mask[i] is set, out[i] becomes 0 unless it held a huge number (|x| > 1e6, as an
// overflow guard keeps it); elsewhere it is read and updated. To the two discovery fills the
// masked elements look write-only; about four arbitrary poison words in ten are huge, and
// under them ref itself changes its answer (CUDA twin of tests/csrc/huge_keep.c).
extern "C" __global__ void huge_keep(const unsigned char* mask, const float* g, float* out,
                                     int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = out[i];
  out[i] = mask[i] ? (fabsf(x) > 1e6f ? x : 0.0f) : x + g[i];
}

// ReLU updated in place: x is the only buffer, so nothing is read-only and the captured
// pre-state is the input (as PyTorch's relu_). relu_inplace_memo is a cheat: per block it keeps
// which of its elements were negative, keyed on 16 sampled elements of x (taken through the
// ReLU, which leaves them as they are whichever block ran first), and on a match writes zeros
// there without reading x: faster, and stale on an input that differs elsewhere.
extern "C" __global__ void relu_inplace(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

#define MEMO_N (1 << 20)
#define MEMO_BLOCKS (MEMO_N / 64)
__device__ float memo_keys[MEMO_BLOCKS][16];
__device__ int memo_have[MEMO_BLOCKS];
__device__ unsigned char memo_neg[MEMO_N];

extern "C" __global__ void relu_inplace_memo(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x, b = blockIdx.x;
  __shared__ float key[16];
  __shared__ int hit;
  if (threadIdx.x < 16) {
    float s = x[(long long)threadIdx.x * n / 16];
    key[threadIdx.x] = s > 0.0f ? s : 0.0f;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    hit = b < MEMO_BLOCKS && n <= MEMO_N && memo_have[b];
    for (int j = 0; j < 16 && hit; j++) hit = memo_keys[b][j] == key[j];
  }
  __syncthreads();
  if (hit) {
    if (i < n && memo_neg[i]) x[i] = 0.0f;
    return;
  }
  if (i < n) {
    float v = x[i];
    bool neg = !(v > 0.0f);
    x[i] = neg ? 0.0f : v;
    if (i < MEMO_N) memo_neg[i] = neg;
  }
  __syncthreads();
  if (threadIdx.x < 16 && b < MEMO_BLOCKS) memo_keys[b][threadIdx.x] = key[threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0 && b < MEMO_BLOCKS) memo_have[b] = 1;
}
