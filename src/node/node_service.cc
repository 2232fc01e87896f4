#include "genie/node/node_service.h"

#include <ATen/ATen.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/random.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "genie/log.h"
#include "genie/node/executor.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"
#include "genie/wire/codec.h"
#include "graph_registry.h"
#include "memory_account.h"
#include "tensor_store.h"

namespace genie::node {

using transport::ConstBuffer;
using transport::Endpoint;
using transport::InboundMessage;
using wire::ErrorCode;

namespace {

using Clock = std::chrono::steady_clock;

/// After handing a request to a session thread, the progress thread's next polls that find
/// nothing yield the core this many times (~1 µs each). A 1-op RunGraph over loopback on 2
/// vCPUs: 31 -> 18 µs (sm), 47 -> 37 µs (tcp), docs/perf/node.md. Yielding on every empty
/// poll instead slowed long graphs' OpenMP kernels (WorkerConfig::yield_while_polling).
constexpr unsigned kHandOffYieldPolls = 64;

/// Leader/followers (D. Schmidt et al., "Leader/Followers", PLoPD 2000): a session thread with
/// nothing to do drives the transport's worker itself for this long (µs) before it sleeps,
/// unless another thread already does, so that the callback of its next request runs on it
/// and the request needs no wake-up. The dedicated progress thread stands aside meanwhile.
constexpr std::chrono::microseconds kSessionLeaderPoll{200};
/// A session thread receiving a request's payload drives the worker for this long (µs)
/// before it waits for the progress thread to finish the receive.
constexpr std::chrono::microseconds kReceivePoll{1000};

wire::Handle randomHandle() {
  uint64_t words[2] = {0, 0};
  while (words[0] == 0 && words[1] == 0) {
    if (getrandom(words, sizeof(words), 0) != sizeof(words)) words[0] = Clock::now().time_since_epoch().count();
  }
  return wire::Handle(words[0], words[1]);
}


/// Failed Hellos (wrong token) a connection may send before it is closed.
constexpr int kMaxFailedHellos = 3;

/// A digest of an auth token, so that tokens of any length compare in constant time.
using TokenDigest = std::array<unsigned char, crypto_generichash_BYTES>;

TokenDigest digestOf(std::string_view token) {
  TokenDigest digest{};
  crypto_generichash(digest.data(), digest.size(), reinterpret_cast<const unsigned char*>(token.data()), token.size(),
                     nullptr, 0);
  return digest;
}

/// Allocates an empty tensor laid out as `desc` on `device` (its whole storage span).
at::Tensor allocate(const wire::TensorDesc& desc, c10::Device device) {
  auto dtype = Executor::scalarType(desc.dtype());
  std::vector<int64_t> shape(desc.shape()->begin(), desc.shape()->end());
  auto options = at::TensorOptions().dtype(*dtype).device(device);
  if (desc.nbytes() == 0) return at::empty(shape, options);
  std::vector<int64_t> strides;
  if (desc.strides() && desc.strides()->size()) {
    strides.assign(desc.strides()->begin(), desc.strides()->end());
  } else {
    auto contiguous = c10::contiguous_strides(shape);
    strides.assign(contiguous.begin(), contiguous.end());
  }
  const int64_t elements = static_cast<int64_t>(desc.nbytes() / c10::elementSize(*dtype));
  return at::empty({elements}, options).as_strided(shape, strides, desc.storage_offset());
}

/// Moves a tensor received in host memory (laid out as `desc`) to the node's device, storage
/// span and all. On the CPU it is the tensor itself; on a GPU it is one staged copy (the
/// payload lands in host memory first; UCX could write device memory directly where it is
/// built with CUDA, which is not done yet).
at::Tensor onDevice(at::Tensor host, const wire::TensorDesc& desc, c10::Device device) {
  if (device.is_cpu()) return host;
  at::Tensor placed = allocate(desc, device);
  if (desc.nbytes() == 0) return placed;
  const auto bytes = static_cast<int64_t>(desc.nbytes());
  at::Tensor to = at::from_blob(placed.storage().mutable_data(), {bytes}, at::TensorOptions().dtype(at::kByte).device(device));
  at::Tensor from = at::from_blob(host.storage().mutable_data(), {bytes}, at::TensorOptions().dtype(at::kByte));
  to.copy_(from);
  return placed;
}

/// The bytes of a tensor's storage span, as they travel (wire::TensorDesc.nbytes).
std::byte* storageBytes(const at::Tensor& t) {
  return static_cast<std::byte*>(t.storage().mutable_data());
}

struct Session;

}  // namespace

// ---- the service ------------------------------------------------------------------------

struct NodeService::Impl {
  NodeConfig config;
  c10::Device device{c10::kCPU};
  Executor executor{c10::Device(c10::kCPU)};
  std::shared_ptr<transport::Worker> worker;
  std::unique_ptr<transport::Listener> listener;
  NodeMemory memory;
  TokenDigest token_digest{};  // of config.auth_token (when set)
  Clock::time_point started = Clock::now();

  GraphRegistry graphs{executor};

  // Progress thread only (and stop()): open connections (with their failed Hellos), and the
  // sessions said Hello on them.
  struct Connection {
    std::shared_ptr<Endpoint> endpoint;
    int failed_hellos = 0;
  };
  std::unordered_map<const Endpoint*, Connection> connections;
  std::unordered_map<const Endpoint*, std::shared_ptr<Session>> sessions;
  // Sessions being ended: one thread (the reaper) stops them in turn, off the progress thread
  // (stopping joins the session's thread, which frees its memory, after its current request).
  std::mutex ending_mutex;
  std::condition_variable ending_cv;
  std::deque<std::shared_ptr<Session>> ending;
  bool reaper_stop = false;
  std::thread reaper;
  std::atomic<uint32_t> session_count{0};
  /// A session's effective memory limit in bytes: the smaller nonzero of its quota and the
  /// node's limit; 0: none.
  uint64_t sessionMemoryLimit() const {
    const uint64_t quota = config.session_memory_limit, node_limit = config.memory_limit;
    if (quota == 0 || node_limit == 0) return std::max(quota, node_limit);
    return std::min(quota, node_limit);
  }
  std::atomic<uint64_t> ops_executed{0};
  bool stopped = false;

  Impl(const NodeConfig& c, c10::Device d) : config(c), device(d), executor(d), memory(c.memory_limit) {}

  /// The reaper thread: ends the sessions handed to it, one at a time, until stop().
  void reapEndedSessions();

  void onMessage(InboundMessage message);
  void onEndpointError(const std::shared_ptr<Endpoint>& endpoint);
  /// Removes a session and ends it on another thread (progress thread).
  void endSession(const Endpoint* endpoint);
  void reply(Endpoint& to, const flatbuffers::DetachedBuffer& header, ConstBuffer payload = {},
             std::shared_ptr<void> keep_alive = nullptr);
  wire::StatsArgs collectStats() const {
    wire::StatsArgs stats;
    stats.sessions = session_count.load();
    uint64_t by_class[4];
    memory.snapshot(by_class);
    for (int r = 0; r < 4; ++r) stats.resident.emplace_back(static_cast<wire::Residency>(r), by_class[r]);
    {
      stats.graphs_cached = graphs.size();
    }
    stats.ops_executed = ops_executed.load();
    stats.bytes_in = worker->bytesReceived();
    stats.bytes_out = worker->bytesSent();
    stats.memory_limit = memory.limit();
    stats.uptime_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count();
    return stats;
  }
  /// Answers a failed request: its RemoteDetail (wire::requestError, the executor), else the
  /// nearest ErrorCode to its StatusCode.
  void replyError(Endpoint& to, uint64_t request_id, const Status& error) {
    reply(to, wire::buildError(request_id, error));
  }
};

namespace {

/// One client's session: its handles, and the thread that runs its requests in order.
struct Session {
  Session(NodeService::Impl& node, std::shared_ptr<Endpoint> endpoint, wire::Handle id)
      : node(node), endpoint(std::move(endpoint)), id(id) {
    thread = std::thread([this] { run(); });
  }
  ~Session() { stop(); }

  void enqueue(InboundMessage message) {
    std::lock_guard<std::mutex> lock(mutex);
    queue.push_back(std::move(message));
    queued.fetch_add(1, std::memory_order_release);
    cv.notify_one();
  }
  /// Ends the session: its thread drains, frees every tensor and exits.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping && !thread.joinable()) return;
      stopping = true;
      cv.notify_one();
    }
    if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) thread.join();
  }

  void run();
  void handle(InboundMessage& message, const wire::Message& msg);
  Status putTensors(InboundMessage& message, const wire::PutTensors& put);
  void getTensors(uint64_t id, const wire::GetTensors& get);
  void registerGraph(uint64_t id, const wire::RegisterGraph& reg);
  void runGraph(uint64_t id, InboundMessage& message, const wire::RunGraph& run);
  Status receive(InboundMessage& message, void* destination, size_t bytes);
  void sendTensors(uint64_t id, bool run_result, const std::vector<std::pair<wire::Handle, at::Tensor>>& tensors,
                   uint64_t exec_us, std::span<const wire::TensorSlotArgs> described = {});
  /// Binds every graph input: RunGraph.inputs first, then the graph's bound handles.
  Status bindInputs(InboundMessage& message, const wire::RunGraph& run, const CompiledGraph& graph,
                                         std::vector<at::Tensor>& inputs);
  /// Applies RunGraph.outputs to the run's values: keeps, returns and describes them. All or
  /// nothing: on an error the outputs kept so far are released.
  Status applyOutputs(const wire::RunGraph& run, const std::vector<at::Tensor>& values,
                                           std::vector<std::pair<wire::Handle, at::Tensor>>& returned,
                                           std::vector<wire::TensorSlotArgs>& described);

  NodeService::Impl& node;
  std::shared_ptr<Endpoint> endpoint;
  wire::Handle id;
  SessionMemory memory{node.config.session_memory_limit};  // guarded by node.memory
  std::thread thread;
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<InboundMessage> queue;
  std::atomic<size_t> queued{0};             // queue.size(), readable without the mutex
  std::atomic<bool> stopping{false};         // set under the mutex; the leader reads it without
  TensorStore tensors{node.memory, memory};  // session thread only
};

void Session::run() {
  pthread_setname_np(pthread_self(), "genie-session");  // else it inherits its creator's name
  reportMemoryOfThisThread();
  for (;;) {
    std::optional<InboundMessage> message;
    if (queued.load(std::memory_order_acquire) == 0 && !stopping.load(std::memory_order_acquire)) {
      // Lead: wait for the next request by driving the worker (kSessionLeaderPoll).
      node.worker->drive(
          {},
          [this] { return queued.load(std::memory_order_acquire) != 0 || stopping.load(std::memory_order_acquire); },
          kSessionLeaderPoll, transport::Worker::Takeover::kUnlessAnotherCaller);
    }
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return stopping || !queue.empty(); });
      if (queue.empty()) break;
      message.emplace(std::move(queue.front()));
      queue.pop_front();
      queued.fetch_sub(1, std::memory_order_relaxed);
    }
    // Verified on the progress thread; the header bytes are the message's own.
    const wire::Message* msg = flatbuffers::GetRoot<wire::Message>(message->header().data());
    try {
      handle(*message, *msg);
    } catch (const std::exception& e) {
      node.replyError(*endpoint, msg->request_id(), wire::requestError(ErrorCode::Internal, e.what()));
    }
  }
  // The session ends: everything it held is freed.
  tensors.clear();
  GENIE_LOG_INFO("session {} from {} ended; its tensors are freed", wire::toString(id), endpoint->peer());
}

Status Session::receive(InboundMessage& message, void* destination, size_t bytes) {
  std::promise<Status> done;
  auto future = done.get_future();
  std::atomic<bool> received{false};
  // Drive the receive from here for a while (the progress thread may be standing aside).
  auto start = [&] {
    message.receivePayload({destination, bytes}, [&done, &received](Status s) {
      received.store(true, std::memory_order_release);  // before: set_value may end this frame
      done.set_value(std::move(s));
    });
  };
  node.worker->drive(std::ref(start), [&received] { return received.load(std::memory_order_acquire); }, kReceivePoll);
  return future.get();  // bounded by the transport: a dead peer fails it within the peer timeout
}

void Session::handle(InboundMessage& message, const wire::Message& msg) {
  const uint64_t id = msg.request_id();
  switch (msg.body_type()) {
    case wire::Body::PutTensors: {
      if (Status error = putTensors(message, *msg.body_as_PutTensors()); !error) return node.replyError(*endpoint, id, error);
      node.reply(*endpoint, wire::buildAck(id, msg.body_as_PutTensors()->tensors()->size()));
      return;
    }
    case wire::Body::GetTensors: return getTensors(id, *msg.body_as_GetTensors());
    case wire::Body::FreeTensors: {
      const auto* handles = msg.body_as_FreeTensors()->handles();
      uint32_t freed = 0;
      for (uint32_t i = 0; handles && i < handles->size(); ++i) freed += tensors.release(*handles->Get(i));
      if (msg.body_as_FreeTensors()->want_reply()) node.reply(*endpoint, wire::buildAck(id, freed));
      return;
    }
    case wire::Body::RegisterGraph: return registerGraph(id, *msg.body_as_RegisterGraph());
    case wire::Body::RunGraph: return runGraph(id, message, *msg.body_as_RunGraph());
    case wire::Body::StatsRequest: return node.reply(*endpoint, wire::buildStats(id, node.collectStats()));
    default:
      node.replyError(*endpoint, id, wire::requestError(ErrorCode::InvalidMessage,
                                      fmt::format("genie-node does not serve {}", wire::bodyName(msg.body_type()))));
  }
}

Status Session::putTensors(InboundMessage& message, const wire::PutTensors& put) {
  const auto* slots = put.tensors();
  // Each tensor's bytes are reserved before its payload is received: an upload over the
  // session's quota or the node's limit is refused without pulling its bytes (rendezvous).
  uint32_t reserved = 0;
  auto unreserve = [&] {
    for (uint32_t i = 0; i < reserved; ++i) {
      node.memory.release(memory, slots->Get(i)->desc()->nbytes(), slots->Get(i)->residency());
    }
  };
  auto refuse = [&](Status error) {
    unreserve();
    message.releasePayload();
    return error;
  };
  for (; reserved < slots->size(); ++reserved) {
    const wire::TensorSlot* slot = slots->Get(reserved);
    if (tensors.contains(*slot->handle())) {
      return refuse(wire::requestError(ErrorCode::DuplicateHandle, fmt::format("PutTensors.tensors[{}]: handle {} is already in use",
                                                             reserved, wire::toString(*slot->handle()))));
    }
    if (auto error = node.memory.reserve(memory, slot->desc()->nbytes(), slot->residency())) {
      return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors.tensors[{}]: {}", reserved, *error)));
    }
  }
  std::vector<at::Tensor> made;
  try {
    for (uint32_t i = 0; i < slots->size(); ++i) {
      made.push_back(allocate(*slots->Get(i)->desc(), c10::Device(c10::kCPU)));  // payloads land in host memory
    }
  } catch (const std::exception& e) {
    return refuse(wire::requestError(ErrorCode::OutOfMemory, fmt::format("PutTensors.tensors[{}]: {}", made.size(), e.what())));
  }
  // Payload: straight into the storage when it is one tensor, else one staging copy.
  if (message.payloadSize() > 0) {
    if (slots->size() == 1 && slots->Get(0)->payload_offset() == 0 && made[0].storage().nbytes() == message.payloadSize()) {
      Status received = receive(message, storageBytes(made[0]), message.payloadSize());
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
    } else {
      std::vector<std::byte> staging(message.payloadSize());
      Status received = receive(message, staging.data(), staging.size());
      if (!received) return refuse(wire::requestError(ErrorCode::PeerUnreachable, received.message()));
      for (uint32_t i = 0; i < slots->size(); ++i) {
        const auto* slot = slots->Get(i);
        std::memcpy(storageBytes(made[i]), staging.data() + slot->payload_offset(), slot->desc()->nbytes());
      }
    }
  }
  for (uint32_t i = 0; i < slots->size(); ++i) {
    const auto* slot = slots->Get(i);
    made[i] = onDevice(std::move(made[i]), *slot->desc(), node.device);
    // Reserved above, each a new storage. A handle named twice in this message fails here.
    if (Status error = tensors.store(*slot->handle(), made[i], slot->residency(), /*reserved=*/true); !error) {
      for (uint32_t j = i; j < slots->size(); ++j) {
        node.memory.release(memory, slots->Get(j)->desc()->nbytes(), slots->Get(j)->residency());
      }
      for (uint32_t j = 0; j < i; ++j) tensors.release(*slots->Get(j)->handle());
      return wire::requestError(wire::errorCodeOf(error), fmt::format("PutTensors.tensors[{}]: {}", i, error.message()));
    }
  }
  return Status::ok();
}

void Session::sendTensors(uint64_t id, bool run_result, const std::vector<std::pair<wire::Handle, at::Tensor>>& out,
                          uint64_t exec_us, std::span<const wire::TensorSlotArgs> described) {
  // Returned tensors travel from host memory, contiguous, one payload: zero-copy for a single
  // contiguous host tensor. The bytes are the logical values: a conjugate or negative view
  // (fft.ifft's output has the conj bit) is resolved first, since the wire has no such bits.
  std::vector<wire::TensorSlotArgs> slots;
  std::vector<at::Tensor> contiguous;
  slots.reserve(out.size());
  contiguous.reserve(out.size());
  wire::PayloadLayout layout;
  for (const auto& [handle, tensor] : out) {
    at::Tensor t = tensor;
    if (t.defined()) {
      // Each step is a dispatcher call: only where needed (a CPU node's tensors are in host
      // memory already; the conj/neg bits are rare).
      if (!t.is_cpu()) t = t.cpu();
      if (t.is_conj()) t = t.resolve_conj();
      if (t.is_neg()) t = t.resolve_neg();
      t = t.contiguous();
    }
    wire::TensorSlotArgs slot;
    slot.handle = handle;
    slot.desc.dtype = t.defined() ? Executor::wireDType(t.scalar_type()) : wire::DType::Float32;
    slot.desc.shape = t.defined() ? t.sizes().vec() : std::vector<int64_t>{0};
    slot.payload_offset = layout.add(t.defined() ? t.nbytes() : 0);
    slots.push_back(std::move(slot));
    contiguous.push_back(std::move(t));
  }
  auto header = run_result ? wire::buildRunResult(id, slots, exec_us, described) : wire::buildTensorData(id, slots);
  if (!header) return node.replyError(*endpoint, id, wire::requestError(ErrorCode::Internal, header.status().message()));
  if (contiguous.size() == 1 && contiguous[0].defined() && layout.size() == contiguous[0].nbytes()) {
    auto keep = std::make_shared<at::Tensor>(contiguous[0]);
    node.reply(*endpoint, *header, {keep->data_ptr(), layout.size()}, keep);
    return;
  }
  auto staging = std::make_shared<std::vector<std::byte>>(layout.size());
  for (size_t i = 0; i < contiguous.size(); ++i) {
    if (contiguous[i].defined() && contiguous[i].nbytes()) {
      std::memcpy(staging->data() + slots[i].payload_offset, contiguous[i].data_ptr(), contiguous[i].nbytes());
    }
  }
  node.reply(*endpoint, *header, {staging->data(), staging->size()}, staging);
}

void Session::getTensors(uint64_t id, const wire::GetTensors& get) {
  std::vector<std::pair<wire::Handle, at::Tensor>> out;
  for (uint32_t i = 0; i < get.handles()->size(); ++i) {
    const wire::Handle& handle = *get.handles()->Get(i);
    const at::Tensor* tensor = tensors.find(handle);
    if (tensor == nullptr) {
      return node.replyError(*endpoint, id, wire::requestError(ErrorCode::UnknownHandle,
                                             fmt::format("GetTensors.handles[{}]: no tensor {} in this session", i,
                                                         wire::toString(handle))));
    }
    out.emplace_back(handle, *tensor);
  }
  sendTensors(id, false, out, 0);
}

void Session::registerGraph(uint64_t id, const wire::RegisterGraph& reg) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(reg.graph()->data()), reg.graph()->size());
  auto registered = node.graphs.add(bytes, *reg.graph_nested_root());
  if (!registered) return node.replyError(*endpoint, id, registered.status());
  node.reply(*endpoint, wire::buildGraphRegistered(id, registered->id, registered->graph->nodes().size()));
}

void Session::runGraph(uint64_t id, InboundMessage& message, const wire::RunGraph& run) {
  // Frees ride on the run and come first, whatever becomes of the run (FreeTensors semantics:
  // unknown handles are ignored).
  for (uint32_t i = 0; run.free() && i < run.free()->size(); ++i) tensors.release(*run.free()->Get(i));
  std::shared_ptr<const CompiledGraph> graph = node.graphs.find(*run.graph_id());
  if (!graph) {
    message.releasePayload();
    return node.replyError(*endpoint, id, wire::requestError(ErrorCode::UnknownGraph,
                                           fmt::format("graph {} is not registered", wire::toString(*run.graph_id()))));
  }
  std::vector<at::Tensor> inputs(graph->numInputs());
  if (Status error = bindInputs(message, run, *graph, inputs); !error) return node.replyError(*endpoint, id, error);
  std::vector<ScalarSlotValue> scalars(graph->numScalarInputs(), int64_t{0});
  const auto* scalar_bindings = run.scalars();
  for (uint32_t i = 0; scalar_bindings && i < scalar_bindings->size(); ++i) {
    const wire::ScalarBinding* s = scalar_bindings->Get(i);
    if (s->slot() >= scalars.size()) {
      return node.replyError(*endpoint, id, wire::requestError(ErrorCode::InvalidMessage,
                                             fmt::format("RunGraph.scalars[{}]: slot {} out of range", i, s->slot())));
    }
    if (s->value_type() == wire::Value::IntValue) scalars[s->slot()] = s->value_as_IntValue()->v();
    if (s->value_type() == wire::Value::DoubleValue) scalars[s->slot()] = s->value_as_DoubleValue()->v();
    if (s->value_type() == wire::Value::BoolValue) scalars[s->slot()] = s->value_as_BoolValue()->v();
  }
  auto start = Clock::now();
  Result<std::vector<at::Tensor>> result = Status(StatusCode::kInternal, "the run did not run");
  {
    // The run's allocations count against the session's quota and the node's limit.
    RunMemoryScope run_memory(node.memory, memory);
    result = node.executor.run(*graph, inputs, scalars, &run_memory.over());
  }
  if (!result) return node.replyError(*endpoint, id, result.status());
  node.ops_executed += graph->nodes().size();
  auto exec_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
  std::vector<std::pair<wire::Handle, at::Tensor>> returned;
  std::vector<wire::TensorSlotArgs> described;
  if (Status error = applyOutputs(run, *result, returned, described); !error) {
    return node.replyError(*endpoint, id, error);
  }
  sendTensors(id, true, returned, static_cast<uint64_t>(exec_us), described);
}

Status Session::bindInputs(InboundMessage& message, const wire::RunGraph& run,
                                                const CompiledGraph& graph, std::vector<at::Tensor>& inputs) {
  // Explicit bindings: resident tensors by handle, or small tensors inline in the payload.
  std::vector<std::byte> staging;
  if (message.payloadSize() > 0) {
    staging.resize(message.payloadSize());
    if (Status received = receive(message, staging.data(), staging.size()); !received) {
      return wire::requestError(ErrorCode::PeerUnreachable, received.message());
    }
  }
  const auto* bindings = run.inputs();
  for (uint32_t i = 0; bindings && i < bindings->size(); ++i) {
    const wire::InputBinding* binding = bindings->Get(i);
    if (binding->input() >= inputs.size()) {
      return wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph.inputs[{}]: input {} of a graph with {} inputs",
                                                                 i, binding->input(), inputs.size()));
    }
    if (binding->kind() == wire::BindingKind::Handle) {
      const at::Tensor* tensor = tensors.find(*binding->handle());
      if (tensor == nullptr) {
        return wire::requestError(ErrorCode::UnknownHandle, fmt::format("RunGraph.inputs[{}]: no tensor {} in this session", i,
                                                                  wire::toString(*binding->handle())));
      }
      inputs[binding->input()] = *tensor;
    } else {
      const wire::TensorSlot* slot = binding->inline_();
      at::Tensor t = allocate(*slot->desc(), c10::Device(c10::kCPU));
      if (slot->desc()->nbytes()) std::memcpy(storageBytes(t), staging.data() + slot->payload_offset(), slot->desc()->nbytes());
      inputs[binding->input()] = onDevice(std::move(t), *slot->desc(), node.device);
    }
  }
  // Bound inputs (Graph.inputs[i].handle) not bound explicitly: this session's tensor.
  const auto& bound = graph.inputHandles();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined()) continue;
    if (i < bound.size() && !wire::isNull(bound[i])) {
      const at::Tensor* tensor = tensors.find(bound[i]);
      if (tensor == nullptr) {
        return wire::requestError(ErrorCode::UnknownHandle,
                            fmt::format("RunGraph: input {} is bound by the graph to handle {}, which is not a tensor "
                                        "in this session (bind the input explicitly or put the tensor first)",
                                        i, wire::toString(bound[i])));
      }
      inputs[i] = *tensor;
      continue;
    }
    return wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph: input {} is not bound", i));
  }
  return Status::ok();
}

/// The descriptor of a tensor as it lives on the node: its own strides and storage offset.
wire::TensorDescArgs describe(const at::Tensor& t) {
  wire::TensorDescArgs desc;
  desc.dtype = Executor::wireDType(t.scalar_type());
  desc.shape = t.sizes().vec();
  desc.strides = t.strides().vec();
  desc.storage_offset = t.storage_offset();
  desc.memory = t.is_cuda() ? wire::MemoryKind::Cuda : wire::MemoryKind::Host;
  desc.device_index = t.is_cuda() ? t.device().index() : 0;
  return desc;
}

Status Session::applyOutputs(const wire::RunGraph& run, const std::vector<at::Tensor>& values,
                                                  std::vector<std::pair<wire::Handle, at::Tensor>>& returned,
                                                  std::vector<wire::TensorSlotArgs>& described) {
  std::vector<wire::Handle> kept;
  auto fail = [&](Status error) {
    for (const auto& handle : kept) tensors.release(handle);
    returned.clear();
    described.clear();
    return error;
  };
  const auto* outputs = run.outputs();
  for (uint32_t i = 0; outputs && i < outputs->size(); ++i) {
    const wire::OutputSpec* spec = outputs->Get(i);
    if (spec->value() >= values.size()) {
      return fail(wire::requestError(ErrorCode::InvalidMessage, fmt::format("RunGraph.outputs[{}]: value {} of a graph with {} values", i,
                                                          spec->value(), values.size())));
    }
    const at::Tensor& value = values[spec->value()];
    const wire::OutputAction action = spec->action();
    if (action != wire::OutputAction::Return) {
      if (!value.defined()) {
        return fail(wire::requestError(ErrorCode::InvalidMessage,
                     fmt::format("RunGraph.outputs[{}]: value {} is None and cannot be kept", i, spec->value())));
      }
      if (Status error = tensors.store(*spec->handle(), value, spec->residency()); !error) {
        return fail(wire::requestError(wire::errorCodeOf(error), fmt::format("RunGraph.outputs[{}]: {}", i, error.message())));
      }
      kept.push_back(*spec->handle());
    }
    if (action == wire::OutputAction::Return || action == wire::OutputAction::ReturnAndKeep) {
      returned.emplace_back(spec->handle() ? *spec->handle() : wire::Handle(), value);
    }
    if (action == wire::OutputAction::KeepAndDescribe) {
      wire::TensorSlotArgs slot;
      slot.handle = *spec->handle();
      slot.desc = describe(value);
      slot.residency = spec->residency();
      if (slot.desc.dtype == wire::DType::Undefined) {
        return fail(wire::requestError(ErrorCode::Internal, fmt::format("RunGraph.outputs[{}]: value {} has dtype {}, which the wire "
                                                      "cannot describe", i, spec->value(), c10::toString(value.scalar_type()))));
      }
      described.push_back(std::move(slot));
    }
  }
  return Status::ok();
}

}  // namespace

void NodeService::Impl::reply(Endpoint& to, const flatbuffers::DetachedBuffer& header, ConstBuffer payload,
                              std::shared_ptr<void> keep_alive) {
  auto send = [&] {
    to.send(wire::bytesOf(header), payload, [keep_alive = std::move(keep_alive)](Status s) {
      if (!s) GENIE_LOG_DEBUG("reply not delivered: {}", s.message());
    });
  };
  // On the progress thread, inline. From a session thread: inline when nobody holds the worker
  // (the progress thread sleeps, or stands aside after this thread led), else handed to the
  // progress thread, which is polling. std::ref: the std::function holds a reference, not a
  // heap copy of the lambda (kOnlyIfFree never keeps `start` past the call).
  if (!worker->drive(std::ref(send), [] { return true; }, std::chrono::microseconds(0),
                     transport::Worker::Takeover::kOnlyIfFree)) {
    send();
  }
}

void NodeService::Impl::onMessage(InboundMessage message) {
  std::shared_ptr<Endpoint> from = message.endpoint();
  auto verified = wire::verifyMessage(message.header(), message.payloadSize());
  if (!verified) {
    GENIE_LOG_WARN("refused a message from {}: {}", from->peer(), verified.status().message());
    replyError(*from, 0, wire::requestError(ErrorCode::InvalidMessage, verified.status().message()));
    return;
  }
  const wire::Message* msg = verified.value();
  const uint64_t id = msg->request_id();
  auto session = sessions.find(from.get());
  switch (msg->body_type()) {
    case wire::Body::Hello: {
      const wire::Hello* hello = msg->body_as_Hello();
      if (hello->protocol_version() != wire::kProtocolVersion) {
        return replyError(*from, id, wire::requestError(ErrorCode::UnsupportedVersion,
                                      fmt::format("protocol version {} is not supported; this node speaks {}",
                                                  hello->protocol_version(), wire::kProtocolVersion)));
      }
      if (!config.auth_token.empty()) {
        // Constant time: both tokens are hashed, then compared with libsodium's sodium_memcmp.
        const TokenDigest presented = digestOf(wire::stringOf(hello->auth_token()));
        if (sodium_memcmp(presented.data(), token_digest.data(), presented.size()) != 0) {
          auto connection = connections.find(from.get());
          const int failed = connection == connections.end() ? kMaxFailedHellos : ++connection->second.failed_hellos;
          GENIE_LOG_WARN("refused a session from {}: wrong auth token ({} of {} tries)", from->peer(), failed,
                         kMaxFailedHellos);
          replyError(*from, id, wire::requestError(ErrorCode::Unauthenticated, "wrong auth token"));
          if (failed >= kMaxFailedHellos) {
            from->close();  // flushes the reply first
            connections.erase(from.get());
          }
          return;
        }
      }
      if (session != sessions.end()) {
        return replyError(*from, id, wire::requestError(ErrorCode::InvalidMessage, "this connection already has a session"));
      }
      from->admitFromProgressThread();
      wire::Handle session_id = randomHandle();
      sessions.emplace(from.get(), std::make_shared<Session>(*this, from, session_id));
      ++session_count;
      GENIE_LOG_INFO("session {} for '{}' (pid {}) from {}", wire::toString(session_id), wire::stringOf(hello->client_name()),
                     hello->pid(), from->peer());
      wire::WelcomeArgs welcome;
      welcome.session_id = session_id;
      welcome.node_name = config.name;
      welcome.device = config.device;
      welcome.memory_limit = sessionMemoryLimit();
      welcome.max_header_bytes = wire::VerifyLimits{}.max_header_bytes;
      return reply(*from, wire::buildWelcome(id, welcome));
    }
    case wire::Body::Ping:
      if (session == sessions.end()) break;  // before a session, only Hello is answered
      message.releasePayload();
      return reply(*from, wire::buildPong(id, msg->body_as_Ping()->timestamp_ns()));
    case wire::Body::Goodbye:
      return endSession(from.get());
    default:
      break;  // StatsRequest too: ordered after the session's earlier requests
  }
  if (session == sessions.end()) {
    message.releasePayload();
    return replyError(*from, id, wire::requestError(ErrorCode::NotInSession, "say Hello first: this connection has no session"));
  }
  session->second->enqueue(std::move(message));
  // The session thread was likely asleep: on a machine with fewer cores than busy threads,
  // let it run now rather than when the scheduler preempts this poller (docs/thread_model.md).
  worker->yieldPollsFromProgressThread(kHandOffYieldPolls);
}

void NodeService::Impl::endSession(const Endpoint* endpoint) {
  auto session = sessions.find(endpoint);
  if (session == sessions.end()) return;
  std::shared_ptr<Session> closing = std::move(session->second);
  sessions.erase(session);
  --session_count;
  std::lock_guard<std::mutex> lock(ending_mutex);
  ending.push_back(std::move(closing));
  ending_cv.notify_one();
}

void NodeService::Impl::reapEndedSessions() {
  pthread_setname_np(pthread_self(), "genie-reaper");
  reportMemoryOfThisThread();
  std::unique_lock<std::mutex> lock(ending_mutex);
  for (;;) {
    ending_cv.wait(lock, [&] { return reaper_stop || !ending.empty(); });
    if (ending.empty()) return;  // stopping, nothing left
    std::shared_ptr<Session> closing = std::move(ending.front());
    ending.pop_front();
    lock.unlock();
    closing->stop();  // joins its thread, which freed every tensor of the session
    closing.reset();
    lock.lock();
  }
}

void NodeService::Impl::onEndpointError(const std::shared_ptr<Endpoint>& endpoint) {
  if (sessions.count(endpoint.get())) GENIE_LOG_INFO("peer {} is gone: ending its session", endpoint->peer());
  endSession(endpoint.get());
  connections.erase(endpoint.get());
}

NodeService::NodeService(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NodeService::~NodeService() { stop(); }

Result<std::unique_ptr<NodeService>> NodeService::start(const NodeConfig& config) {
  c10::Device device(c10::kCPU);
  try {
    device = c10::Device(config.device);
  } catch (const c10::Error& e) {
    return GENIE_ERROR(kInvalidArgument, "--device '{}': {}", config.device, e.what_without_backtrace());
  }
  if (device.is_cuda() && !at::hasCUDA()) {
    return GENIE_ERROR(kInvalidArgument, "--device {}: this machine has no CUDA device", config.device);
  }
  if (sodium_init() < 0) return GENIE_ERROR(kInternal, "libsodium could not be initialized");
  auto impl = std::make_unique<Impl>(config, device);
  if (!config.auth_token.empty()) impl->token_digest = digestOf(config.auth_token);
  transport::WorkerConfig transport = config.transport;
  transport.name = config.name;
  auto worker = transport::Worker::create(transport);
  if (!worker) return worker.status();
  impl->worker = *worker;
  Impl* raw = impl.get();
  impl->worker->setMessageHandler([raw](InboundMessage m) { raw->onMessage(std::move(m)); });
  impl->worker->setEndpointErrorHandler([raw](std::shared_ptr<Endpoint> e, Status) { raw->onEndpointError(e); });
  GENIE_RETURN_IF_ERROR(impl->worker->startProgressThread());
  impl->worker->post(reportMemoryOfThisThread);  // it frees replies' tensors
  auto listener = impl->worker->listen(config.host, config.port, [raw](std::shared_ptr<Endpoint> endpoint) {
    // Until its Hello succeeds: small messages only, and a deadline (docs/security.md).
    endpoint->requireAdmissionFromProgressThread(raw->config.pre_session_max_bytes, raw->config.hello_timeout);
    const Endpoint* key = endpoint.get();
    raw->connections.emplace(key, Impl::Connection{std::move(endpoint), 0});  // open until the peer goes
  });
  if (!listener) return listener.status();
  impl->listener = std::move(listener.value());
  impl->reaper = std::thread([raw] { raw->reapEndedSessions(); });
  if (config.auth_token.empty()) GENIE_LOG_WARN("no auth token configured: any client is accepted");
  return std::unique_ptr<NodeService>(new NodeService(std::move(impl)));
}

uint16_t NodeService::port() const { return impl_->listener ? impl_->listener->port() : 0; }

wire::StatsArgs NodeService::stats() const { return impl_->collectStats(); }

void NodeService::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  std::vector<std::shared_ptr<Session>> sessions;
  std::promise<void> collected;
  impl_->worker->post([&] {
    for (auto& [endpoint, session] : impl_->sessions) {
      sessions.push_back(session);
      auto bye = wire::buildGoodbye(0, "genie-node is shutting down");
      session->endpoint->send(wire::bytesOf(bye), {}, [](Status) {});
    }
    impl_->sessions.clear();
    impl_->connections.clear();
    collected.set_value();
  });
  collected.get_future().wait();
  for (auto& session : sessions) session->stop();
  sessions.clear();
  {
    std::lock_guard<std::mutex> lock(impl_->ending_mutex);
    impl_->reaper_stop = true;
    impl_->ending_cv.notify_one();
  }
  impl_->reaper.join();  // after every session handed to it has ended
  impl_->session_count = 0;
  impl_->listener.reset();
  impl_->worker->shutdown();
}

}  // namespace genie::node
