// genie-node: the service that owns an accelerator and executes the subgraphs clients send,
// keeping their tensors resident. Every flag also reads a GENIE_* environment variable.
//
//   genie-node --listen 0.0.0.0:7070 --device cpu --memory-limit 16G --auth-token-file token
//   genie-node --stats 127.0.0.1:7070 [--auth-token-file token]
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <thread>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "genie/client/client.h"
#include "genie/log.h"
#include "genie/node/node_service.h"
#include "genie/units.h"
#include "node/deterministic_ops.h"
#include "node/membership.h"

namespace {

bool splitHostPort(const std::string& text, std::string* host, uint16_t* port) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  *host = text.substr(0, colon);
  try {
    int value = std::stoi(text.substr(colon + 1));
    if (value < 0 || value > 65535) return false;
    *port = static_cast<uint16_t>(value);
  } catch (const std::exception&) {
    return false;
  }
  return !host->empty();
}

std::string readToken(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read --auth-token-file " + path);
  std::stringstream text;
  text << in.rdbuf();
  std::string token = text.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  return token;
}

int printStats(const std::string& address, const std::string& token) {
  std::string host;
  uint16_t port = 0;
  if (!splitHostPort(address, &host, &port)) {
    std::fprintf(stderr, "genie-node: --stats '%s' is not HOST:PORT\n", address.c_str());
    return 2;
  }
  genie::client::ClientOptions options;
  options.name = "genie-node --stats";
  options.auth_token = token;
  auto client = genie::client::Client::connect(host, port, options);
  if (!client) {
    std::fprintf(stderr, "genie-node: %s\n", client.status().toString().c_str());
    return 1;
  }
  auto stats = (*client)->stats();
  if (!stats) {
    std::fprintf(stderr, "genie-node: %s\n", stats.status().toString().c_str());
    return 1;
  }
  std::cout << fmt::format("sessions        {}\n", stats->sessions);
  for (auto [residency, bytes] : stats->resident) {
    std::cout << fmt::format("resident bytes  {:<20} {}\n", genie::wire::EnumNameResidency(residency), bytes);
  }
  std::cout << fmt::format("graphs cached   {}\nops executed    {}\nbytes in        {}\nbytes out       {}\n"
                           "memory limit    {}\nuptime (s)      {:.1f}\n",
                           stats->graphs_cached, stats->ops_executed, stats->bytes_in, stats->bytes_out,
                           stats->memory_limit, stats->uptime_us / 1e6);
  std::cout << fmt::format("compiled parts  {} by package, {} by executor; {} built, {} loaded, {} failures\n",
                           stats->package_calls, stats->executor_calls, stats->packages_built, stats->packages_loaded,
                           stats->compile_failures);
  std::cout << fmt::format("peer bytes      {} sent, {} received in {} transfers\n", stats->peer_bytes_sent,
                           stats->peer_bytes_received, stats->peer_transfers);
  return 0;
}

/// The HOST:PORT a node registers in etcd: `advertise` when given (its port 0: the port the
/// node listens on), else the listening host and port, where a wildcard host (0.0.0.0, ::)
/// becomes this machine's host name.
bool advertisedAddress(const std::string& advertise, const std::string& listen_host, uint16_t port,
                       std::string* address) {
  std::string host = listen_host;
  uint16_t advertised_port = port;
  if (!advertise.empty()) {
    if (!splitHostPort(advertise, &host, &advertised_port)) return false;
    if (advertised_port == 0) advertised_port = port;
  } else if (host == "0.0.0.0" || host == "::" || host == "[::]") {
    char name[256] = {};
    if (gethostname(name, sizeof name - 1) != 0) return false;
    host = name;
  }
  *address = host + ":" + std::to_string(advertised_port);
  return true;
}

/// Host memory is the CPU device's memory: like the CUDA caching allocator, keep what executed
/// graphs freed for the next run. glibc would otherwise serve every block over its dynamic mmap
/// threshold with a fresh mmap and give freed heap tops back to the OS, so each run page-faults
/// its activations in again (MiniLM, 16 sentences: ~6,000 page faults per run; see
/// docs/perf/models.md). Blocks up to 32 MiB (glibc's largest mmap threshold) come from the heap,
/// and freed memory is trimmed only past 2 GiB.
void retainHostMemory() {
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"genie-node: executes Genie subgraphs on this machine's device, keeping tensors resident"};
  std::string listen = "127.0.0.1:7070", device = "cpu", memory_limit = "0", session_memory_limit = "0", token_file,
              log_level = "info", stats;
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any free port)")
      ->envname("GENIE_NODE_LISTEN")
      ->capture_default_str();
  app.add_option("--device", device, "cpu or cuda:N")->envname("GENIE_NODE_DEVICE")->capture_default_str();
  constexpr const char* kSizeHelp = "; a size: 64M = 64MiB = 2^26 bytes, 64MB = 64*10^6 (K, G, T alike); 0: none";
  app.add_option("--memory-limit", memory_limit,
                 std::string("bytes of every session's resident tensors plus running graphs' transient memory") + kSizeHelp)
      ->envname("GENIE_NODE_MEMORY_LIMIT")
      ->capture_default_str();
  app.add_option("--session-memory-limit", session_memory_limit,
                 std::string("the same for one session (its quota; the node's limit still wins)") + kSizeHelp)
      ->envname("GENIE_NODE_SESSION_MEMORY_LIMIT")
      ->capture_default_str();
  int64_t idle_poll_us = 10000;
  app.add_option("--idle-poll-us", idle_poll_us,
                 "µs an idle session thread may go on polling for its next request when its requests come in quick "
                 "succession (twice the last gap, if at most this); 0: 200 µs after each (docs/node.md 'Threads')")
      ->envname("GENIE_NODE_IDLE_POLL_US")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  std::string gpu_upload = "staged";
  app.add_option("--gpu-upload", gpu_upload,
                 "on a CUDA device, where uploads land: staged (host memory, then one copy up) or direct (device "
                 "memory, UCX moving the bytes through its CUDA transports)")
      ->envname("GENIE_NODE_GPU_UPLOAD")
      ->check(CLI::IsMember({"staged", "direct"}))
      ->capture_default_str();
  int hello_timeout_ms = 5000;
  app.add_option("--hello-timeout-ms", hello_timeout_ms,
                 "a connection that has not said a successful Hello after this long is closed (ms)")
      ->envname("GENIE_NODE_HELLO_TIMEOUT_MS")
      ->check(CLI::Range(1, 3600 * 1000))
      ->capture_default_str();
  app.add_option("--auth-token-file", token_file, "file whose content clients must present in Hello")
      ->envname("GENIE_NODE_AUTH_TOKEN_FILE");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")->envname("GENIE_LOG_LEVEL")->capture_default_str();
  app.add_option("--stats", stats, "print the statistics of the node at HOST:PORT and exit");
  bool retain_host_memory = true;
  app.add_option("--retain-host-memory", retain_host_memory,
                 "keep freed host memory for reuse instead of returning it to the OS (true/false)")
      ->envname("GENIE_NODE_RETAIN_HOST_MEMORY")
      ->capture_default_str();
  std::vector<std::string> libraries;
  app.add_option("--load-library", libraries,
                 "a shared library of operators to load before serving (dlopen), e.g. torchvision's "
                 "_C_stable.so, so that graphs may name its ops (torchvision::nms); repeatable, or "
                 "':'-separated in the environment variable")
      ->envname("GENIE_NODE_LOAD_LIBRARY")
      ->delimiter(':');
  std::vector<std::string> optional_libraries;
  app.add_option("--try-load-library", optional_libraries,
                 "as --load-library, but one that cannot be loaded here (e.g. it needs libtorch_python, as "
                 "torchvision's _C.so before _C_stable.so) is warned about and left out: its ops are unknown "
                 "to this node; repeatable");
  int watch_fd = -1;
  app.add_option("--watch-fd", watch_fd,
                 "a file descriptor (a pipe's read end) whose writer owns this node: when every write "
                 "end is closed (the owner exited, even killed by a signal), the node shuts down as on "
                 "SIGTERM; -1: none")
      ->envname("GENIE_NODE_WATCH_FD")
      ->capture_default_str();
  genie::node::CompileConfig compile;
  std::string compile_cache_size = "4G";
  app.add_option("--compile-engine", compile.engine,
                 "how torch.compile's parts run: aoti (AOT Inductor packages built by a compile worker, the "
                 "executor meanwhile) or executor (op by op, never compiled)")
      ->envname("GENIE_NODE_COMPILE_ENGINE")
      ->check(CLI::IsMember({"aoti", "executor"}))
      ->capture_default_str();
  app.add_option("--compile-cache", compile.cache_dir,
                 "directory of compiled packages (created mode 0700); default $XDG_CACHE_HOME/genie-node/packages "
                 "or ~/.cache/genie-node/packages")
      ->envname("GENIE_NODE_COMPILE_CACHE");
  app.add_option("--compile-cache-size", compile_cache_size,
                 std::string("size limit of the package cache (least recently used deleted first)") + kSizeHelp)
      ->envname("GENIE_NODE_COMPILE_CACHE_SIZE")
      ->capture_default_str();
  app.add_option("--compile-python", compile.python,
                 "the Python interpreter that runs the compile worker (python -m genie.compile.worker; it must "
                 "import genie and torch)")
      ->envname("GENIE_NODE_COMPILE_PYTHON")
      ->capture_default_str();
  genie::node::MembershipConfig membership_config;
  std::string advertise;
  int etcd_ttl_s = 5;
  app.add_option("--etcd", membership_config.etcd_url,
                 "etcd's client URL (http://HOST:PORT): once listening, register under a lease as "
                 "PREFIX+ADDRESS (docs/node.md 'Cluster membership'); unreachable at start: exit status 1; "
                 "empty: no registration")
      ->envname("GENIE_NODE_ETCD");
  app.add_option("--etcd-prefix", membership_config.prefix, "the etcd key prefix under which nodes register")
      ->envname("GENIE_NODE_ETCD_PREFIX")
      ->capture_default_str();
  app.add_option("--etcd-ttl-s", etcd_ttl_s,
                 "seconds of the etcd lease: a killed node's key goes after this long; kept alive every third of it")
      ->envname("GENIE_NODE_ETCD_TTL_S")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--advertise", advertise,
                 "HOST:PORT that clients reach this node at, registered in etcd (port 0: the listening port); "
                 "default the --listen address, its wildcard host replaced by the host name")
      ->envname("GENIE_NODE_ADVERTISE");
  bool print_config = false;
  app.add_flag("--print-config", print_config,
               "print every setting that has an environment variable (NAME=value  # flag, default: help) and exit");
  CLI11_PARSE(app, argc, argv);
  if (print_config) {
    // The node's table is its command line: each option with an environment variable, its
    // effective value (flag, variable or default) and its help.
    for (const CLI::Option* option : app.get_options()) {
      if (option->get_envname().empty()) continue;
      std::string value;
      for (const std::string& result : option->results()) value += (value.empty() ? "" : ":") + result;
      if (option->count() == 0) value = option->get_default_str().empty() ? "(unset)" : option->get_default_str();
      std::printf("%s=%s  # %s, default %s: %s\n", option->get_envname().c_str(), value.c_str(),
                  option->get_name().c_str(),
                  option->get_default_str().empty() ? "(unset)" : option->get_default_str().c_str(),
                  option->get_description().c_str());
    }
    return 0;
  }
  if (retain_host_memory) retainHostMemory();
  for (const std::string& library : libraries) {
    // RTLD_GLOBAL as torch.ops.load_library: its static initializers register the operators.
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "genie-node: --load-library %s: %s\n", library.c_str(), dlerror());
      return 2;
    }
  }
  for (const std::string& library : optional_libraries) {
    if (dlopen(library.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      std::fprintf(stderr, "genie-node: warning: --try-load-library %s: %s; its operators are unknown here\n",
                   library.c_str(), dlerror());
    }
  }
  genie::node::defineDeterministicOps();  // genie::deterministic_<op>: what clients record in deterministic mode
  genie::logToStderr("genie-node");
  if (!genie::setLogLevel(log_level)) {
    std::fprintf(stderr, "genie-node: unknown --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  std::string token;
  try {
    if (!token_file.empty()) token = readToken(token_file);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "genie-node: %s\n", e.what());
    return 2;
  }
  if (!stats.empty()) return printStats(stats, token);

  genie::node::NodeConfig config;
  if (!splitHostPort(listen, &config.host, &config.port)) {
    std::fprintf(stderr, "genie-node: --listen '%s' is not HOST:PORT\n", listen.c_str());
    return 2;
  }
  auto limit = genie::parseByteSize(memory_limit);
  if (!limit) {
    std::fprintf(stderr, "genie-node: --memory-limit: %s\n", limit.status().message().c_str());
    return 2;
  }
  auto session_limit = genie::parseByteSize(session_memory_limit);
  if (!session_limit) {
    std::fprintf(stderr, "genie-node: --session-memory-limit: %s\n", session_limit.status().message().c_str());
    return 2;
  }
  auto transport = genie::transport::WorkerConfig::fromEnvironment();
  if (!transport) {
    std::fprintf(stderr, "genie-node: %s\n", transport.status().message().c_str());
    return 2;
  }
  if (watch_fd >= 0 && fcntl(watch_fd, F_GETFD) == -1) {
    std::fprintf(stderr, "genie-node: --watch-fd %d is not an open file descriptor\n", watch_fd);
    return 2;
  }
  auto cache_size = genie::parseByteSize(compile_cache_size);
  if (!cache_size) {
    std::fprintf(stderr, "genie-node: --compile-cache-size: %s\n", cache_size.status().message().c_str());
    return 2;
  }
  compile.cache_bytes = *cache_size;
  config.compile = compile;
  config.transport = *transport;
  config.memory_limit = *limit;
  config.session_memory_limit = *session_limit;
  config.hello_timeout = std::chrono::milliseconds(hello_timeout_ms);
  config.idle_poll = std::chrono::microseconds(idle_poll_us);
  config.direct_device_uploads = gpu_upload == "direct";
  config.device = device;
  config.auth_token = token;

  // SIGTERM / SIGINT end the service cleanly; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto service = genie::node::NodeService::start(config);
  if (!service) {
    std::fprintf(stderr, "genie-node: %s\n", service.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<genie::node::Membership> membership;
  if (!membership_config.etcd_url.empty()) {
    // Registered before the "listening" line: a node that says it listens is also listed.
    genie::node::NodeRecord record;
    if (!advertisedAddress(advertise, config.host, (*service)->port(), &record.address)) {
      std::fprintf(stderr, "genie-node: --advertise '%s' is not HOST:PORT\n", advertise.c_str());
      (*service)->stop();
      return 2;
    }
    genie::wire::StatsArgs node_stats = (*service)->stats();
    record.device = device;
    record.memory_limit = node_stats.memory_limit;
    record.memory_total = node_stats.device_total;
    record.version = GENIE_VERSION;
    record.protocol_version = genie::wire::kProtocolVersion;
    record.pid = getpid();
    membership_config.ttl = std::chrono::seconds(etcd_ttl_s);
    auto joined = genie::node::Membership::join(membership_config, record);
    if (!joined) {
      std::fprintf(stderr, "genie-node: cannot register in etcd (--etcd %s): %s\n", membership_config.etcd_url.c_str(),
                   joined.status().toString().c_str());
      (*service)->stop();
      return 1;
    }
    membership = std::move(*joined);
  }
  std::printf("genie-node listening on %s:%u (device %s)\n", config.host.c_str(), (*service)->port(), device.c_str());
  std::fflush(stdout);
  static std::atomic<bool> owner_gone{false};
  if (watch_fd >= 0) {
    // Reads until end of file (bytes written to the pipe are ignored), then wakes the sigwait
    // below. The thread inherits the blocked signal mask; it is left blocked in read() when the
    // node stops for another reason and ends with the process.
    std::thread([watch_fd] {
      char discard[256];
      for (;;) {
        ssize_t n = read(watch_fd, discard, sizeof discard);
        if (n > 0 || (n < 0 && errno == EINTR)) continue;
        break;
      }
      owner_gone.store(true);
      kill(getpid(), SIGTERM);
    }).detach();
  }
  int signal = 0;
  sigwait(&signals, &signal);
  if (owner_gone.load()) {
    GENIE_LOG_INFO("genie-node: --watch-fd {} closed (the owning process exited): shutting down", watch_fd);
  } else {
    GENIE_LOG_INFO("genie-node: signal {}: shutting down", signal);
  }
  if (membership) membership->leave();  // first: clients stop choosing it while it stops
  (*service)->stop();
  return 0;
}
