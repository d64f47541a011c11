// fused_bias_relu v1_vectorized: out = relu(x + bias), x [rows, cols], bias [cols]; 16-byte loads and
// stores, math in FP32 (FP64 for double), streaming cache hints on x and out (touched once).
//
// Three paths, chosen per call by the launcher:
//  - rows: cols % N == 0 (N = elements per 16 bytes) and x, bias, out 16-byte aligned. A 2-D block:
//    threadIdx.x walks the 16-byte column vectors of a row, threadIdx.y the rows. Each thread loads
//    its bias vector once into registers and reuses it for every row it handles, kRows rows per
//    loop trip with all kRows loads issued before the first use. No division in the loop.
//  - flat: x and out 16-byte aligned but cols % N != 0 or bias misaligned: x is read as a flat array
//    of 16-byte vectors (a vector may straddle two rows); the bias index is one modulo per vector
//    then a wrapping increment per element, bias read element by element (it stays in L1/L2).
//    The last n % N elements are done one by one by block 0.
//  - scalar: x or out not 16-byte aligned: one element per thread, grid-stride.
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
constexpr int kRows = 4;    // rows path: 16-byte loads in flight per thread
constexpr int kUnroll = 4;  // flat path: 16-byte loads in flight per thread

template <typename A>
__device__ __forceinline__ A relu(A v) { return v < A(0) ? A(0) : v; }  // NaN stays NaN, as torch.relu

template <typename T>
__global__ void __launch_bounds__(kThreads)
bias_relu_rows_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, int64_t rows,
                      int64_t cvec) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  const int64_t cv = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (cv >= cvec) return;  // no barrier below
  const uint4* __restrict__ xv = reinterpret_cast<const uint4*>(x) + cv;
  uint4* __restrict__ ov = reinterpret_cast<uint4*>(out) + cv;
  A bf[N];
  V::unpack(ld_keep(reinterpret_cast<const uint4*>(bias) + cv), bf);
  const int64_t rstep = (int64_t)blockDim.y * kRows;
  for (int64_t r0 = (int64_t)blockIdx.y * rstep + threadIdx.y; r0 < rows; r0 += (int64_t)gridDim.y * rstep) {
    uint4 rx[kRows];
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = r0 + (int64_t)k * blockDim.y;
      rx[k] = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows) rx[k] = ld_stream(xv + r * cvec);
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const int64_t r = r0 + (int64_t)k * blockDim.y;
      if (r < rows) {
        A f[N];
        V::unpack(rx[k], f);
#pragma unroll
        for (int e = 0; e < N; ++e) f[e] = relu(f[e] + bf[e]);
        st_stream(ov + r * cvec, V::pack(f));
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
bias_relu_flat_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, int64_t n,
                      int64_t cols) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  const int64_t nvec = n / N;
  const uint4* __restrict__ xv = reinterpret_cast<const uint4*>(x);
  uint4* __restrict__ ov = reinterpret_cast<uint4*>(out);
  constexpr int64_t tile = (int64_t)kThreads * kUnroll;
  for (int64_t base = (int64_t)blockIdx.x * tile; base < nvec; base += (int64_t)gridDim.x * tile) {
    uint4 rx[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * kThreads + threadIdx.x;
      rx[k] = make_uint4(0u, 0u, 0u, 0u);
      if (i < nvec) rx[k] = ld_stream(xv + i);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const int64_t i = base + k * kThreads + threadIdx.x;
      if (i < nvec) {
        A f[N];
        V::unpack(rx[k], f);
        int64_t c = (i * N) % cols;
#pragma unroll
        for (int e = 0; e < N; ++e) {
          f[e] = relu(f[e] + V::to_acc(bias[c]));
          if (++c == cols) c = 0;
        }
        st_stream(ov + i, V::pack(f));
      }
    }
  }
  if (blockIdx.x == 0) {  // scalar tail: fewer than N elements
    const int64_t i = nvec * N + threadIdx.x;
    if (i < n) out[i] = V::from_acc(relu(V::to_acc(x[i]) + V::to_acc(bias[i % cols])));
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
bias_relu_scalar_kernel(const T* __restrict__ x, const T* __restrict__ bias, T* __restrict__ out, int64_t n,
                        int64_t cols) {
  using V = Vec16<T>;
  const int64_t stride = (int64_t)blockDim.x * gridDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = V::from_acc(relu(V::to_acc(x[i]) + V::to_acc(bias[i % cols])));
  }
}

template <typename T>
cudaError_t launch(const void* x, const void* bias, void* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return cudaSuccess;
  const T* px = static_cast<const T*>(x);
  const T* pb = static_cast<const T*>(bias);
  T* po = static_cast<T*>(out);
  constexpr int N = Vec16<T>::N;
  static_assert(N < kThreads, "the scalar tail is done by one block");
  if (aligned16(x) && aligned16(out)) {
    if (cols % N == 0 && aligned16(bias)) {
      const int64_t cvec = cols / N;
      const int bx = cvec >= kThreads ? kThreads : (int)((cvec + 31) / 32) * 32;  // whole warps along a row
      const int by = kThreads / bx;                                             // the rest of the block: rows
      int64_t gx = (cvec + bx - 1) / bx;
      int64_t gy = (rows + (int64_t)by * kRows - 1) / ((int64_t)by * kRows);
      if (gx > 0x7fffffffLL) return cudaErrorInvalidValue;  // > 2^31 column vectors: not a real shape
      if (gy > 65535) gy = 65535;                           // the row loop covers the rest
      bias_relu_rows_kernel<T><<<dim3((unsigned)gx, (unsigned)gy), dim3(bx, by), 0, stream>>>(px, pb, po, rows, cvec);
    } else {
      const int64_t tile = (int64_t)kThreads * kUnroll;
      int64_t blocks = (n / N + tile - 1) / tile;
      if (blocks < 1) blocks = 1;                        // the tail alone still needs block 0
      if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;  // the grid-stride loop covers the rest
      bias_relu_flat_kernel<T><<<(unsigned)blocks, kThreads, 0, stream>>>(px, pb, po, n, cols);
    }
  } else {
    int64_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > 65535LL * 32) blocks = 65535LL * 32;
    bias_relu_scalar_kernel<T><<<(unsigned)blocks, kThreads, 0, stream>>>(px, pb, po, n, cols);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_fused_bias_relu_v1_vectorized_launch(const void* x, const void* bias, void* out, int64_t rows,
                                                         int64_t cols, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(x, bias, out, rows, cols, stream);
    case MINI_KV_F64: return launch<double>(x, bias, out, rows, cols, stream);
    case MINI_KV_F16: return launch<__half>(x, bias, out, rows, cols, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(x, bias, out, rows, cols, stream);
    default: return cudaErrorInvalidValue;
  }
}
