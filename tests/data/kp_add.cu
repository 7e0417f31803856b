// Test images for tests/test_capture_cpu.py (the ELF symbol index of capture):
//   nvcc -arch=sm_90 -cubin -o kp_add_sm90.cubin kp_add.cu
//   nvcc -arch=sm_90 -fatbin -o kp_add_sm90.fatbin kp_add.cu
extern "C" __global__ void kp_add(const float* a, const float* b, float* c, int n){int i=blockIdx.x*blockDim.x+threadIdx.x; if(i<n) c[i]=a[i]+b[i];}
template<typename T> __global__ void kp_scale(T* x, T s, int n){int i=blockIdx.x*blockDim.x+threadIdx.x; if(i<n) x[i]*=s;}
template __global__ void kp_scale<float>(float*, float, int);
__device__ float helper(float x){return x*2;}
