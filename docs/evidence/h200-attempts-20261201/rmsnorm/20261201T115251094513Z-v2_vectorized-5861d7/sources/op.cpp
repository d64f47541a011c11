// rmsnorm v2_vectorized: schema, CPU and Meta kernels (no backward: no autograd kernel).
// The CPU kernel is a per-row loop (rows split across the intra-op threads) with FP32 accumulation;
// the CUDA kernel (16-byte vectors, row kept in registers, kernel.cu) is registered by op_cuda.cpp.
// out = x * rsqrt(mean(x^2, -1) + eps) * weight, x [..., hidden], weight [hidden]; the CPU kernel
// accumulates in float (double for float64). The CUDA kernel is registered by op_cuda.cpp.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>

#include "checks.h"

#define NS mini_kv_rmsnorm_v2_vectorized

namespace {

at::Tensor rmsnorm_cpu(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_inputs(x_in, weight_in, eps);
  TORCH_CHECK(x_in.device().is_cpu(), "rmsnorm (CPU kernel): expected CPU tensors");
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;
  const int64_t rows = num_rows(x), hidden = x.size(-1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rmsnorm_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* px = x.data_ptr<scalar_t>();
    const scalar_t* pw = weight.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    const acc_t eps_a = static_cast<acc_t>(eps);
    at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / hidden), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* __restrict__ xr = px + r * hidden;
        scalar_t* __restrict__ orow = po + r * hidden;
        acc_t sum = 0;
        for (int64_t j = 0; j < hidden; ++j) {
          const acc_t v = static_cast<acc_t>(xr[j]);
          sum += v * v;
        }
        const acc_t inv = acc_t(1) / std::sqrt(sum / static_cast<acc_t>(hidden) + eps_a);
        for (int64_t j = 0; j < hidden; ++j) {
          orow[j] = static_cast<scalar_t>(static_cast<acc_t>(xr[j]) * inv * static_cast<acc_t>(pw[j]));
        }
      }
    });
  });
  return out;
}

at::Tensor rmsnorm_meta(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_inputs(x, weight, eps);
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

TORCH_LIBRARY(NS, m) { m.def("rmsnorm(Tensor x, Tensor weight, float eps) -> Tensor"); }
TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("rmsnorm", &rmsnorm_cpu); }
TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("rmsnorm", &rmsnorm_meta); }
