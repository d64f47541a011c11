// vector_add v1_vectorized: 16-byte loads and stores (4 floats, 8 halves/bfloat16s, 2 doubles),
// each thread keeping kUnroll vectors of each input in flight, with streaming cache hints
// (inputs and output are touched once). One tile of kThreads * kUnroll vectors per block, as many
// blocks as tiles, so the hardware scheduler balances the tail; a grid-stride loop covers grids
// beyond the launch limit. The last n % N elements are done one by one by block 0.
// Pointers that are not 16-byte aligned (a contiguous view at an odd offset) take a scalar
// grid-stride kernel instead.
// Torch-free on purpose: launchers take raw pointers and a cudaStream_t, so this file
// compile-checks with plain `nvcc -c` on machines whose torch has no CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "dtype_codes.h"
#include "vec16.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte vectors per input per thread per tile: 4 x 2 x 16 B in flight

template <typename T>
__global__ void __launch_bounds__(kThreads)
vector_add_vec_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t nvec, int64_t n) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  const uint4* __restrict__ av = reinterpret_cast<const uint4*>(a);
  const uint4* __restrict__ bv = reinterpret_cast<const uint4*>(b);
  uint4* __restrict__ ov = reinterpret_cast<uint4*>(out);
  constexpr int64_t tile = (int64_t)kThreads * kUnroll;
  for (int64_t base = (int64_t)blockIdx.x * tile; base < nvec; base += (int64_t)gridDim.x * tile) {
    uint4 ra[kUnroll], rb[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {  // all loads first, then the arithmetic
      const int64_t i = base + k * kThreads + threadIdx.x;
      ra[k] = rb[k] = make_uint4(0u, 0u, 0u, 0u);
      if (i < nvec) {
        ra[k] = ld_stream(av + i);
        rb[k] = ld_stream(bv + i);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * kThreads + threadIdx.x;
      if (i < nvec) {
        A fa[N], fb[N];
        V::unpack(ra[k], fa);
        V::unpack(rb[k], fb);
#pragma unroll
        for (int e = 0; e < N; ++e) fa[e] = fa[e] + fb[e];
        st_stream(ov + i, V::pack(fa));
      }
    }
  }
  if (blockIdx.x == 0) {  // scalar tail: fewer than N elements
    const int64_t i = nvec * N + threadIdx.x;
    if (i < n) out[i] = V::from_acc(V::to_acc(a[i]) + V::to_acc(b[i]));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
vector_add_scalar_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n) {
  using V = Vec16<T>;
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = V::from_acc(V::to_acc(a[i]) + V::to_acc(b[i]));
  }
}

template <typename T>
cudaError_t launch(const void* a, const void* b, void* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const T* pa = static_cast<const T*>(a);
  const T* pb = static_cast<const T*>(b);
  T* po = static_cast<T*>(out);
  constexpr int N = Vec16<T>::N;
  static_assert(N < kThreads, "the scalar tail is done by one block");
  if (aligned16(a) && aligned16(b) && aligned16(out)) {
    const int64_t nvec = n / N;
    const int64_t tile = (int64_t)kThreads * kUnroll;
    int64_t blocks = (nvec + tile - 1) / tile;
    if (blocks < 1) blocks = 1;                     // the tail alone still needs block 0
    if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;  // the grid-stride loop covers the rest
    vector_add_vec_kernel<T><<<(unsigned)blocks, kThreads, 0, stream>>>(pa, pb, po, nvec, n);
  } else {
    int64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 65535LL * 32) blocks = 65535LL * 32;
    vector_add_scalar_kernel<T><<<(unsigned)blocks, kThreads, 0, stream>>>(pa, pb, po, n);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_vector_add_v1_vectorized_launch(const void* a, const void* b, void* out, int64_t n, int dtype,
                                                    cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(a, b, out, n, stream);
    case MINI_KV_F64: return launch<double>(a, b, out, n, stream);
    case MINI_KV_F16: return launch<__half>(a, b, out, n, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(a, b, out, n, stream);
    default: return cudaErrorInvalidValue;
  }
}
