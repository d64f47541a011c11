// rmsnorm: argument checks shared by the CPU, Meta and CUDA kernels.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include <cmath>

namespace {

// Numbers are formatted with std::to_string, not streamed into TORCH_CHECK: on one toolchain
// (torch 2.11 wheel + g++ 13) streaming an integer or double into the message crashed the process.
inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline void check_inputs(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1, "rmsnorm: expected x of shape [..., hidden], got a 0-dim tensor");
  TORCH_CHECK(weight.dim() == 1, "rmsnorm: expected a 1-D weight of shape [hidden], got ", shape_str(weight));
  TORCH_CHECK(weight.size(0) == x.size(-1), "rmsnorm: weight has length ", std::to_string(weight.size(0)), " but x has hidden size ",
              std::to_string(x.size(-1)));
  TORCH_CHECK(x.scalar_type() == weight.scalar_type(), "rmsnorm: dtype mismatch, x is ", x.scalar_type(),
              " but weight is ", weight.scalar_type());
  TORCH_CHECK(x.device() == weight.device(), "rmsnorm: device mismatch, x is on ", x.device(), " but weight is on ",
              weight.device());
  TORCH_CHECK(at::isFloatingType(x.scalar_type()), "rmsnorm: expected a floating dtype, got ", x.scalar_type());
  TORCH_CHECK(std::isfinite(eps) && eps >= 0.0, "rmsnorm: eps must be finite and non-negative, got ", std::to_string(eps));
}

// rows = product of the leading dims (well defined when hidden == 0 too)
inline int64_t num_rows(const at::Tensor& x) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  return rows;
}

}  // namespace
