// RMSNorm written with CUTLASS building blocks, destination-passing style:
// run(hidden_states, weight, output).
//
// cutlass::AlignedArray<bfloat16_t, 8> gives 16-byte vector loads and stores,
// cutlass::NumericArrayConverter converts whole vectors between bf16 and fp32
// (round-to-nearest on the way back), and the row reduction is a warp-shuffle
// tree in fp32. One block per row, two passes over the row (the second hits
// L1/L2). Rows whose length or alignment rule out 16-byte vectors take the
// scalar instantiation of the same kernel. Header-only: needs CUTLASS's
// include/ directory on the include path, no library.

#include <torch/extension.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cutlass/array.h>
#include <cutlass/numeric_conversion.h>
#include <cutlass/numeric_types.h>

#include <climits>
#include <cstdint>

namespace {

using Element = cutlass::bfloat16_t;
constexpr int kVec = 8;  // 8 x bf16 = 16 bytes
using Vec = cutlass::AlignedArray<Element, kVec>;  // 16-byte aligned: vector loads/stores
using Elements = cutlass::Array<Element, kVec>;
using Floats = cutlass::Array<float, kVec>;
using ToFloat = cutlass::NumericArrayConverter<float, Element, kVec>;
using ToElement = cutlass::NumericArrayConverter<Element, float, kVec, cutlass::FloatRoundStyle::round_to_nearest>;

constexpr float kEps = 1e-5f;
constexpr int kThreads = 256;

__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < (kThreads / 32) ? partial[threadIdx.x & 31] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <bool kVectorized>
__global__ void __launch_bounds__(kThreads)
rmsnorm_kernel(const Element* __restrict__ x, int64_t x_row_stride, const Element* __restrict__ w,
               Element* __restrict__ y, int64_t y_row_stride, int n, float eps) {
  const Element* xr = x + static_cast<int64_t>(blockIdx.x) * x_row_stride;
  Element* yr = y + static_cast<int64_t>(blockIdx.x) * y_row_stride;

  float ss = 0.0f;
  if constexpr (kVectorized) {
    const Vec* xv = reinterpret_cast<const Vec*>(xr);
    const int num_vec = n / kVec;
    for (int v = threadIdx.x; v < num_vec; v += kThreads) {
      const Floats f = ToFloat()(xv[v]);
#pragma unroll
      for (int i = 0; i < kVec; ++i) ss = fmaf(f[i], f[i], ss);
    }
  } else {
    for (int j = threadIdx.x; j < n; j += kThreads) {
      const float f = static_cast<float>(xr[j]);
      ss = fmaf(f, f, ss);
    }
  }
  const float rstd = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);

  if constexpr (kVectorized) {
    const Vec* xv = reinterpret_cast<const Vec*>(xr);
    const Vec* wv = reinterpret_cast<const Vec*>(w);
    Vec* yv = reinterpret_cast<Vec*>(yr);
    const int num_vec = n / kVec;
    for (int v = threadIdx.x; v < num_vec; v += kThreads) {
      const Floats xf = ToFloat()(xv[v]);
      const Floats wf = ToFloat()(wv[v]);
      Floats out;
#pragma unroll
      for (int i = 0; i < kVec; ++i) out[i] = (xf[i] * rstd) * wf[i];
      Vec packed;
      static_cast<Elements&>(packed) = ToElement()(out);
      yv[v] = packed;
    }
  } else {
    for (int j = threadIdx.x; j < n; j += kThreads) {
      yr[j] = Element((static_cast<float>(xr[j]) * rstd) * static_cast<float>(w[j]));
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void run(torch::Tensor hidden_states, torch::Tensor weight, torch::Tensor output) {
  TORCH_CHECK(hidden_states.is_cuda() && weight.device() == hidden_states.device() &&
                  output.device() == hidden_states.device(),
              "hidden_states, weight and output must be CUDA tensors on one device");
  TORCH_CHECK(hidden_states.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 &&
                  output.scalar_type() == at::kBFloat16,
              "expects bfloat16 tensors");
  TORCH_CHECK(hidden_states.dim() == 2 && output.sizes() == hidden_states.sizes(),
              "hidden_states and output must be [batch_size, hidden_size]");
  const int64_t rows = hidden_states.size(0);
  const int64_t n = hidden_states.size(1);
  TORCH_CHECK(weight.numel() == n, "weight must have hidden_size elements");
  TORCH_CHECK(rows <= INT_MAX && n <= INT_MAX, "shape too large");
  if (rows == 0 || n == 0) return;

  const c10::cuda::CUDAGuard guard(hidden_states.device());
  const at::Tensor x = hidden_states.stride(1) == 1 ? hidden_states : hidden_states.contiguous();
  const at::Tensor w = weight.contiguous();
  const bool direct = output.stride(1) == 1;
  at::Tensor y = direct ? output : at::empty({rows, n}, output.options());

  const auto* xp = reinterpret_cast<const Element*>(x.data_ptr());
  const auto* wp = reinterpret_cast<const Element*>(w.data_ptr());
  auto* yp = reinterpret_cast<Element*>(y.data_ptr());
  // Every row start must be 16-byte aligned: aligned base and row strides
  // that are multiples of 8 elements.
  const bool vectorized = n % kVec == 0 && x.stride(0) % kVec == 0 && y.stride(0) % kVec == 0 &&
                          aligned16(xp) && aligned16(wp) && aligned16(yp);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto grid = static_cast<unsigned>(rows);
  if (vectorized) {
    rmsnorm_kernel<true><<<grid, kThreads, 0, stream>>>(xp, x.stride(0), wp, yp, y.stride(0), static_cast<int>(n), kEps);
  } else {
    rmsnorm_kernel<false><<<grid, kThreads, 0, stream>>>(xp, x.stride(0), wp, yp, y.stride(0), static_cast<int>(n), kEps);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!direct) output.copy_(y);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "RMSNorm with CUTLASS vector types (destination-passing style)",
        pybind11::arg("hidden_states"), pybind11::arg("weight"), pybind11::arg("output"));
}
