#include "transport_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <random>

#include <sys/mman.h>

#include <spdlog/spdlog.h>

#include "genie/transport/message.h"
#include "genie/transport/registration_cache.h"
#include "genie/wire/codec.h"

namespace genie::bench {

using transport::Buffer;
using transport::ConstBuffer;
using transport::Endpoint;
using transport::InboundMessage;
using transport::MemoryType;
using transport::Worker;

namespace {

using Clock = std::chrono::steady_clock;

uint64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

std::span<const std::byte> bytesOf(const flatbuffers::DetachedBuffer& buffer) { return wire::bytesOf(buffer); }

template <typename T>
flatbuffers::DetachedBuffer buildBody(uint64_t request_id,
                                      const std::function<flatbuffers::Offset<T>(flatbuffers::FlatBufferBuilder&)>& make) {
  flatbuffers::FlatBufferBuilder fbb(128);
  wire::finishMessage(fbb, request_id, make(fbb));
  return fbb.Release();
}

/// Page-aligned host memory; 2 MiB-aligned and backed by transparent huge pages when large
/// (as UCX's own allocator does with UCX_*_ALLOC=thp), so big transfers walk fewer pages.
struct HostMemoryDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
std::unique_ptr<std::byte[], HostMemoryDeleter> allocateHost(size_t size) {
  constexpr size_t kHugePage = size_t{2} << 20;
  size_t alignment = size >= kHugePage ? kHugePage : 4096;
  size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* p = nullptr;
  if (posix_memalign(&p, alignment, rounded) != 0) throw std::bad_alloc();
  if (alignment == kHugePage) madvise(p, rounded, MADV_HUGEPAGE);
  return std::unique_ptr<std::byte[], HostMemoryDeleter>(static_cast<std::byte*>(p));
}

/// A host buffer registered once with the worker's registration cache.
class RegisteredBuffer {
 public:
  RegisteredBuffer() = default;
  void reserve(Worker& worker, size_t size) {
    if (size <= size_) return;
    if (data_) (void)worker.registrationCache().deregisterMemory(data_.get());
    data_ = allocateHost(size);
    std::memset(data_.get(), 0x5a, size);
    size_ = size;
    auto region = worker.registrationCache().registerMemory(data_.get(), size, MemoryType::kHost);
    if (!region) SPDLOG_WARN("genie-bench: {}", region.status().toString());
  }
  std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<std::byte[], HostMemoryDeleter> data_;
  size_t size_ = 0;
};

void sendOrLog(Endpoint& endpoint, std::span<const std::byte> header, ConstBuffer payload = {}) {
  endpoint.send(header, payload, [](Status s) {
    if (!s) SPDLOG_WARN("genie-bench: {}", s.toString());
  });
}

}  // namespace

std::string_view benchTestName(BenchTest test) {
  switch (test) {
    case BenchTest::kLatency: return "latency";
    case BenchTest::kBandwidth: return "bandwidth";
    case BenchTest::kPut: return "put";
    case BenchTest::kGet: return "get";
    case BenchTest::kRate: return "rate";
  }
  return "unknown";
}

Result<BenchTest> parseBenchTest(std::string_view name) {
  for (BenchTest test : {BenchTest::kLatency, BenchTest::kBandwidth, BenchTest::kPut, BenchTest::kGet, BenchTest::kRate}) {
    if (benchTestName(test) == name) return test;
  }
  return GENIE_ERROR(kInvalidArgument, "unknown test '{}' (latency, bandwidth, put, get, rate)", name);
}

// ---- server ---------------------------------------------------------------------------

struct BenchServer::State {
  std::shared_ptr<Worker> worker;
  std::unique_ptr<transport::Listener> listener;
  std::vector<std::shared_ptr<Endpoint>> clients;
  size_t clients_left = 0;
  RegisteredBuffer scratch;  // where Ping and BenchData payloads land
  struct Stored {
    RegisteredBuffer buffer;
    size_t size = 0;
  };
  std::unordered_map<wire::Handle, Stored, wire::HandleHash, wire::HandleEqual> store;
  // The bandwidth stream being measured.
  uint64_t stream_messages = 0, stream_bytes = 0, stream_first_ns = 0, stream_last_ns = 0;
  std::shared_ptr<Endpoint> stream_end_to;  // BenchEnd seen, waiting for the data to land
  uint64_t stream_end_request = 0, stream_end_messages = 0;
  uint64_t rejected = 0;

  void onMessage(InboundMessage&& message);
  void reply(Endpoint& to, const flatbuffers::DetachedBuffer& header, ConstBuffer payload = {}) {
    sendOrLog(to, bytesOf(header), payload);
  }
  void maybeReport() {
    if (!stream_end_to || stream_messages < stream_end_messages) return;
    auto report = buildBody<wire::BenchReport>(stream_end_request, [&](auto& fbb) {
      return wire::CreateBenchReport(fbb, stream_messages, stream_bytes, stream_last_ns - stream_first_ns);
    });
    reply(*stream_end_to, report);
    stream_end_to.reset();
    stream_messages = stream_bytes = stream_first_ns = stream_last_ns = 0;
  }
};

BenchServer::BenchServer(std::shared_ptr<Worker> worker) : state_(std::make_unique<State>()) {
  state_->worker = std::move(worker);
  state_->worker->setMessageHandler([state = state_.get()](InboundMessage&& message) { state->onMessage(std::move(message)); });
  state_->worker->setEndpointErrorHandler([state = state_.get()](std::shared_ptr<Endpoint> endpoint, Status) {
    auto& clients = state->clients;
    clients.erase(std::remove(clients.begin(), clients.end(), endpoint), clients.end());
  });
}

BenchServer::~BenchServer() {
  state_->listener.reset();
  state_->clients.clear();
  state_->worker->shutdown();
}

Status BenchServer::listen(const std::string& host, uint16_t port) {
  auto listener = state_->worker->listen(host, port, [state = state_.get()](std::shared_ptr<Endpoint> endpoint) {
    state->clients.push_back(std::move(endpoint));
    ++state->clients_left;
  });
  if (!listener) return listener.status();
  state_->listener = std::move(listener.value());
  return Status::ok();
}

uint16_t BenchServer::port() const { return state_->listener ? state_->listener->port() : 0; }
uint64_t BenchServer::rejectedMessages() const { return state_->rejected; }

Status BenchServer::serve(const std::atomic<bool>* stop, bool once) {
  size_t seen = 0;
  while (!(stop && stop->load(std::memory_order_relaxed))) {
    state_->worker->progress();
    seen = std::max(seen, state_->clients_left);
    if (once && seen > 0 && state_->clients.empty()) break;
  }
  return Status::ok();
}

void BenchServer::State::onMessage(InboundMessage&& message) {
  std::shared_ptr<Endpoint> from = message.endpoint();
  auto verified = wire::verifyMessage(message.header(), message.payloadSize());
  if (!verified) {
    ++rejected;
    SPDLOG_WARN("genie-bench: refused a message from {}: {}", from->peer(), verified.status().message());
    reply(*from, wire::buildError(0, wire::ErrorCode::InvalidMessage, verified.status().message()));
    return;
  }
  const wire::Message* msg = verified.value();
  const uint64_t id = msg->request_id();
  const size_t payload = message.payloadSize();
  switch (msg->body_type()) {
    case wire::Body::Ping: {
      scratch.reserve(*worker, payload);
      const uint64_t timestamp_ns = msg->body_as_Ping()->timestamp_ns();  // echoed, as genie-node does
      message.receivePayload({scratch.data(), payload}, [this, from, id, payload, timestamp_ns](Status s) {
        if (!s) return;
        auto pong = wire::buildPong(id, timestamp_ns);
        reply(*from, pong, {scratch.data(), payload});
      });
      return;
    }
    case wire::Body::BenchData: {
      if (stream_messages == 0 && stream_first_ns == 0) stream_first_ns = nowNs();
      scratch.reserve(*worker, payload);
      message.receivePayload({scratch.data(), payload}, [this, payload](Status s) {
        if (!s) return;
        ++stream_messages;
        stream_bytes += payload;
        stream_last_ns = nowNs();
        maybeReport();
      });
      return;
    }
    case wire::Body::BenchEnd: {
      stream_end_to = from;
      stream_end_request = id;
      stream_end_messages = msg->body_as_BenchEnd()->messages();
      maybeReport();
      return;
    }
    case wire::Body::PutTensors: {
      const auto* tensors = msg->body_as_PutTensors()->tensors();
      if (tensors == nullptr || tensors->size() != 1 || tensors->Get(0)->remote() != nullptr) {
        reply(*from, wire::buildError(id, wire::ErrorCode::InvalidMessage,
                                      "genie-bench stores exactly one tensor per PutTensors, from the payload"));
        return;
      }
      const wire::TensorSlot* slot = tensors->Get(0);
      Stored& stored = store[*slot->handle()];
      stored.size = slot->desc()->nbytes();
      stored.buffer.reserve(*worker, std::max<size_t>(stored.size, 1));
      if (payload != stored.size) {
        reply(*from, wire::buildError(id, wire::ErrorCode::InvalidMessage, "payload size differs from the tensor's"));
        return;
      }
      message.receivePayload({stored.buffer.data(), payload}, [this, from, id](Status s) {
        reply(*from, s ? wire::buildAck(id, 1) : wire::buildError(id, wire::ErrorCode::Internal, s.message()));
      });
      return;
    }
    case wire::Body::GetTensors: {
      const auto* handles = msg->body_as_GetTensors()->handles();
      if (handles == nullptr || handles->size() != 1) {
        reply(*from, wire::buildError(id, wire::ErrorCode::InvalidMessage, "genie-bench serves one tensor per GetTensors"));
        return;
      }
      auto found = store.find(*handles->Get(0));
      if (found == store.end()) {
        reply(*from, wire::buildError(id, wire::ErrorCode::UnknownHandle,
                                      "no tensor " + wire::toString(*handles->Get(0))));
        return;
      }
      wire::TensorSlotArgs slot;
      slot.handle = found->first;
      slot.desc.dtype = wire::DType::UInt8;
      slot.desc.shape = {static_cast<int64_t>(found->second.size)};
      auto data = wire::buildTensorData(id, {&slot, 1});
      if (!data) {
        reply(*from, wire::buildError(id, wire::ErrorCode::Internal, data.status().message()));
        return;
      }
      reply(*from, *data, {found->second.buffer.data(), found->second.size});
      return;
    }
    case wire::Body::FreeTensors: {
      const auto* handles = msg->body_as_FreeTensors()->handles();
      uint32_t freed = 0;
      for (uint32_t i = 0; handles && i < handles->size(); ++i) freed += store.erase(*handles->Get(i));
      if (msg->body_as_FreeTensors()->want_reply()) reply(*from, wire::buildAck(id, freed));
      return;
    }
    case wire::Body::Goodbye:
      clients.erase(std::remove(clients.begin(), clients.end(), from), clients.end());
      return;
    default:
      reply(*from, wire::buildError(id, wire::ErrorCode::InvalidMessage,
                                    fmt::format("genie-bench does not serve {}", wire::bodyName(msg->body_type()))));
  }
}

// ---- client ---------------------------------------------------------------------------

namespace {

/// The client's view of replies; everything runs on the caller's (progress) thread.
struct ClientState {
  Worker& worker;
  RegisteredBuffer scratch;
  uint64_t replies = 0;
  Status error;
  std::optional<uint64_t> report_elapsed_ns;
  uint64_t report_bytes = 0;

  void onMessage(InboundMessage&& message) {
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified) {
      error = Status(StatusCode::kInvalidMessage, "reply failed verification: " + verified.status().message());
      return;
    }
    const wire::Message* msg = verified.value();
    switch (msg->body_type()) {
      case wire::Body::Error:
        error = Status(StatusCode::kRemote, fmt::format("server error {}: {}",
                                                        wire::errorCodeName(msg->body_as_Error()->code()),
                                                        wire::stringOf(msg->body_as_Error()->message())));
        return;
      case wire::Body::BenchReport:
        report_elapsed_ns = msg->body_as_BenchReport()->elapsed_ns();
        report_bytes = msg->body_as_BenchReport()->bytes();
        return;
      default: {
        size_t size = message.payloadSize();
        scratch.reserve(worker, std::max<size_t>(size, 1));
        message.receivePayload({scratch.data(), size}, [this](Status s) {
          if (!s) error = s;
          ++replies;
        });
      }
    }
  }

  /// Drives progress until `replies` reaches `target` (or an error / timeout).
  Status awaitReplies(uint64_t target, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
    auto deadline = Clock::now() + timeout;
    uint32_t spins = 0;
    while (replies < target && error.isOk()) {
      worker.progress();
      if (++spins % 4096 == 0 && Clock::now() > deadline) {
        return GENIE_ERROR(kTimeout, "no reply from the genie-bench server in {} ms", timeout.count());
      }
    }
    return error;
  }
};

size_t iterationsFor(const BenchOptions& options, size_t size) {
  if (options.iterations) return options.iterations;
  size_t by_volume = (size_t{1} << 30) / std::max<size_t>(size, 1);
  return std::clamp<size_t>(by_volume, 100, 100000);
}

size_t warmupFor(const BenchOptions& options, size_t iterations) {
  if (options.warmup) return options.warmup;
  return std::max<size_t>(iterations / 10, 10);
}

}  // namespace

size_t bandwidthWindow(const BenchOptions& options, size_t size) {
  size_t window = std::max<size_t>(options.window, 1);
  if (options.window_bytes == 0) return window;
  return std::clamp<size_t>(options.window_bytes / std::max<size_t>(size, 1), 1, window);
}

namespace {

Result<BenchResult> runLatency(ClientState& client, Endpoint& endpoint, size_t size, size_t iterations,
                               size_t warmup, bool rate_test, size_t window) {
  RegisteredBuffer payload;
  payload.reserve(client.worker, std::max<size_t>(size, 1));
  auto ping = wire::buildPing(1, 0);
  auto send_ping = [&] {
    endpoint.send(bytesOf(ping), {payload.data(), size}, [&client](Status s) {
      if (!s && client.error.isOk()) client.error = s;
    });
  };
  const size_t in_flight = rate_test ? std::max<size_t>(window, 1) : 1;
  auto run = [&](size_t count) -> Status {
    uint64_t base = client.replies;
    size_t sent = 0;
    while (sent < count) {
      while (sent < count && sent - (client.replies - base) < in_flight) {
        send_ping();
        ++sent;
      }
      if (client.replies - base < sent) {
        // Wait for at least one more reply before sending again.
        GENIE_RETURN_IF_ERROR(client.awaitReplies(client.replies + 1));
      }
    }
    return client.awaitReplies(base + count);
  };
  GENIE_RETURN_IF_ERROR(run(warmup));
  auto start = Clock::now();
  GENIE_RETURN_IF_ERROR(run(iterations));
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  BenchResult result;
  result.test = rate_test ? "rate" : "latency";
  result.size = size;
  result.iterations = iterations;
  result.rate_per_s = iterations / seconds;
  result.window = in_flight;
  result.header_bytes = ping.size();
  result.latency_us = rate_test ? seconds * 1e6 / iterations : seconds * 1e6 / iterations / 2;
  result.bandwidth_mbs = rate_test ? 0 : size * iterations * 2 / seconds / (1 << 20);
  return result;
}

Result<BenchResult> runBandwidth(ClientState& client, Endpoint& endpoint, size_t size, size_t iterations,
                                 size_t warmup, size_t window) {
  RegisteredBuffer payload;
  payload.reserve(client.worker, std::max<size_t>(size, 1));
  auto stream = [&](size_t count) -> Result<std::pair<uint64_t, uint64_t>> {
    size_t completed = 0, sent = 0;
    while (sent < count || completed < sent) {
      if (sent < count && sent - completed < window) {
        auto data = buildBody<wire::BenchData>(sent, [&](auto& fbb) { return wire::CreateBenchData(fbb, sent); });
        endpoint.send(bytesOf(data), {payload.data(), size}, [&client, &completed](Status s) {
          if (!s && client.error.isOk()) client.error = s;
          ++completed;
        });
        ++sent;
        continue;
      }
      client.worker.progress();
      GENIE_RETURN_IF_ERROR(client.error);
    }
    client.report_elapsed_ns.reset();
    auto end = buildBody<wire::BenchEnd>(count, [&](auto& fbb) { return wire::CreateBenchEnd(fbb, count); });
    sendOrLog(endpoint, bytesOf(end));
    auto deadline = Clock::now() + std::chrono::seconds(60);
    while (!client.report_elapsed_ns && client.error.isOk()) {
      client.worker.progress();
      if (Clock::now() > deadline) return GENIE_ERROR(kTimeout, "no BenchReport from the server in 60 s");
    }
    GENIE_RETURN_IF_ERROR(client.error);
    return std::make_pair(*client.report_elapsed_ns, client.report_bytes);
  };
  auto warm = stream(warmup);
  if (!warm) return warm.status();
  auto measured = stream(iterations);
  if (!measured) return measured.status();
  auto [elapsed_ns, bytes] = measured.value();
  double seconds = std::max<double>(elapsed_ns, 1) / 1e9;
  BenchResult result;
  result.test = "bandwidth";
  result.size = size;
  result.iterations = iterations;
  result.window = window;
  result.bandwidth_mbs = bytes / seconds / (1 << 20);
  result.rate_per_s = iterations / seconds;
  result.latency_us = seconds * 1e6 / iterations;
  return result;
}

Result<BenchResult> runTensor(ClientState& client, Endpoint& endpoint, BenchTest test, size_t size,
                              size_t iterations, size_t warmup) {
  RegisteredBuffer tensor;
  tensor.reserve(client.worker, std::max<size_t>(size, 1));
  std::mt19937_64 random(std::random_device{}());
  wire::Handle handle(random(), random());
  wire::TensorSlotArgs slot;
  slot.handle = handle;
  slot.desc.dtype = wire::DType::UInt8;
  slot.desc.shape = {static_cast<int64_t>(size)};
  auto put = wire::buildPutTensors(1, {&slot, 1});
  if (!put) return put.status();
  auto get = wire::buildGetTensors(2, {&handle, 1});
  auto& request = test == BenchTest::kPut ? put.value() : get;
  ConstBuffer request_payload = test == BenchTest::kPut ? ConstBuffer{tensor.data(), size} : ConstBuffer{};
  auto round_trips = [&](size_t count, const flatbuffers::DetachedBuffer& header, ConstBuffer body) -> Status {
    for (size_t i = 0; i < count; ++i) {
      sendOrLog(endpoint, bytesOf(header), body);
      GENIE_RETURN_IF_ERROR(client.awaitReplies(client.replies + 1));
    }
    return Status::ok();
  };
  if (test == BenchTest::kGet) GENIE_RETURN_IF_ERROR(round_trips(1, put.value(), {tensor.data(), size}));
  GENIE_RETURN_IF_ERROR(round_trips(warmup, request, request_payload));
  auto start = Clock::now();
  GENIE_RETURN_IF_ERROR(round_trips(iterations, request, request_payload));
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  auto free = wire::buildFreeTensors(3, {&handle, 1}, /*want_reply=*/false);
  sendOrLog(endpoint, bytesOf(free));
  BenchResult result;
  result.test = std::string(benchTestName(test));
  result.size = size;
  result.iterations = iterations;
  result.latency_us = seconds * 1e6 / iterations;
  result.bandwidth_mbs = double(size) * iterations / seconds / (1 << 20);
  result.rate_per_s = iterations / seconds;
  return result;
}

}  // namespace

Result<std::vector<BenchResult>> runBenchClient(Worker& worker, Endpoint& endpoint, const BenchOptions& options) {
  ClientState client{worker, {}, 0, Status::ok(), std::nullopt, 0};
  worker.setMessageHandler([&client](InboundMessage&& message) { client.onMessage(std::move(message)); });
  std::vector<BenchResult> results;
  for (BenchTest test : options.tests) {
    std::vector<size_t> sizes = test == BenchTest::kRate ? std::vector<size_t>{0} : options.sizes;
    for (size_t size : sizes) {
      size_t iterations = iterationsFor(options, test == BenchTest::kRate ? 8 : size);
      size_t warmup = warmupFor(options, iterations);
      Result<BenchResult> result = GENIE_ERROR(kInternal, "not run");
      switch (test) {
        case BenchTest::kLatency: result = runLatency(client, endpoint, size, iterations, warmup, false, 1); break;
        case BenchTest::kRate: result = runLatency(client, endpoint, 0, iterations, warmup, true, options.window); break;
        case BenchTest::kBandwidth:
          result = runBandwidth(client, endpoint, size, iterations, warmup, bandwidthWindow(options, size));
          break;
        case BenchTest::kPut:
        case BenchTest::kGet: result = runTensor(client, endpoint, test, size, iterations, warmup); break;
      }
      if (!result) {
        worker.setMessageHandler(nullptr);
        return Status(result.status().code(),
                      fmt::format("{} at {} bytes: {}", benchTestName(test), size, result.status().message()),
                      result.status().file(), result.status().line());
      }
      results.push_back(result.value());
    }
  }
  auto goodbye = wire::buildGoodbye(0, "genie-bench done");
  bool sent = false;
  endpoint.send(bytesOf(goodbye), {}, [&sent](Status) { sent = true; });
  worker.waitUntil([&] { return sent; }, std::chrono::seconds(2));
  worker.setMessageHandler(nullptr);
  return results;
}

}  // namespace genie::bench
