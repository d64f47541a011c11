#pragma once
#include <cuda_runtime.h>

// y[i, j] = x[i, j] * w[j] * alpha, rows of d contiguous floats
void launch_scale_mul(const float* x, const float* w, float alpha, float* y, long n, long d, cudaStream_t stream);
