// Launch-configuration sweep for rmsnorm/v2_vectorized at the roofline bench shape (docs/measurements/kernels-cold-l2-h200.md):
// the candidate's own register-path kernel under other block sizes, grids and vectors per thread,
// plus a software-pipelined variant that loads the next row while the current one is reduced and
// written. Each variant is checked against the shipped launcher's output (1-ulp-ish tolerance:
// only the reduction tree differs with the block size), then timed by benchmarks/variants_timing.cuh
// (CUDA events, rounds of all variants interleaved, median over rounds; hot or cold L2).
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/rv benchmarks/rmsnorm_variants.cu && /tmp/rv [rows] [hidden] [rounds] [hot|cold]
//
// Built with -DMINI_KV_STREAM_HINTS, every variant (the shipped launcher too) uses evict-first loads
// and stores (__ldcs/__stcs) instead of plain ones: run both builds to time the hints.
//
// Prints one line per variant: median µs per call, min, max over rounds, GB/s, share of the
// copy bandwidth measured the same way (cudaMemcpy device to device of the same bytes).
#include <cmath>
#include <cstdint>

#include "variants_timing.cuh"
#include "../candidates/rmsnorm/v2_vectorized/kernel.cu"

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
using Run = std::function<void(const T*, const T*, T*, int64_t, int, cudaStream_t)>;
struct Named {
  std::string name;
  Run run;
};

template <int VPT, int MAXT, int MINB>
Named reg(bool persistent) {
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
Named pipe(int waves) {
  std::string name = "pipe threads=" + std::to_string(MAXT) + " vpt=" + std::to_string(VPT) + " minb=" +
                     std::to_string(MINB) + " grid=" + std::to_string(waves) + "x resident";
  return {name, [waves](const T* x, const T* w, T* o, int64_t rows, int hvec, cudaStream_t s) {
            auto k = rmsnorm_pipe_kernel<T, VPT, MAXT, MINB>;
            const int threads = ((hvec + VPT - 1) / VPT + 31) / 32 * 32;
            const unsigned grid = grid_for(rows, waves * resident_blocks(k, threads));
            k<<<grid, threads, 0, s>>>(x, w, o, rows, hvec, Acc(1e-6));
          }};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int hidden = argc > 2 ? std::atoi(argv[2]) : 8192;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 15;
  const L2Mode mode = parse_mode(argc > 4 ? argv[4] : nullptr);
  const int calls = 20;
  const int hvec = hidden / 8;
  const size_t n = (size_t)rows * hidden, bytes = n * sizeof(T);
  T *x[2], *o[2], *w, *ref;  // two input/output sets: 2 x 512 MiB at the default shape, far beyond the L2
  std::vector<T> host(n);
  unsigned s = 12345u;
  for (size_t i = 0; i < n; ++i) { s = s * 1664525u + 1013904223u; host[i] = __float2half(((s >> 8) & 0xffff) / 32768.0f - 1.0f); }
  std::vector<T> hw(hidden);
  for (int i = 0; i < hidden; ++i) hw[i] = __float2half(0.5f + (i % 97) / 97.0f);
  for (int k = 0; k < 2; ++k) {
    CK(cudaMalloc(&x[k], bytes)); CK(cudaMalloc(&o[k], bytes));
    CK(cudaMemcpy(x[k], host.data(), bytes, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&w, hidden * sizeof(T))); CK(cudaMalloc(&ref, bytes));
  CK(cudaMemcpy(w, hw.data(), hidden * sizeof(T), cudaMemcpyHostToDevice));
  CK(mini_kv_rmsnorm_v2_vectorized_launch(x[0], w, ref, rows, hidden, 1e-6, MINI_KV_F16, 0));

  std::vector<Named> named = {
      {"shipped launcher", [](const T* x, const T* w, T* o, int64_t rows, int hvec, cudaStream_t s) {
         mini_kv_rmsnorm_v2_vectorized_launch(x, w, o, rows, (int64_t)hvec * 8, 1e-6, MINI_KV_F16, s); }},
      reg<4, 256, 4>(true), reg<4, 256, 4>(false),
      reg<8, 128, 4>(true), reg<8, 128, 4>(false),
      reg<2, 512, 2>(true), reg<2, 512, 2>(false),
      reg<1, 1024, 1>(false),
      pipe<4, 256, 4>(1), pipe<4, 256, 3>(1), pipe<4, 256, 2>(1),
      pipe<2, 512, 2>(1), pipe<8, 128, 4>(1), pipe<8, 128, 6>(1),
  };
  std::vector<Variant> vs;
  for (const Named& v : named) {
    Run run = v.run;
    vs.push_back({v.name, [=](int k) { run(x[k], w, o[k], rows, hvec, 0); }});
  }
  vs.push_back({"copy (cudaMemcpy D2D of the same bytes)",
                [=](int k) { CK(cudaMemcpyAsync(o[k], x[k], bytes, cudaMemcpyDeviceToDevice)); }});
  const std::vector<bool> ok = check_variants(vs, o[0], ref, n, [](T g, T w) {
    const float a = __half2float(g), b = __half2float(w);
    return std::fabs(a - b) <= 2e-3f * (1.0f + std::fabs(b));
  });
  const Timings t = time_variants(vs, mode, rounds, calls);
  const float copy = Timings::median(t.us.back());
#ifdef MINI_KV_STREAM_HINTS
  const char* hints = "evict-first loads/stores (MINI_KV_STREAM_HINTS)";
#else
  const char* hints = "plain loads/stores";
#endif
  std::printf("rmsnorm fp16 [%lld, %d], %s, L2 %s, %d rounds x %d calls; copy %.1f us = %.0f GB/s\n",
              (long long)rows, hidden, hints, mode_name(mode), rounds, calls, copy, 2.0 * bytes / copy / 1e3);
  print_timings(vs, t, ok, 2.0 * bytes + hidden * sizeof(T), copy);
  return 0;
}
