// vector_add v0_naive: CUDA glue. Current stream, device guard, launch error checked, no device sync.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "dtype_codes.h"

#define NS mini_kv_vector_add_v0_naive

cudaError_t mini_kv_vector_add_v0_naive_launch(const void* a, const void* b, void* out, int64_t n, int dtype,
                                               cudaStream_t stream);

namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MINI_KV_F32;
    case at::kHalf: return MINI_KV_F16;
    case at::kBFloat16: return MINI_KV_BF16;
    case at::kDouble: return MINI_KV_F64;
    default: TORCH_CHECK(false, "vector_add: unsupported dtype ", t);
  }
}

at::Tensor vector_add_cuda(const at::Tensor& a_in, const at::Tensor& b_in) {
  check_vector_add_inputs(a_in, b_in);
  TORCH_CHECK(a_in.is_cuda(), "vector_add (CUDA kernel): expected CUDA tensors");
  const c10::cuda::CUDAGuard guard(a_in.device());
  at::Tensor a = a_in.contiguous(), b = b_in.contiguous();
  at::Tensor out = at::empty_like(a, at::MemoryFormat::Contiguous);
  cudaError_t err = mini_kv_vector_add_v0_naive_launch(a.data_ptr(), b.data_ptr(), out.data_ptr(), a.numel(),
                                                       dtype_code(a.scalar_type()),
                                                       at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "vector_add: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(NS, CUDA, m) { m.impl("vector_add", &vector_add_cuda); }
