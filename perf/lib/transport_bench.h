// genie-bench as a library: network microbenchmarks of Genie's data plane in the spirit of
// ucx_perftest, so that the CLI (tools/genie-bench) and the smoke test share one driver.
//
// One process serves (BenchServer), the other drives the tests (runBenchClient). Both drive
// their worker's progress on the calling thread (busy polling, as ucx_perftest does), and
// every message is a verified Genie wire message (schemas/genie.fbs):
//   latency     Ping/Pong with a `size`-byte payload each way; half the round trip (µs)
//   bandwidth   a stream of BenchData messages with `size`-byte payloads, `window` in flight
//               (fewer for large payloads: `window_bytes`); measured at the receiver
//               (BenchReport), MB/s with MB = 2^20 bytes as ucx_perftest reports it
//   put / get   PutTensors / GetTensors of one `size`-byte tensor into / out of the server's
//               registered store, answered by Ack / TensorData: round trip (µs) and MB/s
//   rate        empty Ping/Pong request/response, `window` in flight: requests per second
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "genie/status.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/worker.h"

namespace genie::bench {

enum class BenchTest { kLatency, kBandwidth, kPut, kGet, kRate };

std::string_view benchTestName(BenchTest test);
/// "latency" -> kLatency, ... Errors: kInvalidArgument naming the unknown test.
Result<BenchTest> parseBenchTest(std::string_view name);

/// The defaults were chosen by measurement (docs/perf/transport.md, 2026-11-25,
/// perf/scripts/sweep_bench_defaults.py): on loopback tcp and sm, windows of 8 to 64 messages
/// and runs of 256 MiB to 4 GiB gave the same bandwidth at 64 KiB and 1 MiB within the
/// machine's noise, and at 64 MiB 2 to 4 messages in flight (128-256 MiB) are as fast as 32,
/// so large payloads keep at most `window_bytes` in flight.
struct BenchOptions {
  std::vector<BenchTest> tests{BenchTest::kLatency, BenchTest::kBandwidth};
  std::vector<size_t> sizes{8, size_t{1} << 20};  // bytes
  /// Measured iterations per (test, size); 0 picks one from the size (about 1 GiB moved,
  /// between 100 and 100,000 iterations).
  size_t iterations = 0;
  /// Unmeasured iterations first; 0 picks 10% of the iterations (at least 10).
  size_t warmup = 0;
  /// Messages in flight for bandwidth and rate.
  size_t window = 32;
  /// Payload bytes in flight for bandwidth at most (bytes): the window shrinks to
  /// max(1, window_bytes / size) for large payloads. 0: no bound.
  size_t window_bytes = size_t{256} << 20;
};

/// Messages in flight for a bandwidth stream of `size`-byte payloads under `options`.
size_t bandwidthWindow(const BenchOptions& options, size_t size);

struct BenchResult {
  std::string test;         // benchTestName
  size_t size = 0;          // payload bytes
  size_t iterations = 0;
  size_t window = 1;        // messages in flight (bandwidth, rate)
  double latency_us = 0;    // per message (half round trip for latency; round trip for put/get)
  double bandwidth_mbs = 0; // MB/s, MB = 2^20 bytes
  double rate_per_s = 0;    // messages (or requests) per second
  size_t header_bytes = 0;  // latency, rate: the FlatBuffer header each Ping carries beside the payload
};

/// Serves benchmark clients on `worker` (whose progress the caller's thread drives) until
/// `stop` is set or, with `once`, the first client disconnects. Errors: listen failures.
class BenchServer {
 public:
  explicit BenchServer(std::shared_ptr<transport::Worker> worker);
  ~BenchServer();
  /// Listens on host:port (0 = any free port).
  Status listen(const std::string& host, uint16_t port);
  uint16_t port() const;
  /// Progress loop; returns when `*stop` becomes true or (once) the first client left.
  Status serve(const std::atomic<bool>* stop, bool once);
  /// Messages refused because they failed verification (answered with Error).
  uint64_t rejectedMessages() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Runs every (test, size) of `options` against a BenchServer reached through `endpoint`.
/// The caller's thread drives `worker`'s progress. Errors: kPeerUnreachable, kTimeout,
/// kRemote (the server answered with an Error).
Result<std::vector<BenchResult>> runBenchClient(transport::Worker& worker, transport::Endpoint& endpoint,
                                                const BenchOptions& options);

}  // namespace genie::bench
