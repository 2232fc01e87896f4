// Configuration of the data plane: one table (name, default, help, type with units), read
// from GENIE_* environment variables, printable with `genie-bench --print-config`.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "genie/status.h"

namespace genie::transport {

struct WorkerConfig {
  /// Name of the worker in logs and UCX traces.
  std::string name = "genie";
  /// UCX transports (UCX_TLS syntax, e.g. "tcp", "sm"). Empty: UCX's own choice, which
  /// honours the UCX_TLS environment variable. "sm" alone gets "tcp" added, because the
  /// sockaddr connection manager needs it to establish the connection; data then moves over
  /// shared memory (see docs/configuration.md).
  std::string tls;
  /// UCX network devices (UCX_NET_DEVICES syntax, e.g. "lo", "eth0,mlx5_0:1"). Empty: all.
  std::string net_devices;
  /// A connection on which nothing (no message, no heartbeat) arrived for this long fails, with
  /// every pending request (ms): a dead, stopped or hung peer or a cut link is seen within
  /// peer_timeout + peer_timeout / 8. Heartbeats go out every peer_timeout / 8 where nothing
  /// else was sent; UCX's keepalive runs every peer_timeout / 4. 0: no heartbeats and no such
  /// failure (UCX's keepalive only, every 250 ms).
  std::chrono::milliseconds peer_timeout{2000};
  /// close(): how long a graceful flush may take before the endpoint is force-closed (ms).
  std::chrono::milliseconds close_timeout{1000};
  /// connect(): how long establishing a connection may take (ms).
  std::chrono::milliseconds connect_timeout{5000};
  /// Progress thread: keep polling this long after the last event before sleeping on the
  /// worker's event fd (µs). 0 sleeps as soon as idle.
  std::chrono::microseconds busy_poll{100};
  /// Progress thread: call sched_yield() after each poll that found nothing. For a client
  /// whose callers poll briefly for their replies (genie::client::Client): the caller then gets
  /// the core at once. Off for genie-node, whose kernels (OpenMP) lose more to a yielding
  /// poller than its round trips gain (MiniLM: the node's execution 50 -> 65 ms).
  bool yield_while_polling = false;
  /// Payloads at least this large use rendezvous (received straight into the receiver's
  /// buffer). 0 keeps UCX's own choice ("auto").
  size_t rndv_threshold = 0;

  /// Defaults overridden by the GENIE_* environment variables of configTable(); the first
  /// invalid one fails with kInvalidArgument naming it.
  static Result<WorkerConfig> fromEnvironment();
};

/// One row of the configuration table: the one declaration that both parses a setting from
/// its environment variable and prints its effective value.
struct ConfigEntry {
  const char* env;           // GENIE_UCX_TLS
  std::string default_text;  // as printed
  const char* type;          // "string", "duration ms", "size bytes", ...
  const char* help;
  /// Sets the member from the variable's text; kInvalidArgument naming the variable when the
  /// text is not a valid value.
  std::function<Status(WorkerConfig&, std::string_view)> parse;
  /// The member's value, as printed.
  std::function<std::string(const WorkerConfig&)> format;
};

/// Every setting of the data plane, in the order printed.
const std::vector<ConfigEntry>& configTable();

/// The effective configuration as "NAME=value  # help" lines.
std::string formatConfig(const WorkerConfig& config);

}  // namespace genie::transport
