// RMSNorm through cuDNN's graph API, written with the header-only cuDNN
// frontend C++ library (cudnn_frontend.h). Destination-passing style:
// run(hidden_states, weight, output).
//
// A graph is built once per (device, rows, hidden, row strides) and cached:
// building runs cuDNN's heuristics and compiles an execution plan, far too slow
// to repeat per call. NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING makes the frontend
// call cuDNN through dlsym on cudnn_frontend::cudnn_dlhandle, which the program
// must define and open: it is opened on first use, and finds the libcudnn.so.9
// that torch has already loaded.

#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>

namespace fe = cudnn_frontend;

// Defined here, declared extern by the frontend's dynamic-loading shim.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace {

constexpr float kEps = 1e-5f;

struct Plan {
  std::shared_ptr<fe::graph::Graph> graph;
  std::shared_ptr<fe::graph::Tensor_attributes> x, scale, eps, y;
  int64_t workspace_bytes = 0;
};

void check(fe::error_t status, const char* what) {  // by value: get_message() is not const
  TORCH_CHECK(status.is_good(), "cuDNN frontend: ", what, " failed: ", status.get_message());
}

cudnnHandle_t handle_for(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  if (fe::cudnn_dlhandle == nullptr) {  // already loaded by torch: dlopen returns that copy
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(fe::cudnn_dlhandle != nullptr, "dlopen(libcudnn.so.9) failed: ", dlerror());
  }
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = fe::detail::create_handle(&handle);
  TORCH_CHECK(status == CUDNN_STATUS_SUCCESS, "cudnnCreate failed with status ", static_cast<int>(status));
  handles.emplace(device, handle);
  return handle;
}

std::shared_ptr<Plan> build(cudnnHandle_t handle, int64_t rows, int64_t hidden,
                            int64_t x_row_stride, int64_t y_row_stride) {
  auto plan = std::make_shared<Plan>();
  plan->graph = std::make_shared<fe::graph::Graph>();
  auto& g = *plan->graph;
  g.set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);

  // cuDNN normalisations take N,C,H,W-style tensors: rows -> N, hidden -> C.
  plan->x = g.tensor(fe::graph::Tensor_attributes()
                         .set_name("x")
                         .set_dim({rows, hidden, 1, 1})
                         .set_stride({x_row_stride, 1, hidden, hidden}));
  plan->scale = g.tensor(fe::graph::Tensor_attributes()
                             .set_name("scale")
                             .set_dim({1, hidden, 1, 1})
                             .set_stride({hidden, 1, hidden, hidden}));
  plan->eps = g.tensor(fe::graph::Tensor_attributes()
                           .set_name("epsilon")
                           .set_dim({1, 1, 1, 1})
                           .set_stride({1, 1, 1, 1})
                           .set_data_type(fe::DataType_t::FLOAT)
                           .set_is_pass_by_value(true));
  auto options = fe::graph::Rmsnorm_attributes()
                     .set_forward_phase(fe::NormFwdPhase_t::INFERENCE)
                     .set_epsilon(plan->eps);
  auto outputs = g.rmsnorm(plan->x, plan->scale, options);
  plan->y = outputs[0];  // outputs[1], the inverse RMS, is only produced in training
  plan->y->set_output(true).set_stride({y_row_stride, 1, hidden, hidden});

  check(g.validate(), "validate");
  check(g.build_operation_graph(handle), "build_operation_graph");
  check(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
  check(g.check_support(handle), "check_support");
  check(g.build_plans(handle), "build_plans");
  check(g.get_workspace_size(plan->workspace_bytes), "get_workspace_size");
  return plan;
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
  const int64_t hidden = hidden_states.size(1);
  TORCH_CHECK(weight.numel() == hidden, "weight must have hidden_size elements");
  if (rows == 0 || hidden == 0) return;

  const c10::cuda::CUDAGuard guard(hidden_states.device());
  const at::Tensor x = hidden_states.stride(1) == 1 ? hidden_states : hidden_states.contiguous();
  const at::Tensor w = weight.contiguous();
  const bool direct = output.stride(1) == 1;
  at::Tensor y = direct ? output : at::empty({rows, hidden}, output.options());

  const int device = hidden_states.get_device();
  cudnnHandle_t handle = handle_for(device);

  static std::mutex mutex;
  static std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t>, std::shared_ptr<Plan>> cache;
  std::shared_ptr<Plan> plan;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto key = std::make_tuple(device, rows, hidden, x.stride(0), y.stride(0));
    auto it = cache.find(key);
    if (it == cache.end()) it = cache.emplace(key, build(handle, rows, hidden, x.stride(0), y.stride(0))).first;
    plan = it->second;
  }

  TORCH_CHECK(fe::detail::set_stream(handle, c10::cuda::getCurrentCUDAStream()) == CUDNN_STATUS_SUCCESS,
              "cudnnSetStream failed");
  at::Tensor workspace = at::empty({std::max<int64_t>(plan->workspace_bytes, 1)},
                                   hidden_states.options().dtype(at::kByte));
  float eps = kEps;  // pass-by-value scalar: a host pointer in the variant pack
  std::unordered_map<std::shared_ptr<fe::graph::Tensor_attributes>, void*> pack = {
      {plan->x, x.data_ptr()}, {plan->scale, w.data_ptr()}, {plan->eps, &eps}, {plan->y, y.data_ptr()}};
  check(plan->graph->execute(handle, pack, workspace.data_ptr()), "execute");
  if (!direct) output.copy_(y);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "RMSNorm through a cached cuDNN graph (destination-passing style)",
        pybind11::arg("hidden_states"), pybind11::arg("weight"), pybind11::arg("output"));
}
