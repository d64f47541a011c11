// fused_bias_relu v1_vectorized: argument checks shared by the CPU, Meta and CUDA kernels.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace {

// Numbers are formatted with std::to_string, not streamed into TORCH_CHECK: on one toolchain
// (torch 2.11 wheel + g++ 13) streaming an integer or double into the message crashed the process.
inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline void check_inputs(const at::Tensor& x, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2, "fused_bias_relu: expected x of shape [rows, cols], got ", shape_str(x));
  TORCH_CHECK(bias.dim() == 1, "fused_bias_relu: expected a 1-D bias of shape [cols], got ", shape_str(bias));
  TORCH_CHECK(bias.size(0) == x.size(1), "fused_bias_relu: bias has length ", std::to_string(bias.size(0)), " but x has ",
              std::to_string(x.size(1)), " columns");
  TORCH_CHECK(x.scalar_type() == bias.scalar_type(), "fused_bias_relu: dtype mismatch, x is ", x.scalar_type(),
              " but bias is ", bias.scalar_type());
  TORCH_CHECK(x.device() == bias.device(), "fused_bias_relu: device mismatch, x is on ", x.device(),
              " but bias is on ", bias.device());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "fused_bias_relu: expected a floating dtype, got ",
              x.scalar_type());
}

}  // namespace
