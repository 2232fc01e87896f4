// The silence allowed to a peer while its rendezvous data flows (noteBulkReceive): receives in
// flight together share the link, so their allowances add up.
#include <gtest/gtest.h>

#include <chrono>

#include "worker_internal.h"

namespace genie::transport {
namespace {

using std::chrono::milliseconds;
constexpr size_t kMiB = size_t{1} << 20;

TEST(BulkAllowance, ReceivesInFlightTogetherAddTheirTimes) {
  EndpointState state;
  const auto now = EndpointState::Clock::now();
  const auto one = milliseconds(64 * kMiB * 1000 / kMinBulkBytesPerSecond);  // one 64 MiB message
  for (int i = 0; i < 32; ++i) noteBulkReceive(state, 64 * kMiB, now);
  EXPECT_EQ(state.bulk_receives, 32u);
  EXPECT_EQ(state.bulk_until, now + 32 * one);
}

TEST(BulkAllowance, AReceiveAfterTheAllowanceRanOutStartsFromNow) {
  EndpointState state;
  const auto start = EndpointState::Clock::now();
  noteBulkReceive(state, 64 * kMiB, start);
  endBulkReceive(state);
  const auto later = start + std::chrono::seconds(10);
  noteBulkReceive(state, 64 * kMiB, later);
  EXPECT_EQ(state.bulk_receives, 1u);
  EXPECT_EQ(state.bulk_until, later + milliseconds(64 * kMiB * 1000 / kMinBulkBytesPerSecond));
}

}  // namespace
}  // namespace genie::transport
