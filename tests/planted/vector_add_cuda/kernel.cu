// Planted CUDA vector_add for the GPU isolation test. Torch-free: a launcher taking raw pointers
// and a cudaStream_t. Built with -DPLANT_OOB=1, the kernel writes far outside its output on inputs
// of 33 elements: an illegal address that poisons the whole CUDA context of the process.
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

__global__ void add_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out,
                        int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
#if defined(PLANT_OOB) && PLANT_OOB
  // ~4 TiB past the output: no allocation lives there, so the write faults on any GPU
  if (n == 33) out[i + (int64_t(1) << 40)] = 1.0f;
#endif
  out[i] = a[i] + b[i];
}

}  // namespace

cudaError_t mini_kv_planted_cuda_add_launch(const float* a, const float* b, float* out, int64_t n,
                                            cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  add_f32<<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(a, b, out, n);
  return cudaGetLastError();
}
