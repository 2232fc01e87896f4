// TensorStore: a session's handles, with each storage's bytes counted once against the
// session's quota and the node's limit.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "genie/wire/codec.h"
#include "memory_account.h"
#include "tensor_store.h"

namespace genie::node {
namespace {

constexpr auto kWeight = wire::Residency::PersistentWeight;

uint64_t residentBytes(const NodeMemory& memory) {
  uint64_t by_class[4] = {};
  memory.snapshot(by_class);
  return by_class[0] + by_class[1] + by_class[2] + by_class[3];
}

wire::ErrorCode codeOf(const Status& status) { return wire::errorCodeOf(status); }

TEST(TensorStore, ViewsOfOneStorageCountItsBytesOnceUntilTheLastGoes) {
  NodeMemory node(0);
  SessionMemory session(0);
  TensorStore store(node, session);
  at::Tensor base = at::zeros({256}, at::kFloat);  // 1 KiB
  ASSERT_TRUE(store.store(wire::Handle(1, 1), base, kWeight).isOk());
  ASSERT_TRUE(store.store(wire::Handle(1, 2), base.narrow(0, 0, 16), kWeight).isOk());
  EXPECT_EQ(store.size(), 2u);
  EXPECT_EQ(store.storages(), 1u);
  EXPECT_EQ(session.resident, 1024u);
  EXPECT_EQ(residentBytes(node), 1024u);
  EXPECT_TRUE(store.release(wire::Handle(1, 1)));
  EXPECT_EQ(session.resident, 1024u);  // the view still holds the storage
  ASSERT_NE(store.find(wire::Handle(1, 2)), nullptr);
  EXPECT_EQ(store.find(wire::Handle(1, 2))->numel(), 16);
  EXPECT_TRUE(store.release(wire::Handle(1, 2)));
  EXPECT_EQ(session.resident, 0u);
  EXPECT_EQ(residentBytes(node), 0u);
  EXPECT_FALSE(store.release(wire::Handle(1, 2)));  // unknown now
  EXPECT_EQ(store.find(wire::Handle(1, 2)), nullptr);
}

TEST(TensorStore, AHandleInUseIsRefusedAndNothingIsCountedTwice) {
  NodeMemory node(0);
  SessionMemory session(0);
  TensorStore store(node, session);
  ASSERT_TRUE(store.store(wire::Handle(2, 1), at::ones({4}), kWeight).isOk());
  Status again = store.store(wire::Handle(2, 1), at::ones({8}), kWeight);
  EXPECT_EQ(codeOf(again), wire::ErrorCode::DuplicateHandle);
  EXPECT_NE(again.message().find(wire::toString(wire::Handle(2, 1))), std::string::npos) << again.message();
  EXPECT_EQ(session.resident, 16u);
  EXPECT_EQ(store.find(wire::Handle(2, 1))->numel(), 4);
}

TEST(TensorStore, TheQuotaAndTheNodeLimitRefuseWhatDoesNotFit) {
  NodeMemory node(3000);
  SessionMemory first(2048), second(0);
  TensorStore a(node, first), b(node, second);
  ASSERT_TRUE(a.store(wire::Handle(3, 1), at::zeros({256}), kWeight).isOk());  // 1 KiB of a 2 KiB quota
  Status over_quota = a.store(wire::Handle(3, 2), at::zeros({512}), kWeight);  // 2 KiB more
  EXPECT_EQ(codeOf(over_quota), wire::ErrorCode::OutOfMemory);
  EXPECT_NE(over_quota.message().find("2048"), std::string::npos) << over_quota.message();
  EXPECT_FALSE(a.contains(wire::Handle(3, 2)));
  Status over_node = b.store(wire::Handle(3, 3), at::zeros({512}), kWeight);  // 1 KiB + 2 KiB > 3000
  EXPECT_EQ(codeOf(over_node), wire::ErrorCode::OutOfMemory);
  EXPECT_NE(over_node.message().find("3000"), std::string::npos) << over_node.message();
  EXPECT_TRUE(b.store(wire::Handle(3, 4), at::zeros({256}), kWeight).isOk());  // what fits still does
  EXPECT_EQ(residentBytes(node), 2048u);
}

TEST(TensorStore, ReservedBytesAreNotReservedAgainAndClearReleasesEverything) {
  NodeMemory node(0);
  SessionMemory session(0);
  {
    TensorStore store(node, session);
    ASSERT_FALSE(node.reserve(session, 64, kWeight).has_value());  // as PutTensors does before receiving
    ASSERT_TRUE(store.store(wire::Handle(4, 1), at::zeros({16}), kWeight, /*reserved=*/true).isOk());
    EXPECT_EQ(session.resident, 64u);
    ASSERT_TRUE(store.store(wire::Handle(4, 2), at::zeros({16}), wire::Residency::StatefulKvCache).isOk());
    EXPECT_EQ(session.resident, 128u);
    store.clear();
    EXPECT_EQ(store.size(), 0u);
    EXPECT_EQ(session.resident, 0u);
    ASSERT_TRUE(store.store(wire::Handle(4, 3), at::zeros({16}), kWeight).isOk());
  }  // the destructor releases what is left
  EXPECT_EQ(session.resident, 0u);
  EXPECT_EQ(residentBytes(node), 0u);
}

}  // namespace
}  // namespace genie::node
