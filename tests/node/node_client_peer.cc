// node_client_peer: a genie-node client in its own process, for tests that kill, stop or cut
// it off, or that need many sessions fast.
//
//   node_client_peer PORT BYTES [--host H] [--token T] [--watch]
//       connects, stores BYTES bytes resident, prints "ready"; then waits, or with --watch
//       pings every 100 ms and, when a ping fails, prints "lost <ms since the last good ping>:
//       <error>" and exits 3.
//   node_client_peer PORT --churn N [--host H] [--token T]
//       opens and closes N sessions one after the other on one UCX worker (connect, Hello,
//       Welcome, Goodbye, close), then prints "done N" (exit 1 at the first that fails).
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "genie/client/client.h"
#include "genie/log.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/worker.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int holdBytes(const std::string& host, uint16_t port, const std::string& token, size_t bytes, bool watch) {
  genie::client::ClientOptions options;
  options.name = "node_client_peer";
  options.auth_token = token;
  auto client = genie::client::Client::connect(host, port, options);
  if (!client) {
    std::fprintf(stderr, "%s\n", client.status().toString().c_str());
    return 1;
  }
  std::vector<std::byte> data(bytes, std::byte{1});
  genie::wire::TensorDescArgs desc;
  desc.dtype = genie::wire::DType::UInt8;
  desc.shape = {static_cast<int64_t>(bytes)};
  auto put = (*client)->putTensor(genie::client::Client::newHandle(), desc, genie::wire::Residency::StatefulKvCache, data);
  if (!put) {
    std::fprintf(stderr, "%s\n", put.toString().c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  if (!watch) {
    for (;;) pause();
  }
  auto last_good = Clock::now();
  for (;;) {
    genie::Status ping = (*client)->ping();
    if (!ping) {
      auto since = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_good).count();
      std::printf("lost %lld: %s\n", static_cast<long long>(since), ping.message().c_str());
      std::fflush(stdout);
      return 3;
    }
    last_good = Clock::now();
    std::this_thread::sleep_for(100ms);
  }
}

/// Sessions opened and closed on one worker, as fast as the node answers.
int churn(const std::string& host, uint16_t port, const std::string& token, int sessions) {
  genie::transport::WorkerConfig config;
  config.name = "node_client_peer";
  auto worker = genie::transport::Worker::create(config);
  if (!worker) {
    std::fprintf(stderr, "%s\n", worker.status().toString().c_str());
    return 1;
  }
  std::mutex mutex;
  std::condition_variable cv;
  int welcomes = 0;
  (*worker)->setMessageHandler([&](genie::transport::InboundMessage message) {
    auto verified = genie::wire::verifyMessage(message.header(), message.payloadSize());
    if (!verified || verified.value()->body_type() != genie::wire::Body::Welcome) return;
    std::lock_guard<std::mutex> lock(mutex);
    ++welcomes;
    cv.notify_all();
  });
  if (!(*worker)->startProgressThread()) return 1;
  for (int i = 0; i < sessions; ++i) {
    auto endpoint = (*worker)->connect(host, port);
    if (!endpoint) {
      std::fprintf(stderr, "session %d: %s\n", i, endpoint.status().toString().c_str());
      return 1;
    }
    auto hello = genie::wire::buildHello(1, "node_client_peer", token, getpid());
    (*endpoint)->send(genie::wire::bytesOf(hello), {}, [](genie::Status) {});
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (!cv.wait_for(lock, 10s, [&] { return welcomes == i + 1; })) {
        std::fprintf(stderr, "session %d: no Welcome in 10 s\n", i);
        return 1;
      }
    }
    auto bye = genie::wire::buildGoodbye(0, "churn");
    (*endpoint)->send(genie::wire::bytesOf(bye), {}, [](genie::Status) {});
    (*endpoint)->close();
  }
  (*worker)->shutdown();
  std::printf("done %d\n", sessions);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"node_client_peer: a genie-node client for tests"};
  int port = 0;
  size_t bytes = 0;
  int sessions = 0;
  std::string host = "127.0.0.1", token;
  bool watch = false;
  app.add_option("port", port)->required();
  app.add_option("bytes", bytes);
  app.add_option("--host", host);
  app.add_option("--token", token);
  app.add_flag("--watch", watch);
  app.add_option("--churn", sessions);
  CLI11_PARSE(app, argc, argv);
  genie::logToStderr("node_client_peer");  // stdout carries "ready" / "lost" / "done" to the test
  if (sessions > 0) {
    genie::setLogLevel("warn");  // not a line per connection
    return churn(host, static_cast<uint16_t>(port), token, sessions);
  }
  return holdBytes(host, static_cast<uint16_t>(port), token, bytes, watch);
}
