// Client (genie/client/client.h): the C++ client of genie-node, one connection and one session.
//
// Over 600 lines: Client::Impl (the pending-request table, reply matching, failures, Goodbye,
// asynchronous runs) and the Client's calls, one per request body; every call goes through
// Impl::call and that one table, so the two halves are one unit.
#include "genie/client/client.h"

#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <unordered_map>

#include "genie/log.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"

namespace genie::client {

using transport::InboundMessage;

namespace {

/// A buffer of `size` bytes at a kPayloadAlignment-aligned address (any dtype may live at
/// any payload_offset inside it).
PayloadBuffer allocatePayload(size_t size) {
  const size_t rounded = (size + wire::kPayloadAlignment - 1) / wire::kPayloadAlignment * wire::kPayloadAlignment;
  void* memory = std::aligned_alloc(wire::kPayloadAlignment, rounded == 0 ? wire::kPayloadAlignment : rounded);
  if (memory == nullptr) throw std::bad_alloc();
  return {std::shared_ptr<std::byte>(static_cast<std::byte*>(memory), [](std::byte* p) { std::free(p); }), size};
}

/// How long a caller drives the worker, waiting for its reply, before it sleeps.
constexpr std::chrono::microseconds kReplyPoll{100};

/// One request waiting for its reply.
struct Pending {
  std::mutex mutex;
  std::condition_variable cv;
  std::atomic<bool> done{false};  // set under `mutex`; also read without it (the caller's brief poll)
  Status status;
  std::vector<std::byte> header;  // 16-byte aligned by the allocator: verifiable in place
  PayloadBuffer payload;
  bool async = false;  // sent by runGraphAsync: nobody waits; the reply only reports a failure

  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mutex);
    status = std::move(s);
    done.store(true, std::memory_order_release);
    cv.notify_all();
  }
};

struct Reply {
  std::vector<std::byte> header;
  PayloadBuffer payload;
  const wire::Message* message() const { return flatbuffers::GetRoot<wire::Message>(header.data()); }
};

}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::string peer;
  std::shared_ptr<transport::Worker> worker;
  std::shared_ptr<transport::Endpoint> endpoint;
  wire::Handle session_id{};
  wire::WelcomeArgs welcome;
  std::atomic<uint64_t> next_request{1};
  std::atomic<uint64_t> bytes_sent{0};
  std::atomic<uint64_t> bytes_received{0};
  std::atomic<uint64_t> messages_sent{0};
  std::atomic<uint64_t> round_trips{0};
  std::atomic<uint64_t> async_runs{0};
  std::atomic<uint64_t> node_exec_us{0};  // RunResult.exec_us summed
  std::mutex resident_mutex;
  ResidentStat resident;  // the session's resident bytes as the replies report them; under resident_mutex

  /// A reply reported the session's resident bytes (Ack, RunResult, Stats).
  void noteResident(uint64_t bytes) {
    std::lock_guard<std::mutex> lock(resident_mutex);
    if (bytes > resident.current) resident.allocated += bytes - resident.current;
    if (bytes < resident.current) resident.freed += resident.current - bytes;
    resident.current = bytes;
    resident.peak = std::max(resident.peak, bytes);
  }
  std::mutex pending_mutex;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  // Asynchronous runs (runGraphAsync): how many await their reply, and the failures not yet
  // taken; both under pending_mutex. async_done is notified when async_in_flight drops.
  size_t async_in_flight = 0;
  std::vector<AsyncFailure> async_failures;
  std::condition_variable async_done;
  bool closed = false;
  // Set once the node said Goodbye (it is shutting down): every request then fails with it.
  std::atomic<bool> node_left{false};
  std::string goodbye;  // the node's reason; written once, before node_left is set

  void onMessage(InboundMessage message) {
    bytes_received += message.header().size() + message.payloadSize();
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified) {
      // Which request it answers cannot be trusted: every request waiting fails with it (kInvalidMessage
      // naming the node and the check), rather than waiting for its timeout.
      GENIE_LOG_WARN("genie client: a reply from {} failed verification: {}", peer, verified.status().message());
      return failPending(Status(StatusCode::kInvalidMessage,
                                fmt::format("genie-node {} sent a reply that failed verification: {}", peer,
                                            verified.status().message()),
                                __FILE__, __LINE__));
    }
    const wire::Message* msg = verified.value();
    if (msg->body_type() == wire::Body::Ack) noteResident(msg->body_as_Ack()->session_resident());
    if (msg->body_type() == wire::Body::RunResult) noteResident(msg->body_as_RunResult()->session_resident());
    std::shared_ptr<Pending> waiting;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      auto it = pending.find(msg->request_id());
      if (it != pending.end()) {
        waiting = it->second;
        pending.erase(it);
      }
    }
    if (!waiting && msg->request_id() == 0 && msg->body_type() == wire::Body::Error) {
      return failAllPending(*msg->body_as_Error());
    }
    if (!waiting) {
      if (msg->body_type() == wire::Body::Goodbye) {
        return onGoodbye(wire::stringOf(msg->body_as_Goodbye()->reason()));
      } else if (msg->body_type() == wire::Body::Error) {
        GENIE_LOG_WARN("genie-node {}: {}", peer, wire::stringOf(msg->body_as_Error()->message()));
      }
      return;
    }
    if (waiting->async) return finishAsync(msg->request_id(), *msg);
    waiting->header.assign(message.header().begin(), message.header().end());
    if (message.payloadSize() == 0) return waiting->finish(Status::ok());
    try {
      waiting->payload = allocatePayload(message.payloadSize());
    } catch (const std::bad_alloc&) {
      return waiting->finish(
          GENIE_ERROR(kOutOfMemory, "no memory for a {}-byte reply from genie-node {}", message.payloadSize(), peer));
    }
    message.receivePayload({waiting->payload.data.get(), waiting->payload.size},
                           [waiting](Status s) { waiting->finish(std::move(s)); });
  }

  /// An Error with request_id 0: the node refused a message it could not verify, so it cannot
  /// say which. Every request waiting now fails with it (rather than waiting for its timeout).
  void failAllPending(const wire::Error& error) {
    GENIE_LOG_WARN("genie-node {} refused a message: {}", peer, wire::stringOf(error.message()));
    Status refused = wire::remoteStatus(error);
    failPending(Status(StatusCode::kRemote,
                       fmt::format("{} (genie-node {} refused a request it could not read)", refused.message(), peer),
                       __FILE__, __LINE__)
                    .withRemote(*refused.remote()));
  }

  /// The node said Goodbye (a clean stop): every request waiting, and every later one, fails
  /// with kPeerUnreachable saying so, rather than with the connection's end.
  void onGoodbye(std::string_view reason) {
    GENIE_LOG_INFO("genie-node {} said goodbye: {}", peer, reason);
    if (!node_left.load()) {
      goodbye = std::string(reason);
      node_left.store(true);
    }
    failPending(goneStatus());
  }

  /// kPeerUnreachable for a node that said Goodbye.
  Status goneStatus() const {
    return Status(StatusCode::kPeerUnreachable, fmt::format("genie-node {} is shutting down: {}", peer, goodbye),
                  __FILE__, __LINE__);
  }

  /// The connection failed (peer died, link broke): every request waiting now fails at once
  /// with kPeerUnreachable naming the node, instead of waiting for its reply's timeout.
  void onEndpointError(const Status& error) {
    failPending(Status(StatusCode::kPeerUnreachable, fmt::format("genie-node {}: {}", peer, error.message()),
                       __FILE__, __LINE__));
  }

  void failPending(const Status& status) {
    std::unordered_map<uint64_t, std::shared_ptr<Pending>> failed;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      failed.swap(pending);
    }
    for (auto& [id, waiting] : failed) {
      if (waiting->async) {
        asyncRunAnswered({id, status});
      } else {
        waiting->finish(status);
      }
    }
  }

  /// The reply to an asynchronous run (already taken out of `pending`): a RunResult, or an
  /// Error that is kept for takeAsyncFailures().
  void finishAsync(uint64_t id, const wire::Message& msg) {
    if (msg.body_type() == wire::Body::RunResult) {
      node_exec_us += msg.body_as_RunResult()->exec_us();
      return asyncRunAnswered({id, Status::ok()});
    }
    if (msg.body_type() != wire::Body::Error) {
      return asyncRunAnswered({id, GENIE_ERROR(kInvalidMessage, "genie-node {} answered a RunGraph with {}", peer,
                                                 wire::bodyName(msg.body_type()))});
    }
    asyncRunAnswered({id, wire::remoteStatus(*msg.body_as_Error())});
  }

  /// One asynchronous run answered (or failed to go out): kept when `failure.status` is an error.
  void asyncRunAnswered(AsyncFailure failure) {
    std::lock_guard<std::mutex> lock(pending_mutex);
    if (!failure.status) async_failures.push_back(std::move(failure));
    if (async_in_flight > 0) --async_in_flight;
    async_done.notify_all();
  }


  /// kCancelled when the client is closed, kPeerUnreachable when the connection failed:
  /// a message that gets no reply could not report either.
  Status sendable() const {
    if (closed) return GENIE_ERROR(kCancelled, "the client of {} is closed", peer);
    if (node_left.load()) return goneStatus();
    if (!endpoint->isConnected()) return GENIE_ERROR(kPeerUnreachable, "genie-node {}: {}", peer, endpoint->error().message());
    return Status::ok();
  }


  /// Sends a message that gets no reply; `header` is copied by the transport.
  void sendOneWay(const flatbuffers::DetachedBuffer& header) {
    bytes_sent += header.size();
    ++messages_sent;
    endpoint->send(wire::bytesOf(header), {}, [](Status) {});
  }

  /// True when the node answers a Ping within the timeout. Its progress thread answers at
  /// once, also while a session thread executes a long run, so a late reply with a Pong means
  /// "busy", not "gone".
  bool nodeAnswersPing() {
    auto reply = call([](uint64_t id) { return wire::buildPing(id, 0); }, {}, /*while_alive=*/false);
    return reply && reply->message()->body_type() == wire::Body::Pong;
  }

  /// Waits on `cv` (with `lock` held) until `done()`: for the timeout, then, with `while_alive`,
  /// again each time the node answers a Ping (unlocked while it asks). False when the node went
  /// silent (or the one wait ran out) before `done()`.
  template <typename Done>
  bool waitWhileAlive(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Done done, bool while_alive) {
    for (;;) {
      if (cv.wait_for(lock, options.timeout, done)) return true;
      if (!while_alive) return false;
      lock.unlock();
      const bool alive = nodeAnswersPing();
      lock.lock();
      if (!alive) return done();
    }
  }

  /// Sends the request `build(id)` makes and waits for its reply. A build error (a request
  /// the wire format cannot carry) is returned without sending anything. With `while_alive`,
  /// a reply not there after the timeout is waited for again as long as the node answers a
  /// Ping (a run may take longer than the timeout); kTimeout once it answers neither.
  /// `parts`, when given, is the payload instead of `payload`: sent as their concatenation
  /// without a copy (Endpoint::sendInParts).
  Result<Reply> call(const std::function<Result<flatbuffers::DetachedBuffer>(uint64_t)>& build,
                     std::span<const std::byte> payload = {}, bool while_alive = true,
                     const std::vector<transport::ConstBuffer>& parts = {}) {
    if (closed) return GENIE_ERROR(kCancelled, "the client of {} is closed", peer);
    if (node_left.load()) return goneStatus();
    const uint64_t id = next_request++;
    auto built = build(id);
    if (!built) return built.status();
    flatbuffers::DetachedBuffer header = std::move(built.value());
    auto waiting = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      pending.emplace(id, waiting);
    }
    size_t payload_bytes = payload.size();
    if (!parts.empty()) {
      payload_bytes = 0;
      for (const transport::ConstBuffer& part : parts) payload_bytes += part.size;
    }
    bytes_sent += header.size() + payload_bytes;
    ++messages_sent;
    ++round_trips;
    Status sent_status;
    // Shared with the send's completion: a send the node never takes (a stopped node, a
    // rendezvous it does not answer) completes, cancelled, only when the endpoint closes,
    // after this call returned.
    auto sent = std::make_shared<std::promise<Status>>();
    auto sent_future = sent->get_future();
    // A reply often comes within microseconds (small graphs, a node on the same host): this
    // thread drives the worker itself for a while (it sends the request inline and runs the
    // reply's callback), so neither the request nor the reply crosses a thread, before it
    // sleeps on the condition variable and leaves progress to the progress thread.
    auto send = [&] {
      if (!parts.empty()) {
        endpoint->sendInParts(wire::bytesOf(header), parts, [sent](Status s) { sent->set_value(s); });
      } else {
        endpoint->send(wire::bytesOf(header), {payload.data(), payload.size()}, [sent](Status s) { sent->set_value(s); });
      }
    };
    worker->drive(std::ref(send),  // std::ref: no heap copy of the lambda per request
                  [&waiting] { return waiting->done.load(std::memory_order_acquire); }, kReplyPoll);
    std::unique_lock<std::mutex> lock(waiting->mutex);
    bool answered = waitWhileAlive(
        lock, waiting->cv, [&] { return waiting->done || !endpoint->isConnected(); }, while_alive);
    lock.unlock();
    sent_status = sent_future.wait_for(options.timeout) == std::future_status::ready ? sent_future.get() : Status::ok();
    if (!waiting->done) {
      std::lock_guard<std::mutex> guard(pending_mutex);
      pending.erase(id);
      if (node_left.load()) return goneStatus();
      if (!endpoint->isConnected()) {
        Status error = endpoint->error();
        return Status(StatusCode::kPeerUnreachable, fmt::format("genie-node {}: {}", peer, error.message()), __FILE__,
                      __LINE__);
      }
      if (!answered) return GENIE_ERROR(kTimeout, "genie-node {} did not answer in {} ms", peer, options.timeout.count());
    }
    if (!sent_status) return sent_status;
    if (!waiting->status) return waiting->status;
    Reply reply{std::move(waiting->header), std::move(waiting->payload)};
    const wire::Message* msg = reply.message();
    if (msg->body_type() == wire::Body::Error) {
      return wire::remoteStatus(*msg->body_as_Error());
    }
    return reply;
  }

  static Status expect(const Reply& reply, wire::Body body) {
    if (reply.message()->body_type() != body) {
      return GENIE_ERROR(kInvalidMessage, "expected {}, the node answered {}", wire::bodyName(body),
                         wire::bodyName(reply.message()->body_type()));
    }
    return Status::ok();
  }

  using Slots = flatbuffers::Vector<flatbuffers::Offset<wire::TensorSlot>>;

  /// The descriptors of verified slots (verifyMessage checked each desc and payload range).
  static std::vector<wire::TensorSlotArgs> slotsOf(const Slots* slots) {
    std::vector<wire::TensorSlotArgs> out;
    for (uint32_t i = 0; slots && i < slots->size(); ++i) {
      const wire::TensorSlot* slot = slots->Get(i);
      const wire::TensorDesc* desc = slot->desc();
      wire::TensorSlotArgs t;
      if (slot->handle()) t.handle = *slot->handle();
      t.desc.dtype = desc->dtype();
      if (desc->shape()) t.desc.shape.assign(desc->shape()->begin(), desc->shape()->end());
      if (desc->strides()) t.desc.strides.assign(desc->strides()->begin(), desc->strides()->end());
      t.desc.storage_offset = desc->storage_offset();
      t.desc.memory = desc->memory();
      t.desc.device_index = desc->device_index();
      t.residency = slot->residency();
      t.payload_offset = slot->payload_offset();
      out.push_back(std::move(t));
    }
    return out;
  }

  static TensorBatch batchOf(Reply& reply, const Slots* slots) {
    TensorBatch batch;
    batch.tensors = slotsOf(slots);
    batch.payload = std::move(reply.payload);
    return batch;
  }

  /// Copies each tensor of a batch into its own ReturnedTensor (contiguous tensors only:
  /// ReturnedTensor has no strides).
  static std::vector<ReturnedTensor> copiesOf(const TensorBatch& batch) {
    std::vector<ReturnedTensor> out;
    for (size_t i = 0; i < batch.tensors.size(); ++i) {
      ReturnedTensor t;
      t.handle = batch.tensors[i].handle;
      t.dtype = batch.tensors[i].desc.dtype;
      t.shape = batch.tensors[i].desc.shape;
      auto bytes = batch.bytesOf(i);
      t.bytes.assign(bytes.begin(), bytes.end());
      out.push_back(std::move(t));
    }
    return out;
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() { close(); }

wire::Handle Client::newHandle() {
  uint64_t words[2] = {0, 0};
  while ((words[0] | words[1]) == 0) {
    if (getrandom(words, sizeof(words), 0) != sizeof(words)) words[0] = 1;
  }
  return wire::Handle(words[0], words[1]);
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& host, uint16_t port, const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->peer = fmt::format("{}:{}", host, port);
  transport::WorkerConfig config = options.transport;
  config.name = options.name;
  config.yield_while_polling = true;  // call() polls for replies: see kReplyPoll
  auto worker = transport::Worker::create(config);
  if (!worker) return worker.status();
  impl->worker = *worker;
  Impl* raw = impl.get();
  impl->worker->setMessageHandler([raw](InboundMessage m) { raw->onMessage(std::move(m)); });
  impl->worker->setEndpointErrorHandler(
      [raw](const std::shared_ptr<transport::Endpoint>&, const Status& error) { raw->onEndpointError(error); });
  GENIE_RETURN_IF_ERROR(impl->worker->startProgressThread());
  auto endpoint = impl->worker->connect(host, port);
  if (!endpoint) {
    impl->worker->shutdown();
    return endpoint.status();
  }
  impl->endpoint = *endpoint;
  auto reply = impl->call([&](uint64_t id) {
    return wire::buildHello(id, options.name, options.auth_token, getpid(), options.protocol_version,
                            options.attach_session);
  });
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::Welcome));
  const wire::Welcome* welcome = reply->message()->body_as_Welcome();
  client->impl_->session_id = *welcome->session_id();
  client->impl_->welcome = {*welcome->session_id(),
                            std::string(wire::stringOf(welcome->node_name())),
                            std::string(wire::stringOf(welcome->device())),
                            welcome->memory_limit(),
                            welcome->max_header_bytes(),
                            welcome->protocol_version()};
  return client;
}

std::span<const std::byte> TensorBatch::bytesOf(size_t i) const {
  return {payload.data.get() + tensors[i].payload_offset, static_cast<size_t>(nbytesOf(i))};
}

uint64_t TensorBatch::nbytesOf(size_t i) const {
  const wire::TensorDescArgs& d = tensors[i].desc;
  auto n = wire::tensorSpanBytes(d.dtype, d.shape, d.strides, d.storage_offset);
  return n ? *n : 0;  // verified on receipt: always computable
}

const wire::Handle& Client::sessionId() const { return impl_->session_id; }
const wire::WelcomeArgs& Client::welcome() const { return impl_->welcome; }
const std::string& Client::address() const { return impl_->peer; }

ClientCounters Client::counters() const {
  return {impl_->bytes_sent.load(), impl_->bytes_received.load(), impl_->messages_sent.load(),
          impl_->round_trips.load(), impl_->async_runs.load(), impl_->node_exec_us.load()};
}

Status Client::putTensor(const wire::Handle& handle, const wire::TensorDescArgs& desc, wire::Residency residency,
                         std::span<const std::byte> bytes) {
  wire::TensorSlotArgs slot;
  slot.handle = handle;
  slot.desc = desc;
  slot.residency = residency;
  return putTensors({&slot, 1}, bytes);
}

Status Client::putTensors(std::span<const wire::TensorSlotArgs> slots, std::vector<transport::ConstBuffer> parts) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildPutTensors(id, slots); }, {}, true, parts);
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Ack);
}

Status Client::putTensors(std::span<const wire::TensorSlotArgs> slots, std::span<const std::byte> payload) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildPutTensors(id, slots); }, payload);
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Ack);
}

Result<ReturnedTensor> Client::getTensor(const wire::Handle& handle) {
  auto batch = getTensors({&handle, 1});
  if (!batch) return batch.status();
  return std::move(Impl::copiesOf(*batch)[0]);
}

Result<TensorBatch> Client::getTensors(std::span<const wire::Handle> handles) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildGetTensors(id, handles); });
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::TensorData));
  TensorBatch batch = Impl::batchOf(*reply, reply->message()->body_as_TensorData()->tensors());
  if (batch.tensors.size() != handles.size()) {
    return GENIE_ERROR(kInvalidMessage, "asked genie-node {} for {} tensors, got {}", impl_->peer, handles.size(),
                       batch.tensors.size());
  }
  return batch;
}

Status Client::freeTensors(std::span<const wire::Handle> handles, bool want_reply) {
  if (!want_reply) {
    GENIE_RETURN_IF_ERROR(impl_->sendable());
    impl_->sendOneWay(wire::buildFreeTensors(impl_->next_request++, handles, false));
    return Status::ok();
  }
  auto reply = impl_->call([&](uint64_t id) { return wire::buildFreeTensors(id, handles, true); });
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Ack);
}

Result<wire::GraphId> Client::registerGraph(std::span<const std::byte> graph_bytes) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildRegisterGraph(id, graph_bytes); });
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::GraphRegistered));
  return *reply->message()->body_as_GraphRegistered()->graph_id();
}

Result<std::vector<ReturnedTensor>> Client::runGraph(const wire::RunGraphArgs& run,
                                                     std::span<const std::byte> inline_payload) {
  auto reply = runGraphReply(run, inline_payload);
  if (!reply) return reply.status();
  return Impl::copiesOf(reply->outputs);
}

Result<RunReply> Client::runGraphReply(const wire::RunGraphArgs& run, std::span<const std::byte> inline_payload) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildRunGraph(id, run); }, inline_payload);
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::RunResult));
  const wire::RunResult* result = reply->message()->body_as_RunResult();
  RunReply out;
  out.described = Impl::slotsOf(result->described());
  out.exec_us = result->exec_us();
  impl_->node_exec_us += out.exec_us;
  out.outputs = Impl::batchOf(*reply, result->outputs());
  return out;
}

Result<uint64_t> Client::runGraphAsync(const wire::RunGraphArgs& run, std::span<const std::byte> inline_payload) {
  for (const wire::OutputSpecArgs& spec : run.outputs) {
    if (spec.action != wire::OutputAction::KeepResident) {
      return GENIE_ERROR(kInvalidArgument, "an asynchronous RunGraph can only keep its outputs resident, not {} them",
                         wire::EnumNameOutputAction(spec.action));
    }
  }
  Impl& impl = *impl_;
  GENIE_RETURN_IF_ERROR(impl.sendable());
  const uint64_t id = impl.next_request++;
  auto header = wire::buildRunGraph(id, run);
  if (!header) return header.status();
  auto waiting = std::make_shared<Pending>();
  waiting->async = true;
  {
    std::lock_guard<std::mutex> lock(impl.pending_mutex);
    impl.pending.emplace(id, waiting);
    ++impl.async_in_flight;
  }
  impl.bytes_sent += header->size() + inline_payload.size();
  ++impl.messages_sent;
  ++impl.async_runs;
  // The payload must outlive the send: a copy travels with the completion callback.
  auto payload = std::make_shared<std::vector<std::byte>>(inline_payload.begin(), inline_payload.end());
  impl.endpoint->send(wire::bytesOf(*header), {payload->data(), payload->size()}, [&impl, id, payload](Status s) {
    if (s) return;
    // Not sent: no reply will come. Whoever takes the request out of `pending` reports it
    // (here, or failPending when the connection failed first).
    {
      std::lock_guard<std::mutex> lock(impl.pending_mutex);
      if (impl.pending.erase(id) == 0) return;
    }
    impl.asyncRunAnswered({id, std::move(s)});
  });
  return id;
}

std::vector<AsyncFailure> Client::takeAsyncFailures(bool wait) {
  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.pending_mutex);
  // As Impl::call: runs longer than the timeout are waited for while the node answers Pings.
  if (wait && !impl.waitWhileAlive(lock, impl.async_done, [&] { return impl.async_in_flight == 0; }, true)) {
    for (auto it = impl.pending.begin(); it != impl.pending.end();) {
      if (!it->second->async) {
        ++it;
        continue;
      }
      impl.async_failures.push_back(
          {it->first, GENIE_ERROR(kTimeout, "genie-node {} did not answer an asynchronous RunGraph in {} ms",
                                  impl.peer, impl.options.timeout.count())});
      it = impl.pending.erase(it);
    }
    impl.async_in_flight = 0;
  }
  std::vector<AsyncFailure> out;
  out.swap(impl.async_failures);
  return out;
}

ResidentStat Client::residentStat() const {
  std::lock_guard<std::mutex> lock(impl_->resident_mutex);
  return impl_->resident;
}

void Client::resetResidentPeak() {
  std::lock_guard<std::mutex> lock(impl_->resident_mutex);
  impl_->resident.peak = impl_->resident.current;
}

void Client::resetResidentAccumulated() {
  std::lock_guard<std::mutex> lock(impl_->resident_mutex);
  impl_->resident.allocated = impl_->resident.freed = 0;
}

size_t Client::asyncInFlight() const {
  std::lock_guard<std::mutex> lock(impl_->pending_mutex);
  return impl_->async_in_flight;
}

Result<wire::StatsArgs> Client::stats(std::span<const wire::GraphId> parts) {
  auto reply = impl_->call([parts](uint64_t id) { return wire::buildStatsRequest(id, parts); });
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::Stats));
  const wire::Stats* s = reply->message()->body_as_Stats();
  wire::StatsArgs out;
  out.sessions = s->sessions();
  for (uint32_t i = 0; s->resident() && i < s->resident()->size(); ++i) {
    out.resident.emplace_back(s->resident()->Get(i)->residency(), s->resident()->Get(i)->bytes());
  }
  out.graphs_cached = s->graphs_cached();
  out.ops_executed = s->ops_executed();
  out.bytes_in = s->bytes_in();
  out.bytes_out = s->bytes_out();
  out.memory_limit = s->memory_limit();
  out.uptime_us = s->uptime_us();
  out.session_resident = s->session_resident();
  out.device_free = s->device_free();
  out.device_total = s->device_total();
  out.package_calls = s->package_calls();
  out.executor_calls = s->executor_calls();
  out.packages_built = s->packages_built();
  out.packages_loaded = s->packages_loaded();
  out.compile_failures = s->compile_failures();
  out.peer_bytes_sent = s->peer_bytes_sent();
  out.peer_bytes_received = s->peer_bytes_received();
  out.peer_transfers = s->peer_transfers();
  out.cuda_graph_replays = s->cuda_graph_replays();
  for (uint32_t i = 0; s->colocation() && i < s->colocation()->size(); ++i) {
    const wire::ColocationBytes* g = s->colocation()->Get(i);
    out.colocation.push_back({std::string(wire::stringOf(g->group())), g->bytes(), g->resident()});
  }
  for (uint32_t i = 0; s->parts() && i < s->parts()->size(); ++i) {
    const wire::PartStats* p = s->parts()->Get(i);
    wire::StatsArgs::Part part;
    if (p->graph_id()) part.graph_id = *p->graph_id();
    part.inputs = std::string(wire::stringOf(p->inputs()));
    part.state = std::string(wire::stringOf(p->state()));
    part.package_calls = p->package_calls();
    part.executor_calls = p->executor_calls();
    part.build_us = p->build_us();
    part.from_cache = p->from_cache();
    part.reason = std::string(wire::stringOf(p->reason()));
    part.cuda_graph_replays = p->cuda_graph_replays();
    out.parts.push_back(std::move(part));
  }
  impl_->noteResident(out.session_resident);
  return out;
}

Status Client::sendTensors(const std::string& peer, const std::string& auth_token, const wire::Handle& peer_session,
                           std::span<const wire::Handle> handles, std::span<const wire::Handle> peer_handles) {
  if (handles.empty() || handles.size() != peer_handles.size()) {
    return GENIE_ERROR(kInvalidArgument, "sendTensors: {} handles and {} peer handles (need as many, at least one)",
                       handles.size(), peer_handles.size());
  }
  wire::SendTensorsArgs send;
  send.peer = peer;
  send.auth_token = auth_token;
  send.peer_session = peer_session;
  send.handles.assign(handles.begin(), handles.end());
  send.peer_handles.assign(peer_handles.begin(), peer_handles.end());
  auto reply = impl_->call([&](uint64_t id) { return wire::buildSendTensors(id, send); });
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Ack);
}

bool Client::connected() const {
  return impl_ && !impl_->closed && impl_->endpoint && impl_->endpoint->isConnected() && !impl_->node_left.load();
}

Status Client::ping() {
  auto reply = impl_->call([](uint64_t id) { return wire::buildPing(id, 0); });
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Pong);
}

void Client::close() {
  if (!impl_ || impl_->closed) return;
  if (impl_->endpoint && impl_->endpoint->isConnected()) {
    auto bye = wire::buildGoodbye(0, "client closing");
    impl_->bytes_sent += bye.size();
    ++impl_->messages_sent;
    auto sent = std::make_shared<std::promise<void>>();  // the completion may come after this frame (Impl::call)
    auto sent_future = sent->get_future();
    impl_->endpoint->send(wire::bytesOf(bye), {}, [sent](Status) { sent->set_value(); });
    sent_future.wait_for(std::chrono::seconds(2));
    impl_->endpoint->close();
  }
  impl_->closed = true;
  impl_->endpoint.reset();
  impl_->worker->shutdown();
}

}  // namespace genie::client
