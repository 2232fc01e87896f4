// A real genie-node process against peers that break the rules: messages before a session,
// oversize or missing Hellos, wrong tokens; a clean stop; sessions over their memory quota.
// (Raw TCP garbage, dead peers and cut links: tests/python/test_reliability.py.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "genie/client/client.h"
#include "graph_builder.h"
#include "node_process.h"
#include "node_test_util.h"
#include "raw_session.h"

namespace genie::node {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using client::Client;
using wire::DType;
using wire::ErrorCode;

/// A token file with `token`, removed with the object.
struct TokenFile {
  explicit TokenFile(const std::string& token) : path("/tmp/genie-security-test-token-" + std::to_string(getpid())) {
    std::ofstream(path) << token << "\n";
  }
  ~TokenFile() { std::remove(path.c_str()); }
  std::string path;
};

ErrorCode errorCodeOf(const RawReply& reply) {
  if (reply.header.empty() || reply.message()->body_type() != wire::Body::Error) return ErrorCode::Unknown;
  return reply.message()->body_as_Error()->code();
}

TEST(NodeSecurity, BeforeASessionOnlyHelloIsAnswered) {
  NodeProcess node;
  RawSession raw(node.port(), /*say_hello=*/false);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(errorCodeOf(raw.call(wire::buildPing(7, 1))), ErrorCode::NotInSession);
  EXPECT_EQ(errorCodeOf(raw.call(wire::buildStatsRequest(8))), ErrorCode::NotInSession);
  auto welcome = raw.call(wire::buildHello(9, "late", "", getpid()));
  ASSERT_FALSE(welcome.header.empty());
  EXPECT_EQ(welcome.message()->body_type(), wire::Body::Welcome);
  // In the session, the same requests are answered.
  EXPECT_EQ(raw.call(wire::buildPing(10, 1)).message()->body_type(), wire::Body::Pong);
  EXPECT_EQ(raw.call(wire::buildStatsRequest(11)).message()->body_type(), wire::Body::Stats);
}

TEST(NodeSecurity, AMessageOverThePreSessionLimitClosesTheConnection) {
  NodeProcess node;
  RawSession raw(node.port(), /*say_hello=*/false);
  ASSERT_TRUE(raw.ok());
  // A Hello whose client name alone is 64 KiB: over the 4 KiB allowed before a session.
  raw.call(wire::buildHello(1, std::string(64 * 1024, 'x'), "", getpid()), {}, /*expect_reply=*/false);
  EXPECT_TRUE(raw.waitUntilDisconnected(2s)) << "the node kept a connection that sent 64 KiB before Hello";
  // A payload counts too: a small header with 1 MiB beside it.
  RawSession payload(node.port(), /*say_hello=*/false);
  std::vector<std::byte> bytes(1 << 20);
  payload.call(wire::buildPing(2, 0), bytes, /*expect_reply=*/false);
  EXPECT_TRUE(payload.waitUntilDisconnected(2s));
  // The node goes on serving.
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->ping().isOk());
}

TEST(NodeSecurity, AConnectionThatNeverSaysHelloIsClosedAtTheDeadline) {
  NodeProcess node({"--hello-timeout-ms", "300"});
  RawSession raw(node.port(), /*say_hello=*/false);
  ASSERT_TRUE(raw.ok());
  auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(raw.waitUntilDisconnected(3s));
  auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 200ms);
  EXPECT_LT(waited, 1500ms);
  // A session made in time stays.
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  std::this_thread::sleep_for(600ms);
  EXPECT_TRUE(client->ping().isOk());
}

TEST(NodeSecurity, RepeatedWrongTokensCloseTheConnection) {
  TokenFile token("the-right-token");
  NodeProcess node({"--auth-token-file", token.path});
  RawSession raw(node.port(), /*say_hello=*/false);
  ASSERT_TRUE(raw.ok());
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_EQ(errorCodeOf(raw.call(wire::buildHello(1 + attempt, "guess", "wrong-" + std::to_string(attempt), 1))),
              ErrorCode::Unauthenticated);
  }
  EXPECT_TRUE(raw.waitUntilDisconnected(2s)) << "a third wrong token left the connection open";
  // The right token, of another length than the wrong ones, still opens a session.
  auto client = connectOrFail(node.port(), "the-right-token");
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->ping().isOk());
}

TEST(NodeSecurity, ACleanStopReachesClientsAsShuttingDown) {
  auto node = std::make_unique<NodeProcess>();
  auto client = connectOrFail(node->port());
  ASSERT_NE(client, nullptr);
  node->process().kill(SIGTERM);
  EXPECT_EQ(node->process().wait(10s), 0);
  Status after = client->ping();
  ASSERT_FALSE(after.isOk());
  EXPECT_EQ(after.code(), StatusCode::kPeerUnreachable);
  EXPECT_NE(after.message().find("shutting down"), std::string::npos) << after.message();
}

/// A graph whose one op makes a float tensor of `elements` (a scalar slot) elements and
/// returns its sum: its transient memory is 4 * elements bytes.
struct OnesGraph {
  explicit OnesGraph(Client& client) {
    GraphBuilder g;
    uint32_t n = g.scalarSlot();
    uint32_t ones = g.op("aten::ones", "", {Ints({0}, {static_cast<int32_t>(n)}), Named("dtype", Dtype(DType::Float32))});
    sum = g.op("aten::sum", "", {T(ones)});
    auto bytes = g.finish();
    auto registered = client.registerGraph(wire::bytesOf(bytes));
    EXPECT_TRUE(registered.isOk()) << registered.status().toString();
    if (registered) id = *registered;
  }
  Status run(Client& client, int64_t elements) const {
    wire::RunGraphArgs args;
    args.graph_id = id;
    args.scalars = {{0, elements}};
    args.outputs = {{sum, wire::OutputAction::Return, {}, {}}};
    auto result = client.runGraph(args);
    return result ? Status::ok() : result.status();
  }
  wire::GraphId id;
  uint32_t sum = 0;
};

Status putBytes(Client& client, size_t bytes) {
  at::Tensor t = at::ones({static_cast<int64_t>(bytes)}, at::kByte);
  return client.putTensor(Client::newHandle(), descOf(t), wire::Residency::PersistentWeight, bytesOf(t));
}

TEST(NodeQuota, ASessionFillingItsQuotaNeverFailsAnothersRuns) {
  NodeProcess node({"--memory-limit", "16MiB", "--session-memory-limit", "8MiB"});
  auto greedy = connectOrFail(node.port());
  auto other = connectOrFail(node.port());
  ASSERT_NE(greedy, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(greedy->welcome().memory_limit, 8u << 20);
  OnesGraph greedy_graph(*greedy), other_graph(*other);
  // The greedy session fills its quota with resident tensors...
  size_t held = 0;
  Status put;
  while ((put = putBytes(*greedy, 1 << 20)).isOk()) held += 1 << 20;
  EXPECT_EQ(held, 8u << 20);
  EXPECT_EQ(codeOf(remoteOf(put)), ErrorCode::OutOfMemory);
  EXPECT_NE(put.message().find("of its quota (8388608 bytes)"), std::string::npos) << put.message();
  // ...and its runs' transient memory counts too: 4 KiB of activations no longer fit.
  Status run = greedy_graph.run(*greedy, 1024);
  ASSERT_FALSE(run.isOk());
  EXPECT_EQ(codeOf(remoteOf(run)), ErrorCode::OutOfMemory);
  EXPECT_EQ(remoteOf(run).op_name, "aten::ones.default");
  // The other session stores and runs within its own quota all along, also runs whose
  // transient memory is most of it (6 MiB of 8).
  for (int i = 0; i < 5; ++i) {
    Status ran = other_graph.run(*other, 1536 * 1024);
    EXPECT_TRUE(ran.isOk()) << ran.message();
    Status stored = putBytes(*other, 256 << 10);
    EXPECT_TRUE(stored.isOk()) << stored.message();
  }
  // A run over the other's quota fails alone; its session goes on.
  EXPECT_EQ(codeOf(remoteOf(other_graph.run(*other, 3 << 20))), ErrorCode::OutOfMemory);
  EXPECT_TRUE(other_graph.run(*other, 1024).isOk());
}

TEST(NodeQuota, ARefusedUploadIsNotReceived) {
  NodeProcess node({"--session-memory-limit", "1MiB"});
  auto client = connectOrFail(node.port());
  ASSERT_NE(client, nullptr);
  auto before = client->stats();
  ASSERT_TRUE(before.isOk());
  EXPECT_EQ(codeOf(remoteOf(putBytes(*client, 64 << 20))), ErrorCode::OutOfMemory);
  auto after = client->stats();
  ASSERT_TRUE(after.isOk());
  // The 64 MiB payload was refused before its rendezvous: only headers reached the node.
  EXPECT_LT(after->bytes_in - before->bytes_in, 64u << 10);
}

TEST(NodeQuota, TheNodeLimitWinsOverQuotasThatAddUpToMore) {
  NodeProcess node({"--memory-limit", "4MiB", "--session-memory-limit", "3MiB"});
  auto first = connectOrFail(node.port());
  auto second = connectOrFail(node.port());
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(putBytes(*first, 3 << 20).isOk());
  // Within the second's quota, over what the node has left.
  Status refused = putBytes(*second, 2 << 20);
  const std::string& message = refused.message();
  EXPECT_EQ(codeOf(remoteOf(refused)), ErrorCode::OutOfMemory);
  EXPECT_NE(message.find("2097152 bytes requested"), std::string::npos) << message;
  EXPECT_NE(message.find("this session uses 0 bytes of its quota (3145728 bytes)"), std::string::npos) << message;
  EXPECT_NE(message.find("the node 3145728 bytes of its limit (4194304 bytes)"), std::string::npos) << message;
  EXPECT_TRUE(putBytes(*second, 1 << 20).isOk());
}

}  // namespace
}  // namespace genie::node
