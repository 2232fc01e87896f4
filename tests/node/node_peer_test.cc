// Node to node (SendTensors, Hello.attach_session) between real genie-node processes driven by
// the C++ client: tensors of a session on node A land in a session on node B without passing
// through the client; attached connections may only put; a wrong token or session id, another
// session's handle and a dead peer are refused with errors that name what failed.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "genie/client/client.h"
#include "node_process.h"
#include "node_test_util.h"
#include "session.h"

namespace genie::node {
namespace {

using namespace std::chrono_literals;
using namespace testing;
using client::Client;
using wire::ErrorCode;

/// A token file with `token`, removed with the object.
struct TokenFile {
  explicit TokenFile(const std::string& token)
      : path("/tmp/genie-peer-test-token-" + std::to_string(getpid()) + "-" + token) {
    std::ofstream(path) << token << "\n";
  }
  ~TokenFile() { std::remove(path.c_str()); }
  std::string path;
};

std::string addressOf(const NodeProcess& node) { return "127.0.0.1:" + std::to_string(node.port()); }

/// Puts `t` under a fresh handle and returns the handle.
wire::Handle put(Client& client, const at::Tensor& t, wire::Residency residency = wire::Residency::EphemeralActivation) {
  const wire::Handle handle = Client::newHandle();
  EXPECT_TRUE(client.putTensor(handle, descOf(t), residency, bytesOf(t)).isOk());
  return handle;
}

TEST(NodePeer, TensorsMoveNodeToNodeIntoTheSameClientsSessionOnThePeer) {
  TokenFile token_b("token-of-b");
  NodeProcess a, b({"--auth-token-file", token_b.path});
  auto on_a = connectOrFail(a.port());
  auto on_b = connectOrFail(b.port(), "token-of-b");
  ASSERT_TRUE(on_a && on_b);
  at::Tensor x = at::arange(1 << 20, at::kFloat);  // 4 MiB
  at::Tensor y = at::arange(10, at::kLong);
  const wire::Handle hx = put(*on_a, x, wire::Residency::PersistentWeight), hy = put(*on_a, y);
  const wire::Handle px = Client::newHandle(), py = Client::newHandle();
  const uint64_t client_bytes = on_a->counters().bytes_sent + on_a->counters().bytes_received;
  const wire::Handle handles[] = {hx, hy}, peer_handles[] = {px, py};
  ASSERT_TRUE(on_a->sendTensors(addressOf(b), "token-of-b", on_b->sessionId(), handles, peer_handles).isOk());
  EXPECT_LT(on_a->counters().bytes_sent + on_a->counters().bytes_received - client_bytes, 4096u)
      << "the tensor's bytes passed through the client";
  auto x_back = on_b->getTensor(px);
  auto y_back = on_b->getTensor(py);
  ASSERT_TRUE(x_back.isOk() && y_back.isOk());
  EXPECT_TRUE(at::equal(tensorOf(*x_back), x));
  EXPECT_TRUE(at::equal(tensorOf(*y_back), y));
  // The residency class travels with the tensor.
  auto b_stats = on_b->stats();
  ASSERT_TRUE(b_stats.isOk());
  uint64_t weights = 0;
  for (auto [residency, bytes] : b_stats->resident) {
    if (residency == wire::Residency::PersistentWeight) weights += bytes;
  }
  EXPECT_EQ(weights, x.nbytes());
  EXPECT_GE(b_stats->peer_bytes_received, x.nbytes() + y.nbytes());
  EXPECT_EQ(b_stats->peer_transfers, 1u);
  auto a_stats = on_a->stats();
  ASSERT_TRUE(a_stats.isOk());
  EXPECT_GE(a_stats->peer_bytes_sent, x.nbytes() + y.nbytes());
  EXPECT_EQ(a_stats->peer_transfers, 1u);
  // A second send reuses the connection; a handle in use on the peer is the peer's refusal.
  const wire::Handle again[] = {hy};
  Status duplicate = on_a->sendTensors(addressOf(b), "token-of-b", on_b->sessionId(), again, std::span(peer_handles).subspan(1));
  EXPECT_EQ(codeOf(remoteOf(duplicate)), ErrorCode::DuplicateHandle);
  EXPECT_NE(duplicate.message().find("peer " + addressOf(b) + " refused"), std::string::npos) << duplicate.message();
}

TEST(NodePeer, OnlyTheRequestingSessionsHandlesCanBeSent) {
  NodeProcess a, b;
  auto owner = connectOrFail(a.port()), other = connectOrFail(a.port()), on_b = connectOrFail(b.port());
  ASSERT_TRUE(owner && other && on_b);
  const wire::Handle mine = put(*owner, at::ones({4}));
  const wire::Handle to[] = {Client::newHandle()};
  Status refused = other->sendTensors(addressOf(b), "", on_b->sessionId(), {&mine, 1}, to);
  EXPECT_EQ(codeOf(remoteOf(refused)), ErrorCode::UnknownHandle);
  EXPECT_NE(refused.message().find(wire::toString(mine)), std::string::npos) << refused.message();
  // Nothing reached the peer, and both nodes serve on.
  EXPECT_FALSE(on_b->getTensor(to[0]).isOk());
  EXPECT_TRUE(owner->getTensor(mine).isOk());
  EXPECT_TRUE(other->ping().isOk());
  // A session cannot send to itself (its thread would wait for itself).
  Status self = owner->sendTensors(addressOf(a), "", owner->sessionId(), {&mine, 1}, to);
  EXPECT_EQ(codeOf(remoteOf(self)), ErrorCode::InvalidMessage);
  // Another session of the same node is a peer like any other.
  ASSERT_TRUE(owner->sendTensors(addressOf(a), "", other->sessionId(), {&mine, 1}, to).isOk());
  EXPECT_TRUE(other->getTensor(to[0]).isOk());
}

TEST(NodePeer, AWrongTokenOrSessionIdIsRefusedByThePeer) {
  TokenFile token_b("token-b2");
  NodeProcess a, b({"--auth-token-file", token_b.path});
  auto on_a = connectOrFail(a.port()), on_b = connectOrFail(b.port(), "token-b2");
  ASSERT_TRUE(on_a && on_b);
  const wire::Handle h = put(*on_a, at::ones({3}));
  const wire::Handle to[] = {Client::newHandle()};
  Status wrong_token = on_a->sendTensors(addressOf(b), "not-it", on_b->sessionId(), {&h, 1}, to);
  EXPECT_EQ(codeOf(remoteOf(wrong_token)), ErrorCode::Unauthenticated);
  EXPECT_NE(wrong_token.message().find("wrong auth token"), std::string::npos) << wrong_token.message();
  Status wrong_session = on_a->sendTensors(addressOf(b), "token-b2", Client::newHandle(), {&h, 1}, to);
  EXPECT_EQ(codeOf(remoteOf(wrong_session)), ErrorCode::Unauthenticated);
  EXPECT_NE(wrong_session.message().find("no session"), std::string::npos) << wrong_session.message();
  EXPECT_NE(wrong_session.message().find(addressOf(b)), std::string::npos) << wrong_session.message();
  Status bad_peer = on_a->sendTensors("no-port-here", "", on_b->sessionId(), {&h, 1}, to);
  EXPECT_EQ(codeOf(remoteOf(bad_peer)), ErrorCode::InvalidMessage);
  // A client attaching with a wrong session id directly gets the same refusal.
  client::ClientOptions options;
  options.auth_token = "token-b2";
  options.attach_session = Client::newHandle();
  auto attached = Client::connect("127.0.0.1", b.port(), options);
  ASSERT_FALSE(attached.isOk());
  EXPECT_EQ(codeOf(remoteOf(attached)), ErrorCode::Unauthenticated);
  EXPECT_TRUE(on_b->ping().isOk());
}

TEST(NodePeer, AnAttachedConnectionOnlyPutsAndEndsWithItsSession) {
  NodeProcess b;
  auto owner = connectOrFail(b.port());
  ASSERT_TRUE(owner);
  client::ClientOptions options;
  options.timeout = 30s;
  options.attach_session = owner->sessionId();
  auto attached = Client::connect("127.0.0.1", b.port(), options);
  ASSERT_TRUE(attached.isOk()) << attached.status().toString();
  EXPECT_TRUE((*attached)->sessionId() == owner->sessionId());
  at::Tensor t = at::arange(6, at::kInt);
  const wire::Handle h = put(**attached, t);
  auto back = owner->getTensor(h);  // in the owner's session
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_TRUE(at::equal(tensorOf(*back), t));
  EXPECT_EQ(codeOf(remoteOf((*attached)->getTensor(h))), ErrorCode::InvalidMessage);
  EXPECT_EQ(codeOf(remoteOf((*attached)->stats())), ErrorCode::InvalidMessage);
  EXPECT_TRUE((*attached)->ping().isOk());
  // The owner leaves: the attached connection is closed by the node.
  owner->close();
  auto deadline = std::chrono::steady_clock::now() + 3s;
  while ((*attached)->connected() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_FALSE((*attached)->connected());
  EXPECT_FALSE((*attached)->putTensor(Client::newHandle(), descOf(t), wire::Residency::EphemeralActivation, bytesOf(t)).isOk());
}

TEST(NodePeer, TwoSessionsSendingToEachOtherAtOnceBothFinish) {
  // Each session's thread waits for its own send while it runs the other's put into it.
  NodeProcess a, b;
  auto on_a = connectOrFail(a.port()), on_b = connectOrFail(b.port());
  ASSERT_TRUE(on_a && on_b);
  at::Tensor x = at::arange(1 << 18, at::kFloat), y = at::arange(1 << 18, at::kDouble);
  const wire::Handle hx = put(*on_a, x), hy = put(*on_b, y);
  for (int round = 0; round < 5; ++round) {
    const wire::Handle to_b[] = {Client::newHandle()}, to_a[] = {Client::newHandle()};
    Status from_b;
    std::thread other([&] { from_b = on_b->sendTensors(addressOf(a), "", on_a->sessionId(), {&hy, 1}, to_a); });
    Status from_a = on_a->sendTensors(addressOf(b), "", on_b->sessionId(), {&hx, 1}, to_b);
    other.join();
    ASSERT_TRUE(from_a.isOk()) << from_a.toString();
    ASSERT_TRUE(from_b.isOk()) << from_b.toString();
    auto x_there = on_b->getTensor(to_b[0]), y_there = on_a->getTensor(to_a[0]);
    ASSERT_TRUE(x_there.isOk() && y_there.isOk());
    EXPECT_TRUE(at::equal(tensorOf(*x_there), x));
    EXPECT_TRUE(at::equal(tensorOf(*y_there), y));
  }
}

TEST(NodePeer, MorePeerSessionsThanConnectionsAreServedByClosingTheLeastRecentlyUsed) {
  NodeProcess a, b;
  auto on_a = connectOrFail(a.port());
  ASSERT_TRUE(on_a);
  std::vector<std::unique_ptr<Client>> on_b;
  for (size_t i = 0; i < kMaxPeerConnections + 2; ++i) {
    on_b.push_back(connectOrFail(b.port()));
    ASSERT_TRUE(on_b.back());
  }
  const wire::Handle h = put(*on_a, at::arange(16, at::kInt));
  // Each session of B once, then the first ones again (their connections were closed).
  for (size_t round = 0; round < on_b.size() + 3; ++round) {
    Client& peer = *on_b[round % on_b.size()];
    const wire::Handle to[] = {Client::newHandle()};
    Status sent = on_a->sendTensors(addressOf(b), "", peer.sessionId(), {&h, 1}, to);
    ASSERT_TRUE(sent.isOk()) << "send " << round << ": " << sent.toString();
    EXPECT_TRUE(peer.getTensor(to[0]).isOk());
  }
  auto stats = on_a->stats();
  ASSERT_TRUE(stats.isOk());
  EXPECT_EQ(stats->peer_transfers, on_b.size() + 3);
}

TEST(NodePeer, ADeadPeerFailsTheSendWithinThePeerTimeoutNamingIt) {
  NodeProcess a;
  auto b = std::make_unique<NodeProcess>();
  const std::string b_address = addressOf(*b);
  auto on_a = connectOrFail(a.port()), on_b = connectOrFail(b->port());
  ASSERT_TRUE(on_a && on_b);
  const wire::Handle h = put(*on_a, at::ones({1024}));
  const wire::Handle first[] = {Client::newHandle()}, second[] = {Client::newHandle()};
  ASSERT_TRUE(on_a->sendTensors(b_address, "", on_b->sessionId(), {&h, 1}, first).isOk());
  b->process().kill(SIGKILL);
  b->process().wait(5s);
  auto start = std::chrono::steady_clock::now();
  Status dead = on_a->sendTensors(b_address, "", on_b->sessionId(), {&h, 1}, second);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(codeOf(remoteOf(dead)), ErrorCode::PeerUnreachable);
  EXPECT_NE(dead.message().find(b_address), std::string::npos) << dead.message();
  // Again, with no connection left to reuse: refused at once, naming the peer.
  start = std::chrono::steady_clock::now();
  Status again = on_a->sendTensors(b_address, "", on_b->sessionId(), {&h, 1}, second);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_EQ(codeOf(remoteOf(again)), ErrorCode::PeerUnreachable);
  EXPECT_NE(again.message().find(b_address), std::string::npos) << again.message();
  EXPECT_TRUE(on_a->getTensor(h).isOk());  // node A serves on
}

}  // namespace
}  // namespace genie::node
