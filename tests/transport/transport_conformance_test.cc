// The transport conformance suite: every test runs on each UCX transport Genie supports
// here (UCX_TLS=tcp and UCX_TLS=sm), as TensorPipe instantiates one suite per backend.
#include <signal.h>
#include <xxhash.h>

#include <cstring>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "genie/transport/registration_cache.h"
#include "transport_test_util.h"

namespace genie::transport::testing {
namespace {

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::string tls() const { return GetParam(); }
};

struct Pair {
  explicit Pair(const std::string& tls) : server(tls, "server"), client(tls, "client") {
    uint16_t port = server.listen();
    auto connected = client.worker->connect("127.0.0.1", port);
    EXPECT_TRUE(connected.isOk()) << connected.status().toString();
    if (connected) to_server = connected.value();
    to_client = server.waitAccepted();
    EXPECT_NE(to_client, nullptr);
  }
  Node server;
  Node client;
  std::shared_ptr<Endpoint> to_server;
  std::shared_ptr<Endpoint> to_client;
};

TEST_P(TransportTest, ConnectReportsTransportsAndDisconnects) {
  Node server(tls(), "server");
  uint16_t port = server.listen();
  ASSERT_NE(port, 0);
  for (int round = 0; round < 5; ++round) {
    Node client(tls(), "client");
    auto endpoint = client.worker->connect("127.0.0.1", port);
    ASSERT_TRUE(endpoint.isOk()) << endpoint.status().toString();
    EXPECT_TRUE((*endpoint)->isConnected());
    std::string lanes = (*endpoint)->transports();
    if (tls() == "tcp") {
      EXPECT_NE(lanes.find("am=tcp/"), std::string::npos) << lanes;
    } else {
      // Shared memory carries the data; tcp is only the connection manager's.
      EXPECT_EQ(lanes.find("am=tcp"), std::string::npos) << lanes;
      EXPECT_NE(lanes.find("memory"), std::string::npos) << lanes;
    }
    (*endpoint)->close();
    EXPECT_FALSE((*endpoint)->isConnected());
  }
  EXPECT_EQ(server.accepted.size(), 5u);
}

TEST_P(TransportTest, ConnectToAClosedPortFailsNamingThePeer) {
  Node client(tls(), "client");
  Node probe(tls(), "probe");
  uint16_t port = probe.listen();
  probe.listener.reset();  // nobody listens there any more
  auto start = std::chrono::steady_clock::now();
  auto endpoint = client.worker->connect("127.0.0.1", port);
  ASSERT_FALSE(endpoint.isOk());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 6s);
  EXPECT_NE(endpoint.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << endpoint.status().toString();
}

TEST_P(TransportTest, SmallMessageRoundTrip) {
  Pair pair(tls());
  std::string payload = "tensor bytes";
  ASSERT_TRUE(sendAndWait(*pair.to_server, bytesOf("header"), {payload.data(), payload.size()}).isOk());
  auto message = pair.server.nextMessage();
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(textOf(message->header()), "header");
  ASSERT_EQ(message->payloadSize(), payload.size());
  std::string received(payload.size(), '\0');
  ASSERT_TRUE(receiveAndWait(*message, {received.data(), received.size()}).isOk());
  EXPECT_EQ(received, payload);
  // Reply on the endpoint the message came from.
  ASSERT_NE(message->endpoint(), nullptr);
  ASSERT_TRUE(sendAndWait(*message->endpoint(), bytesOf("reply"), {}).isOk());
  auto reply = pair.client.nextMessage();
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(textOf(reply->header()), "reply");
  EXPECT_EQ(reply->payloadSize(), 0u);
}

TEST_P(TransportTest, ManyMessagesArriveInOrder) {
  Pair pair(tls());
  constexpr int kCount = 2000;
  std::vector<uint32_t> values(kCount);
  std::iota(values.begin(), values.end(), 0);
  auto sent = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < kCount; ++i) {
    pair.to_server->send(bytesOf("n"), {&values[i], sizeof(uint32_t)}, [sent](Status s) {
      EXPECT_TRUE(s.isOk()) << s.toString();
      ++*sent;
    });
  }
  for (int i = 0; i < kCount; ++i) {
    auto message = pair.server.nextMessage();
    ASSERT_TRUE(message.has_value()) << "message " << i;
    uint32_t value = 0;
    ASSERT_TRUE(receiveAndWait(*message, {&value, sizeof(value)}).isOk());
    ASSERT_EQ(value, static_cast<uint32_t>(i));
  }
  EXPECT_TRUE(pair.client.worker->waitUntil([&] { return sent->load() == kCount; }, 10s));
}

TEST_P(TransportTest, RendezvousReceivesIntoTheReceiversBuffer) {
  Pair pair(tls());
  std::vector<uint8_t> payload(64 << 20);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 131 + 7);
  auto sent = std::make_shared<Awaitable<Status>>();
  pair.to_server->send(bytesOf("big"), {payload.data(), payload.size()}, [sent](Status s) { sent->set(s); });
  auto message = pair.server.nextMessage();
  ASSERT_TRUE(message.has_value());
  ASSERT_EQ(message->payloadSize(), payload.size());
  std::vector<uint8_t> received(payload.size());
  ASSERT_TRUE(receiveAndWait(*message, {received.data(), received.size()}).isOk());
  EXPECT_TRUE(received == payload);
  auto status = sent->wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(status->isOk()) << status->toString();
}

TEST_P(TransportTest, APayloadIsReceivedInPartsWithoutStaging) {
  // Four 16 MiB tensors and the padding between them (rendezvous: UCX's iov), and a small
  // eager payload in seven parts (copied), each sent in parts; parts whose sizes miss the
  // payload are refused.
  Pair pair(tls());
  for (size_t part_bytes : {size_t{16} << 20, size_t{24}}) {
    const size_t gap = 64;
    std::vector<uint8_t> payload(4 * part_bytes + 3 * gap);
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 131 + 7);
    auto sent = std::make_shared<Awaitable<Status>>();
    // Sent in parts too (UCX's iov on both sides): cut where the receiver does not cut.
    std::vector<ConstBuffer> out;
    for (size_t at = 0; at < payload.size(); at += part_bytes) {
      out.push_back({payload.data() + at, std::min(part_bytes, payload.size() - at)});
    }
    pair.to_server->sendInParts(bytesOf("parts"), out, [sent](Status s) { sent->set(s); });
    auto message = pair.server.nextMessage();
    ASSERT_TRUE(message.has_value());
    std::vector<std::vector<uint8_t>> tensors(4, std::vector<uint8_t>(part_bytes));
    std::vector<uint8_t> padding(gap);
    std::vector<Buffer> parts;
    for (size_t t = 0; t < tensors.size(); ++t) {
      if (t > 0) parts.push_back({padding.data(), gap});
      parts.push_back({tensors[t].data(), part_bytes});
    }
    auto received = std::make_shared<Awaitable<Status>>();
    message->receivePayloadInParts(parts, [received](Status s) { received->set(s); });
    auto status = received->wait(30s);
    ASSERT_TRUE(status.has_value());
    ASSERT_TRUE(status->isOk()) << status->toString();
    for (size_t t = 0; t < tensors.size(); ++t) {
      const auto* expected = payload.data() + t * (part_bytes + gap);
      EXPECT_TRUE(std::equal(tensors[t].begin(), tensors[t].end(), expected)) << "part " << t << " of " << part_bytes;
    }
    ASSERT_TRUE(sent->wait(10s).has_value());
  }
  std::vector<uint8_t> small(100);  // must outlive its send: waited for below
  auto small_sent = std::make_shared<Awaitable<Status>>();
  pair.to_server->send(bytesOf("short"), {small.data(), small.size()}, [small_sent](Status s) { small_sent->set(s); });
  auto message = pair.server.nextMessage();
  ASSERT_TRUE(message.has_value());
  std::vector<uint8_t> a(50), b(40);
  auto refused = std::make_shared<Awaitable<Status>>();
  message->receivePayloadInParts(std::vector<Buffer>{{a.data(), a.size()}, {b.data(), b.size()}},
                          [refused](Status s) { refused->set(s); });
  auto status = refused->wait(10s);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->code(), StatusCode::kInvalidArgument) << status->toString();
  ASSERT_TRUE(small_sent->wait(10s).has_value());
}

TEST_P(TransportTest, OneGibTransferArrivesIntact) {
  Pair pair(tls());
  constexpr size_t kBytes = size_t{1} << 30;
  std::unique_ptr<uint64_t[]> source(new uint64_t[kBytes / 8]);
  for (size_t i = 0; i < kBytes / 8; ++i) source[i] = i * 0x9E3779B97F4A7C15ull;
  const XXH64_hash_t sent_checksum = XXH3_64bits(source.get(), kBytes);
  pair.to_server->send(bytesOf("1GiB"), {source.get(), kBytes}, [](Status s) { EXPECT_TRUE(s.isOk()) << s.toString(); });
  auto message = pair.server.nextMessage(30s);
  ASSERT_TRUE(message.has_value());
  ASSERT_EQ(message->payloadSize(), kBytes);
  std::unique_ptr<uint64_t[]> destination(new uint64_t[kBytes / 8]);
  ASSERT_TRUE(receiveAndWait(*message, {destination.get(), kBytes}, 60s).isOk());
  EXPECT_EQ(XXH3_64bits(destination.get(), kBytes), sent_checksum);
}

TEST_P(TransportTest, HeaderLargerThanUcxLimitTravelsInTheData) {
  Pair pair(tls());
  size_t limit = pair.client.worker->info().max_am_header;
  ASSERT_GT(limit, 0u);
  std::string header(limit * 4 + 3, 'h');
  for (size_t i = 0; i < header.size(); ++i) header[i] = static_cast<char>('a' + i % 26);
  std::string payload(100000, 'p');
  ASSERT_TRUE(sendAndWait(*pair.to_server, bytesOf(header), {payload.data(), payload.size()}).isOk());
  auto message = pair.server.nextMessage();
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(textOf(message->header()), header);
  std::string received(message->payloadSize(), '\0');
  ASSERT_TRUE(receiveAndWait(*message, {received.data(), received.size()}).isOk());
  EXPECT_EQ(received, payload);
}

TEST_P(TransportTest, DroppedMessageReleasesItsPayloadAndTheSenderCompletes) {
  Pair pair(tls());
  std::vector<uint8_t> payload(8 << 20, 1);
  auto sent = std::make_shared<Awaitable<Status>>();
  pair.to_server->send(bytesOf("unwanted"), {payload.data(), payload.size()}, [sent](Status s) { sent->set(s); });
  {
    auto message = pair.server.nextMessage();
    ASSERT_TRUE(message.has_value());
  }  // dropped without receiving
  auto status = sent->wait(10s);
  ASSERT_TRUE(status.has_value()) << "sender hangs after the receiver dropped the message";
  // The connection still works afterwards.
  ASSERT_TRUE(sendAndWait(*pair.to_server, bytesOf("after"), {}).isOk());
  auto next = pair.server.nextMessage();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(textOf(next->header()), "after");
}

TEST_P(TransportTest, ReceiveIntoAWrongSizedBufferIsRefused) {
  Pair pair(tls());
  std::string payload = "12345678";
  ASSERT_TRUE(sendAndWait(*pair.to_server, bytesOf("h"), {payload.data(), payload.size()}).isOk());
  auto message = pair.server.nextMessage();
  ASSERT_TRUE(message.has_value());
  char small[4];
  Status status = receiveAndWait(*message, {small, sizeof(small)});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("8 bytes"), std::string::npos) << status.toString();
}

TEST_P(TransportTest, RmaPutAndGetWithPackedRemoteKey) {
  Pair pair(tls());
  std::vector<uint8_t> remote(1 << 20, 0);
  Result<MemoryRegion> region = GENIE_ERROR(kInternal, "not run");
  std::atomic<bool> done{false};
  pair.server.worker->post([&] {
    region = pair.server.worker->registrationCache().registerMemory(remote.data(), remote.size(), MemoryType::kHost);
    done = true;
  });
  ASSERT_TRUE(pair.server.worker->waitUntil([&] { return done.load(); }, 5s));
  ASSERT_TRUE(region.isOk()) << region.status().toString();
  auto packed = pair.server.worker->registrationCache().packRkey(*region);
  ASSERT_TRUE(packed.isOk());
  auto rkey = pair.to_server->unpackRkey(*packed);
  ASSERT_TRUE(rkey.isOk()) << rkey.status().toString();

  std::vector<uint8_t> local(remote.size());
  for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i % 251);
  auto put = std::make_shared<Awaitable<Status>>();
  pair.to_server->put({local.data(), local.size()}, reinterpret_cast<uint64_t>(remote.data()), *rkey,
                      [put](Status s) { put->set(s); });
  auto put_status = put->wait(10s);
  ASSERT_TRUE(put_status.has_value() && put_status->isOk());
  auto flushed = std::make_shared<Awaitable<Status>>();
  pair.to_server->flush([flushed](Status s) { flushed->set(s); });
  ASSERT_TRUE(flushed->wait(10s).value_or(GENIE_ERROR(kTimeout, "flush")).isOk());
  EXPECT_TRUE(remote == local);

  std::vector<uint8_t> back(remote.size(), 0);
  auto got = std::make_shared<Awaitable<Status>>();
  pair.to_server->get({back.data(), back.size()}, reinterpret_cast<uint64_t>(remote.data()), *rkey,
                      [got](Status s) { got->set(s); });
  auto get_status = got->wait(10s);
  ASSERT_TRUE(get_status.has_value() && get_status->isOk());
  EXPECT_TRUE(back == local);
  rkey->reset();
}

TEST_P(TransportTest, RegistrationCacheFindsContainingRegions) {
  Node node(tls(), "rcache");
  std::vector<uint8_t> buffer(1 << 16);
  // The cache belongs to the progress thread: every call goes through post().
  auto& cache = node.worker->registrationCache();
  Result<MemoryRegion> region = GENIE_ERROR(kInternal, "not run");
  bool inside = false, beyond = false;
  uint64_t before = 0, after = 0;
  std::atomic<bool> checked{false};
  node.worker->post([&] {
    region = cache.registerMemory(buffer.data(), buffer.size(), MemoryType::kHost);
    inside = cache.find(buffer.data() + 100, 1000) != nullptr;
    beyond = cache.find(buffer.data() + buffer.size() - 10, 20) != nullptr;
    // Registering a sub-range again does not call UCX again.
    before = cache.registrations();
    (void)cache.registerMemory(buffer.data() + 64, 64, MemoryType::kHost);
    after = cache.registrations();
    checked = true;
  });
  ASSERT_TRUE(node.worker->waitUntil([&] { return checked.load(); }, 5s));
  ASSERT_TRUE(region.isOk()) << region.status().toString();
  EXPECT_TRUE(inside);
  EXPECT_FALSE(beyond);
  EXPECT_EQ(after, before);
  std::atomic<bool> removed{false};
  node.worker->post([&] {
    EXPECT_TRUE(cache.deregisterMemory(buffer.data()).isOk());
    EXPECT_EQ(cache.deregisterMemory(buffer.data()).code(), StatusCode::kNotFound);
    removed = true;
  });
  ASSERT_TRUE(node.worker->waitUntil([&] { return removed.load(); }, 5s));
}

TEST_P(TransportTest, SenderGetsAnErrorWhenTheReceiverIsKilled) {
  Node node(tls(), "sender");
  uint16_t port = node.listen();
  PeerProcess peer({"--connect", "127.0.0.1:" + std::to_string(port), "--tls", tls(), "--mode", "hold"});
  auto hello = node.nextMessage(20s);
  ASSERT_TRUE(hello.has_value());
  auto to_peer = hello->endpoint();
  // The peer holds the message without receiving: the rendezvous stays pending.
  std::vector<uint8_t> payload(256 << 20, 3);
  auto sent = std::make_shared<Awaitable<Status>>();
  to_peer->send(bytesOf("pending"), {payload.data(), payload.size()}, [sent](Status s) { sent->set(s); });
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(sent->wait(0ms).has_value()) << "the send completed although the peer never received";
  auto killed_at = std::chrono::steady_clock::now();
  peer.kill(SIGKILL);
  auto status = sent->wait(2s);
  ASSERT_TRUE(status.has_value()) << "pending send still hanging 2 s after the peer died";
  EXPECT_LE(std::chrono::steady_clock::now() - killed_at, 2s);
  EXPECT_FALSE(status->isOk());
  EXPECT_EQ(status->code(), StatusCode::kPeerUnreachable) << status->toString();
  EXPECT_NE(status->message().find(to_peer->peer()), std::string::npos) << status->toString();
  EXPECT_FALSE(to_peer->isConnected());
  // New operations fail at once, naming the peer.
  EXPECT_EQ(sendAndWait(*to_peer, bytesOf("x"), {}, 2s).code(), StatusCode::kPeerUnreachable);
}

TEST_P(TransportTest, ReceiverGetsAnErrorWhenTheSenderIsKilledMidTransfer) {
  Node node(tls(), "receiver");
  uint16_t port = node.listen();
  constexpr size_t kBytes = size_t{1} << 30;
  PeerProcess peer({"--connect", "127.0.0.1:" + std::to_string(port), "--tls", tls(), "--mode", "send-large",
                    "--bytes", std::to_string(kBytes)});
  auto message = node.nextMessage(30s);
  ASSERT_TRUE(message.has_value());
  ASSERT_EQ(message->payloadSize(), kBytes);
  std::unique_ptr<uint8_t[]> destination(new uint8_t[kBytes]);
  auto received = std::make_shared<Awaitable<Status>>();
  peer.kill(SIGKILL);  // dies while (or before) its bytes are pulled
  auto killed_at = std::chrono::steady_clock::now();
  message->receivePayload({destination.get(), kBytes}, [received](Status s) { received->set(s); });
  auto status = received->wait(2s);
  ASSERT_TRUE(status.has_value()) << "receive still hanging 2 s after the sender died";
  EXPECT_LE(std::chrono::steady_clock::now() - killed_at, 2s);
  EXPECT_EQ(status->code(), StatusCode::kPeerUnreachable) << status->toString();
  auto error = node.nextError(2s);
  ASSERT_TRUE(error.has_value()) << "no endpoint error within 2 s of the peer's death";
  EXPECT_EQ(error->code(), StatusCode::kPeerUnreachable);
}

TEST_P(TransportTest, CloseIsBoundedWhenThePeerStopsAnswering) {
  Node node(tls(), "closer");
  uint16_t port = node.listen();
  PeerProcess peer({"--connect", "127.0.0.1:" + std::to_string(port), "--tls", tls(), "--mode", "hold"});
  auto hello = node.nextMessage(20s);
  ASSERT_TRUE(hello.has_value());
  auto to_peer = hello->endpoint();
  std::vector<uint8_t> payload(64 << 20, 5);
  auto sent = std::make_shared<Awaitable<Status>>();
  to_peer->send(bytesOf("pending"), {payload.data(), payload.size()}, [sent](Status s) { sent->set(s); });
  peer.kill(SIGSTOP);  // alive but silent: a flush can never finish
  auto start = std::chrono::steady_clock::now();
  to_peer->close();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LE(took, node.worker->config().close_timeout + 500ms);
  EXPECT_FALSE(to_peer->isConnected());
  auto status = sent->wait(2s);
  ASSERT_TRUE(status.has_value()) << "the pending send did not complete after close";
  EXPECT_FALSE(status->isOk());
  peer.kill(SIGKILL);
}

TEST_P(TransportTest, AStoppedPeerIsDeclaredDeadByHeartbeatsAndAnIdleOneIsNot) {
  Node node(tls(), "watcher");
  uint16_t port = node.listen();
  PeerProcess peer({"--connect", "127.0.0.1:" + std::to_string(port), "--tls", tls(), "--mode", "hold"});
  auto hello = node.nextMessage(20s);
  ASSERT_TRUE(hello.has_value());
  const auto timeout = node.worker->config().peer_timeout;
  // Idle for twice the timeout: the peer's heartbeats keep the connection up.
  EXPECT_FALSE(node.nextError(2 * timeout).has_value()) << "an idle, live peer was declared dead";
  EXPECT_TRUE(hello->endpoint()->isConnected());
  peer.kill(SIGSTOP);  // its kernel still answers TCP; UCX's keepalive sees nothing wrong
  auto stopped_at = std::chrono::steady_clock::now();
  auto error = node.nextError(timeout + 2s);
  ASSERT_TRUE(error.has_value()) << "a stopped peer was not declared dead";
  EXPECT_LE(std::chrono::steady_clock::now() - stopped_at, timeout + timeout / 8 + 200ms);
  EXPECT_EQ(error->code(), StatusCode::kPeerUnreachable) << error->toString();
  EXPECT_NE(error->message().find("nothing heard from"), std::string::npos) << error->toString();
  EXPECT_FALSE(hello->endpoint()->isConnected());
  peer.kill(SIGKILL);
}

/// A worker whose message handler counts replies by header and notes the thread it ran on.
struct DrivenClient {
  explicit DrivenClient(const std::string& tls) {
    WorkerConfig config;
    config.tls = tls;
    config.name = "driven";
    config.net_devices = "lo";
    worker = Worker::create(config).value();
    worker->setMessageHandler([this](InboundMessage message) {
      std::lock_guard<std::mutex> lock(mutex);
      replies[textOf(message.header())] = std::this_thread::get_id();
    });
    EXPECT_TRUE(worker->startProgressThread().isOk());
  }
  ~DrivenClient() { worker->shutdown(); }
  bool answered(const std::string& header, std::thread::id* on = nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = replies.find(header);
    if (it == replies.end()) return false;
    if (on) *on = it->second;
    return true;
  }
  std::shared_ptr<Worker> worker;
  std::mutex mutex;
  std::unordered_map<std::string, std::thread::id> replies;
};

TEST_P(TransportTest, CallersDriveTheWorkerForTheirReplies) {
  Node server(tls(), "server");
  uint16_t port = server.listen();
  DrivenClient client(tls());
  auto to_server = client.worker->connect("127.0.0.1", port).value();
  std::atomic<bool> stop{false};
  std::vector<std::string> seen;  // every header the server got, in order
  std::thread echo([&] {
    while (!stop) {
      auto message = server.nextMessage(100ms);
      if (!message) continue;
      seen.push_back(textOf(message->header()));
      message->endpoint()->send(message->header(), {}, [](Status) {});
    }
  });
  // One caller: the request goes out from the caller and the reply's callback runs on it.
  const auto me = std::this_thread::get_id();
  for (int i = 0; i < 200; ++i) {
    std::string request = "one-" + std::to_string(i);
    // A send made before the drive (posted to the progress thread) still leaves first.
    std::string before = "before-" + std::to_string(i);
    to_server->send(bytesOf(before), {}, [](Status) {});
    bool done = client.worker->drive([&] { to_server->send(bytesOf(request), {}, [](Status) {}); },
                                     [&] { return client.answered(request); }, 10s);
    ASSERT_TRUE(done) << request;
    std::thread::id on;
    ASSERT_TRUE(client.answered(request, &on));
    EXPECT_EQ(on, me) << request << ": the reply's callback ran on another thread";
  }
  // Two callers at once: each gets its replies, whoever drives when they arrive.
  auto caller = [&](const std::string& name) {
    for (int i = 0; i < 300; ++i) {
      std::string request = name + std::to_string(i);
      bool done = client.worker->drive([&] { to_server->send(bytesOf(request), {}, [](Status) {}); },
                                       [&] { return client.answered(request); }, 10s);
      EXPECT_TRUE(done) << request;
    }
  };
  std::thread a(caller, "a-"), b(caller, "b-");
  a.join();
  b.join();
  // While one caller drives, kUnlessAnotherCaller gives up at once and runs nothing; after it,
  // kUnlessAnotherCaller takes the worker.
  std::atomic<bool> holding{false}, release{false};
  std::thread holder([&] {
    client.worker->drive([&] { holding = true; }, [&] { return release.load(); }, 10s);
  });
  while (!holding) std::this_thread::yield();
  bool ran = false;
  EXPECT_FALSE(client.worker->drive([&] { ran = true; }, [] { return true; }, 1s,
                                    Worker::Takeover::kUnlessAnotherCaller));
  EXPECT_FALSE(ran);
  release = true;
  holder.join();
  EXPECT_TRUE(client.worker->drive([&] { ran = true; }, [] { return true; }, 1s,
                                   Worker::Takeover::kUnlessAnotherCaller));
  EXPECT_TRUE(ran);
  // A leader (kUnlessAnotherCaller) steps down for a caller that waits (kWait).
  std::atomic<bool> leading{false};
  std::thread leader([&] {
    EXPECT_FALSE(client.worker->drive([&] { leading = true; }, [] { return false; }, 20s,
                                      Worker::Takeover::kUnlessAnotherCaller));
  });
  while (!leading) std::this_thread::yield();
  const auto asked = std::chrono::steady_clock::now();
  EXPECT_TRUE(client.worker->drive([] {}, [] { return true; }, 1s));
  leader.join();
  EXPECT_LT(std::chrono::steady_clock::now() - asked, 5s);
  // Every request was answered: 200 "before-", 200 "one-", 600 from the two callers.
  EXPECT_TRUE(client.worker->waitUntil(
      [&] {
        std::lock_guard<std::mutex> lock(client.mutex);
        return client.replies.size() == 1000u;
      },
      10s));
  stop = true;
  echo.join();
  // The server saw each "before-i" right before "one-i".
  std::vector<std::string> ordered;
  for (const auto& header : seen) {
    if (header.rfind("before-", 0) == 0 || header.rfind("one-", 0) == 0) ordered.push_back(header);
  }
  ASSERT_EQ(ordered.size(), 400u);
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(ordered[2 * i], "before-" + std::to_string(i));
    EXPECT_EQ(ordered[2 * i + 1], "one-" + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Ucx, TransportTest, ::testing::Values("tcp", "sm"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace genie::transport::testing
