// Planted misbehaving vector_add candidates for the isolation tests. One source; the task card
// builds it once per behaviour with -DPLANT=<n> and -DNS=<namespace>. Each misbehaves only on
// inputs of 33 elements, so the cases before and after it show that a failure stays local.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
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
  // Find the harness's result fd from our command line and write a fake PASS record on it.
  std::ifstream f("/proc/self/cmdline");
  std::string arg, prev;
  int fd = -1;
  while (std::getline(f, arg, '\0')) {
    if (prev == "--result-fd") fd = std::atoi(arg.c_str());
    prev = arg;
  }
  if (fd < 0) return;
  const char* fake = "{\"event\": \"case\", \"record\": {\"id\": \"n33-float32\", \"status\": \"PASS\"}}\n";
  ssize_t ignored = write(fd, fake, strlen(fake));
  (void)ignored;
}

void misbehave() {
#if PLANT == PLANT_SEGFAULT
  volatile int* p = nullptr;
  *p = 42;
#elif PLANT == PLANT_ABORT
  std::abort();
#elif PLANT == PLANT_HANG
  volatile bool forever = true;
  while (forever) {
  }
#elif PLANT == PLANT_THROW
  throw std::runtime_error("planted: the op threw a C++ exception");
#elif PLANT == PLANT_OOM
  std::vector<at::Tensor> hoard;
  for (;;) hoard.push_back(at::ones({1 << 28}, at::kByte));  // 256 MiB at a time, touched
#elif PLANT == PLANT_FORGE
  forge_result_channel();
#endif
}

at::Tensor vector_add_cpu(const at::Tensor& a_in, const at::Tensor& b_in) {
  TORCH_CHECK(a_in.sizes() == b_in.sizes(), "vector_add: shape mismatch");
  TORCH_CHECK(a_in.scalar_type() == b_in.scalar_type(), "vector_add: dtype mismatch");
  if (a_in.numel() == 33) misbehave();
  return a_in + b_in;
}

at::Tensor vector_add_meta(const at::Tensor& a, const at::Tensor& b) { return at::empty_like(a); }

}  // namespace

TORCH_LIBRARY(NS, m) { m.def("vector_add(Tensor a, Tensor b) -> Tensor"); }
TORCH_LIBRARY_IMPL(NS, CPU, m) { m.impl("vector_add", &vector_add_cpu); }
TORCH_LIBRARY_IMPL(NS, Meta, m) { m.impl("vector_add", &vector_add_meta); }
