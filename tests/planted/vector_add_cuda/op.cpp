// Planted CUDA vector_add: schema, CPU and Meta kernels. The namespace comes from -DNS=<ns>.
#include <ATen/ATen.h>
#include <torch/library.h>

namespace {

at::Tensor add_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "vector_add: shape mismatch");
  TORCH_CHECK(a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat, "vector_add: float32 only");
  return a + b;
}

at::Tensor add_meta(const at::Tensor& a, const at::Tensor& b) { return at::empty_like(a); }

}  // namespace

TORCH_LIBRARY(NS, m) { m.def("vector_add(Tensor a, Tensor b) -> Tensor"); }
TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("vector_add", &add_cpu); }
TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("vector_add", &add_meta); }
