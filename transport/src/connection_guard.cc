#include "connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

namespace genie::transport {

namespace {

/// The port of a socket address (0 for other families).
uint16_t portOf(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port);
  return 0;
}

std::string addressText(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, host, sizeof(host));
  } else if (address.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, host, sizeof(host));
  }
  return std::string(host) + ":" + std::to_string(portOf(address));
}

}  // namespace

void ConnectionGuard::removePort(uint16_t port) {
  auto it = std::find(ports_.begin(), ports_.end(), port);
  if (it != ports_.end()) ports_.erase(it);
}

unsigned ConnectionGuard::scan(Clock::time_point now, std::chrono::milliseconds window,
                               const std::function<bool(const std::string& peer)>& owned) {
  if (ports_.empty()) return 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  std::unordered_map<ino_t, Seen> seen;
  unsigned aborted = 0;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t length = sizeof(local);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &length) != 0) continue;
    const uint16_t port = portOf(local);
    if (port == 0 || std::find(ports_.begin(), ports_.end(), port) == ports_.end()) continue;
    length = sizeof(peer);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &length) != 0) continue;  // the listener
    const std::string peer_text = addressText(peer);
    if (owned(peer_text)) continue;
    tcp_info info{};
    socklen_t info_length = sizeof(info);
    int unread = 0;
    if (getsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_INFO, &info, &info_length) != 0 ||
        ioctl(static_cast<int>(fd), SIOCINQ, &unread) != 0) {
      continue;
    }
    auto previous = seen_.find(st.st_ino);
    Seen now_seen{previous == seen_.end() ? now : previous->second.first, false};
    now_seen.stuck = unread > 0 || info.tcpi_state == TCP_CLOSE_WAIT;
    const bool stuck_twice = now_seen.stuck && previous != seen_.end() && previous->second.stuck;
    const bool overdue = now - now_seen.first >= window;
    if (stuck_twice || overdue) {
      sockaddr none{};
      none.sa_family = AF_UNSPEC;
      if (connect(static_cast<int>(fd), &none, sizeof(none)) == 0) {
        ++aborted;
        SPDLOG_WARN("aborted a connection request from {} that UCX's connection manager left {} ({} bytes unread): "
                    "a malformed or incomplete handshake", peer_text,
                    stuck_twice ? (info.tcpi_state == TCP_CLOSE_WAIT ? "in CLOSE-WAIT" : "unread") : "unanswered", unread);
        continue;
      }
      SPDLOG_DEBUG("aborting the connection request from {} failed: {}", peer_text, std::strerror(errno));
    }
    seen.emplace(st.st_ino, now_seen);
  }
  closedir(dir);
  seen_.swap(seen);
  return aborted;
}

}  // namespace genie::transport
