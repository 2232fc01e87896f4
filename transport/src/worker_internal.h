// Private: what the active-message callback and InboundMessage agree on.
#pragma once

#include <ucp/api/ucp.h>

#include <algorithm>

#include "genie/transport/endpoint.h"
#include "genie/transport/worker.h"

namespace genie::transport {

/// A rendezvous receive of `bytes` from the peer starts (progress thread): its silence is not
/// held against it while the data may still be flowing (EndpointState::bulk_until). Receives
/// in flight together share the link, so each adds its own time at kMinBulkBytesPerSecond to
/// what is still allowed (64 messages of 64 MiB: 64 s, not the 1 s of one). The receive's
/// completion decrements bulk_receives.
inline void noteBulkReceive(EndpointState& from, size_t bytes,
                            EndpointState::Clock::time_point now = EndpointState::Clock::now()) {
  ++from.bulk_receives;
  from.bulk_until = std::max(from.bulk_until, now) + std::chrono::milliseconds(bytes * 1000 / kMinBulkBytesPerSecond);
}

/// That receive completed or failed (progress thread).
inline void endBulkReceive(EndpointState& from) {
  if (from.bulk_receives > 0) --from.bulk_receives;
}

/// Lives on the stack of an active-message callback. A message received or released while
/// its own callback runs must not call into UCX for its data; it records what the callback
/// should return instead (UCS_OK: UCX frees the data; UCS_INPROGRESS: kept or handed over).
struct AmCallbackScope {
  enum class Disposition { kKeep, kRelease };

  explicit AmCallbackScope(Worker& worker) : worker(worker), previous(worker.am_scope_) {
    ++worker.am_generation_;
    worker.am_scope_ = this;
  }
  ~AmCallbackScope() { worker.am_scope_ = previous; }
  AmCallbackScope(const AmCallbackScope&) = delete;
  AmCallbackScope& operator=(const AmCallbackScope&) = delete;

  ucs_status_t ucxReturn(size_t payload_length) const {
    if (payload_length == 0 || disposition == Disposition::kRelease) return UCS_OK;
    return UCS_INPROGRESS;
  }

  /// True if the message of `generation` is the one whose callback is running.
  static AmCallbackScope* current(const Worker& worker, uint64_t generation) {
    return worker.amScope() != nullptr && worker.amGeneration() == generation ? worker.amScope() : nullptr;
  }

  Worker& worker;
  AmCallbackScope* previous;
  Disposition disposition = Disposition::kKeep;
};

}  // namespace genie::transport
