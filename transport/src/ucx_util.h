// Private helpers shared by the transport's .cc files: UCX status conversion, parsing.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <string_view>
#include <initializer_list>
#include <vector>

#include "genie/status.h"
#include "genie/transport/types.h"

namespace genie::transport {

/// Maps a UCX status to a Genie Status whose message names `what` and UCX's reason.
Status statusFromUcx(ucs_status_t status, std::string_view what, const char* file, int line);
#define GENIE_UCX_STATUS(st, ...) \
  ::genie::transport::statusFromUcx((st), ::fmt::format(__VA_ARGS__), __FILE__, __LINE__)

inline ucs_memory_type_t ucsMemoryType(MemoryType type) {
  return type == MemoryType::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
}

/// The items of a UCX_TLS list: "sm,tcp" -> {"sm", "tcp"} (empty items dropped).
std::vector<std::string_view> tlsItems(std::string_view tls);
/// Whether the UCX_TLS list names one of `names` as an item ("^x" exclusions never match).
bool tlsNamesAny(std::string_view tls, std::initializer_list<std::string_view> names);

/// Summarizes ucp_ep_print_info() as "am=tcp/lo am_bw=tcp/lo rma_bw=tcp/lo".
std::string describeEndpointLanes(ucp_ep_h ep);

/// True if `tls` (UCX_TLS syntax) asks for a transport faster than tcp (shared memory,
/// verbs, CUDA) while `lanes` (describeEndpointLanes) moves data over tcp only.
bool slowerThanRequested(std::string_view tls, std::string_view lanes);

}  // namespace genie::transport
