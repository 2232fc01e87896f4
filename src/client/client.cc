#include "genie/client/client.h"

#include <sys/random.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
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

/// One request waiting for its reply.
struct Pending {
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::vector<std::byte> header;  // 16-byte aligned by the allocator: verifiable in place
  std::vector<std::byte> payload;

  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mutex);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
};

struct Reply {
  std::vector<std::byte> header;
  std::vector<std::byte> payload;
  const wire::Message* message() const { return flatbuffers::GetRoot<wire::Message>(header.data()); }
};

}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::string peer;
  std::shared_ptr<transport::Worker> worker;
  std::shared_ptr<transport::Endpoint> endpoint;
  wire::Handle session_id{};
  std::atomic<uint64_t> next_request{1};
  std::mutex pending_mutex;
  std::unordered_map<uint64_t, std::shared_ptr<Pending>> pending;
  RemoteError last_error;
  bool closed = false;

  void onMessage(InboundMessage message) {
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified) {
      GENIE_LOG_WARN("genie client: a reply from {} failed verification: {}", peer, verified.status().message());
      return;
    }
    const wire::Message* msg = verified.value();
    std::shared_ptr<Pending> waiting;
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      auto it = pending.find(msg->request_id());
      if (it != pending.end()) {
        waiting = it->second;
        pending.erase(it);
      }
    }
    if (!waiting) {
      if (msg->body_type() == wire::Body::Goodbye) {
        GENIE_LOG_INFO("genie-node {} said goodbye: {}", peer, wire::stringOf(msg->body_as_Goodbye()->reason()));
      } else if (msg->body_type() == wire::Body::Error) {
        GENIE_LOG_WARN("genie-node {}: {}", peer, wire::stringOf(msg->body_as_Error()->message()));
      }
      return;
    }
    waiting->header.assign(message.header().begin(), message.header().end());
    if (message.payloadSize() == 0) return waiting->finish(Status::ok());
    waiting->payload.resize(message.payloadSize());
    message.receivePayload({waiting->payload.data(), waiting->payload.size()},
                           [waiting](Status s) { waiting->finish(std::move(s)); });
  }

  /// Sends the request that `build(request_id)` makes and waits for its reply.
  Result<Reply> call(const std::function<flatbuffers::DetachedBuffer(uint64_t)>& build,
                     std::span<const std::byte> payload = {}) {
    if (closed) return GENIE_ERROR(kCancelled, "the client of {} is closed", peer);
    const uint64_t id = next_request++;
    auto waiting = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> lock(pending_mutex);
      pending.emplace(id, waiting);
    }
    auto header = build(id);
    Status sent_status;
    std::promise<Status> sent;
    auto sent_future = sent.get_future();
    endpoint->send(wire::bytesOf(header), {payload.data(), payload.size()}, [&sent](Status s) { sent.set_value(s); });
    std::unique_lock<std::mutex> lock(waiting->mutex);
    bool answered = waiting->cv.wait_for(lock, options.timeout, [&] { return waiting->done || !endpoint->isConnected(); });
    lock.unlock();
    sent_status = sent_future.wait_for(options.timeout) == std::future_status::ready ? sent_future.get() : Status::ok();
    if (!waiting->done) {
      std::lock_guard<std::mutex> guard(pending_mutex);
      pending.erase(id);
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
      const wire::Error* error = msg->body_as_Error();
      last_error = {error->code(), error->op_index(), std::string(wire::stringOf(error->op_name())),
                    std::string(wire::stringOf(error->message()))};
      std::string where = error->op_index() >= 0
                              ? fmt::format(" op {} ({})", error->op_index(), wire::stringOf(error->op_name()))
                              : std::string();
      return Status(StatusCode::kRemote,
                    fmt::format("{}{}: {}", wire::errorCodeName(error->code()), where, wire::stringOf(error->message())),
                    __FILE__, __LINE__);
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

  static std::vector<ReturnedTensor> tensorsOf(const Reply& reply,
                                               const flatbuffers::Vector<flatbuffers::Offset<wire::TensorSlot>>* slots) {
    std::vector<ReturnedTensor> out;
    for (uint32_t i = 0; slots && i < slots->size(); ++i) {
      const wire::TensorSlot* slot = slots->Get(i);
      ReturnedTensor t;
      if (slot->handle()) t.handle = *slot->handle();
      t.dtype = slot->desc()->dtype();
      t.shape.assign(slot->desc()->shape()->begin(), slot->desc()->shape()->end());
      auto begin = reply.payload.begin() + slot->payload_offset();
      t.bytes.assign(begin, begin + slot->desc()->nbytes());
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
  auto worker = transport::Worker::create(config);
  if (!worker) return worker.status();
  impl->worker = *worker;
  Impl* raw = impl.get();
  impl->worker->setMessageHandler([raw](InboundMessage m) { raw->onMessage(std::move(m)); });
  GENIE_RETURN_IF_ERROR(impl->worker->startProgressThread());
  auto endpoint = impl->worker->connect(host, port);
  if (!endpoint) {
    impl->worker->shutdown();
    return endpoint.status();
  }
  impl->endpoint = *endpoint;
  auto reply = impl->call([&](uint64_t id) {
    return wire::buildHello(id, options.name, options.auth_token, getpid(), options.protocol_version);
  });
  std::unique_ptr<Client> client(new Client(std::move(impl)));
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::Welcome));
  client->impl_->session_id = *reply->message()->body_as_Welcome()->session_id();
  return client;
}

const wire::Handle& Client::sessionId() const { return impl_->session_id; }
const RemoteError& Client::lastRemoteError() const { return impl_->last_error; }

Status Client::putTensor(const wire::Handle& handle, const wire::TensorDescArgs& desc, wire::Residency residency,
                         std::span<const std::byte> bytes) {
  wire::TensorSlotArgs slot;
  slot.handle = handle;
  slot.desc = desc;
  slot.residency = residency;
  auto header = wire::buildPutTensors(0, {&slot, 1});
  if (!header) return header.status();
  auto reply = impl_->call([&](uint64_t id) { return std::move(wire::buildPutTensors(id, {&slot, 1}).value()); }, bytes);
  if (!reply) return reply.status();
  return Impl::expect(*reply, wire::Body::Ack);
}

Result<ReturnedTensor> Client::getTensor(const wire::Handle& handle) {
  auto reply = impl_->call([&](uint64_t id) { return wire::buildGetTensors(id, {&handle, 1}); });
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::TensorData));
  auto tensors = Impl::tensorsOf(*reply, reply->message()->body_as_TensorData()->tensors());
  if (tensors.size() != 1) return GENIE_ERROR(kInvalidMessage, "asked for one tensor, got {}", tensors.size());
  return std::move(tensors[0]);
}

Status Client::freeTensors(std::span<const wire::Handle> handles) {
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
  auto header = wire::buildRunGraph(0, run);
  if (!header) return header.status();
  auto reply = impl_->call([&](uint64_t id) { return std::move(wire::buildRunGraph(id, run).value()); }, inline_payload);
  if (!reply) return reply.status();
  GENIE_RETURN_IF_ERROR(Impl::expect(*reply, wire::Body::RunResult));
  return Impl::tensorsOf(*reply, reply->message()->body_as_RunResult()->outputs());
}

Result<wire::StatsArgs> Client::stats() {
  auto reply = impl_->call([](uint64_t id) { return wire::buildStatsRequest(id); });
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
  return out;
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
    std::promise<void> sent;
    impl_->endpoint->send(wire::bytesOf(bye), {}, [&sent](Status) { sent.set_value(); });
    sent.get_future().wait_for(std::chrono::seconds(2));
    impl_->endpoint->close();
  }
  impl_->closed = true;
  impl_->endpoint.reset();
  impl_->worker->shutdown();
}

}  // namespace genie::client
