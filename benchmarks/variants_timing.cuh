// Timing harness shared by the launch-sweep scripts (benchmarks/*_variants.cu): CUDA events, rounds of
// all variants interleaved, median over rounds, in one of two L2 states:
//   hot : `calls` back-to-back calls between two events, alternating two input/output sets;
//   cold: before each call, outside the events, a write of 2x the L2 size (what mini_kv's cold-L2
//         mode and Triton's do_bench do) and a device sync; one call between two events, queued
//         behind a 50 us spin so the host's launch latency is not inside them.
// Torch-free: plain CUDA runtime.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

// Holds the GPU for `us` microseconds so that what is queued behind it (start event, call, end
// event) runs back to back, without the host's launch latency inside the measured span.
__global__ void variants_spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

inline void hold_gpu(float us) {
  int dev = 0, khz = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  variants_spin<<<1, 1>>>((long long)(us * 1e-3 * khz));
}

struct Variant {
  std::string name;
  std::function<void(int set)> run;  // one call on input/output set `set` (0 or 1), default stream
};

enum class L2Mode { kHot, kCold };

inline L2Mode parse_mode(const char* s) { return s && std::strcmp(s, "cold") == 0 ? L2Mode::kCold : L2Mode::kHot; }
inline const char* mode_name(L2Mode m) { return m == L2Mode::kCold ? "cold" : "hot"; }

// Per variant (and the extra `copy` variant at the end): median, min, max of the per-call µs.
struct Timings {
  std::vector<std::vector<float>> us;
  static float median(std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }
};

inline Timings time_variants(const std::vector<Variant>& vs, L2Mode mode, int rounds, int calls) {
  int dev = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  void* flush = nullptr;
  const size_t flush_bytes = 2 * (size_t)(l2 > 0 ? l2 : 64 << 20);
  if (mode == L2Mode::kCold) CK(cudaMalloc(&flush, flush_bytes));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  Timings t;
  t.us.resize(vs.size());
  for (int r = 0; r <= rounds; ++r) {  // round 0 is warm-up
    for (size_t v = 0; v < vs.size(); ++v) {
      if (mode == L2Mode::kHot) {
        CK(cudaEventRecord(a));
        for (int c = 0; c < calls; ++c) vs[v].run(c % 2);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (r > 0) t.us[v].push_back(ms * 1000.0f / calls);
      } else {
        for (int c = 0; c < calls; ++c) {
          CK(cudaMemsetAsync(flush, c & 0xff, flush_bytes));
          CK(cudaDeviceSynchronize());
          hold_gpu(50.0f);
          CK(cudaEventRecord(a));
          vs[v].run(c % 2);
          CK(cudaEventRecord(b));
          CK(cudaEventSynchronize(b));
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, a, b));
          if (r > 0) t.us[v].push_back(ms * 1000.0f);
        }
      }
    }
  }
  CK(cudaGetLastError());
  if (flush) CK(cudaFree(flush));
  return t;
}

// Runs every variant but the last (the copy) once on set 0, into `out` (n elements, pre-filled with
// 0xFF bytes), and counts the elements where `same(got, want)` is false against `ref` (the shipped
// launcher's output). Returns ok per variant (the copy: true).
template <typename T, typename Same>
std::vector<bool> check_variants(const std::vector<Variant>& vs, T* out, const T* ref, size_t n, Same same) {
  std::vector<T> got(n), want(n);
  CK(cudaMemcpy(want.data(), ref, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<bool> ok(vs.size(), true);
  for (size_t v = 0; v + 1 < vs.size(); ++v) {
    CK(cudaMemset(out, 0xff, n * sizeof(T)));
    vs[v].run(0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), out, n * sizeof(T), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += same(got[i], want[i]) ? 0 : 1;
    ok[v] = bad == 0;
    if (bad) std::printf("MISMATCH %s: %zu elements\n", vs[v].name.c_str(), bad);
  }
  return ok;
}

// One line per variant; `moved` = bytes per call, `copy_us` = the copy variant's median (same bytes).
inline void print_timings(const std::vector<Variant>& vs, const Timings& t, const std::vector<bool>& ok, double moved,
                          float copy_us) {
  for (size_t v = 0; v < vs.size(); ++v) {
    const float m = Timings::median(t.us[v]);
    std::printf("%-56s %s median %8.1f us  min %8.1f  max %8.1f  %5.0f GB/s  %5.1f%% of copy\n", vs[v].name.c_str(),
                ok[v] ? "ok " : "BAD", m, *std::min_element(t.us[v].begin(), t.us[v].end()),
                *std::max_element(t.us[v].begin(), t.us[v].end()), moved / m / 1e3, 100.0 * copy_us / m);
  }
}
