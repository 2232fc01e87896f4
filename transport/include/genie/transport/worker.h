// Worker: one UCX context + worker, its progress thread, listeners and endpoints.
//
// The data plane of Genie (DESIGN.md "UCX is the data plane"). A Worker owns a ucp_context
// and one ucp_worker that only ONE thread at a time touches: the progress thread. That is
// either a thread the Worker starts (startProgressThread(): it polls under load and sleeps on
// the worker's event fd when idle) or, for benchmarks, the thread that created the Worker and
// calls progress() itself. A thread waiting for a reply may take the worker over for a short
// while (drive()): it then is the progress thread, and the started one stands aside. Every
// other thread hands work over with post(); all callbacks (messages, completions, connects,
// errors) run on the progress thread and must not block. See docs/thread_model.md.
//
// Messages are UCX active messages: the header is a FlatBuffer (opaque here), the data is the
// payload, which the receiver places where it wants (rendezvous straight into its buffer for
// large payloads). RMA put/get use memory registered once through the registration cache.
//
// Errors: endpoints use UCX's peer error handling; when a peer dies or the link breaks, every
// pending request completes with kPeerUnreachable naming the peer, and nothing hangs.
// Liveness: UCX's keepalive misses a peer that is stopped or hung (its kernel still answers
// TCP) and a link cut without a reset; so each worker also sends a heartbeat on every
// connection it has sent nothing on for WorkerConfig::peer_timeout / 8, and fails a connection
// it has heard nothing on (no message, no heartbeat) for peer_timeout. A peer is then declared
// dead within peer_timeout + peer_timeout / 8, and a live one (busy running a graph, receiving
// a large payload) never is: its progress thread keeps sending heartbeats.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "genie/status.h"
#include "genie/transport/config.h"
#include "genie/transport/types.h"

// UCX handles, declared here so that users of this header need not include UCX.
typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;
typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_listener* ucp_listener_h;
typedef struct ucp_conn_request* ucp_conn_request_h;

namespace genie::transport {

class ConnectionGuard;
class Endpoint;
class InboundMessage;
class Listener;
class RegistrationCache;
struct EndpointState;

/// Called on the progress thread for every message that arrives on any endpoint. Takes the
/// message by rvalue reference (one move less per message); a lambda taking
/// `InboundMessage message` by value fits as well.
using MessageHandler = std::function<void(InboundMessage&& message)>;
/// Called on the progress thread when a listener accepted a connection.
using AcceptHandler = std::function<void(std::shared_ptr<Endpoint> endpoint)>;
/// Called on the progress thread once when an endpoint fails (peer died, link broke).
using EndpointErrorHandler = std::function<void(std::shared_ptr<Endpoint> endpoint, Status)>;

/// What UCX can do in this process.
struct WorkerInfo {
  std::string ucx_version;         // "1.13.1"
  bool cuda_memory = false;        // UCX handles CUDA memory natively
  size_t max_am_header = 0;        // bytes; larger headers travel in the payload
  std::string tls;                 // the effective UCX_TLS ("" = UCX default)
};

class Worker : public std::enable_shared_from_this<Worker> {
 public:
  /// Creates the UCX context and worker. Errors: kUnsupported (UCX lacks a feature),
  /// kInternal (UCX failed) with UCX's message.
  static Result<std::shared_ptr<Worker>> create(const WorkerConfig& config);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  const WorkerConfig& config() const { return config_; }
  const WorkerInfo& info() const { return info_; }

  // ---- handlers: set before listen()/connect() -------------------------------------
  void setMessageHandler(MessageHandler handler);
  void setEndpointErrorHandler(EndpointErrorHandler handler);

  // ---- connections (any thread; blocks until done or timed out) ---------------------
  /// Listens on host:port (port 0 picks a free port; Listener::port() tells which).
  /// Errors: kInvalidArgument (bad address), kAlreadyExists (port in use), kInternal.
  Result<std::unique_ptr<Listener>> listen(const std::string& host, uint16_t port,
                                           AcceptHandler on_accept);
  /// Connects to a listener and waits until the connection is established (at most
  /// config().connect_timeout). Errors: kPeerUnreachable naming host:port, kTimeout.
  Result<std::shared_ptr<Endpoint>> connect(const std::string& host, uint16_t port);

  // ---- progress ----------------------------------------------------------------------
  /// Starts the progress thread; from then on only it touches UCX.
  Status startProgressThread();
  /// Caller-driven progress (when no progress thread runs): runs posted tasks and UCX
  /// callbacks once. Returns the number of events handled. Progress thread only.
  unsigned progress();
  /// Runs `task` on the progress thread (inline if called there).
  void post(std::function<void()> task);
  /// True on the thread that drives the worker now (the progress thread, or a caller inside
  /// drive()).
  bool isProgressThread() const { return driver_.load(std::memory_order_relaxed) == std::this_thread::get_id(); }
  /// How drive() gets the worker when another thread has it.
  enum class Takeover {
    kWait,                 // ask the progress thread to stand aside; wait behind other callers
    kUnlessAnotherCaller,  // as kWait, but give up at once if another caller drives or waits
                           // to, and stop driving early when another caller asks for the worker
    kOnlyIfFree,           // only if nobody holds the worker now (a sleeping progress thread)
  };
  /// Caller-driven progress from any thread, for a caller that waits for a reply: takes the
  /// worker over from the progress thread (which stands aside between two progress rounds; a
  /// sleeping one holds nothing), runs the tasks posted before, then `start` (typically the
  /// request's send, which then goes out inline instead of through post()), then progress()
  /// until `done()` holds or `poll` (µs) passes, and hands the worker back. Callbacks of every
  /// message and completion that arrive meanwhile run on the caller. Returns done().
  /// With kUnlessAnotherCaller and kOnlyIfFree, returns false without running `start` when it
  /// did not get the worker. With kWait on a worker without a started progress thread, from
  /// another thread than its own, `start` is post()ed and nothing is driven. An empty `start`
  /// is allowed; then done() is also checked while waiting for the worker. Except in that
  /// post()ed case, `start` runs before drive() returns, so it may refer to the caller's frame
  /// (callers pass std::ref(lambda): the std::function then holds no heap copy).
  /// Saves the thread hand-offs of a round trip (docs/thread_model.md).
  bool drive(const std::function<void()>& start, const std::function<bool()>& done, std::chrono::microseconds poll,
             Takeover takeover = Takeover::kWait);
  /// Blocks until `done()` holds or `timeout` passes. On the progress thread it drives
  /// progress(); elsewhere it sleeps. Returns false on timeout.
  bool waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout);
  /// Stops the progress thread and force-closes every endpoint and listener; pending
  /// requests complete with kCancelled. Idempotent; called by the destructor.
  void shutdown();

  /// The memory registration cache (progress thread, or through post()).
  RegistrationCache& registrationCache() { return *rcache_; }

  // ---- statistics (any thread) -------------------------------------------------------
  uint64_t bytesSent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytesReceived() const { return bytes_received_.load(std::memory_order_relaxed); }
  /// Bytes of CUDA payloads staged through host memory because UCX lacks CUDA support.
  uint64_t bytesStaged() const { return bytes_staged_.load(std::memory_order_relaxed); }

  // ---- internal, used by Endpoint / InboundMessage / Listener --------------------------
  ucp_worker_h ucpWorker() const { return worker_; }
  ucp_context_h ucpContext() const { return context_; }
  // Called only by the thread that drives the worker (the progress thread, or a caller inside
  // drive(), whose mutex orders it after the previous driver): one writer at a time, so a
  // plain load and store, not a locked read-modify-write on every message. Read anywhere.
  void countSent(size_t n) { bytes_sent_.store(bytes_sent_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
  void countReceived(size_t n) {
    bytes_received_.store(bytes_received_.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  /// Counts a CUDA payload staged through host memory; warns the first time.
  void noteStaged(size_t n);
  /// A listener's port starts or stops being watched by the connection guard (progress thread).
  void guardPortFromProgressThread(uint16_t port, bool guard);
  /// Creates the ucp endpoint of an accepted connection request (progress thread).
  void acceptFromProgressThread(ucp_conn_request_h request, AcceptHandler& on_accept);
  void onEndpointErrorFromProgressThread(EndpointState* state, Status status);
  /// Runs the liveness and admission checks when their tick is due (progress thread).
  void tickIfDueFromProgressThread();
  /// Starts closing an endpoint: graceful (flush) or forced; bounded by close_timeout.
  void closeEndpointFromProgressThread(const std::shared_ptr<EndpointState>& state, bool force);
  /// Runs fn(arg) on the progress thread after the current ucp_worker_progress() returns
  /// (UCX only queues operations started inside its callbacks). Progress thread only.
  void deferFromProgressThread(void (*fn)(void*), void* arg) { deferred_.push_back({fn, arg}); }
  void deferTaskFromProgressThread(std::function<void()> task);
  /// The next `polls` polls of the progress thread that find nothing yield the core
  /// (sched_yield), as with WorkerConfig::yield_while_polling. For a handler that just handed
  /// work to a sleeping thread (genie-node's session thread): on a machine with fewer cores
  /// than busy threads it then runs at once. Progress thread only.
  void yieldPollsFromProgressThread(unsigned polls) { yield_polls_ = std::max(yield_polls_, polls); }
  /// True while deferred work waits for the end of this ucp_worker_progress() round.
  bool hasDeferredFromProgressThread() const { return !deferred_.empty(); }
  /// Non-null while an active-message callback runs (see worker_internal.h).
  struct AmCallbackScope* amScope() const { return am_scope_; }
  uint64_t amGeneration() const { return am_generation_; }

 private:
  explicit Worker(const WorkerConfig& config);
  Status init();
  void progressThreadMain();
  /// Progress thread: takes the worker back after a caller drove it, without making the
  /// caller's unlock pay for a wake-up (polls the lock with short sleeps).
  void retakeFromCaller(std::unique_lock<std::mutex>& held);
  unsigned progressCloses();
  unsigned runDeferred();
  unsigned runPostedTasks();
  /// Wraps a created ucp endpoint (state->ep set) in an Endpoint and tracks it.
  std::shared_ptr<Endpoint> adoptEndpointFromProgressThread(std::shared_ptr<EndpointState> state);
  std::shared_ptr<Endpoint> endpointFor(ucp_ep_h ep);
  /// The state of an open endpoint, or null (progress thread).
  EndpointState* stateFor(ucp_ep_h ep);
  /// Liveness and admission (see the header comment): heartbeats where nothing was sent since
  /// the last tick, failures where nothing was heard for peer_timeout or probation expired.
  void tickFromProgressThread(std::chrono::steady_clock::time_point now);
  /// A heartbeat (kAmHeartbeat: no header, no data) to the endpoint's peer.
  void sendHeartbeatFromProgressThread(EndpointState& state);
  /// Fails a connection that sent a message over its probation limit (inside its callback).
  void refuseOversizeFromProgressThread(EndpointState* state, size_t bytes);
  void forgetEndpointFromProgressThread(ucp_ep_h ep);
  friend struct AmDispatch;
  friend struct AmCallbackScope;

  struct PendingClose {
    enum class Phase { kFlushing, kClosing };
    std::shared_ptr<EndpointState> state;
    void* request;
    std::chrono::steady_clock::time_point deadline;
    Phase phase;
  };
  void issueCloseFromProgressThread(const std::shared_ptr<EndpointState>& state, bool force,
                                    std::chrono::steady_clock::time_point deadline);

  WorkerConfig config_;
  WorkerInfo info_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1;  // UCX's event fd
  int wake_fd_ = -1;     // eventfd written by post() while the progress thread sleeps
  int epoll_fd_ = -1;
  std::unique_ptr<RegistrationCache> rcache_;

  MessageHandler message_handler_;
  EndpointErrorHandler error_handler_;

  std::thread progress_thread_;
  std::atomic<std::thread::id> driver_;       // the thread that touches UCX now
  std::mutex drive_mutex_;                    // held by the started progress thread or a driving caller
  std::atomic<unsigned> drive_requests_{0};   // callers waiting to drive
  std::atomic<unsigned> callers_{0};          // callers inside drive(), waiting or driving
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  bool shut_down_ = false;

  std::mutex tasks_mutex_;
  std::vector<std::function<void()>> tasks_;
  std::vector<std::function<void()>> running_tasks_;  // progress thread only
  std::atomic<size_t> tasks_pending_{0};

  // Progress thread only: every open ucp endpoint and its state.
  std::unordered_map<ucp_ep_h, std::shared_ptr<EndpointState>> endpoints_;
  ucp_ep_h last_ep_ = nullptr;                // endpointFor's one-entry cache:
  EndpointState* last_state_ = nullptr;       // endpoints_[last_ep_], or null
  std::vector<PendingClose> pending_closes_;
  std::vector<std::pair<void (*)(void*), void*>> deferred_;       // progress thread only
  std::vector<std::pair<void (*)(void*), void*>> running_deferred_;
  AmCallbackScope* am_scope_ = nullptr;
  unsigned yield_polls_ = 0;  // progress thread only: see yieldPollsFromProgressThread
  // Liveness tick (progress thread only): progress() compares a coarse clock (ms) with
  // next_tick_ms_; the progress thread sleeps at most one tick interval.
  std::chrono::milliseconds tick_interval_{100};
  int64_t next_tick_ms_ = 0;
  std::chrono::steady_clock::time_point last_tick_{};
  // Listening ports' stuck connection requests (connection_guard.h), scanned every 250 ms.
  std::unique_ptr<ConnectionGuard> guard_;
  std::chrono::steady_clock::time_point next_guard_scan_{};
  uint64_t am_generation_ = 0;

  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bytes_staged_{0};
};

/// A listening socket address. Destroying it stops accepting (connections stay open).
class Listener {
 public:
  Listener(std::shared_ptr<Worker> worker, AcceptHandler on_accept);
  ~Listener();
  /// The port actually bound (useful with port 0).
  uint16_t port() const { return port_; }
  const std::string& address() const { return address_; }

  // internal
  Status startFromProgressThread(const std::string& host, uint16_t port);
  static void onConnectionRequest(ucp_conn_request_h request, void* arg);

 private:
  std::shared_ptr<Worker> worker_;
  AcceptHandler on_accept_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::string address_;
};

}  // namespace genie::transport
