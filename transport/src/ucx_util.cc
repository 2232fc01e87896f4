#include "ucx_util.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

namespace genie::transport {

Status statusFromUcx(ucs_status_t status, std::string_view what, const char* file, int line) {
  StatusCode code = StatusCode::kInternal;
  switch (status) {
    case UCS_OK: return Status::ok();
    case UCS_ERR_CANCELED: code = StatusCode::kCancelled; break;
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT: code = StatusCode::kOutOfMemory; break;
    case UCS_ERR_TIMED_OUT: code = StatusCode::kTimeout; break;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_IO_ERROR: code = StatusCode::kPeerUnreachable; break;
    case UCS_ERR_BUSY: code = StatusCode::kAlreadyExists; break;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR: code = StatusCode::kInvalidArgument; break;
    case UCS_ERR_UNSUPPORTED: code = StatusCode::kUnsupported; break;
    case UCS_ERR_MESSAGE_TRUNCATED: code = StatusCode::kInvalidArgument; break;
    default: break;
  }
  return Status(code, fmt::format("{}: {}", what, ucs_status_string(status)), file, line);
}

std::string describeEndpointLanes(ucp_ep_h ep) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_ep_print_info(ep, stream);
  std::fclose(stream);
  std::istringstream lines(std::string(text, size));
  std::free(text);
  // Lines look like: "#   lane[0]:  0:tcp/lo.0 md[0]  -> md[0]/tcp/sysdev[255] rma_bw#0 am am_bw#0"
  std::map<std::string, std::set<std::string>> by_role;
  std::string line;
  while (std::getline(lines, line)) {
    auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':', lane) + 1));
    std::string resource, word;
    words >> resource;  // "0:tcp/lo.0"
    resource = resource.substr(resource.find(':') + 1);
    resource = resource.substr(0, resource.rfind('.'));
    while (words >> word) {
      auto hash = word.find('#');
      std::string role = word.substr(0, hash);
      if (role == "am" || role == "am_bw" || role == "rma" || role == "rma_bw" || role == "amo" ||
          role == "tag" || role == "wireup" || role == "cm") {
        by_role[role].insert(resource);
      }
    }
  }
  std::string out;
  for (const auto& [role, resources] : by_role) {
    if (!out.empty()) out += ' ';
    out += role + "=" + fmt::format("{}", fmt::join(resources, ","));
  }
  return out;
}

std::vector<std::string_view> tlsItems(std::string_view tls) {
  std::vector<std::string_view> items;
  while (!tls.empty()) {
    size_t comma = tls.find(',');
    std::string_view item = tls.substr(0, comma);
    if (!item.empty()) items.push_back(item);
    if (comma == std::string_view::npos) break;
    tls.remove_prefix(comma + 1);
  }
  return items;
}

bool tlsNamesAny(std::string_view tls, std::initializer_list<std::string_view> names) {
  for (std::string_view item : tlsItems(tls)) {
    for (std::string_view name : names) {
      if (item == name) return true;
    }
  }
  return false;
}

bool slowerThanRequested(std::string_view tls, std::string_view lanes) {
  const bool asked_fast =
      tlsNamesAny(tls, {"sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "rc", "rc_x", "rc_v", "rc_mlx5", "dc",
                        "dc_x", "dc_mlx5", "ud", "ud_x", "ud_v", "ud_mlx5", "ib", "cuda_ipc", "gdr_copy"});
  if (!asked_fast || lanes.empty()) return false;
  // Data lanes (am_bw / rma_bw, or am when there is no bw lane) all on tcp?
  auto role_lane = [&](std::string_view role) -> std::string_view {
    std::string key = std::string(role) + "=";
    auto pos = lanes.find(key);
    if (pos == std::string_view::npos || (pos != 0 && lanes[pos - 1] != ' ')) return {};
    auto end = lanes.find(' ', pos);
    return lanes.substr(pos + key.size(), end == std::string_view::npos ? end : end - pos - key.size());
  };
  for (std::string_view role : {"am", "am_bw", "rma_bw"}) {
    std::string_view resources = role_lane(role);
    if (!resources.empty() && resources.find("tcp/") == std::string_view::npos) return false;
  }
  return true;
}

std::string_view memoryTypeName(MemoryType type) {
  return type == MemoryType::kCuda ? "cuda" : "host";
}

}  // namespace genie::transport
