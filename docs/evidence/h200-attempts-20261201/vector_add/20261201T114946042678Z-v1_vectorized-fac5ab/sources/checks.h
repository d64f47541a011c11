// vector_add v1_vectorized: input checks shared by the CPU and CUDA glue.
// Numbers are formatted with std::to_string, not streamed: on one toolchain (torch 2.11 wheel +
// g++ 13) streaming an integer or double into TORCH_CHECK's message crashed the process.
#pragma once
#include <ATen/ATen.h>

#include <string>

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

inline void check_vector_add_inputs(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes(), "vector_add: shape mismatch, a is ", shape_str(a), " but b is ", shape_str(b));
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "vector_add: dtype mismatch, a is ", a.scalar_type(),
              " but b is ", b.scalar_type());
  TORCH_CHECK(a.device() == b.device(), "vector_add: device mismatch, a is on ", a.device(), " but b is on ",
              b.device());
  TORCH_CHECK(at::isFloatingType(a.scalar_type()), "vector_add: expected a floating dtype, got ", a.scalar_type());
}
