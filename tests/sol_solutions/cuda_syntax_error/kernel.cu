#include <torch/extension.h>

__global__ void scale_mul_kernel(const float* x, const float* w, float alpha, float* y, int n, int d) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * d) y[i] = x[i] * w[i % d] * alpha  // planted: missing ';'
}

std::vector<torch::Tensor> run(torch::Tensor x, torch::Tensor w, double alpha) {
    auto y = torch::empty_like(x);
    int n = x.size(0), d = x.size(1);
    scale_mul_kernel<<<(n * d + 255) / 256, 256>>>(x.data_ptr<float>(), w.data_ptr<float>(), (float)alpha,
                                                    y.data_ptr<float>(), n, d);
    return {y, y.sum()};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
