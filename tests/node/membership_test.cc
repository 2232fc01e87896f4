// Cluster membership (src/node/membership.h) against a real etcd (Debian's etcd-server,
// /usr/bin/etcd, started here on free loopback ports); skipped when there is no etcd binary.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "node/membership.h"

namespace genie::node {
namespace {

using namespace std::chrono_literals;

uint16_t freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

/// A CPU node's record at `address`.
NodeRecord recordAt(const std::string& address) {
  NodeRecord record;
  record.address = address;
  record.device = "cpu";
  record.pid = getpid();
  return record;
}

/// Nodes register under "/test/nodes/" at `url` with a lease of `ttl`.
MembershipConfig configFor(const std::string& url, std::chrono::seconds ttl) {
  MembershipConfig config;
  config.etcd_url = url;
  config.prefix = "/test/nodes/";
  config.ttl = ttl;
  return config;
}

std::string etcdBinary() {
  for (const char* path : {"/usr/bin/etcd", "/usr/local/bin/etcd"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

/// An etcd on loopback (client and peer ports given) with its data in a fresh temporary folder;
/// killed and its folder removed at the end.
class EtcdProcess {
 public:
  EtcdProcess(const std::string& binary, uint16_t client_port, uint16_t peer_port) {
    char folder[] = "/tmp/genie-etcd-XXXXXX";
    dir_ = mkdtemp(folder);
    url_ = "http://127.0.0.1:" + std::to_string(client_port);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
    std::vector<std::string> args{binary,        "--data-dir",         dir_ + "/data", "--listen-client-urls", url_,
                                  "--advertise-client-urls", url_, "--listen-peer-urls", peer,
                                  "--log-level", "error"};
    std::vector<char*> argv;
    for (auto& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, (dir_ + "/log").c_str(), O_WRONLY | O_CREAT, 0600);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    EXPECT_EQ(posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
  }
  ~EtcdProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  const std::string& url() const { return url_; }
  /// Waits (up to 10 s) until etcd answers a range read.
  bool ready(EtcdClient& client) {
    for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
      if (client.rangePrefix("/").isOk()) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

 private:
  std::string dir_, url_;
  pid_t pid_ = -1;
};

TEST(NodeRecordTest, EncodeDecodeRoundTrip) {
  NodeRecord record{"10.0.0.7:7070", "cuda:1", 16ull << 30, 80ull << 30, "0.1.0", 1, 4242};
  auto decoded = decodeNodeRecord(encodeNodeRecord(record));
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_EQ(decoded->address, record.address);
  EXPECT_EQ(decoded->device, record.device);
  EXPECT_EQ(decoded->memory_limit, record.memory_limit);
  EXPECT_EQ(decoded->memory_total, record.memory_total);
  EXPECT_EQ(decoded->pid, record.pid);
  auto bad = decodeNodeRecord(R"({"address": "a:1"})");
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidMessage);
}

TEST(MembershipTest, UnreachableEtcdNamesItsUrl) {
  MembershipConfig config;
  config.etcd_url = "http://127.0.0.1:" + std::to_string(freePort());  // nothing listens there
  auto joined = Membership::join(config, recordAt("127.0.0.1:7070"));
  ASSERT_FALSE(joined.isOk());
  EXPECT_EQ(joined.status().code(), StatusCode::kPeerUnreachable);
  EXPECT_NE(joined.status().message().find(config.etcd_url), std::string::npos) << joined.status().message();
}

class MembershipEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string binary = etcdBinary();
    if (binary.empty()) GTEST_SKIP() << "no etcd binary (Debian's etcd-server: tools/setup.sh installs it)";
    binary_ = binary;
    client_port_ = freePort();
    peer_port_ = freePort();
    etcd_ = std::make_unique<EtcdProcess>(binary_, client_port_, peer_port_);
    auto client = EtcdClient::create(etcd_->url(), 2000ms);
    ASSERT_TRUE(client.isOk());
    client_ = std::move(*client);
    ASSERT_TRUE(etcd_->ready(*client_)) << "etcd did not answer at " << etcd_->url();
  }

  /// The keys under `prefix` now.
  std::vector<std::pair<std::string, std::string>> keys(const std::string& prefix) {
    auto range = client_->rangePrefix(prefix);
    EXPECT_TRUE(range.isOk()) << range.status().toString();
    return range.isOk() ? *range : std::vector<std::pair<std::string, std::string>>{};
  }

  /// Waits up to `timeout` until the keys under `prefix` are `count`.
  bool waitForKeys(const std::string& prefix, size_t count, std::chrono::milliseconds timeout) {
    for (auto deadline = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < deadline;) {
      auto range = client_->rangePrefix(prefix);
      if (range.isOk() && range->size() == count) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  std::string binary_;
  uint16_t client_port_ = 0, peer_port_ = 0;
  std::unique_ptr<EtcdProcess> etcd_;
  std::unique_ptr<EtcdClient> client_;
};

TEST_F(MembershipEtcdTest, JoinPutsTheRecordAndLeaveDeletesIt) {
  MembershipConfig config = configFor(etcd_->url(), 2s);
  NodeRecord record = recordAt("127.0.0.1:7070");
  record.memory_limit = 1 << 20;
  record.memory_total = 2 << 20;
  auto joined = Membership::join(config, record);
  ASSERT_TRUE(joined.isOk()) << joined.status().toString();
  EXPECT_EQ((*joined)->key(), "/test/nodes/127.0.0.1:7070");
  // A key outside the prefix ("/test/nodes0" sorts right after it) is not listed.
  ASSERT_TRUE(client_->put("/test/nodes0", "other", 0).isOk());

  // Kept alive past its TTL.
  std::this_thread::sleep_for(3s);
  auto listed = keys("/test/nodes/");
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].first, "/test/nodes/127.0.0.1:7070");
  auto decoded = decodeNodeRecord(listed[0].second);
  ASSERT_TRUE(decoded.isOk()) << decoded.status().toString();
  EXPECT_EQ(decoded->address, record.address);
  EXPECT_EQ(decoded->memory_total, record.memory_total);

  (*joined)->leave();
  EXPECT_TRUE(keys("/test/nodes/").empty());  // revoked: gone at once, not after the TTL
  (*joined)->leave();                         // idempotent
}

TEST_F(MembershipEtcdTest, LeaseCallsOfAnEndedLeaseAreNotFound) {
  auto granted = client_->leaseGrant(5s);
  ASSERT_TRUE(granted.isOk()) << granted.status().toString();
  auto ttl = client_->leaseKeepAlive(*granted);
  ASSERT_TRUE(ttl.isOk()) << ttl.status().toString();
  EXPECT_GE(*ttl, 4);
  ASSERT_TRUE(client_->leaseRevoke(*granted).isOk());
  EXPECT_EQ(client_->leaseRevoke(*granted).code(), StatusCode::kNotFound);
  EXPECT_EQ(client_->leaseKeepAlive(*granted).status().code(), StatusCode::kNotFound);
}

TEST_F(MembershipEtcdTest, RegistersAgainWhenEtcdComesBackWithoutItsLease) {
  MembershipConfig config = configFor(etcd_->url(), 2s);
  auto joined = Membership::join(config, recordAt("127.0.0.1:7071"));
  ASSERT_TRUE(joined.isOk()) << joined.status().toString();
  ASSERT_EQ(keys("/test/nodes/").size(), 1u);
  // etcd lost, then a new one at the same URL that knows nothing (a fresh data folder): the
  // node's keepalives fail meanwhile (it serves on), then find its lease unknown, and it
  // registers again within a keepalive period (ttl/3) of etcd's return.
  etcd_.reset();
  std::this_thread::sleep_for(1s);
  etcd_ = std::make_unique<EtcdProcess>(binary_, client_port_, peer_port_);
  ASSERT_TRUE(etcd_->ready(*client_)) << "etcd did not come back at " << etcd_->url();
  EXPECT_TRUE(waitForKeys("/test/nodes/", 1, 5s)) << "the node did not register again";
  (*joined)->leave();
  EXPECT_TRUE(keys("/test/nodes/").empty());
}

}  // namespace
}  // namespace genie::node
