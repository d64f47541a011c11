// fused_bias_relu v1_vectorized: schema, CPU and Meta kernels, and the autograd kernel.
// out = relu(x + bias), x [rows, cols], bias [cols] broadcast over the rows.
// The CUDA kernel (16-byte vectors, kernel.cu) is registered by op_cuda.cpp, built only where
// torch has CUDA. The CPU kernel walks contiguous rows, split across the intra-op threads, with the
// arithmetic in opmath (float for half/bfloat16) so the inner loop vectorises.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>

#include "checks.h"

#define NS mini_kv_fused_bias_relu_v1_vectorized

namespace {

at::Tensor fused_bias_relu_cpu(const at::Tensor& x_in, const at::Tensor& bias_in) {
  check_inputs(x_in, bias_in);
  TORCH_CHECK(x_in.device().is_cpu(), "fused_bias_relu (CPU kernel): expected CPU tensors");
  at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t rows = x.size(0), cols = x.size(1);
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "fused_bias_relu_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* __restrict__ px = x.data_ptr<scalar_t>();
    const scalar_t* __restrict__ pb = bias.data_ptr<scalar_t>();
    scalar_t* __restrict__ po = out.data_ptr<scalar_t>();
    const int64_t grain = std::max<int64_t>(1, 32768 / cols);  // rows per intra-op task
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* __restrict__ xr = px + r * cols;
        scalar_t* __restrict__ orow = po + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const acc_t v = static_cast<acc_t>(xr[c]) + static_cast<acc_t>(pb[c]);
          orow[c] = static_cast<scalar_t>(v < acc_t(0) ? acc_t(0) : v);  // NaN stays NaN
        }
      }
    });
  });
  return out;
}

at::Tensor fused_bias_relu_meta(const at::Tensor& x, const at::Tensor& bias) {
  check_inputs(x, bias);
  return at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
}

class FusedBiasReluFn : public torch::autograd::Function<FusedBiasReluFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& bias) {
    at::Tensor out;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      static auto op = c10::Dispatcher::singleton()
                           .findSchemaOrThrow("mini_kv_fused_bias_relu_v1_vectorized::fused_bias_relu", "")
                           .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
      out = op.call(x, bias);
    }
    ctx->save_for_backward({out});
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor out = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grads[0];
    // d relu(x + b) / d x = 1 where the output is positive, 0 elsewhere (also at exactly 0)
    at::Tensor grad_x = grad * out.gt(0).to(grad.scalar_type());
    at::Tensor grad_bias = grad_x.sum(0);
    return {grad_x, grad_bias};
  }
};

at::Tensor fused_bias_relu_autograd(const at::Tensor& x, const at::Tensor& bias) {
  return FusedBiasReluFn::apply(x, bias);
}

}  // namespace

TORCH_LIBRARY(NS, m) { m.def("fused_bias_relu(Tensor x, Tensor bias) -> Tensor"); }
TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("fused_bias_relu", &fused_bias_relu_cpu); }
TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("fused_bias_relu", &fused_bias_relu_meta); }
TORCH_LIBRARY_IMPL(NS, Autograd, m) { m.impl("fused_bias_relu", &fused_bias_relu_autograd); }
