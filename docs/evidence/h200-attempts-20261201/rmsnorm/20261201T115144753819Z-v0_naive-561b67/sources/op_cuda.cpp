// rmsnorm v0_naive: CUDA glue. Current stream, device guard, launch error checked, no device sync.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "dtype_codes.h"

#define NS mini_kv_rmsnorm_v0_naive

cudaError_t mini_kv_rmsnorm_v0_naive_launch(const void* x, const void* weight, void* out, int64_t rows,
                                            int64_t hidden, double eps, int dtype, cudaStream_t stream);

namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MINI_KV_F32;
    case at::kHalf: return MINI_KV_F16;
    case at::kBFloat16: return MINI_KV_BF16;
    case at::kDouble: return MINI_KV_F64;
    default: TORCH_CHECK(false, "rmsnorm: unsupported dtype ", t);
  }
}

at::Tensor rmsnorm_cuda(const at::Tensor& x_in, const at::Tensor& weight_in, double eps) {
  check_inputs(x_in, weight_in, eps);
  TORCH_CHECK(x_in.is_cuda(), "rmsnorm (CUDA kernel): expected CUDA tensors");
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous(), weight = weight_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;  // nothing to launch
  cudaError_t err = mini_kv_rmsnorm_v0_naive_launch(x.data_ptr(), weight.data_ptr(), out.data_ptr(), num_rows(x),
                                                    x.size(-1), eps, dtype_code(x.scalar_type()),
                                                    at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "rmsnorm: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(NS, CUDA, m) { m.impl("rmsnorm", &rmsnorm_cuda); }
