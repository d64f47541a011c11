// rmsnorm v2_vectorized: out = x * rsqrt(mean(x^2) + eps) * weight over the last dimension, with
// 16-byte loads and stores and FP32 accumulation (FP64 for double).
//
// Three paths, chosen per call by the launcher (N = elements per 16 bytes):
//  - registers: hidden % N == 0, x, weight and out 16-byte aligned, and the row fits in at most
//    kMaxVpt 16-byte vectors per thread of a block of at most 1024 threads (hidden <= 32768 for
//    half/bfloat16, 16384 for float). One block per row: for rows of up to 8192 half/bfloat16 one
//    block is launched per row, longer rows use a persistent grid (grid = resident blocks, each
//    looping over rows); the row is read from memory exactly once into registers
//    (streaming hint), squared and summed in FP32, reduced over the block with warp shuffles and one
//    barrier, then scaled and written from the same registers. For float/double each thread loads
//    its slice of the weight once into registers and reuses it for every row it handles.
//  - vector: the same alignment, longer rows: two passes over the row with 16-byte loads (the
//    second pass finds the row in L2), weight read through the read-only path.
//  - scalar: anything else (hidden % N != 0 or a misaligned pointer): two passes, one element per
//    load, as v1_block_reduce.
// Torch-free on purpose: launchers take raw pointers and a cudaStream_t, so this file
// compile-checks with plain `nvcc -c` on machines whose torch has no CUDA.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>

#include "dtype_codes.h"
#include "vec16.cuh"

namespace {

constexpr int kMaxVpt = 4;         // 16-byte vectors of a row per thread on the register path
constexpr int kMaxThreads = 1024;  // so rows of up to kMaxVpt * 1024 vectors stay in registers
constexpr int kVecThreads = 512;   // vector path block size
constexpr int kMaxDevices = 64;
// Register path: keep the thread's slice of the weight in registers across rows. Only for
// float/double: for half/bfloat16 the compiler keeps the row widened to FP32 between the sum and the
// scaling (32 registers for 4 vectors), and the weight on top spills under the 64-register cap
// that 4 blocks of 256 threads per SM allow; there the weight is re-read per row from L1.
template <typename T> constexpr bool kKeepWeight = sizeof(T) >= 4;

__device__ __forceinline__ float inv_sqrt(float v) { return rsqrtf(v); }
__device__ __forceinline__ double inv_sqrt(double v) { return rsqrt(v); }

template <typename A>
__device__ __forceinline__ A warp_allsum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;  // the butterfly leaves the same total, bit for bit, in every lane
}

// Sum of `v` over the block (blockDim.x a multiple of 32); every thread gets the total. One barrier:
// the two halves of `partials` alternate between calls (`parity`), so a fast warp writing the next
// row's partials cannot overwrite ones a slow warp is still reading (it would first have to pass
// the next call's barrier, which the slow warp only reaches after its read).
template <typename A>
__device__ __forceinline__ A block_allsum(A v, A (*partials)[32], int parity) {
  v = warp_allsum(v);
  const int nwarps = blockDim.x >> 5;
  if (nwarps == 1) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partials[parity][warp] = v;
  __syncthreads();
  return warp_allsum(lane < nwarps ? partials[parity][lane] : A(0));
}

template <typename T, int VPT, int MAXT, int MINB, bool KEEP_W>
__global__ void __launch_bounds__(MAXT, MINB)
rmsnorm_reg_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, int64_t rows,
                   int hvec, typename Vec16<T>::acc eps) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  __shared__ A partials[2][32];
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint4* __restrict__ wv = reinterpret_cast<const uint4*>(weight);
  uint4 wreg[KEEP_W ? VPT : 1];
#pragma unroll
  for (int k = 0; k < (KEEP_W ? VPT : 0); ++k) {
    const int j = tid + k * nt;
    wreg[k] = make_uint4(0u, 0u, 0u, 0u);
    if (j < hvec) wreg[k] = ld_keep(wv + j);
  }
  const A hidden = static_cast<A>((int64_t)hvec * N);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform over the block
    const uint4* __restrict__ xr = reinterpret_cast<const uint4*>(x) + row * hvec;
    uint4* __restrict__ orow = reinterpret_cast<uint4*>(out) + row * hvec;
    uint4 xreg[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k) {  // the whole slice in flight before the first use
      const int j = tid + k * nt;
      xreg[k] = make_uint4(0u, 0u, 0u, 0u);  // zeros add nothing to the sum
      if (j < hvec) xreg[k] = ld_stream(xr + j);
    }
    A sum = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      A f[N];
      V::unpack(xreg[k], f);
#pragma unroll
      for (int e = 0; e < N; ++e) sum += f[e] * f[e];
    }
    sum = block_allsum(sum, partials, parity);
    parity ^= 1;
    uint4 wrow[KEEP_W ? 1 : VPT];  // per-row weight slice when it is not kept across rows
#pragma unroll
    for (int k = 0; k < (KEEP_W ? 0 : VPT); ++k) {  // all in flight before the first store
      const int j = tid + k * nt;
      wrow[k] = make_uint4(0u, 0u, 0u, 0u);
      if (j < hvec) wrow[k] = ld_keep(wv + j);
    }
    const A inv = inv_sqrt(sum / hidden + eps);
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = tid + k * nt;
      if (j < hvec) {
        A f[N], g[N];
        V::unpack(xreg[k], f);
        V::unpack(KEEP_W ? wreg[k] : wrow[k], g);
#pragma unroll
        for (int e = 0; e < N; ++e) f[e] = f[e] * inv * g[e];
        st_stream(orow + j, V::pack(f));
      }
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kVecThreads)
rmsnorm_vec_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, int64_t rows,
                   int64_t hvec, typename Vec16<T>::acc eps) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  __shared__ A partials[2][32];
  const A hidden = static_cast<A>(hvec * N);
  const uint4* __restrict__ wv = reinterpret_cast<const uint4*>(weight);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const uint4* __restrict__ xr = reinterpret_cast<const uint4*>(x) + row * hvec;
    uint4* __restrict__ orow = reinterpret_cast<uint4*>(out) + row * hvec;
    A sum = 0;
    for (int64_t j = threadIdx.x; j < hvec; j += blockDim.x) {
      A f[N];
      V::unpack(xr[j], f);  // default caching: the second pass re-reads the row
#pragma unroll
      for (int e = 0; e < N; ++e) sum += f[e] * f[e];
    }
    sum = block_allsum(sum, partials, parity);
    parity ^= 1;
    const A inv = inv_sqrt(sum / hidden + eps);
    for (int64_t j = threadIdx.x; j < hvec; j += blockDim.x) {
      A f[N], g[N];
      V::unpack(ld_stream(xr + j), f);
      V::unpack(ld_keep(wv + j), g);
#pragma unroll
      for (int e = 0; e < N; ++e) f[e] = f[e] * inv * g[e];
      st_stream(orow + j, V::pack(f));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kMaxThreads)
rmsnorm_scalar_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, int64_t rows,
                      int64_t hidden, typename Vec16<T>::acc eps) {
  using V = Vec16<T>;
  using A = typename V::acc;
  __shared__ A partials[2][32];
  int parity = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * hidden;
    T* orow = out + row * hidden;
    A sum = 0;
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      const A v = V::to_acc(xr[j]);
      sum += v * v;
    }
    sum = block_allsum(sum, partials, parity);
    parity ^= 1;
    const A inv = inv_sqrt(sum / static_cast<A>(hidden) + eps);
    for (int64_t j = threadIdx.x; j < hidden; j += blockDim.x) {
      orow[j] = V::from_acc(V::to_acc(xr[j]) * inv * V::to_acc(weight[j]));
    }
  }
}

// Blocks of `kernel` with `threads` threads that fit on the device at once (0 if unknown),
// cached per device and block size.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int threads) {
  static std::atomic<int> cache[kMaxDevices][kMaxThreads / 32];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices || threads < 32 || threads > kMaxThreads) {
    (void)cudaGetLastError();
    return 0;
  }
  std::atomic<int>& slot = cache[dev][threads / 32 - 1];
  int blocks = slot.load(std::memory_order_relaxed);
  if (blocks == 0) {
    int sms = 0, per_sm = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    blocks = sms * (per_sm > 0 ? per_sm : 1);
    slot.store(blocks, std::memory_order_relaxed);
  }
  return blocks;
}

// Persistent grid: at most `resident` blocks, each taking the same number of rows (16384 rows on
// 528 slots: 512 blocks of 32 rows, rather than 528 blocks of which 16 do a 32nd row alone at the end).
inline unsigned grid_for(int64_t rows, int64_t resident) {
  int64_t blocks = rows;
  if (resident > 0 && rows > resident) {
    const int64_t per_block = (rows + resident - 1) / resident;
    blocks = (rows + per_block - 1) / per_block;
  }
  if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
  return (unsigned)blocks;
}

// `persistent`: grid = resident blocks, each looping over rows; otherwise one block per row (up to
// 2^31 - 1 blocks; the row loop covers the rest). At [16384, 8192] FP16 on an H200 one block per row
// ran at 131.6 us against 146.4 us persistent (scripts/rmsnorm_variants.cu): a block that finishes
// its row is replaced at once by one that starts loading the next, so the loads of some blocks are
// always in flight while others reduce or store; a persistent block stalls its loads at each of its
// rows' barriers and stores instead.
template <typename T, int VPT, int MAXT, int MINB>
cudaError_t launch_reg(const T* x, const T* w, T* out, int64_t rows, int hvec, typename Vec16<T>::acc eps,
                       cudaStream_t stream, bool persistent = true) {
  const int per_thread = (hvec + VPT - 1) / VPT;
  const int threads = ((per_thread + 31) / 32) * 32;  // whole warps: the shuffles use a full mask
  auto kernel = rmsnorm_reg_kernel<T, VPT, MAXT, MINB, kKeepWeight<T>>;
  const unsigned grid = persistent ? grid_for(rows, resident_blocks(kernel, threads))
                                   : (unsigned)(rows < 0x7fffffffLL ? rows : 0x7fffffffLL);
  kernel<<<grid, threads, 0, stream>>>(x, w, out, rows, hvec, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch(const void* x_, const void* w_, void* out_, int64_t rows, int64_t hidden, double eps_d,
                   cudaStream_t stream) {
  if (rows <= 0 || hidden <= 0) return cudaSuccess;
  using A = typename Vec16<T>::acc;
  constexpr int N = Vec16<T>::N;
  const T* x = static_cast<const T*>(x_);
  const T* w = static_cast<const T*>(w_);
  T* out = static_cast<T*>(out_);
  const A eps = static_cast<A>(eps_d);
  if (hidden % N == 0 && aligned16(x) && aligned16(w) && aligned16(out)) {
    const int64_t hvec = hidden / N;
    if (hvec < 64) return launch_reg<T, 1, 256, 4>(x, w, out, rows, (int)hvec, eps, stream);
    if (hvec < 128) return launch_reg<T, 2, 256, 4>(x, w, out, rows, (int)hvec, eps, stream);
    // rows of 1024 to 8192 half/bfloat16 (512 to 4096 float): one block per row (measured faster);
    // the other paths keep the persistent grid (not measured against it)
    if (hvec <= 256 * kMaxVpt)
      return launch_reg<T, kMaxVpt, 256, 4>(x, w, out, rows, (int)hvec, eps, stream, /*persistent=*/false);
    if (hvec <= 512 * kMaxVpt) return launch_reg<T, kMaxVpt, 512, 2>(x, w, out, rows, (int)hvec, eps, stream);
    if (hvec <= 1024 * kMaxVpt) return launch_reg<T, kMaxVpt, 1024, 1>(x, w, out, rows, (int)hvec, eps, stream);
    auto kernel = rmsnorm_vec_kernel<T>;
    kernel<<<grid_for(rows, resident_blocks(kernel, kVecThreads)), kVecThreads, 0, stream>>>(x, w, out, rows, hvec,
                                                                                             eps);
    return cudaGetLastError();
  }
  // whole warps only; small rows get a small block
  const int threads = hidden >= 512 ? 512 : (int)((hidden + 31) / 32) * 32;
  int64_t blocks = rows;
  if (blocks > 65535LL * 32) blocks = 65535LL * 32;  // the row loop covers the rest
  rmsnorm_scalar_kernel<T><<<(unsigned)blocks, threads, 0, stream>>>(x, w, out, rows, hidden, eps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mini_kv_rmsnorm_v2_vectorized_launch(const void* x, const void* weight, void* out, int64_t rows,
                                                 int64_t hidden, double eps, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case MINI_KV_F32: return launch<float>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F64: return launch<double>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_F16: return launch<__half>(x, weight, out, rows, hidden, eps, stream);
    case MINI_KV_BF16: return launch<__nv_bfloat16>(x, weight, out, rows, hidden, eps, stream);
    default: return cudaErrorInvalidValue;
  }
}
