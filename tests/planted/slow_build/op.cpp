// A candidate whose build takes many minutes: a compile-time loop of 10^9 steps. Used by
// tests/test_compile_timeout.py to check that --compile-timeout kills the whole build.
#include <torch/library.h>

namespace {

constexpr unsigned long long spin(unsigned long long n) {
  unsigned long long x = 1;
  for (unsigned long long i = 0; i < n; ++i) x = x * 6364136223846793005ULL + i;
  return x;
}
static_assert(spin(1000000000ULL) != 0, "evaluated at compile time");

}  // namespace

TORCH_LIBRARY(mini_kv_planted_slow_build, m) { m.def("vector_add(Tensor a, Tensor b) -> Tensor"); }
