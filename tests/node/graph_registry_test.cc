// GraphRegistry: compiled graphs shared by content hash.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "genie/node/executor.h"
#include "graph_builder.h"
#include "graph_registry.h"

namespace genie::node {
namespace {

using testing::GraphBuilder;
using testing::T;
using wire::DType;

const wire::Graph& rootOf(const flatbuffers::DetachedBuffer& bytes) {
  auto verified = wire::verifyGraph(wire::bytesOf(bytes));
  EXPECT_TRUE(verified.isOk()) << verified.status().toString();
  return **verified;
}

flatbuffers::DetachedBuffer reluGraph(int64_t n) {
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {n});
  g.op("aten::relu", "", {T(x)});
  return g.finish();
}

TEST(GraphRegistry, TheSameBytesAreOneGraphCompiledOnce) {
  Executor executor(c10::Device(c10::kCPU));
  GraphRegistry registry(executor);
  auto bytes = reluGraph(4);
  auto first = registry.add(wire::bytesOf(bytes), rootOf(bytes));
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  auto again = registry.add(wire::bytesOf(bytes), rootOf(bytes));
  ASSERT_TRUE(again.isOk());
  EXPECT_TRUE(wire::GraphIdEqual{}(first->id, again->id));
  EXPECT_EQ(first->graph.get(), again->graph.get());  // not compiled again
  EXPECT_TRUE(wire::GraphIdEqual{}(first->id, wire::hashGraph(wire::bytesOf(bytes))));
  EXPECT_EQ(registry.find(first->id).get(), first->graph.get());
  auto other = reluGraph(8);
  auto second = registry.add(wire::bytesOf(other), rootOf(other));
  ASSERT_TRUE(second.isOk());
  EXPECT_FALSE(wire::GraphIdEqual{}(first->id, second->id));
  EXPECT_EQ(registry.size(), 2u);
  EXPECT_EQ(registry.find(wire::GraphId(1, 2)), nullptr);
}

TEST(GraphRegistry, AGraphThatDoesNotCompileIsNotKept) {
  Executor executor(c10::Device(c10::kCPU));
  GraphRegistry registry(executor);
  GraphBuilder g;
  uint32_t x = g.input(DType::Float32, {2});
  g.op("aten::frobnicate", "", {T(x)});
  auto bytes = g.finish();
  auto refused = registry.add(wire::bytesOf(bytes), rootOf(bytes));
  ASSERT_FALSE(refused.isOk());
  ASSERT_NE(refused.status().remote(), nullptr);
  EXPECT_EQ(static_cast<wire::ErrorCode>(refused.status().remote()->code), wire::ErrorCode::UnknownOp);
  EXPECT_EQ(refused.status().remote()->op_name, "aten::frobnicate.default");
  EXPECT_EQ(registry.size(), 0u);
  EXPECT_EQ(registry.find(wire::hashGraph(wire::bytesOf(bytes))), nullptr);
}

TEST(GraphRegistry, SessionsRegisteringTheSameGraphAtOnceGetOneGraph) {
  Executor executor(c10::Device(c10::kCPU));
  GraphRegistry registry(executor);
  auto bytes = reluGraph(16);
  std::vector<const CompiledGraph*> seen(4, nullptr);
  std::vector<std::thread> sessions;
  for (size_t i = 0; i < seen.size(); ++i) {
    sessions.emplace_back([&, i] {
      auto registered = registry.add(wire::bytesOf(bytes), rootOf(bytes));
      if (registered) seen[i] = registered->graph.get();
    });
  }
  for (auto& t : sessions) t.join();
  EXPECT_EQ(registry.size(), 1u);
  for (const CompiledGraph* graph : seen) EXPECT_EQ(graph, registry.find(wire::hashGraph(wire::bytesOf(bytes))).get());
}

}  // namespace
}  // namespace genie::node
