#include "genie/transport/config.h"

#include <charconv>
#include <cstdlib>
#include <functional>
#include <string_view>

#include <fmt/format.h>

#include "genie/units.h"

namespace genie::transport {

namespace {

Result<uint64_t> parseUnsigned(const char* name, std::string_view text) {
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return GENIE_ERROR(kInvalidArgument, "{}='{}' is not a non-negative integer", name, text);
  }
  return value;
}

// A row for a duration member (ms or µs): parsed as a non-negative integer.
template <typename Duration>
ConfigEntry duration(const char* env, const char* type, Duration WorkerConfig::*member, const char* help) {
  return {env, std::to_string((WorkerConfig{}.*member).count()), type, help,
          [env, member](WorkerConfig& config, std::string_view text) -> Status {
            auto value = parseUnsigned(env, text);
            if (!value) return value.status();
            config.*member = Duration(*value);
            return Status::ok();
          },
          [member](const WorkerConfig& config) { return std::to_string((config.*member).count()); }};
}

}  // namespace

const std::vector<ConfigEntry>& configTable() {
  static const std::vector<ConfigEntry> kTable = {
      {"GENIE_UCX_TLS", "(UCX_TLS, else UCX's choice)", "string",
       "UCX transports, UCX_TLS syntax (tcp, sm, rc, ...); 'sm' gets tcp added for connection setup",
       [](WorkerConfig& config, std::string_view text) {
         config.tls = text;
         return Status::ok();
       },
       [](const WorkerConfig& config) {
         const char* ucx_tls = std::getenv("UCX_TLS");
         if (!config.tls.empty()) return config.tls;
         return ucx_tls ? std::string(ucx_tls) + " (UCX_TLS)" : std::string("(UCX default)");
       }},
      {"GENIE_UCX_NET_DEVICES", "(UCX_NET_DEVICES, else all)", "string",
       "UCX network devices, UCX_NET_DEVICES syntax (lo, eth0, mlx5_0:1)",
       [](WorkerConfig& config, std::string_view text) {
         config.net_devices = text;
         return Status::ok();
       },
       [](const WorkerConfig& config) { return config.net_devices.empty() ? std::string("(all)") : config.net_devices; }},
      duration("GENIE_PEER_TIMEOUT_MS", "duration ms", &WorkerConfig::peer_timeout,
               "a connection silent this long (no message, no heartbeat) fails with its pending requests; 0: off"),
      duration("GENIE_CLOSE_TIMEOUT_MS", "duration ms", &WorkerConfig::close_timeout,
               "graceful close flush bound, then force"),
      duration("GENIE_CONNECT_TIMEOUT_MS", "duration ms", &WorkerConfig::connect_timeout,
               "connection establishment bound"),
      duration("GENIE_BUSY_POLL_US", "duration us", &WorkerConfig::busy_poll,
               "progress thread polls this long after the last event before sleeping on the event fd"),
      {"GENIE_RNDV_THRESHOLD", "0 (UCX auto)", "size bytes",
       "payloads at least this large use rendezvous into the receiver's buffer (64K = 64KiB, 1MB = 10^6)",
       [](WorkerConfig& config, std::string_view text) -> Status {
         auto value = parseByteSize(text);
         if (!value) return GENIE_ERROR(kInvalidArgument, "GENIE_RNDV_THRESHOLD: {}", value.status().message());
         config.rndv_threshold = *value;
         return Status::ok();
       },
       [](const WorkerConfig& config) {
         return config.rndv_threshold ? std::to_string(config.rndv_threshold) : std::string("0 (UCX auto)");
       }},
  };
  return kTable;
}

Result<WorkerConfig> WorkerConfig::fromEnvironment() {
  WorkerConfig config;
  for (const auto& entry : configTable()) {
    if (const char* text = std::getenv(entry.env)) GENIE_RETURN_IF_ERROR(entry.parse(config, text));
  }
  return config;
}

std::string formatConfig(const WorkerConfig& config) {
  std::string out;
  for (const auto& entry : configTable()) {
    out += fmt::format("{}={}  # {}, {}\n", entry.env, entry.format(config), entry.type, entry.help);
  }
  return out;
}

}  // namespace genie::transport
