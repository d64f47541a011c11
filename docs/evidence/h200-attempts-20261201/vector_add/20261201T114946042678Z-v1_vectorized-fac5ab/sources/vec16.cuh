// 16-byte vectors (uint4) of float, double, half and bfloat16, unpacked to and packed from the
// arithmetic type (float; double for double), and loads/stores with cache hints.
// Only conversion intrinsics are used, so torch's -D__CUDA_NO_HALF_OPERATORS__,
// -D__CUDA_NO_HALF_CONVERSIONS__ and friends do not matter. Torch-free.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

template <typename T> struct Vec16;

template <> struct Vec16<float> {
  using acc = float;
  static constexpr int N = 4;
  static __device__ __forceinline__ void unpack(const uint4& u, acc (&f)[N]) {
    f[0] = __uint_as_float(u.x); f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z); f[3] = __uint_as_float(u.w);
  }
  static __device__ __forceinline__ uint4 pack(const acc (&f)[N]) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  static __device__ __forceinline__ acc to_acc(float v) { return v; }
  static __device__ __forceinline__ float from_acc(acc v) { return v; }
};

template <> struct Vec16<double> {
  using acc = double;
  static constexpr int N = 2;
  static __device__ __forceinline__ void unpack(const uint4& u, acc (&f)[N]) {
    f[0] = __hiloint2double((int)u.y, (int)u.x);
    f[1] = __hiloint2double((int)u.w, (int)u.z);
  }
  static __device__ __forceinline__ uint4 pack(const acc (&f)[N]) {
    return make_uint4((unsigned)__double2loint(f[0]), (unsigned)__double2hiint(f[0]),
                      (unsigned)__double2loint(f[1]), (unsigned)__double2hiint(f[1]));
  }
  static __device__ __forceinline__ acc to_acc(double v) { return v; }
  static __device__ __forceinline__ double from_acc(acc v) { return v; }
};

template <> struct Vec16<__half> {
  using acc = float;
  static constexpr int N = 8;
  static __device__ __forceinline__ float lo(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu))); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __half2float(__ushort_as_half((unsigned short)(w >> 16))); }
  static __device__ __forceinline__ uint32_t two(float a, float b) {
    return (uint32_t)__half_as_ushort(__float2half_rn(a)) | ((uint32_t)__half_as_ushort(__float2half_rn(b)) << 16);
  }
  static __device__ __forceinline__ void unpack(const uint4& u, acc (&f)[N]) {
    f[0] = lo(u.x); f[1] = hi(u.x); f[2] = lo(u.y); f[3] = hi(u.y);
    f[4] = lo(u.z); f[5] = hi(u.z); f[6] = lo(u.w); f[7] = hi(u.w);
  }
  static __device__ __forceinline__ uint4 pack(const acc (&f)[N]) {
    return make_uint4(two(f[0], f[1]), two(f[2], f[3]), two(f[4], f[5]), two(f[6], f[7]));
  }
  static __device__ __forceinline__ acc to_acc(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_acc(acc v) { return __float2half_rn(v); }
};

template <> struct Vec16<__nv_bfloat16> {
  using acc = float;
  static constexpr int N = 8;
  // bfloat16 is the upper half of a float: widening is a shift
  static __device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
  static __device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
  static __device__ __forceinline__ uint32_t two(float a, float b) {
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(a)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(b)) << 16);
  }
  static __device__ __forceinline__ void unpack(const uint4& u, acc (&f)[N]) {
    f[0] = lo(u.x); f[1] = hi(u.x); f[2] = lo(u.y); f[3] = hi(u.y);
    f[4] = lo(u.z); f[5] = hi(u.z); f[6] = lo(u.w); f[7] = hi(u.w);
  }
  static __device__ __forceinline__ uint4 pack(const acc (&f)[N]) {
    return make_uint4(two(f[0], f[1]), two(f[2], f[3]), two(f[4], f[5]), two(f[6], f[7]));
  }
  static __device__ __forceinline__ acc to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_acc(acc v) { return __float2bfloat16_rn(v); }
};

// Loads and stores of data each kernel touches once. Plain (default caching) on purpose: on the
// H200 the evict-first hints (__ldcs/__stcs) cost 36 us on vector_add at 256M elements and 10 us on
// rmsnorm [16384, 8192] when L2 starts cold (docs/kernels.md, scripts/*_variants.cu).
// MINI_KV_STREAM_HINTS (set only by the sweeps' comparison builds) turns the hints back on.
#ifdef MINI_KV_STREAM_HINTS
__device__ __forceinline__ uint4 ld_stream(const uint4* p) { return __ldcs(p); }
__device__ __forceinline__ void st_stream(uint4* p, const uint4& v) { __stcs(p, v); }
#else
__device__ __forceinline__ uint4 ld_stream(const uint4* p) { return *p; }
__device__ __forceinline__ void st_stream(uint4* p, const uint4& v) { *p = v; }
#endif
// Read-only path for small operands that every block re-reads (bias, weight).
__device__ __forceinline__ uint4 ld_keep(const uint4* p) { return __ldg(p); }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace
