#include "genie/node/node_service.h"

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/random.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "genie/log.h"
#include "genie/node/executor.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"
#include "genie/wire/codec.h"
#include "session.h"

namespace genie::node {

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

}  // namespace

// ---- the service ------------------------------------------------------------------------

struct NodeService::Impl : NodeContext {
  NodeConfig config;
  std::unique_ptr<transport::Listener> listener;
  TokenDigest token_digest{};  // of config.auth_token (when set)
  Clock::time_point started = Clock::now();


  // Progress thread only (and stop()): open connections (with their failed Hellos), and the
  // sessions said Hello on them.
  struct Connection {
    std::shared_ptr<Endpoint> endpoint;
    int failed_hellos = 0;
  };
  std::unordered_map<const Endpoint*, Connection> connections;
  std::unordered_map<const Endpoint*, std::shared_ptr<Session>> sessions;
  // Sessions by id (Welcome.session_id), and the connections other nodes attached to them
  // (Hello.attach_session: SendTensors puts) with the session each is attached to.
  std::unordered_map<wire::Handle, std::shared_ptr<Session>, wire::HandleHash, wire::HandleEqual> sessions_by_id;
  std::unordered_map<const Endpoint*, std::shared_ptr<Session>> attachments;
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
  /// The Welcome of session `session_id` (a new session, or one a connection attached to).
  wire::WelcomeArgs welcomeOf(const wire::Handle& session_id) const {
    wire::WelcomeArgs welcome;
    welcome.session_id = session_id;
    welcome.node_name = config.name;
    welcome.device = config.device;
    welcome.memory_limit = sessionMemoryLimit();
    welcome.max_header_bytes = wire::VerifyLimits{}.max_header_bytes;
    return welcome;
  }
  bool stopped = false;

  Impl(const NodeConfig& c, c10::Device d)
      : NodeContext(d, c.memory_limit, c.session_memory_limit, c.compile), config(c) {
    idle_poll = c.idle_poll;
    direct_device_uploads = c.direct_device_uploads;
    peer_transport = c.transport;
    peer_client_name = c.name + " (node to node)";
  }

  /// A failed Hello (wrong token, unknown session to attach to): answered with `error`; the
  /// kMaxFailedHellos-th closes the connection.
  void refuseHello(const std::shared_ptr<Endpoint>& from, uint64_t id, const std::string& why);
  /// Hello with attach_session: attaches the connection to that session (progress thread).
  void attach(const std::shared_ptr<Endpoint>& from, uint64_t id, const wire::Handle& session_id);

  /// The reaper thread: ends the sessions handed to it, one at a time, until stop().
  void reapEndedSessions();

  void onMessage(InboundMessage message);
  void onEndpointError(const std::shared_ptr<Endpoint>& endpoint);
  /// Removes a session and ends it on another thread (progress thread).
  void endSession(const Endpoint* endpoint);
  /// The device's free and total memory in bytes (Stats.device_free, device_total): with a
  /// memory limit, the limit and what is left of it; else the host's MemAvailable and MemTotal
  /// for a CPU node, the device allocator's getMemoryInfo for another (cudaMemGetInfo); 0 when
  /// not known.
  void deviceMemory(uint64_t& free, uint64_t& total) const;
  wire::StatsArgs collectStats() const override {
    wire::StatsArgs stats;
    stats.sessions = session_count.load();
    uint64_t by_class[4];
    memory.snapshot(by_class);
    for (int r = 0; r < 4; ++r) stats.resident.emplace_back(static_cast<wire::Residency>(r), by_class[r]);
    stats.graphs_cached = graphs.size();
    stats.ops_executed = ops_executed.load();
    stats.bytes_in = worker->bytesReceived();
    stats.bytes_out = worker->bytesSent();
    stats.memory_limit = memory.limit();
    stats.uptime_us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - started).count();
    deviceMemory(stats.device_free, stats.device_total);
    const auto counts = compiled.counts();
    stats.package_calls = counts.package_calls;
    stats.executor_calls = counts.executor_calls;
    stats.packages_built = counts.packages_built;
    stats.packages_loaded = counts.packages_loaded;
    stats.compile_failures = counts.failures;
    stats.cuda_graph_replays = counts.cuda_graph_replays;
    stats.peer_bytes_sent = peer_bytes_sent.load();
    stats.peer_bytes_received = peer_bytes_received.load();
    stats.peer_transfers = peer_transfers.load();
    return stats;
  }
};

namespace {

/// `field` of /proc/meminfo ("MemTotal", "MemAvailable") in bytes; 0 where there is none.
uint64_t hostMemInfo(const std::string& field) {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> name >> kib >> unit) {
    if (name == field + ":") return kib * 1024;
  }
  return 0;
}

}  // namespace

void NodeService::Impl::deviceMemory(uint64_t& free, uint64_t& total) const {
  free = total = 0;
  if (memory.limit() != 0) {  // the limit is what this node may use, whatever the device has
    total = memory.limit();
    const uint64_t used = memory.used();
    free = used < total ? total - used : 0;
    return;
  }
  if (device.is_cpu()) {
    total = hostMemInfo("MemTotal");
    free = hostMemInfo("MemAvailable");
    return;
  }
  try {  // the device's allocator (the CUDA caching allocator: cudaMemGetInfo), through c10
    auto [device_free, device_total] = c10::getDeviceAllocator(device.type())->getMemoryInfo(device.has_index() ? device.index() : 0);
    free = device_free;
    total = device_total;
  } catch (const c10::Error& e) {
    GENIE_LOG_WARN("the memory of {} is not known: {}", device.str(), e.what_without_backtrace());
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
  auto attached = session == sessions.end() ? attachments.find(from.get()) : attachments.end();
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
          return refuseHello(from, id, "wrong auth token");
        }
      }
      if (session != sessions.end() || attached != attachments.end()) {
        return replyError(*from, id, wire::requestError(ErrorCode::InvalidMessage, "this connection already has a session"));
      }
      if (hello->attach_session() && !wire::isNull(*hello->attach_session())) {
        return attach(from, id, *hello->attach_session());
      }
      from->admitFromProgressThread();
      wire::Handle session_id = randomHandle();
      auto made = std::make_shared<Session>(*this, from, session_id);
      sessions.emplace(from.get(), made);
      sessions_by_id.emplace(session_id, std::move(made));
      ++session_count;
      GENIE_LOG_INFO("session {} for '{}' (pid {}) from {}", wire::toString(session_id), wire::stringOf(hello->client_name()),
                     hello->pid(), from->peer());
      return reply(*from, wire::buildWelcome(id, welcomeOf(session_id)));
    }
    case wire::Body::Ping:
      if (session == sessions.end() && attached == attachments.end()) break;  // before a session, only Hello is answered
      message.releasePayload();
      return reply(*from, wire::buildPong(id, msg->body_as_Ping()->timestamp_ns()));
    case wire::Body::Goodbye:
      if (attached != attachments.end()) {
        attachments.erase(attached);  // another node is done putting: its session goes on
        return;
      }
      return endSession(from.get());
    default:
      break;  // StatsRequest too: ordered after the session's earlier requests
  }
  if (attached != attachments.end()) {
    if (msg->body_type() == wire::Body::PutTensors) {
      attached->second->enqueueAttached(std::move(message));
      worker->yieldPollsFromProgressThread(kHandOffYieldPolls);
      return;
    }
    message.releasePayload();
    return replyError(*from, id, wire::requestError(ErrorCode::InvalidMessage,
                                  fmt::format("this connection is attached to session {}: it may only put tensors, not "
                                              "send {}", wire::toString(attached->second->id()),
                                              wire::bodyName(msg->body_type()))));
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

void NodeService::Impl::refuseHello(const std::shared_ptr<Endpoint>& from, uint64_t id, const std::string& why) {
  auto connection = connections.find(from.get());
  const int failed = connection == connections.end() ? kMaxFailedHellos : ++connection->second.failed_hellos;
  GENIE_LOG_WARN("refused a session from {}: {} ({} of {} tries)", from->peer(), why, failed, kMaxFailedHellos);
  replyError(*from, id, wire::requestError(ErrorCode::Unauthenticated, why));
  if (failed >= kMaxFailedHellos) {
    from->close();  // flushes the reply first
    connections.erase(from.get());
  }
}

void NodeService::Impl::attach(const std::shared_ptr<Endpoint>& from, uint64_t id, const wire::Handle& session_id) {
  auto target = sessions_by_id.find(session_id);
  if (target == sessions_by_id.end()) {
    // Session ids are capabilities: a wrong one counts as a failed Hello, like a wrong token.
    return refuseHello(from, id, fmt::format("Hello.attach_session: no session {} on this node", wire::toString(session_id)));
  }
  from->admitFromProgressThread();
  attachments.emplace(from.get(), target->second);
  GENIE_LOG_INFO("connection from {} attached to session {} (node to node)", from->peer(), wire::toString(session_id));
  reply(*from, wire::buildWelcome(id, welcomeOf(session_id)));
}

void NodeService::Impl::endSession(const Endpoint* endpoint) {
  auto session = sessions.find(endpoint);
  if (session == sessions.end()) return;
  std::shared_ptr<Session> closing = std::move(session->second);
  sessions.erase(session);
  sessions_by_id.erase(closing->id());
  // Connections other nodes attached to it are closed: their next put fails (PeerUnreachable).
  for (auto it = attachments.begin(); it != attachments.end();) {
    if (it->second != closing) {
      ++it;
      continue;
    }
    auto connection = connections.find(it->first);
    if (connection != connections.end()) {
      connection->second.endpoint->close();
      connections.erase(connection);
    }
    it = attachments.erase(it);
  }
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
  attachments.erase(endpoint.get());
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
  NodeConfig effective = config;
  if (effective.memory_limit == 0 && !device.is_cpu()) {
    // A GPU node without --memory-limit: 90 % of the device's free memory at start, the rest
    // left to the CUDA context's own needs (cuBLAS workspaces, the caching allocator's
    // rounding), so that a session over it gets Genie's OutOfMemory before the device's.
    try {
      auto [free, total] = c10::getDeviceAllocator(device.type())->getMemoryInfo(device.has_index() ? device.index() : 0);
      effective.memory_limit = free / 10 * 9;
      GENIE_LOG_INFO("memory limit {} bytes: 90 % of {}'s {} free bytes of {} at start (--memory-limit sets it)",
                     effective.memory_limit, device.str(), free, total);
    } catch (const c10::Error& e) {
      GENIE_LOG_WARN("the free memory of {} is not known ({}): no memory limit", device.str(), e.what_without_backtrace());
    }
  }
  auto impl = std::make_unique<Impl>(effective, device);
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
  if (!device.is_cpu()) {
    // The device current on the progress thread too (its primary context, for UCX's CUDA
    // transports receiving into device memory from there).
    impl->worker->post([device] { c10::impl::VirtualGuardImpl(device.type()).setDevice(device); });
  }
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
      session->endpoint()->send(wire::bytesOf(bye), {}, [](Status) {});
    }
    impl_->sessions.clear();
    impl_->sessions_by_id.clear();
    impl_->attachments.clear();
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
