// rmsnorm v1_block_reduce: one block per row; each thread sums the squares of a strided slice of the
// row in FP32 (FP64 for double), then a warp-shuffle reduction and a shared-memory pass over the
// warps' partial sums give the row total; every thread then writes its slice.
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

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024). Every thread gets the total.
// `partials` holds one value per warp; the trailing barrier lets the caller reuse it for the next row.
template <typename A>
__device__ __forceinline__ A block_sum(A v, A* partials) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) partials[warp] = v;
  __syncthreads();
  if (warp == 0) {
    A w = lane < nwarps ? partials[lane] : A(0);
    w = warp_sum(w);
    if (lane == 0) partials[0] = w;
  }
  __syncthreads();
  const A total = partials[0];
  __syncthreads();
  return total;
}

template <typename T>
__global__ void rmsnorm_block_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out,
                                     int64_t rows, int64_t hidden, typename Acc<T>::type eps) {
  using A = typename Acc<T>::type;
  __shared__ A partials[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform over the block
    const T* xr = x + row * hidden;
    T* orow = out + row * hidden;
    A sum = 0;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const A v = to_acc(xr[j]);
      sum += v * v;
    }
    sum = block_sum(sum, partials);
    const A inv = inv_sqrt(sum / static_cast<A>(hidden) + eps);
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      store(orow + j, to_acc(xr[j]) * inv * to_acc(weight[j]));
    }
  }
}

template <typename T>
cudaError_t launch(const void* x, const void* weight, void* out, int64_t rows, int64_t hidden, double eps,
                   cudaStream_t stream) {
  if (rows == 0 || hidden == 0) return cudaSuccess;
  // whole warps only (the shuffle mask is full); small rows get a small block
  const int threads = hidden >= 512 ? 512 : (int)((hidden + 31) / 32) * 32;
  int64_t blocks = rows;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // the row loop covers the rest
  rmsnorm_block_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<T*>(out), rows, hidden,
      static_cast<typename Acc<T>::type>(eps));
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_rmsnorm_v1_block_reduce_launch(const void* x, const void* weight, void* out, int64_t rows,
                                                   int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F64: return launch<double>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F16: return launch<__half>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(x, weight, out, rows, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
