// ConnectionGuard: aborts the sockets of connection requests that UCX's TCP connection manager
// (tcp_sockcm) leaves stuck.
//
// A listener's accepted socket first carries a private-data header whose length field UCX
// trusts (UCX 1.22, src/uct/tcp/tcp_sockcm_ep.c, uct_tcp_sockcm_ep_recv): when a peer claims
// more than UCX's buffer holds, or sends more than it claimed, UCX fills its buffer and then
// calls recv() with length 0 for ever. The socket stays readable, so UCX's async thread spins
// at 100% of a core, and it never reads the peer's FIN: the socket stays in CLOSE-WAIT and the
// fd is never released (UCX 1.13.1 asserts and aborts the process instead). No connection
// request ever reaches Genie, so Genie cannot close it through UCX. The guard finds such
// sockets among this process's file descriptors and aborts them with connect(AF_UNSPEC)
// (Linux: sends a reset, sets ECONNRESET on the socket, drops its unread bytes): UCX then sees
// an error event and releases the socket itself. The fd is never closed behind UCX's back.
// Reproduction and versions: docs/security.md.
//
// Progress thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

namespace genie::transport {

class ConnectionGuard {
 public:
  using Clock = std::chrono::steady_clock;

  void addPort(uint16_t port) { ports_.push_back(port); }
  void removePort(uint16_t port);
  bool empty() const { return ports_.empty(); }

  /// Looks at every TCP socket of this process accepted on a listening port and aborts one
  /// that is not an endpoint's (`owned(peer)` false, peer as "ip:port") and either stays
  /// stuck (unread bytes or CLOSE-WAIT) at two scans in a row, or has been open for `window`
  /// without becoming one. Returns how many it aborted.
  unsigned scan(Clock::time_point now, std::chrono::milliseconds window,
                const std::function<bool(const std::string& peer)>& owned);

 private:
  struct Seen {
    Clock::time_point first;
    bool stuck = false;  // stuck at the previous scan
  };
  std::vector<uint16_t> ports_;
  std::unordered_map<ino_t, Seen> seen_;  // by socket inode: fds are reused, inodes are not
};

}  // namespace genie::transport
