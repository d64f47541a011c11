// vector_add v0_naive: one thread per element, grid-stride loop.
// Torch-free on purpose: launchers take raw pointers and a cudaStream_t, so this file
// compile-checks with plain `nvcc -c` on machines whose torch has no CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dtype_codes.h"

namespace {

// torch builds .cu files with __CUDA_NO_HALF_OPERATORS__ and friends, so half/bf16 arithmetic
// goes through explicit float conversions.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T>
__device__ __forceinline__ T add(T a, T b) { return from_float<T>(to_float(a) + to_float(b)); }
template <>
__device__ __forceinline__ double add<double>(double a, double b) { return a + b; }

template <typename T>
__global__ void vector_add_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                                  int64_t n) {
  int64_t stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = add(a[i], b[i]);
  }
}

template <typename T>
cudaError_t launch(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // the grid-stride loop covers the rest
  vector_add_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_vector_add_v0_naive_launch(const void* a, const void* b, void* out, int64_t n,
                                               int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(a, b, out, n, stream);
    case MINI_KV_F64: return launch<double>(a, b, out, n, stream);
    case MINI_KV_F16: return launch<__half>(a, b, out, n, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(a, b, out, n, stream);
    default: return cudaErrorInvalidValue;
  }
}
