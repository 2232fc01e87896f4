// NodeService: the genie-node service. Listens on the UCX data plane, authenticates
// sessions, keeps each session's tensors resident under client-chosen handles, registers
// graphs by content hash and runs them with the Executor.
//
// Threads (docs/thread_model.md): the transport's progress thread verifies every message and
// answers Hello; every other request goes to its session's own thread, which runs the
// session's requests in order (sessions run concurrently). Tensor payloads land straight in
// the tensor's storage (one tensor per message) or through one counted staging copy. One more
// thread (the reaper) ends sessions: their Goodbye, their peer's death or a cut link.
//
// Security (docs/security.md): before a session exists only a small Hello is taken, within a
// deadline; the token is compared in constant time; each session has its own handles and
// memory quota.
//
// This header has no torch types, so that programs embedding the service need not compile
// torch headers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "genie/status.h"
#include "genie/transport/config.h"
#include "genie/wire/codec.h"

namespace genie::node {

/// How compiled parts run (torch.compile(backend="genie"); src/node/compiled_parts.h).
struct CompileConfig {
  /// "aoti": build and run AOT Inductor packages; "executor": run every part by the executor.
  std::string engine = "aoti";
  /// Where packages are cached (mode 0700); empty: $XDG_CACHE_HOME/genie-node/packages, else
  /// $HOME/.cache/genie-node/packages.
  std::string cache_dir;
  /// The cache's size limit in bytes (least recently used packages deleted first).
  uint64_t cache_bytes = 4ull << 30;
  /// The Python interpreter that runs the compile worker (it must import genie and torch).
  std::string python = "python3";
};

struct NodeConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 0;              // 0: any free port (NodeService::port tells which)
  std::string device = "cpu";     // "cpu" or "cuda:N"
  /// Bytes of every session's resident tensors plus the transient memory of the runs executing
  /// now (src/node/memory_account.h); 0 = unlimited.
  uint64_t memory_limit = 0;
  /// The same for one session (its quota); 0 = only the node's limit. The node's limit wins
  /// when the quotas add up to more.
  uint64_t session_memory_limit = 0;
  std::string auth_token;         // empty: any token is accepted (warned at start)
  /// A connection must say a successful Hello within this long, or it is closed (ms).
  std::chrono::milliseconds hello_timeout{5000};
  /// How long at most an idle session thread goes on polling for its next request when its
  /// requests have been coming in quick succession (docs/node.md "Threads"): twice the last
  /// gap between two of them, if that gap was at most this long. 0: 200 µs after every request.
  std::chrono::microseconds idle_poll{10000};
  /// On a CUDA device: uploads' payloads land straight in device memory, UCX moving them
  /// (rendezvous through its CUDA transports), instead of in host memory and then one copy up.
  bool direct_device_uploads = false;
  /// Before its Hello succeeded, a connection's message (header + payload) may be at most this
  /// large (bytes); a larger one closes it without its payload being received.
  size_t pre_session_max_bytes = 4096;
  std::string name = "genie-node";
  CompileConfig compile;
  transport::WorkerConfig transport;
};

class NodeService {
 public:
  /// Starts the progress thread and listens. Errors: kInvalidArgument (device), listen errors.
  static Result<std::unique_ptr<NodeService>> start(const NodeConfig& config);
  ~NodeService();

  uint16_t port() const;
  /// What the Stats message reports: sessions, resident bytes by class, graphs, ops, bytes.
  wire::StatsArgs stats() const;
  /// Says Goodbye to every session, frees their memory, stops the data plane. Idempotent.
  void stop();

  struct Impl;

 private:
  explicit NodeService(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace genie::node
