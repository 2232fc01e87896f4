// genie-bench's driver (perf/lib) against a real BenchServer on loopback, on tcp and sm:
// every test runs and reports sane numbers, a Pong echoes its Ping, and garbage gets an
// error reply while the server keeps serving.
#include <future>
#include <random>
#include <thread>

#include "genie/wire/codec.h"
#include "transport_bench.h"
#include "transport_test_util.h"

namespace genie::bench {
namespace {

using namespace std::chrono_literals;
using transport::testing::Awaitable;

class BenchSmokeTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::promise<uint16_t> port;
    auto port_future = port.get_future();
    server_thread_ = std::thread([this, &port] {
      transport::WorkerConfig config;
      config.tls = GetParam();
      config.net_devices = "lo";
      config.name = "bench-server";
      auto worker = transport::Worker::create(config);
      if (!worker) {
        port.set_value(0);
        return;
      }
      BenchServer server(*worker);
      if (!server.listen("127.0.0.1", 0)) {
        port.set_value(0);
        return;
      }
      port.set_value(server.port());
      (void)server.serve(&stop_, /*once=*/false);
      rejected_ = server.rejectedMessages();
    });
    port_ = port_future.get();
    ASSERT_NE(port_, 0);
    transport::WorkerConfig config;
    config.tls = GetParam();
    config.net_devices = "lo";
    auto worker = transport::Worker::create(config);
    ASSERT_TRUE(worker.isOk()) << worker.status().toString();
    worker_ = *worker;
    auto endpoint = worker_->connect("127.0.0.1", port_);
    ASSERT_TRUE(endpoint.isOk()) << endpoint.status().toString();
    endpoint_ = *endpoint;
  }
  void TearDown() override {
    endpoint_.reset();
    if (worker_) worker_->shutdown();
    stop_ = true;
    if (server_thread_.joinable()) server_thread_.join();
  }

  std::atomic<bool> stop_{false};
  std::thread server_thread_;
  uint16_t port_ = 0;
  uint64_t rejected_ = 0;
  std::shared_ptr<transport::Worker> worker_;
  std::shared_ptr<transport::Endpoint> endpoint_;
};

TEST_P(BenchSmokeTest, EveryTestRunsAndReportsSaneNumbers) {
  BenchOptions options;
  options.tests = {BenchTest::kLatency, BenchTest::kBandwidth, BenchTest::kPut, BenchTest::kGet, BenchTest::kRate};
  options.sizes = {8, 256 << 10, 4 << 20};
  options.iterations = 50;
  options.warmup = 5;
  auto results = runBenchClient(*worker_, *endpoint_, options);
  ASSERT_TRUE(results.isOk()) << results.status().toString();
  ASSERT_EQ(results->size(), 4u * 3u + 1u);
  for (const auto& r : *results) {
    SCOPED_TRACE(r.test + " " + std::to_string(r.size));
    EXPECT_EQ(r.iterations, 50u);
    EXPECT_GT(r.latency_us, 0.0);
    EXPECT_LT(r.latency_us, 1e6);
    EXPECT_GT(r.rate_per_s, 0.0);
    if (r.test != "rate") {
      EXPECT_GT(r.bandwidth_mbs, 0.0);
    }
  }
  EXPECT_EQ((*results)[3].test, "bandwidth");
  EXPECT_EQ((*results)[5].size, size_t{4} << 20);
}

TEST_P(BenchSmokeTest, GarbageGetsAnErrorReplyAndTheServerKeepsServing) {
  std::mt19937 random(42);
  std::vector<std::byte> garbage(200);
  for (auto& b : garbage) b = std::byte(random());
  auto reply = std::make_shared<Awaitable<std::string>>();
  worker_->setMessageHandler([reply](transport::InboundMessage message) {
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified || verified.value()->body_type() != wire::Body::Error) {
      reply->set("unexpected reply");
      return;
    }
    const wire::Error* error = verified.value()->body_as_Error();
    reply->set(std::string(wire::errorCodeName(error->code())) + ": " + std::string(wire::stringOf(error->message())));
  });
  endpoint_->send(garbage, {}, [](Status) {});
  auto deadline = std::chrono::steady_clock::now() + 10s;
  std::optional<std::string> text;
  while (!(text = reply->wait(0ms)) && std::chrono::steady_clock::now() < deadline) worker_->progress();
  ASSERT_TRUE(text.has_value()) << "no reply to a garbage message";
  EXPECT_EQ(text->rfind("InvalidMessage: ", 0), 0u) << *text;
  // The same connection still gets served.
  BenchOptions options;
  options.tests = {BenchTest::kLatency};
  options.sizes = {8};
  options.iterations = 20;
  options.warmup = 2;
  auto results = runBenchClient(*worker_, *endpoint_, options);
  ASSERT_TRUE(results.isOk()) << results.status().toString();
  endpoint_.reset();
  worker_->shutdown();
  stop_ = true;
  server_thread_.join();
  EXPECT_EQ(rejected_, 1u);
}

TEST_P(BenchSmokeTest, APongEchoesItsPingsTimestampAndPayload) {
  struct Reply {
    uint64_t request_id = 0, timestamp_ns = 0;
    std::vector<std::byte> payload;
  };
  auto reply = std::make_shared<Awaitable<std::optional<Reply>>>();
  worker_->setMessageHandler([reply](transport::InboundMessage message) {
    auto verified = wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified || verified.value()->body_type() != wire::Body::Pong) {
      reply->set(std::nullopt);
      return;
    }
    auto got = std::make_shared<Reply>(Reply{verified.value()->request_id(),
                                             verified.value()->body_as_Pong()->timestamp_ns(),
                                             std::vector<std::byte>(message.payloadSize())});
    message.receivePayload({got->payload.data(), got->payload.size()},
                           [reply, got](Status s) { reply->set(s ? std::optional(*got) : std::nullopt); });
  });
  std::vector<std::byte> payload(24);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = std::byte(i * 7 + 1);
  auto ping = wire::buildPing(77, 123456789);
  endpoint_->send(wire::bytesOf(ping), {payload.data(), payload.size()}, [](Status) {});
  auto deadline = std::chrono::steady_clock::now() + 10s;
  std::optional<std::optional<Reply>> got;
  while (!(got = reply->wait(0ms)) && std::chrono::steady_clock::now() < deadline) worker_->progress();
  ASSERT_TRUE(got.has_value()) << "no reply to a Ping";
  ASSERT_TRUE(got->has_value()) << "the reply to a Ping was not a verified Pong with its payload";
  EXPECT_EQ((*got)->request_id, 77u);
  EXPECT_EQ((*got)->timestamp_ns, 123456789u);  // docs/wire_format.md: Pong echoes timestamp_ns
  EXPECT_EQ((*got)->payload, payload);
}

INSTANTIATE_TEST_SUITE_P(Ucx, BenchSmokeTest, ::testing::Values("tcp", "sm"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace genie::bench
