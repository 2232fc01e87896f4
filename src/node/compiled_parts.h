// CompiledParts: the node side of torch.compile(backend="genie") (docs/compile.md).
//
// A compiled call reaches the node as one op of an ordinary graph,
//   genie::call_graph(str graph, int[] outputs, Tensor[] inputs, Tensor(a!)[] written) -> Tensor[]
// naming a part graph registered before (its GraphId as 32 hex digits), the wire value ids of
// its outputs, its inputs, and the inputs it writes in place (a KV cache's update; each also in
// `inputs`: declared for the client's recorder and autograd). The part runs by one of two engines:
//  - "package": an AOT Inductor package (torch._inductor.aoti_compile_and_package) built for
//    the part and these input shapes by a compile worker (`python -m genie.compile.worker`, a
//    process on this host) and run in C++ by torch::inductor::AOTIModelPackageLoader;
//  - "executor": the dispatcher executor (executor.h), op by op, while the package is being
//    built, when the build or the load failed, or when compiling is off.
// The first call of a part with new input shapes queues its build and runs by the executor; a
// call never waits for a compiler. Packages are cached on disk under a key of everything they
// depend on (the graph, the inputs' dtypes, sizes and strides, the torch version, the device,
// the CPU's ISA level or the GPU's architecture, the TORCHINDUCTOR_* environment and the
// worker's format version): a restarted node finds them without compiling. The cache directory
// is the node's own (created and kept mode 0700); past its size limit the least recently used
// packages are deleted. A package whose outputs' strides differ from eager's is restrided, so
// a client sees what the executor would give it.
//
// Threads: calls come from session threads (concurrently); one compile thread builds and loads
// packages in turn. Bounded: at most 4096 parts (graph and input geometries) are tracked and 64
// builds queued; a call past either bound runs by the executor and queues nothing, so clients
// cannot make the node keep or compile without limit.
#pragma once

#include <ATen/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "genie/node/executor.h"
#include "genie/node/node_service.h"
#include "graph_registry.h"

namespace genie::node {

class CompiledParts {
 public:
  /// Installs itself as the instance genie::call_graph uses (one per process). Creates the
  /// cache directory (mode 0700); when it cannot, compiling is off (logged).
  CompiledParts(const Executor& executor, const GraphRegistry& graphs, CompileConfig config);
  /// Stops the compile thread (a running worker is killed) and uninstalls itself.
  ~CompiledParts();

  /// Runs part `graph` (32 hex digits) on `inputs` and returns the values `output_ids`; the
  /// part's ops write `written` (inputs too) in place. Throws c10::Error naming the part for an
  /// unknown graph, a `written` tensor that is no input, what the executor raised, and a
  /// package failure of a part that writes inputs (not run again: the writes may be done).
  std::vector<at::Tensor> call(const std::string& graph, const std::vector<int64_t>& output_ids,
                               const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& written);

  struct Counts {
    uint64_t package_calls = 0;   // calls run by a package
    uint64_t executor_calls = 0;  // calls run by the executor
    uint64_t packages_built = 0;  // packages the worker built
    uint64_t packages_loaded = 0; // packages loaded (built now or found in the cache)
    uint64_t failures = 0;        // builds, loads or package runs that failed (logged)
    uint64_t cuda_graph_replays = 0;  // package calls run as a replay of a CUDA graph (of package_calls)
  };
  Counts counts() const;
  /// The parts of graphs `graphs` (every input geometry of each): which engine runs them and
  /// why, their calls per engine, their build (schemas/genie.fbs PartStats).
  std::vector<wire::StatsArgs::Part> facts(std::span<const wire::GraphId> graphs) const;
  const std::string& cacheDir() const { return cache_dir_; }

  /// The installed instance, or nullptr (genie::call_graph's kernel).
  static CompiledParts* current();

  struct Part;

 private:
  void compileLoop();
  void build(Part& part);
  /// A package call of a part that wants a CUDA graph (compiled_cuda.h): warm-up runs, then a
  /// capture, then replays; a capture that fails turns graphs off for the part (logged, in its
  /// reason). Under the part's run mutex.
  std::vector<at::Tensor> runWithGraph(Part& part, const std::vector<at::Tensor>& inputs,
                                       const std::vector<at::Tensor>& written);
  std::shared_ptr<Part> partFor(const std::string& graph, const std::vector<at::Tensor>& inputs,
                                const std::vector<int64_t>& output_ids);

  const Executor& executor_;
  const GraphRegistry& graphs_;
  CompileConfig config_;
  std::string cache_dir_;  // empty: compiling is off
  std::string fingerprint_;  // what every key holds besides the part: torch, device, ISA, env

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<Part>> parts_;  // by graph id + input metadata
  std::deque<std::shared_ptr<Part>> queue_;
  std::condition_variable queue_cv_;
  bool stopping_ = false;
  std::atomic<int> worker_pid_{0};
  std::thread compile_thread_;

  std::atomic<uint64_t> package_calls_{0}, executor_calls_{0}, packages_built_{0}, packages_loaded_{0}, failures_{0},
      graph_replays_{0};
};

}  // namespace genie::node
