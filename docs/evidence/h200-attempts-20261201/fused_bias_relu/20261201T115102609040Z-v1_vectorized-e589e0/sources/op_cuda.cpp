// fused_bias_relu v1_vectorized: CUDA glue. Current stream, device guard, launch error checked, no device sync.
// Non-contiguous inputs are made contiguous first; the launcher picks the 16-byte paths by alignment.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "checks.h"
#include "dtype_codes.h"

#define NS mini_kv_fused_bias_relu_v1_vectorized

cudaError_t mini_kv_fused_bias_relu_v1_vectorized_launch(const void* x, const void* bias, void* out, int64_t rows,
                                                         int64_t cols, int dtype, cudaStream_t stream);

namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MINI_KV_F32;
    case at::kHalf: return MINI_KV_F16;
    case at::kBFloat16: return MINI_KV_BF16;
    case at::kDouble: return MINI_KV_F64;
    default: TORCH_CHECK(false, "fused_bias_relu: unsupported dtype ", t);
  }
}

at::Tensor fused_bias_relu_cuda(const at::Tensor& x_in, const at::Tensor& bias_in) {
  check_inputs(x_in, bias_in);
  TORCH_CHECK(x_in.is_cuda(), "fused_bias_relu (CUDA kernel): expected CUDA tensors");
  const c10::cuda::CUDAGuard guard(x_in.device());
  at::Tensor x = x_in.contiguous(), bias = bias_in.contiguous();
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (out.numel() == 0) return out;  // nothing to launch
  cudaError_t err = mini_kv_fused_bias_relu_v1_vectorized_launch(x.data_ptr(), bias.data_ptr(), out.data_ptr(),
                                                                 x.size(0), x.size(1), dtype_code(x.scalar_type()),
                                                                 at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "fused_bias_relu: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(NS, CUDA, m) { m.impl("fused_bias_relu", &fused_bias_relu_cuda); }
