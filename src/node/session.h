// Session: one client's session on genie-node, and NodeContext, the node as sessions see it.
//
// A session owns its resident tensors (TensorStore) and one thread that runs its requests in
// order: PutTensors, GetTensors, FreeTensors, RegisterGraph, RunGraph, StatsRequest. Sessions
// run concurrently; what they share (the executor, the graph registry, the memory accounts, the
// data plane's worker) is the NodeContext's. While idle, a session's thread drives the worker
// itself (leader/followers) so that its next request needs no wake-up (docs/thread_model.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "genie/node/executor.h"
#include "genie/status.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"
#include "genie/wire/codec.h"
#include "compiled_parts.h"
#include "graph_registry.h"
#include "memory_account.h"
#include "tensor_store.h"

namespace genie::node {

/// The node as its sessions see it (NodeService's implementation is one): its device,
/// executor, graph registry, memory accounts, worker, counters, and how replies go out.
struct NodeContext {
  NodeContext(c10::Device device, uint64_t memory_limit, uint64_t session_memory_limit, const CompileConfig& compile)
      : device(device),
        executor(device),
        compiled(executor, graphs, compile),
        memory(memory_limit),
        session_memory_limit(session_memory_limit) {}
  virtual ~NodeContext() = default;

  c10::Device device;
  Executor executor;
  GraphRegistry graphs{executor};
  CompiledParts compiled;  // genie::call_graph (torch.compile's parts)
  NodeMemory memory;
  const uint64_t session_memory_limit;  // each session's quota, bytes; 0: the node's limit only
  std::shared_ptr<transport::Worker> worker;
  std::atomic<uint64_t> ops_executed{0};

  /// Sends a reply (header copied; `payload` must live until sent: `keep_alive` holds it). From
  /// any thread: inline when nobody drives the worker, else through the progress thread.
  void reply(transport::Endpoint& to, const flatbuffers::DetachedBuffer& header, transport::ConstBuffer payload = {},
             std::shared_ptr<void> keep_alive = nullptr);
  /// Answers a failed request: its RemoteDetail (wire::requestError, the executor), else the
  /// nearest ErrorCode to its StatusCode.
  void replyError(transport::Endpoint& to, uint64_t request_id, const Status& error) {
    reply(to, wire::buildError(request_id, error));
  }
  /// What a StatsRequest is answered with.
  virtual wire::StatsArgs collectStats() const = 0;
};

class Session {
 public:
  /// Starts the session's thread. `node` outlives the session.
  Session(NodeContext& node, std::shared_ptr<transport::Endpoint> endpoint, wire::Handle id);
  /// stop().
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  /// Queues a verified request of this session (progress thread).
  void enqueue(transport::InboundMessage message);
  /// Ends the session: its thread finishes the request it runs, frees every tensor and exits.
  /// Idempotent; joins the thread.
  void stop();
  const std::shared_ptr<transport::Endpoint>& endpoint() const { return endpoint_; }

 private:
  void run();
  void handle(transport::InboundMessage& message, const wire::Message& msg);
  Status putTensors(transport::InboundMessage& message, const wire::PutTensors& put);
  void getTensors(uint64_t id, const wire::GetTensors& get);
  void registerGraph(uint64_t id, const wire::RegisterGraph& reg);
  void runGraph(uint64_t id, transport::InboundMessage& message, const wire::RunGraph& run);
  Status receive(transport::InboundMessage& message, void* destination, size_t bytes);
  void sendTensors(uint64_t id, bool run_result, const std::vector<std::pair<wire::Handle, at::Tensor>>& tensors,
                   uint64_t exec_us, std::span<const wire::TensorSlotArgs> described = {});
  /// Binds every graph input: RunGraph.inputs first, then the graph's bound handles.
  Status bindInputs(transport::InboundMessage& message, const wire::RunGraph& run, const CompiledGraph& graph,
                    std::vector<at::Tensor>& inputs);
  /// Applies RunGraph.outputs to the run's values: keeps, returns and describes them. All or
  /// nothing: on an error the outputs kept so far are released.
  Status applyOutputs(const wire::RunGraph& run, const std::vector<at::Tensor>& values,
                      std::vector<std::pair<wire::Handle, at::Tensor>>& returned,
                      std::vector<wire::TensorSlotArgs>& described);

  NodeContext& node;
  std::shared_ptr<transport::Endpoint> endpoint_;
  wire::Handle id_;
  SessionMemory memory{node.session_memory_limit};  // guarded by node.memory
  std::thread thread;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<transport::InboundMessage> queue;
  std::atomic<size_t> queued{0};             // queue.size(), readable without the mutex
  std::atomic<bool> stopping{false};         // set under the mutex; the leader reads it without
  TensorStore tensors{node.memory, memory};  // session thread only
};

}  // namespace genie::node
