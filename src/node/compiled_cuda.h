// The CUDA side of compiled parts (compiled_parts.h): the GPU's architecture for the package
// key, and PackageGraph, one part's package run captured as a CUDA graph and replayed
// (torch.compile(mode="reduce-overhead") on a CUDA node, docs/compile.md "CUDA graphs").
//
// A CUDA graph replays the captured kernels on the device addresses they were captured with.
// Each input is either fixed (a weight, a KV cache: resident at one address from call to call;
// replay reads and writes it where it is) or moving (a token, a position: a new tensor each
// call), which gets a static buffer the call's value is copied into before the replay, and
// copied back out of after it if the part writes it. The outputs live in the graph's private
// memory pool and are overwritten by the next replay: each replay returns copies.
//
// The technique is PyTorch's (torch.cuda.graphs, at::cuda::CUDAGraph: a private memory pool,
// capture on a side stream after warm-up runs); CUDA's own rules apply: no host
// synchronization and no new device memory from cudaMalloc inside the run.
//
// Built only with GENIE_WITH_CUDA; without it, capture throws (the part runs its package
// without a graph) and the architecture is unknown. A PackageGraph is not thread-safe: the
// caller holds the part's run mutex.
#pragma once

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace genie::node {

class PackageGraph {
 public:
  /// The package's run on a CUDA stream (`stream`: a cudaStream_t).
  using Run = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs, void* stream)>;

  /// Captures `run` on `inputs` (CUDA tensors, the part's inputs at this call). `moving[i]`:
  /// input i gets a static buffer; `written[i]`: the part writes input i in place. Nothing
  /// runs: replay() runs the captured work. Throws c10::Error naming what failed (a capture
  /// CUDA refused: a host synchronization or an allocation outside the pool in `run`; a build
  /// without CUDA; a moving input that aliases another input).
  static std::unique_ptr<PackageGraph> capture(const Run& run, const std::vector<at::Tensor>& inputs,
                                               const std::vector<bool>& moving, const std::vector<bool>& written);
  ~PackageGraph();

  /// Runs the graph on `inputs` (the same geometry as at capture) on the current CUDA stream
  /// and returns copies of its outputs; nullopt, running nothing, when fixed input
  /// `*moved_input` is not at its captured address (the caller captures again with it moving).
  std::optional<std::vector<at::Tensor>> replay(const std::vector<at::Tensor>& inputs, size_t* moved_input);

  struct State;

 private:
  explicit PackageGraph(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

/// CUDA device `index`'s name and compute capability ("NVIDIA H100 80GB HBM3, sm_90"): what a
/// package built for it is specific to. Empty in a build without CUDA. Throws c10::Error for
/// a device that does not exist.
std::string cudaArchitecture(c10::DeviceIndex index);

}  // namespace genie::node
