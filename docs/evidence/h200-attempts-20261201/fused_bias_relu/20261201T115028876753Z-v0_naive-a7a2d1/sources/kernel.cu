// fused_bias_relu v0_naive: one thread per element, grid-stride loop, math in FP32 (FP64 for double).
// Torch-free on purpose: launchers take raw pointers and a cudaStream_t, so this file
// compile-checks with plain `nvcc -c` on machines whose torch has no CUDA. Half/bfloat16 go
// through the conversion intrinsics, so torch's -D__CUDA_NO_HALF_OPERATORS__ etc. do not matter.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dtype_codes.h"

namespace {

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void fused_bias_relu_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out,
                                       int64_t n, int64_t cols) {
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const auto v = to_acc(x[i]) + to_acc(bias[i % cols]);
    store(out + i, v < 0 ? decltype(v)(0) : v);  // NaN stays NaN, as torch.relu
  }
}

template <typename T>
cudaError_t launch(const void* x, const void* bias, void* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // the grid-stride loop covers the rest
  fused_bias_relu_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<T*>(out), n, cols);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_fused_bias_relu_v0_naive_launch(const void* x, const void* bias, void* out, int64_t rows,
                                                    int64_t cols, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(x, bias, out, rows, cols, stream);
    case MINI_KV_F64: return launch<double>(x, bias, out, rows, cols, stream);
    case MINI_KV_F16: return launch<__half>(x, bias, out, rows, cols, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(x, bias, out, rows, cols, stream);
    default: return cudaErrorInvalidValue;
  }
}
