// Session: one client's session on genie-node, and NodeContext, the node as sessions see it.
//
// A session owns its resident tensors (TensorStore) and one thread that runs its requests in
// order: PutTensors, GetTensors, FreeTensors, RegisterGraph, RunGraph, StatsRequest,
// SendTensors. Sessions run concurrently; what they share (the executor, the graph registry,
// the memory accounts, the data plane's worker) is the NodeContext's. While idle, a session's
// thread drives the worker itself (leader/followers) so that its next request needs no wake-up
// (docs/thread_model.md).
//
// Node to node: other nodes' connections attached to the session (Hello.attach_session) put
// tensors into its store; the session thread runs those puts too, also while it waits for its
// own SendTensors to a peer (so two sessions sending to each other at once never wait on each
// other). A session's SendTensors go through the C++ client (genie::client::Client): one
// connection per (peer address, peer session), at most kMaxPeerConnections, closed when the
// session ends.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "genie/client/client.h"
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
  /// NodeConfig::idle_poll: the longest an idle session thread goes on leading.
  std::chrono::microseconds idle_poll{0};
  /// NodeConfig::direct_device_uploads.
  bool direct_device_uploads = false;
  std::shared_ptr<transport::Worker> worker;
  std::atomic<uint64_t> ops_executed{0};
  /// Node-to-node transfers (Stats.peer_*): bytes (headers + payloads) sent to other nodes'
  /// sessions and received from other nodes on attached connections; transfers made
  /// (SendTensors served) and received (attached PutTensors).
  std::atomic<uint64_t> peer_bytes_sent{0};
  std::atomic<uint64_t> peer_bytes_received{0};
  std::atomic<uint64_t> peer_transfers{0};
  /// The data plane's settings of the connections sessions open to other nodes (SendTensors),
  /// and the client name they say Hello with.
  transport::WorkerConfig peer_transport;
  std::string peer_client_name = "genie-node";

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

/// Connections to other nodes' sessions one session keeps open for SendTensors; past it the
/// least recently used one is closed first (docs/security.md).
inline constexpr size_t kMaxPeerConnections = 8;

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
  /// Queues a verified PutTensors that came on a connection attached to this session (another
  /// node's SendTensors); it is answered on that connection (progress thread).
  void enqueueAttached(transport::InboundMessage message);
  /// The session's id (Welcome.session_id).
  const wire::Handle& id() const { return id_; }
  /// Ends the session: its thread finishes the request it runs, frees every tensor and exits.
  /// Idempotent; joins the thread.
  void stop();
  const std::shared_ptr<transport::Endpoint>& endpoint() const { return endpoint_; }

 private:
  void run();
  /// Waits for the next request by driving the worker (leader/followers): 200 µs, or up to
  /// twice the last gap between requests when it was at most node.idle_poll. Returns early
  /// when another thread holds or asks for the worker.
  void lead();
  void handle(transport::InboundMessage& message, const wire::Message& msg);
  Status putTensors(transport::InboundMessage& message, const wire::PutTensors& put);
  void getTensors(uint64_t id, const wire::GetTensors& get);
  void registerGraph(uint64_t id, const wire::RegisterGraph& reg);
  void runGraph(uint64_t id, transport::InboundMessage& message, const wire::RunGraph& run);
  /// SendTensors: puts this session's tensors into a session of another node, as its client.
  void sendToPeer(uint64_t id, const wire::SendTensors& send);
  /// Runs `work` on a helper thread and meanwhile runs the attached puts that arrive; returns
  /// once `work` returned.
  void runServingAttached(const std::function<void()>& work);
  /// Runs one PutTensors of an attached connection and answers it there.
  void handleAttached(transport::InboundMessage& message);
  Status receive(transport::InboundMessage& message, void* destination, size_t bytes,
                 transport::MemoryType memory = transport::MemoryType::kHost);
  /// The payload into `parts` in order (host memory, sizes adding up to the payload's).
  Status receive(transport::InboundMessage& message, std::vector<transport::Buffer> parts);
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
  std::deque<transport::InboundMessage> attached_queue;  // PutTensors of attached connections
  std::atomic<size_t> queued{0};             // both queues' sizes, readable without the mutex
  std::atomic<bool> stopping{false};         // set under the mutex; the leader reads it without
  /// When this thread last finished a request, and the gap before the request after it
  /// (0 when it was longer than node.idle_poll): lead()'s window. Session thread only.
  std::chrono::steady_clock::time_point idle_since_{};
  std::chrono::microseconds last_gap_{0};
  TensorStore tensors{node.memory, memory};  // session thread only
  /// A connection to a session of another node (SendTensors), reused by later sends there.
  struct PeerLink {
    std::string address;           // "host:port" as the SendTensors named it
    wire::Handle peer_session{};   // the session it is attached to there
    std::unique_ptr<client::Client> client;
    uint64_t last_used = 0;        // sends_ when it was last used (least recently used goes first)
  };
  std::vector<PeerLink> peers;  // session thread only; at most kMaxPeerConnections
  uint64_t sends_ = 0;          // SendTensors run so far (session thread only)
};

}  // namespace genie::node
