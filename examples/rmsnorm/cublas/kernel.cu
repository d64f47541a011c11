// RMSNorm with cuBLAS doing the reduction, destination-passing style:
// run(hidden_states, weight, output).
//
// The sum of squares of every row is a batch of 1x1 GEMMs, row_i . row_i, which
// one cublasGemmStridedBatchedEx call computes for all rows: bf16 inputs, fp32
// accumulation and fp32 results. A small elementwise kernel then applies
// rsqrt(mean + eps) and the weight. That reads x twice (the GEMM and the scale),
// so it trails a fused kernel, but the reduction is entirely cuBLAS.
//
// The cuBLAS entry point is looked up at run time in the libcublas that torch
// has already loaded, so the extension needs no -lcublas and no library path.

#include <torch/extension.h>

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/cuda/CUDAContext.h>  // at::cuda::getCurrentCUDABlasHandle
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <dlfcn.h>

#include <climits>

namespace {

constexpr float kEps = 1e-5f;

// The C entry point (the header also declares a C++ overload of the same name).
using GemmStridedBatchedEx = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
    const void*, cudaDataType, int, long long int, const void*, cudaDataType, int, long long int,
    const void*, void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);

GemmStridedBatchedEx gemm_strided_batched_ex() {
  static const GemmStridedBatchedEx fn = [] {
    void* sym = dlsym(RTLD_DEFAULT, "cublasGemmStridedBatchedEx");
    for (const char* lib : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
      if (sym != nullptr) break;
      if (void* handle = dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) sym = dlsym(handle, "cublasGemmStridedBatchedEx");
    }
    return reinterpret_cast<GemmStridedBatchedEx>(sym);
  }();
  TORCH_CHECK(fn != nullptr, "cublasGemmStridedBatchedEx not found in the loaded libcublas");
  return fn;
}

// One block per row: y = (x * rsqrt(sum_sq / n + eps)) * w, fp32 math, bf16 out.
__global__ void scale_rows(const __nv_bfloat16* __restrict__ x, int64_t x_row_stride,
                           const __nv_bfloat16* __restrict__ w, const float* __restrict__ sum_sq,
                           __nv_bfloat16* __restrict__ y, int64_t y_row_stride, int n, float eps) {
  const int64_t row = blockIdx.x;
  const float rstd = rsqrtf(sum_sq[row] / static_cast<float>(n) + eps);
  const __nv_bfloat16* xr = x + row * x_row_stride;
  __nv_bfloat16* yr = y + row * y_row_stride;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    yr[j] = __float2bfloat16_rn((__bfloat162float(xr[j]) * rstd) * __bfloat162float(w[j]));
  }
}

}  // namespace

void run(torch::Tensor hidden_states, torch::Tensor weight, torch::Tensor output) {
  TORCH_CHECK(hidden_states.is_cuda() && weight.device() == hidden_states.device() &&
                  output.device() == hidden_states.device(),
              "hidden_states, weight and output must be CUDA tensors on one device");
  TORCH_CHECK(hidden_states.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16 &&
                  output.scalar_type() == at::kBFloat16,
              "expects bfloat16 tensors");
  TORCH_CHECK(hidden_states.dim() == 2 && output.sizes() == hidden_states.sizes(),
              "hidden_states and output must be [batch_size, hidden_size]");
  const int64_t rows = hidden_states.size(0);
  const int64_t n = hidden_states.size(1);
  TORCH_CHECK(weight.numel() == n, "weight must have hidden_size elements");
  TORCH_CHECK(rows <= INT_MAX && n <= INT_MAX, "shape too large");
  if (rows == 0 || n == 0) return;

  const c10::cuda::CUDAGuard guard(hidden_states.device());
  // cuBLAS needs each row contiguous and a row stride of at least n.
  const at::Tensor x = (hidden_states.stride(1) == 1 && hidden_states.stride(0) >= n) ? hidden_states
                                                                                      : hidden_states.contiguous();
  const at::Tensor w = weight.contiguous();
  at::Tensor sum_sq = at::empty({rows}, hidden_states.options().dtype(at::kFloat));

  // Column-major view: row i is a k x 1 column (k = n) at x + i * ld. With
  // op(A) = A^T (1 x k) and op(B) = B (k x 1), C_i = row_i . row_i.
  const int k = static_cast<int>(n);
  const int64_t ld = x.stride(0);
  TORCH_CHECK(ld <= INT_MAX, "row stride too large for cuBLAS");
  const float one = 1.0f, zero = 0.0f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // bound to the current stream
  const cublasStatus_t status = gemm_strided_batched_ex()(
      handle, CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/1, /*n=*/1, k, &one,
      x.data_ptr(), CUDA_R_16BF, static_cast<int>(ld), ld,
      x.data_ptr(), CUDA_R_16BF, static_cast<int>(ld), ld, &zero,
      sum_sq.data_ptr(), CUDA_R_32F, /*ldc=*/1, /*strideC=*/1,
      static_cast<int>(rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasGemmStridedBatchedEx failed with status ",
              static_cast<int>(status));

  const bool direct = output.stride(1) == 1;
  at::Tensor y = direct ? output : at::empty({rows, n}, output.options());
  const int threads = n >= 1024 ? 512 : 128;
  scale_rows<<<static_cast<unsigned>(rows), threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()), x.stride(0),
      reinterpret_cast<const __nv_bfloat16*>(w.data_ptr<at::BFloat16>()), sum_sq.data_ptr<float>(),
      reinterpret_cast<__nv_bfloat16*>(y.data_ptr<at::BFloat16>()), y.stride(0), k, kEps);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (!direct) output.copy_(y);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "RMSNorm, row sums of squares by cuBLAS (destination-passing style)",
        pybind11::arg("hidden_states"), pybind11::arg("weight"), pybind11::arg("output"));
}
