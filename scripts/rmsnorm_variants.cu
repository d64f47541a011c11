// Launch-configuration sweep for rmsnorm/v2_vectorized at the roofline bench shape (docs/kernels.md):
// the candidate's own register-path kernel under other block sizes, grids and vectors per thread,
// plus a software-pipelined variant that loads the next row while the current one is reduced and
// written. Each variant is checked against the shipped launcher's output (bit for bit: same FP32
// arithmetic per element, only the reduction tree differs in the block size, so a 1-ulp tolerance),
// then timed with CUDA events: rounds of all variants interleaved, median over rounds.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/rmsnorm_variants scripts/rmsnorm_variants.cu && /tmp/rmsnorm_variants
//
// Prints one line per variant: median µs per call, min, max over rounds, GB/s, share of the
// copy bandwidth measured in the same process (cudaMemcpy device to device of the same bytes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "../candidates/rmsnorm/v2_vectorized/kernel.cu"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

namespace {

// The register path, with the next row's slice loaded before the current row is reduced and
// written: the loads of row k+1 are in flight during row k's barrier and stores.
template <typename T, int VPT, int MAXT, int MINB>
__global__ void __launch_bounds__(MAXT, MINB)
rmsnorm_pipe_kernel(const T* __restrict__ x, const T* __restrict__ weight, T* __restrict__ out, int64_t rows,
                    int hvec, typename Vec16<T>::acc eps) {
  using V = Vec16<T>;
  using A = typename V::acc;
  constexpr int N = V::N;
  __shared__ A partials[2][32];
  const int tid = threadIdx.x, nt = blockDim.x;
  const uint4* __restrict__ wv = reinterpret_cast<const uint4*>(weight);
  const A hidden = static_cast<A>((int64_t)hvec * N);
  int parity = 0;
  uint4 cur[VPT], nxt[VPT];
  int64_t row = blockIdx.x;
  auto load = [&](uint4 (&dst)[VPT], int64_t r) {
    const uint4* __restrict__ xr = reinterpret_cast<const uint4*>(x) + r * hvec;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = tid + k * nt;
      dst[k] = make_uint4(0u, 0u, 0u, 0u);
      if (r < rows && j < hvec) dst[k] = ld_stream(xr + j);
    }
  };
  load(cur, row);
  for (; row < rows; row += gridDim.x) {
    load(nxt, row + gridDim.x);
    A sum = 0;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      A f[N];
      V::unpack(cur[k], f);
#pragma unroll
      for (int e = 0; e < N; ++e) sum += f[e] * f[e];
    }
    sum = block_allsum(sum, partials, parity);
    parity ^= 1;
    const A inv = inv_sqrt(sum / hidden + eps);
    uint4* __restrict__ orow = reinterpret_cast<uint4*>(out) + row * hvec;
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int j = tid + k * nt;
      if (j < hvec) {
        A f[N], g[N];
        V::unpack(cur[k], f);
        V::unpack(ld_keep(wv + j), g);
#pragma unroll
        for (int e = 0; e < N; ++e) f[e] = f[e] * inv * g[e];
        st_stream(orow + j, V::pack(f));
      }
    }
#pragma unroll
    for (int k = 0; k < VPT; ++k) cur[k] = nxt[k];
  }
}

using T = __half;
using Acc = float;

struct Variant {
  std::string name;
  std::function<void(const T*, const T*, T*, int64_t, int, cudaStream_t)> run;
};

template <int VPT, int MAXT, int MINB>
Variant reg(bool persistent) {
  std::string name = "reg threads=" + std::to_string(MAXT) + " vpt=" + std::to_string(VPT) + " minb=" +
                     std::to_string(MINB) + (persistent ? " persistent" : " grid=rows");
  return {name, [persistent](const T* x, const T* w, T* o, int64_t rows, int hvec, cudaStream_t s) {
            auto k = rmsnorm_reg_kernel<T, VPT, MAXT, MINB, kKeepWeight<T>>;
            const int threads = ((hvec + VPT - 1) / VPT + 31) / 32 * 32;
            const unsigned grid = persistent ? grid_for(rows, resident_blocks(k, threads)) : (unsigned)rows;
            k<<<grid, threads, 0, s>>>(x, w, o, rows, hvec, Acc(1e-6));
          }};
}

template <int VPT, int MAXT, int MINB>
Variant pipe(int waves) {
  std::string name = "pipe threads=" + std::to_string(MAXT) + " vpt=" + std::to_string(VPT) + " minb=" +
                     std::to_string(MINB) + " grid=" + std::to_string(waves) + "x resident";
  return {name, [waves](const T* x, const T* w, T* o, int64_t rows, int hvec, cudaStream_t s) {
            auto k = rmsnorm_pipe_kernel<T, VPT, MAXT, MINB>;
            const int threads = ((hvec + VPT - 1) / VPT + 31) / 32 * 32;
            const unsigned grid = grid_for(rows, waves * resident_blocks(k, threads));
            k<<<grid, threads, 0, s>>>(x, w, o, rows, hvec, Acc(1e-6));
          }};
}

float elapsed_us(cudaEvent_t a, cudaEvent_t b, int calls) {
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  return ms * 1000.0f / calls;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int hidden = argc > 2 ? std::atoi(argv[2]) : 8192;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 15;
  const int calls = 20;
  const int hvec = hidden / 8;
  const size_t n = (size_t)rows * hidden, bytes = n * sizeof(T);
  constexpr int kSets = 2;  // alternate input/output sets: 2 x 512 MiB, far beyond the 60 MiB L2
  T *x[kSets], *o[kSets], *w, *ref;
  std::vector<T> host(n);
  unsigned s = 12345u;
  for (size_t i = 0; i < n; ++i) { s = s * 1664525u + 1013904223u; host[i] = __float2half(((s >> 8) & 0xffff) / 32768.0f - 1.0f); }
  std::vector<T> hw(hidden);
  for (int i = 0; i < hidden; ++i) hw[i] = __float2half(0.5f + (i % 97) / 97.0f);
  for (int k = 0; k < kSets; ++k) {
    CK(cudaMalloc(&x[k], bytes)); CK(cudaMalloc(&o[k], bytes));
    CK(cudaMemcpy(x[k], host.data(), bytes, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&w, hidden * sizeof(T))); CK(cudaMalloc(&ref, bytes));
  CK(cudaMemcpy(w, hw.data(), hidden * sizeof(T), cudaMemcpyHostToDevice));
  CK(mini_kv_rmsnorm_v2_vectorized_launch(x[0], w, ref, rows, hidden, 1e-6, MINI_KV_F16, 0));

  std::vector<Variant> vs = {
      {"shipped launcher", [](const T* x, const T* w, T* o, int64_t rows, int hvec, cudaStream_t s) {
         mini_kv_rmsnorm_v2_vectorized_launch(x, w, o, rows, (int64_t)hvec * 8, 1e-6, MINI_KV_F16, s); }},
      reg<4, 256, 4>(true), reg<4, 256, 4>(false),
      reg<8, 128, 4>(true), reg<8, 128, 4>(false),
      reg<2, 512, 2>(true), reg<2, 512, 2>(false),
      reg<1, 1024, 1>(false),
      pipe<4, 256, 4>(1), pipe<4, 256, 3>(1), pipe<4, 256, 2>(1),
      pipe<2, 512, 2>(1), pipe<8, 128, 4>(1), pipe<8, 128, 6>(1),
  };
  std::vector<T> got(n), want(n);
  CK(cudaMemcpy(want.data(), ref, bytes, cudaMemcpyDeviceToHost));
  std::vector<bool> ok(vs.size(), true);
  for (size_t v = 0; v < vs.size(); ++v) {
    CK(cudaMemset(o[0], 0xff, bytes));
    vs[v].run(x[0], w, o[0], rows, hvec, 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), o[0], bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      const float a = __half2float(got[i]), b = __half2float(want[i]);
      if (!(std::fabs(a - b) <= 2e-3f * (1.0f + std::fabs(b)))) ++bad;
    }
    ok[v] = bad == 0;
    if (bad) std::printf("MISMATCH %s: %zu elements\n", vs[v].name.c_str(), bad);
  }

  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  std::vector<std::vector<float>> t(vs.size() + 1);
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 is warm-up
    for (size_t v = 0; v <= vs.size(); ++v) {
      CK(cudaEventRecord(a));
      for (int c = 0; c < calls; ++c) {
        if (v == vs.size()) CK(cudaMemcpyAsync(o[c % kSets], x[c % kSets], bytes, cudaMemcpyDeviceToDevice));
        else vs[v].run(x[c % kSets], w, o[c % kSets], rows, hvec, 0);
      }
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      if (r > 0) t[v].push_back(elapsed_us(a, b, calls));
    }
  }
  auto med = [](std::vector<float> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
  const float copy = med(t.back());
  const double moved = 2.0 * bytes + hidden * sizeof(T);
  std::printf("rmsnorm fp16 [%lld, %d], %d rounds x %d calls; copy (cudaMemcpy D2D) %.1f us = %.0f GB/s\n",
              (long long)rows, hidden, rounds, calls, copy, 2.0 * bytes / copy / 1e3);
  for (size_t v = 0; v < vs.size(); ++v) {
    const float m = med(t[v]);
    std::printf("%-48s %s median %7.1f us  min %7.1f  max %7.1f  %5.0f GB/s  %5.1f%% of copy\n", vs[v].name.c_str(),
                ok[v] ? "ok " : "BAD", m, *std::min_element(t[v].begin(), t[v].end()),
                *std::max_element(t[v].begin(), t[v].end()), moved / m / 1e3, 100.0 * copy / m);
  }
  return 0;
}
