// Planted CUDA vector_add: CUDA glue on the current stream.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

cudaError_t mini_kv_planted_cuda_add_launch(const float* a, const float* b, float* out, int64_t n,
                                            cudaStream_t stream);

namespace {

at::Tensor add_cuda(const at::Tensor& a_in, const at::Tensor& b_in) {
  TORCH_CHECK(a_in.sizes() == b_in.sizes(), "vector_add: shape mismatch");
  TORCH_CHECK(a_in.scalar_type() == at::kFloat && b_in.scalar_type() == at::kFloat, "vector_add: float32 only");
  const c10::cuda::CUDAGuard guard(a_in.device());
  at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  at::Tensor out = at::empty_like(a);
  cudaError_t err = mini_kv_planted_cuda_add_launch(a.data_ptr<float>(), b.data_ptr<float>(),
                                                    out.data_ptr<float>(), a.numel(),
                                                    at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, std::string("vector_add: launch failed: ") + cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(NS, CUDA, m) { m.impl("vector_add", &add_cuda); }
