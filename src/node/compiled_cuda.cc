#include "compiled_cuda.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#ifdef GENIE_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace genie::node {

struct PackageGraph::State {
#ifdef GENIE_WITH_CUDA
  at::cuda::CUDAGraph graph;
#endif
  c10::DeviceIndex device = 0;
  std::vector<const void*> addresses;  // each input's data pointer at capture (the fixed ones are checked)
  std::vector<at::Tensor> statics;     // the moving inputs' buffers (undefined for a fixed input)
  std::vector<bool> written;
  std::vector<at::Tensor> outputs;     // the graph's outputs, in its private pool
};

PackageGraph::PackageGraph(std::unique_ptr<State> state) : state_(std::move(state)) {}
PackageGraph::~PackageGraph() = default;

#ifdef GENIE_WITH_CUDA

std::string cudaArchitecture(c10::DeviceIndex index) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(index);
  return std::string(props->name) + ", sm_" + std::to_string(props->major) + std::to_string(props->minor);
}

namespace {

/// An uninitialised tensor of `t`'s dtype, sizes, strides and storage offset (what the
/// package was compiled for) on `t`'s device.
at::Tensor sameGeometry(const at::Tensor& t) {
  if (t.storage_offset() == 0) return at::empty_strided(t.sizes(), t.strides(), t.options());
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  if (t.numel() == 0) span = 0;
  return at::empty({t.storage_offset() + span}, t.options()).as_strided(t.sizes(), t.strides(), t.storage_offset());
}

}  // namespace

std::unique_ptr<PackageGraph> PackageGraph::capture(const Run& run, const std::vector<at::Tensor>& inputs,
                                                    const std::vector<bool>& moving, const std::vector<bool>& written) {
  TORCH_CHECK(moving.size() == inputs.size() && written.size() == inputs.size(),
              "CUDA graph capture: ", inputs.size(), " inputs, ", moving.size(), " moving flags, ", written.size(),
              " written flags");
  TORCH_CHECK(!inputs.empty(), "CUDA graph capture: a part without inputs (no device to capture on)");
  auto state = std::make_unique<State>();
  state->device = inputs[0].device().index();
  state->written = written;
  state->statics.resize(inputs.size());
  std::vector<at::Tensor> graph_inputs(inputs.size());
  c10::cuda::CUDAGuard device_guard(state->device);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& t = inputs[i];
    TORCH_CHECK(t.defined() && t.is_cuda() && t.device().index() == state->device, "CUDA graph capture: input ", i,
                " is ", t.defined() ? t.device().str() : std::string("undefined"), ", not on cuda:",
                static_cast<int>(state->device));
    state->addresses.push_back(t.data_ptr());
    if (!moving[i]) {
      graph_inputs[i] = t;
      continue;
    }
    for (size_t j = 0; j < inputs.size(); ++j) {
      TORCH_CHECK(j == i || !t.is_alias_of(inputs[j]), "CUDA graph capture: input ", i,
                  " changes address between calls and shares memory with input ", j);
    }
    state->statics[i] = sameGeometry(t);
    state->statics[i].copy_(t);
    graph_inputs[i] = state->statics[i];
  }
  // Captured on a side stream (the legacy default stream cannot capture) that first waits for
  // what the current stream has queued: the inputs' producers and the copies above.
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(state->device);
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, state->device);
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    // Thread-local: other sessions' threads may allocate and copy while this one captures.
    state->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      state->outputs = run(graph_inputs, side.stream());
    } catch (...) {
      try {
        state->graph.capture_end();  // ends the capture (it fails: the run's error is the one to report)
      } catch (...) {
      }
      throw;
    }
    state->graph.capture_end();
  }
  return std::unique_ptr<PackageGraph>(new PackageGraph(std::move(state)));
}

std::optional<std::vector<at::Tensor>> PackageGraph::replay(const std::vector<at::Tensor>& inputs,
                                                            size_t* moved_input) {
  State& s = *state_;
  TORCH_CHECK(inputs.size() == s.addresses.size(), "CUDA graph replay: ", inputs.size(), " inputs, captured with ",
              s.addresses.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!s.statics[i].defined() && inputs[i].data_ptr() != s.addresses[i]) {
      *moved_input = i;
      return std::nullopt;
    }
  }
  c10::cuda::CUDAGuard device_guard(s.device);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (s.statics[i].defined()) s.statics[i].copy_(inputs[i], /*non_blocking=*/true);
  }
  s.graph.replay();  // on the current stream, after the copies
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (s.statics[i].defined() && s.written[i]) inputs[i].copy_(s.statics[i], /*non_blocking=*/true);
  }
  std::vector<at::Tensor> out;
  out.reserve(s.outputs.size());
  for (const at::Tensor& o : s.outputs) out.push_back(o.clone(at::MemoryFormat::Preserve));
  return out;
}

#else  // !GENIE_WITH_CUDA

std::string cudaArchitecture(c10::DeviceIndex) { return ""; }

std::unique_ptr<PackageGraph> PackageGraph::capture(const Run&, const std::vector<at::Tensor>&,
                                                    const std::vector<bool>&, const std::vector<bool>&) {
  TORCH_CHECK(false, "this genie-node was built without CUDA graphs (GENIE_WITH_CUDA=OFF)");
}

std::optional<std::vector<at::Tensor>> PackageGraph::replay(const std::vector<at::Tensor>&, size_t*) {
  TORCH_CHECK(false, "this genie-node was built without CUDA graphs (GENIE_WITH_CUDA=OFF)");
}

#endif

}  // namespace genie::node
