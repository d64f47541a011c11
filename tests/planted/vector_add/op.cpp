// Planted misbehaving vector_add candidates for the isolation tests. One source, one build (the same
// sources and flags for every candidate): each behaviour is registered in a dispatcher namespace of its
// own, which the task card's candidate names. Each misbehaves only on inputs of 33 elements, so the
// cases before and after it show that a failure stays local.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#define PLANT_SEGFAULT 1
#define PLANT_ABORT 2
#define PLANT_HANG 3
#define PLANT_THROW 4
#define PLANT_OOM 5
#define PLANT_FORGE 6

namespace {

void forge_result_channel() {
  // Write a fake PASS record on every pipe this process holds open (the harness's result channel is
  // one of them), as an attacker who does not know which fd it is would.
  const char* fake = "{\"event\": \"case\", \"record\": {\"id\": \"n33-float32\", \"status\": \"PASS\"}}\n";
  for (int fd = 3; fd < 1024; ++fd) {
    char path[64], target[256];
    std::snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::strncmp(target, "pipe:", 5) != 0) continue;
    ssize_t ignored = write(fd, fake, strlen(fake));
    (void)ignored;
  }
}

template <int PLANT>
void misbehave() {
  if constexpr (PLANT == PLANT_SEGFAULT) {
    volatile int* p = nullptr;
    *p = 42;
  } else if constexpr (PLANT == PLANT_ABORT) {
    std::abort();
  } else if constexpr (PLANT == PLANT_HANG) {
    volatile bool forever = true;
    while (forever) {
    }
  } else if constexpr (PLANT == PLANT_THROW) {
    throw std::runtime_error("planted: the op threw a C++ exception");
  } else if constexpr (PLANT == PLANT_OOM) {
    std::vector<at::Tensor> hoard;
    for (;;) hoard.push_back(at::ones({1 << 28}, at::kByte));  // 256 MiB at a time, touched
  } else if constexpr (PLANT == PLANT_FORGE) {
    forge_result_channel();
  }
}

template <int PLANT>
at::Tensor vector_add_cpu(const at::Tensor& a_in, const at::Tensor& b_in) {
  TORCH_CHECK(a_in.sizes() == b_in.sizes(), "vector_add: shape mismatch");
  TORCH_CHECK(a_in.scalar_type() == b_in.scalar_type(), "vector_add: dtype mismatch");
  if (a_in.numel() == 33) misbehave<PLANT>();
  return a_in + b_in;
}

at::Tensor vector_add_meta(const at::Tensor& a, const at::Tensor& b) { return at::empty_like(a); }

}  // namespace

#define PLANTED(NS, PLANT)                                                          \
  TORCH_LIBRARY(NS, m) { m.def("vector_add(Tensor a, Tensor b) -> Tensor"); }       \
  TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("vector_add", &vector_add_cpu<PLANT>); } \
  TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("vector_add", &vector_add_meta); }

PLANTED(mini_kv_planted_segfault, PLANT_SEGFAULT)
PLANTED(mini_kv_planted_abort, PLANT_ABORT)
PLANTED(mini_kv_planted_hang, PLANT_HANG)
PLANTED(mini_kv_planted_throw, PLANT_THROW)
PLANTED(mini_kv_planted_oom, PLANT_OOM)
PLANTED(mini_kv_planted_forge, PLANT_FORGE)
