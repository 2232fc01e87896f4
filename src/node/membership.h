// Cluster membership through etcd leases (docs/node.md "Cluster membership (etcd)").
//
// A node that joins puts one key, `<prefix><address>`, whose value is its NodeRecord as JSON,
// attached to an etcd lease of `ttl`; a thread keeps the lease alive every ttl/3. The key goes
// when the node leaves (the lease is revoked: at once) or dies (the lease expires: after ttl).
// Clients read the keys under the prefix when they start (python/genie/scheduler/membership.py),
// so a node that joins or leaves changes later placements only. There is no protocol of our own:
// etcd decides who is alive.
//
// etcd is spoken to through its v3 JSON gateway over HTTP (etcd 3.4: /v3/lease/grant,
// /v3/kv/put, /v3/lease/keepalive, /v3/lease/revoke, /v3/kv/range; keys and values in base64,
// 64-bit integers as decimal strings) with libcurl.
//
// Threads: `join` and `leave` run on the caller's thread; the keepalive loop runs on a thread of
// its own (Membership::keepAliveThread), which also registers again after etcd was lost. The
// client is used by one thread at a time (a mutex). No torch types here.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "genie/status.h"

namespace genie::node {

/// What a node says of itself under its key (a JSON object with these names).
struct NodeRecord {
  std::string address;        // HOST:PORT that clients connect to
  std::string device;         // "cpu", "cuda:0"
  uint64_t memory_limit = 0;  // bytes a node lets sessions use (--memory-limit); 0: none
  uint64_t memory_total = 0;  // bytes of the device (Stats.device_total); 0: not known
  std::string version;        // the genie version of the node's build, "0.1.0"
  uint32_t protocol_version = 0;  // the wire protocol it speaks (wire::kProtocolVersion)
  int64_t pid = 0;            // the node's process id on its host
};

/// The record as one JSON object.
std::string encodeNodeRecord(const NodeRecord& record);
/// The record from JSON. Errors: kInvalidMessage naming what is missing or malformed.
Result<NodeRecord> decodeNodeRecord(std::string_view json);

/// The etcd v3 JSON gateway at `url`: the calls a lease needs, and a range read by prefix.
/// Every call is one HTTP POST bounded by `timeout`. Errors: kPeerUnreachable (no connection,
/// timeout: the message names the URL and libcurl's reason), kNotFound (etcd: no such lease),
/// kRemote (another answer of etcd's, its message), kInvalidMessage (an answer not understood).
class EtcdClient {
 public:
  /// `url`: "http://HOST:PORT" (a trailing '/' is dropped). Errors: kInvalidArgument (not http(s)).
  static Result<std::unique_ptr<EtcdClient>> create(std::string url, std::chrono::milliseconds timeout);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const std::string& url() const { return url_; }
  /// A new lease of `ttl` (etcd may grant a longer one); returns its id.
  Result<int64_t> leaseGrant(std::chrono::seconds ttl);
  /// Refreshes lease `id`; returns the TTL left in seconds. kNotFound when it has expired.
  Result<int64_t> leaseKeepAlive(int64_t id);
  /// Ends lease `id`: its keys are deleted at once. kNotFound when it had expired.
  Status leaseRevoke(int64_t id);
  /// Puts `key` = `value`, attached to lease `lease` (0: none).
  Status put(std::string_view key, std::string_view value, int64_t lease);
  /// Every key that starts with `prefix` and its value, in key order.
  Result<std::vector<std::pair<std::string, std::string>>> rangePrefix(std::string_view prefix);

 private:
  EtcdClient(std::string url, std::chrono::milliseconds timeout, void* curl);
  /// POSTs `body` (JSON) to `path`; the answer's body parsed, or the error above.
  Result<std::string> post(std::string_view path, const std::string& body);

  std::string url_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one request at a time on the curl handle
  void* curl_;        // CURL*
};

struct MembershipConfig {
  std::string etcd_url;                   // "http://127.0.0.1:2379"
  std::string prefix = "/genie/nodes/";   // the key is prefix + address
  std::chrono::seconds ttl{5};            // the lease's time to live; kept alive every ttl/3
  std::chrono::milliseconds request_timeout{2000};  // one HTTP request to etcd
};

/// One node's registration: its key under its lease, kept alive until `leave`.
class Membership {
 public:
  /// Grants a lease, puts the key and starts the keepalive thread. Errors: those of EtcdClient
  /// (kPeerUnreachable when etcd cannot be reached), each naming the URL; kInvalidArgument for
  /// a ttl under 1 s or an empty prefix or address.
  static Result<std::unique_ptr<Membership>> join(const MembershipConfig& config, const NodeRecord& record);
  /// leave().
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  /// Stops the keepalive thread and revokes the lease, so the key disappears at once (a failed
  /// revoke is logged: the key then goes when the lease expires). Idempotent.
  void leave();
  const std::string& key() const { return key_; }

 private:
  Membership(MembershipConfig config, std::string key, std::string value, std::unique_ptr<EtcdClient> etcd);
  /// Grants a lease and puts the key under it.
  Status registerOnce();
  /// Every ttl/3: keeps the lease alive; when etcd was lost and the lease expired, or the key
  /// could not be put, registers again. Logs a warning when etcd is lost and when it is back.
  void keepAliveThread();

  MembershipConfig config_;
  std::string key_;
  std::string value_;
  std::unique_ptr<EtcdClient> etcd_;
  int64_t lease_ = 0;       // 0: not registered (only the keepalive thread and leave touch it)
  std::mutex mutex_;        // guards stopping_
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace genie::node
