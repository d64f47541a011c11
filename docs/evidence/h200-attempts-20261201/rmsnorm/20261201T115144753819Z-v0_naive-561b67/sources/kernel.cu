// rmsnorm v0_naive: one thread per row, serial sum of squares in FP32 (FP64 for double).
// Torch-free on purpose: launchers take raw pointers and a cudaStream_t, so this file
// compile-checks with plain `nvcc -c` on machines whose torch has no CUDA. Half/bfloat16 go
// through the conversion intrinsics, so torch's -D__CUDA_NO_HALF_OPERATORS__ etc. do not matter.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dtype_codes.h"

namespace {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

__device__ __forceinline__ float inv_sqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return rsqrt(v); }

template <typename T>
__global__ void rmsnorm_row_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                                   int64_t rows, int64_t hidden, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; row < rows; row += stride) {
    const T* xr = x + row * hidden;
    T* orow = out + row * hidden;
    A sum = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const A v = to_acc(xr[j]);
      sum += v * v;
    }
    const A inv = inv_sqrt(sum / static_cast<A>(hidden) + eps);
    for (int64_t j = 0; j < hidden; ++j) store(orow + j, to_acc(xr[j]) * inv * to_acc(weight[j]));
  }
}

template <typename T>
cudaError_t launch(const void* x, const void* weight, void* out, int64_t rows, int64_t hidden, double eps,
                   cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  const int threads = 128;
  int64_t blocks = (rows + threads - 1) / threads;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // the grid-stride loop covers the rest
  rmsnorm_row_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(out), rows, hidden,
      static_cast<typename Acc<T>::type>(eps));
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_rmsnorm_v0_naive_launch(const void* x, const void* weight, void* out, int64_t rows,
                                            int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F64: return launch<double>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F16: return launch<__half>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(x, weight, out, rows, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
