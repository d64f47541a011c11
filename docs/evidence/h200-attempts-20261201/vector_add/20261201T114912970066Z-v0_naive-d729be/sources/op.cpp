// vector_add v0_naive: schema, CPU and Meta kernels, and the autograd kernel.
// The CUDA kernel is registered by op_cuda.cpp, built only where torch has CUDA.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "checks.h"

#define NS mini_kv_vector_add_v0_naive

namespace {

at::Tensor vector_add_cpu(const at::Tensor& a_in, const at::Tensor& b_in) {
  check_vector_add_inputs(a_in, b_in);
  TORCH_CHECK(a_in.device().is_cpu(), "vector_add (CPU kernel): expected CPU tensors");
  at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
  const int64_t n = a.numel();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.scalar_type(), "vector_add_cpu", [&] {
    const scalar_t* pa = a.data_ptr<scalar_t>();
    const scalar_t* pb = b.data_ptr<scalar_t>();
    scalar_t* po = out.data_ptr<scalar_t>();
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
  });
  return out;
}

at::Tensor vector_add_meta(const at::Tensor& a, const at::Tensor& b) {
  check_vector_add_inputs(a, b);
  return at::empty(a.sizes(), a.options().memory_format(at::MemoryFormat::Contiguous));
}

class VectorAddFn : public torch::autograd::Function<VectorAddFn> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& a, const at::Tensor& b) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mini_kv_vector_add_v0_naive::vector_add", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
    return op.call(a, b);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], grads[0]};
  }
};

at::Tensor vector_add_autograd(const at::Tensor& a, const at::Tensor& b) { return VectorAddFn::apply(a, b); }

}  // namespace

TORCH_LIBRARY(NS, m) { m.def("vector_add(Tensor a, Tensor b) -> Tensor"); }
TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("vector_add", &vector_add_cpu); }
TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("vector_add", &vector_add_meta); }
TORCH_LIBRARY_IMPL(NS, Autograd, m) { m.impl("vector_add", &vector_add_autograd); }
