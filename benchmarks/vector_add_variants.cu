// Cache-hint sweep for vector_add/v1_vectorized at its roofline bench size (docs/measurements/kernels-cold-l2-h200.md): the
// shipped launcher (default caching) against the same vector kernel with evict-first hints
// (__ldcs/__stcs) on the loads, the stores or both, and other unroll depths, in hot or cold L2
// (benchmarks/variants_timing.cuh). Cold is the state the targets are defined for; there the hinted
// kernel lost 36-45 µs to default caching at 256M FP16 elements, so the candidate no longer hints.
// Each variant's output is checked bit for bit against the shipped launcher's first.
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -o /tmp/va benchmarks/vector_add_variants.cu && /tmp/va [n] [rounds] [hot|cold]
#include <cstdint>

#include "variants_timing.cuh"
#include "../candidates/vector_add/v1_vectorized/kernel.cu"

namespace {

using T = __half;

template <bool kStreamLoad, bool kStreamStore, int kU>
__global__ void __launch_bounds__(256) add_kernel(const T* __restrict__ a, const T* __restrict__ b,
                                                  T* __restrict__ out, int64_t nvec) {
  using V = Vec16<T>;
  constexpr int N = V::N;
  const uint4* __restrict__ av = reinterpret_cast<const uint4*>(a);
  const uint4* __restrict__ bv = reinterpret_cast<const uint4*>(b);
  uint4* __restrict__ ov = reinterpret_cast<uint4*>(out);
  constexpr int64_t tile = 256LL * kU;
  for (int64_t base = (int64_t)blockIdx.x * tile; base < nvec; base += (int64_t)gridDim.x * tile) {
    uint4 ra[kU], rb[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t i = base + k * 256 + threadIdx.x;
      ra[k] = rb[k] = make_uint4(0u, 0u, 0u, 0u);
      if (i < nvec) {
        ra[k] = kStreamLoad ? __ldcs(av + i) : av[i];
        rb[k] = kStreamLoad ? __ldcs(bv + i) : bv[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      const int64_t i = base + k * 256 + threadIdx.x;
      if (i < nvec) {
        float fa[N], fb[N];
        V::unpack(ra[k], fa);
        V::unpack(rb[k], fb);
#pragma unroll
        for (int e = 0; e < N; ++e) fa[e] = fa[e] + fb[e];
        if (kStreamStore) __stcs(ov + i, V::pack(fa));
        else ov[i] = V::pack(fa);
      }
    }
  }
}

template <bool kStreamLoad, bool kStreamStore, int kU>
Variant variant(const T* const* a, const T* const* b, T* const* o, int64_t n) {
  const std::string name = std::string("loads ") + (kStreamLoad ? "evict-first" : "default") + ", stores " +
                           (kStreamStore ? "evict-first" : "default") + ", unroll " + std::to_string(kU);
  return {name, [=](int k) {
            const int64_t nvec = n / 8, tile = 256LL * kU;
            add_kernel<kStreamLoad, kStreamStore, kU><<<(unsigned)((nvec + tile - 1) / tile), 256>>>(a[k], b[k], o[k], nvec);
          }};
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (1LL << 28);  // a multiple of 8: no scalar tail
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 15;
  const L2Mode mode = parse_mode(argc > 3 ? argv[3] : nullptr);
  const int calls = mode == L2Mode::kCold ? 10 : 20;
  const size_t bytes = (size_t)n * sizeof(T);
  T *a[2], *b[2], *o[2], *ref;
  std::vector<T> host(n);
  unsigned s = 777u;
  for (int64_t i = 0; i < n; ++i) { s = s * 1664525u + 1013904223u; host[i] = __float2half(((s >> 8) & 0xffff) / 16384.0f - 2.0f); }
  for (int k = 0; k < 2; ++k) {
    CK(cudaMalloc(&a[k], bytes)); CK(cudaMalloc(&b[k], bytes)); CK(cudaMalloc(&o[k], bytes));
    CK(cudaMemcpy(a[k], host.data(), bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b[k], host.data() + (k ? 1 : 0), bytes - (k ? sizeof(T) : 0), cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&ref, bytes));
  CK(mini_kv_vector_add_v1_vectorized_launch(a[0], b[0], ref, n, MINI_KV_F16, 0));
  std::vector<Variant> vs = {
      {"shipped launcher (default caching, unroll 4)",
       [=](int k) { mini_kv_vector_add_v1_vectorized_launch(a[k], b[k], o[k], n, MINI_KV_F16, 0); }},
      variant<true, true, 4>(a, b, o, n),   variant<false, false, 4>(a, b, o, n),
      variant<true, false, 4>(a, b, o, n),  variant<false, true, 4>(a, b, o, n),
      variant<false, false, 2>(a, b, o, n), variant<false, false, 8>(a, b, o, n),
      variant<true, true, 8>(a, b, o, n),
      {"copy (cudaMemcpy D2D of one operand: n read + n written)",
       [=](int k) { CK(cudaMemcpyAsync(o[k], a[k], bytes, cudaMemcpyDeviceToDevice)); }},
  };
  const std::vector<bool> ok = check_variants(vs, o[0], ref, (size_t)n, [](T g, T w) {  // bit for bit
    return __half_as_ushort(g) == __half_as_ushort(w);
  });
  const Timings t = time_variants(vs, mode, rounds, calls);
  const float copy = Timings::median(t.us.back());
  std::printf("vector_add fp16 n=%lld, L2 %s, %d rounds x %d calls; copy of one operand (2 x %zu bytes) %.1f us\n",
              (long long)n, mode_name(mode), rounds, calls, bytes, copy);
  print_timings(vs, t, ok, 3.0 * bytes, copy * 1.5f);  // % of copy: against the copy's rate for 3 x bytes
  return 0;
}
