#include "genie/transport/config.h"

#include <charconv>
#include <cstdlib>
#include <functional>

#include <fmt/format.h>

#include "genie/units.h"

namespace genie::transport {

const std::vector<ConfigEntry>& configTable() {
  static const std::vector<ConfigEntry> kTable = {
      {"GENIE_UCX_TLS", "(UCX_TLS, else UCX's choice)", "string",
       "UCX transports, UCX_TLS syntax (tcp, sm, rc, ...); 'sm' gets tcp added for connection setup"},
      {"GENIE_UCX_NET_DEVICES", "(UCX_NET_DEVICES, else all)", "string",
       "UCX network devices, UCX_NET_DEVICES syntax (lo, eth0, mlx5_0:1)"},
      {"GENIE_PEER_TIMEOUT_MS", "2000", "duration ms",
       "a connection silent this long (no message, no heartbeat) fails with its pending requests; 0: off"},
      {"GENIE_CLOSE_TIMEOUT_MS", "1000", "duration ms", "graceful close flush bound, then force"},
      {"GENIE_CONNECT_TIMEOUT_MS", "5000", "duration ms", "connection establishment bound"},
      {"GENIE_BUSY_POLL_US", "100", "duration us",
       "progress thread polls this long after the last event before sleeping on the event fd"},
      {"GENIE_RNDV_THRESHOLD", "0 (UCX auto)", "size bytes",
       "payloads at least this large use rendezvous into the receiver's buffer"},
  };
  return kTable;
}

namespace {

Result<uint64_t> parseUnsigned(const char* name, const char* text) {
  uint64_t value = 0;
  const char* end = text + std::char_traits<char>::length(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end) {
    return GENIE_ERROR(kInvalidArgument, "{}='{}' is not a non-negative integer", name, text);
  }
  return value;
}

}  // namespace

Result<WorkerConfig> WorkerConfig::fromEnvironment() {
  WorkerConfig config;
  if (const char* tls = std::getenv("GENIE_UCX_TLS")) config.tls = tls;
  if (const char* devices = std::getenv("GENIE_UCX_NET_DEVICES")) config.net_devices = devices;
  struct Number {
    const char* env;
    std::function<void(uint64_t)> set;
    bool size = false;  // a byte count (parseByteSize: 64K, 64MiB, 64MB), else a plain integer
  };
  const Number numbers[] = {
      {"GENIE_PEER_TIMEOUT_MS", [&](uint64_t v) { config.peer_timeout = std::chrono::milliseconds(v); }},
      {"GENIE_CLOSE_TIMEOUT_MS", [&](uint64_t v) { config.close_timeout = std::chrono::milliseconds(v); }},
      {"GENIE_CONNECT_TIMEOUT_MS", [&](uint64_t v) { config.connect_timeout = std::chrono::milliseconds(v); }},
      {"GENIE_BUSY_POLL_US", [&](uint64_t v) { config.busy_poll = std::chrono::microseconds(v); }},
      {"GENIE_RNDV_THRESHOLD", [&](uint64_t v) { config.rndv_threshold = v; }, true},
  };
  for (const auto& number : numbers) {
    const char* text = std::getenv(number.env);
    if (text == nullptr) continue;
    auto value = number.size ? parseByteSize(text) : parseUnsigned(number.env, text);
    if (!value && number.size) return GENIE_ERROR(kInvalidArgument, "{}: {}", number.env, value.status().message());
    if (!value) return value.status();
    number.set(*value);
  }
  return config;
}

std::string formatConfig(const WorkerConfig& config) {
  const char* ucx_tls = std::getenv("UCX_TLS");
  std::string tls = !config.tls.empty() ? config.tls : (ucx_tls ? std::string(ucx_tls) + " (UCX_TLS)" : "(UCX default)");
  const std::string values[] = {
      tls,
      config.net_devices.empty() ? std::string("(all)") : config.net_devices,
      std::to_string(config.peer_timeout.count()),
      std::to_string(config.close_timeout.count()),
      std::to_string(config.connect_timeout.count()),
      std::to_string(config.busy_poll.count()),
      config.rndv_threshold ? std::to_string(config.rndv_threshold) : std::string("0 (UCX auto)"),
  };
  std::string out;
  const auto& table = configTable();
  for (size_t i = 0; i < table.size(); ++i) {
    out += fmt::format("{}={}  # {}, {}\n", table[i].env, values[i], table[i].type, table[i].help);
  }
  return out;
}

}  // namespace genie::transport
