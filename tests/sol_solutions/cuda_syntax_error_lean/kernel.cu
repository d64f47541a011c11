// A missing ';' in a .cu without torch headers: the compiler stops within seconds (cuda_syntax_error/
// includes torch/extension.h, which nvcc parses for a minute or more before it gets to the error).
#include <cuda_runtime.h>

__global__ void scale_mul_kernel(const float* x, const float* w, float alpha, float* y, int n, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] = x[i] * w[i % d] * alpha  // planted: missing ';'
}
