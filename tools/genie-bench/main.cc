// genie-bench: network microbenchmarks of Genie's data plane (a thin CLI over perf/lib).
//
//   genie-bench --server [--port 13337]                      serve until interrupted
//   genie-bench 127.0.0.1 [--port 13337] --tests latency,bandwidth --sizes 8,1M,64M [--json]
//
// Honours UCX_TLS / UCX_NET_DEVICES (and GENIE_UCX_TLS / GENIE_UCX_NET_DEVICES).
#include <csignal>
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "genie/transport/config.h"
#include "genie/units.h"
#include "genie/transport/worker.h"
#include "transport_bench.h"

namespace {

std::atomic<bool> g_stop{false};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"genie-bench: latency, bandwidth, tensor put/get and request rate over Genie's UCX data plane"};
  bool server = false, json = false, print_config = false, once = false;
  std::string host = "127.0.0.1";
  uint16_t port = 13337;
  std::vector<std::string> tests{"latency", "bandwidth"};
  std::vector<std::string> sizes{"8", "1M"};
  genie::bench::BenchOptions options;
  std::string log_level = "warn";
  app.add_flag("--server", server, "serve benchmark clients");
  app.add_flag("--once", once, "server: exit after the first client leaves");
  app.add_option("host", host, "client: the server's address")->capture_default_str();
  app.add_option("-p,--port", port, "port to listen on / connect to")->capture_default_str();
  app.add_option("-t,--tests", tests, "latency, bandwidth, put, get, rate")->delimiter(',')->capture_default_str();
  app.add_option("-s,--sizes", sizes, "payload sizes: 8, 64K, 1M = 1MiB = 2^20 bytes, 1MB = 10^6 (K, G alike)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("-n,--iterations", options.iterations,
                 "measured iterations per test and size (0: by size, about 1 GiB moved, 100 to 100,000)")
      ->capture_default_str();
  app.add_option("-w,--warmup", options.warmup, "warm-up iterations (0: 10% of iterations, at least 10)")
      ->capture_default_str();
  app.add_option("--window", options.window, "messages in flight for bandwidth and rate")->capture_default_str();
  std::string window_bytes = fmt::format("{}M", options.window_bytes >> 20);
  app.add_option("--window-bytes", window_bytes,
                 "bandwidth: payload bytes in flight at most, the window shrinks for large sizes (0: no bound)")
      ->capture_default_str();
  app.add_flag("--json", json, "print results as a JSON array of objects");
  app.add_flag("--print-config", print_config, "print the effective data-plane configuration and exit");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_default_logger(spdlog::stderr_color_mt("genie-bench"));
  spdlog::set_level(spdlog::level::from_str(log_level));

  auto config = genie::transport::WorkerConfig::fromEnvironment();
  if (!config) {
    std::fprintf(stderr, "genie-bench: %s\n", config.status().message().c_str());
    return 2;
  }
  config->name = server ? "genie-bench-server" : "genie-bench-client";
  if (print_config) {
    std::cout << genie::transport::formatConfig(*config);
    return 0;
  }
  options.tests.clear();
  for (const auto& name : tests) {
    auto test = genie::bench::parseBenchTest(name);
    if (!test) {
      std::fprintf(stderr, "genie-bench: %s\n", test.status().message().c_str());
      return 2;
    }
    options.tests.push_back(*test);
  }
  if (auto bytes = genie::parseByteSize(window_bytes); bytes) {
    options.window_bytes = *bytes;
  } else {
    std::fprintf(stderr, "genie-bench: %s\n", bytes.status().message().c_str());
    return 2;
  }
  options.sizes.clear();
  for (const auto& text : sizes) {
    auto size = genie::parseByteSize(text);
    if (!size) {
      std::fprintf(stderr, "genie-bench: %s\n", size.status().message().c_str());
      return 2;
    }
    options.sizes.push_back(*size);
  }

  auto worker = genie::transport::Worker::create(*config);
  if (!worker) {
    std::fprintf(stderr, "genie-bench: %s\n", worker.status().toString().c_str());
    return 1;
  }
  if (server) {
    std::signal(SIGINT, [](int) { g_stop = true; });
    std::signal(SIGTERM, [](int) { g_stop = true; });
    genie::bench::BenchServer bench_server(*worker);
    if (auto st = bench_server.listen(host == "127.0.0.1" ? "0.0.0.0" : host, port); !st) {
      std::fprintf(stderr, "genie-bench: %s\n", st.toString().c_str());
      return 1;
    }
    std::fprintf(stderr, "genie-bench: serving on port %u (UCX %s, UCX_TLS=%s)\n", bench_server.port(),
                 (*worker)->info().ucx_version.c_str(),
                 (*worker)->info().tls.empty() ? "default" : (*worker)->info().tls.c_str());
    auto st = bench_server.serve(&g_stop, once);
    return st ? 0 : 1;
  }

  auto endpoint = (*worker)->connect(host, port);
  if (!endpoint) {
    std::fprintf(stderr, "genie-bench: %s\n", endpoint.status().toString().c_str());
    return 1;
  }
  auto results = genie::bench::runBenchClient(**worker, **endpoint, options);
  std::string transports = (*endpoint)->transports();
  (*endpoint)->close();
  endpoint->reset();
  (*worker)->shutdown();
  if (!results) {
    std::fprintf(stderr, "genie-bench: %s\n", results.status().toString().c_str());
    return 1;
  }
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& r : *results) {
      out.push_back({{"test", r.test},
                     {"size", r.size},
                     {"iterations", r.iterations},
                     {"window", r.window},
                     {"latency_us", r.latency_us},
                     {"bandwidth_mbs", r.bandwidth_mbs},
                     {"rate_per_s", r.rate_per_s},
                     {"header_bytes", r.header_bytes},
                     {"transports", transports}});
    }
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  std::cout << fmt::format("# genie-bench over [{}]\n", transports);
  std::cout << fmt::format("{:<10} {:>12} {:>10} {:>14} {:>16} {:>14}\n", "test", "size (B)", "iters",
                           "latency (us)", "bandwidth (MB/s)", "rate (msg/s)");
  for (const auto& r : *results) {
    std::cout << fmt::format("{:<10} {:>12} {:>10} {:>14.3f} {:>16.1f} {:>14.0f}\n", r.test, r.size, r.iterations,
                             r.latency_us, r.bandwidth_mbs, r.rate_per_s);
  }
  return 0;
}
