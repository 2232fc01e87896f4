// Worker and Listener (genie/transport/worker.h): a UCX context and worker, progress, endpoints.
//
// Over 600 lines: one class over one ucp_worker that only the progress thread touches; its
// active-message dispatch, lifecycle, progress and drive(), endpoints (liveness ticks, closes,
// connect, accept) and Listener all work on the same endpoint table and task queues there.
#include "genie/transport/worker.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>

#include "connection_guard.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/message.h"
#include "genie/transport/registration_cache.h"
#include "ucx_util.h"
#include "worker_internal.h"

namespace genie::transport {

namespace {

/// A millisecond clock that costs a few ns (CLOCK_MONOTONIC_COARSE, vDSO; a few ms of
/// resolution): progress() reads it on every call to see whether the liveness tick is due.
int64_t coarseMilliseconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

/// Once per process: a UCX older than the release Genie's tests run on (GENIE_UCX_TESTED_VERSION,
/// set by CMake) is named, with what is known to go wrong with the one CI builds against.
void warnIfOlderThanTested(unsigned major, unsigned minor, unsigned release) {
  static std::atomic<bool> warned{false};
  unsigned tested[3] = {0, 0, 0};
  std::sscanf(GENIE_UCX_TESTED_VERSION, "%u.%u.%u", &tested[0], &tested[1], &tested[2]);
  const unsigned running[3] = {major, minor, release};
  if (!std::lexicographical_compare(running, running + 3, tested, tested + 3) || warned.exchange(true)) return;
  SPDLOG_WARN("UCX {}.{}.{} is older than {}, the release Genie is tested on: UCX 1.13's TCP connection manager "
              "aborts the process on some malformed connection requests; listen only on a trusted fabric "
              "(docs/security.md)", major, minor, release, GENIE_UCX_TESTED_VERSION);
}

/// UCX_TLS as Genie uses it: shared memory alone cannot establish a client-server
/// connection (the sockaddr connection manager needs tcp), so "sm" gets tcp added.
std::string effectiveTls(const std::string& tls) {
  auto items = tlsItems(tls);
  if (items.empty()) return tls;
  for (std::string_view item : items) {
    if (!tlsNamesAny(item, {"sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "self", "mm"})) {
      return tls;  // something besides shared memory: leave it as asked
    }
  }
  return tls + ",tcp";
}

/// Whether UCX_TLS (empty: all) may select a shared-memory (mm) transport.
bool usesSharedMemory(const std::string& tls) {
  return tls.empty() || tlsNamesAny(tls, {"sm", "shm", "posix", "sysv", "mm", "all"});
}

Result<sockaddr_storage> resolve(const std::string& host, uint16_t port, socklen_t* length) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = host.empty() ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return GENIE_ERROR(kInvalidArgument, "cannot resolve '{}': {}", host, gai_strerror(rc));
  }
  sockaddr_storage address{};
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  *length = found->ai_addrlen;
  freeaddrinfo(found);
  return address;
}

std::string formatAddress(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  uint16_t port = 0;
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace

// ---- active-message dispatch (progress thread) ---------------------------------------

struct AmDispatch {
  static ucs_status_t onMessage(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* worker = static_cast<Worker*>(arg);
    EndpointState* state = heardFrom(*worker, param);
    std::shared_ptr<Endpoint> endpoint = state ? state->owner.lock() : nullptr;
    if (!endpoint) {
      SPDLOG_WARN("dropping a message from an endpoint that is closed or unknown");
      return UCS_OK;
    }
    if (header_length + length > state->max_inbound_bytes) {
      worker->refuseOversizeFromProgressThread(state, header_length + length);
      return UCS_OK;  // a rendezvous payload is then never pulled
    }
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    // A rendezvous payload is counted when the receiver pulls it (a refused one never is).
    worker->countReceived(header_length + (rndv ? 0 : length));
    if (!worker->message_handler_) return UCS_OK;
    AmCallbackScope scope(*worker);
    worker->message_handler_(InboundMessage(std::move(endpoint), {static_cast<const std::byte*>(header), header_length},
                                            length ? data : nullptr, length, rndv));
    return scope.ucxReturn(length);
  }

  /// kAmLargeHeader: header is the FlatBuffer's length; data holds FlatBuffer then payload.
  static ucs_status_t onLargeHeader(void* arg, const void* header, size_t header_length,
                                    void* data, size_t length, const ucp_am_recv_param_t* param) {
    auto* worker = static_cast<Worker*>(arg);
    uint64_t flatbuffer_length = 0;
    EndpointState* state = heardFrom(*worker, param);
    std::shared_ptr<Endpoint> endpoint = state ? state->owner.lock() : nullptr;
    if (header_length != sizeof(flatbuffer_length) || !endpoint) {
      SPDLOG_WARN("dropping a malformed large-header message");
      return UCS_OK;
    }
    if (header_length + length > state->max_inbound_bytes) {
      worker->refuseOversizeFromProgressThread(state, header_length + length);
      return UCS_OK;
    }
    std::memcpy(&flatbuffer_length, header, sizeof(flatbuffer_length));
    if (flatbuffer_length > length) {
      SPDLOG_WARN("dropping a large-header message from {}: header {} B > data {} B",
                  endpoint->peer(), flatbuffer_length, length);
      return UCS_OK;
    }
    worker->countReceived(header_length + length);
    auto deliver = [worker, endpoint, flatbuffer_length](std::vector<std::byte> bytes) {
      if (!worker->message_handler_) return;
      InboundMessage message(endpoint, {bytes.data(), static_cast<size_t>(flatbuffer_length)}, nullptr, 0, false);
      message.adoptEagerCopy(std::vector<std::byte>(bytes.begin() + flatbuffer_length, bytes.end()));
      worker->message_handler_(std::move(message));
    };
    // The whole message is copied into (or received by rendezvous into) a host buffer: a
    // length this process cannot allocate fails the connection, not the process.
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    std::vector<std::byte> bytes;
    try {
      if (rndv) {
        bytes.resize(length);
      } else {
        bytes.assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + length);
      }
    } catch (const std::bad_alloc&) {
      worker->onEndpointErrorFromProgressThread(
          state, GENIE_ERROR(kOutOfMemory, "{} sent a {}-byte message with a large header, more than this process "
                                           "can allocate: connection closed", state->peer, length));
      return UCS_OK;
    }
    if (!rndv) {
      deliver(std::move(bytes));
      return UCS_OK;  // copied: UCX may release its descriptor
    }
    // Rendezvous: pull the whole message into the host buffer, then deliver it.
    noteBulkReceive(*state, length);
    auto* pending = new LargeHeaderReceive{std::move(bytes), deliver, endpoint->state()};
    ucp_request_param_t request{};
    request.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    request.cb.recv_am = [](void* req, ucs_status_t status, size_t, void* user_data) {
      std::unique_ptr<LargeHeaderReceive> done(static_cast<LargeHeaderReceive*>(user_data));
      endBulkReceive(*done->from);
      if (status == UCS_OK) done->deliver(std::move(done->bytes));
      if (req != nullptr) ucp_request_free(req);
    };
    request.user_data = pending;
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(worker->worker_, data, pending->bytes.data(), length, &request);
    if (sp == nullptr) {
      std::unique_ptr<LargeHeaderReceive> done(pending);
      endBulkReceive(*state);
      done->deliver(std::move(done->bytes));
    } else if (UCS_PTR_IS_ERR(sp)) {
      endBulkReceive(*state);
      delete pending;
      SPDLOG_WARN("large-header receive from {} failed: {}", endpoint->peer(),
                  ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    return UCS_INPROGRESS;
  }

  /// kAmHeartbeat: counted, nothing else.
  static ucs_status_t onHeartbeat(void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t* param) {
    heardFrom(*static_cast<Worker*>(arg), param);
    return UCS_OK;
  }

  /// The state of the endpoint a message came on (null if closed or unknown), with the message
  /// counted for its liveness.
  static EndpointState* heardFrom(Worker& worker, const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
    EndpointState* state = worker.stateFor(param->reply_ep);
    if (state != nullptr && state->messages_in++ == 0) state->established.store(true, std::memory_order_release);
    return state;
  }

  struct LargeHeaderReceive {
    std::vector<std::byte> bytes;
    std::function<void(std::vector<std::byte>)> deliver;
    std::shared_ptr<EndpointState> from;
  };

  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* state = static_cast<EndpointState*>(arg);
    auto worker_owner = state->owner.lock();
    Worker* worker = worker_owner ? &worker_owner->worker() : nullptr;
    Status error = GENIE_UCX_STATUS(status, "connection to {} failed", state->peer);
    if (worker != nullptr) {
      worker->onEndpointErrorFromProgressThread(state, error);
    } else {
      state->error = error;
      state->failed = true;
    }
  }

  static void onConnectionRequest(ucp_conn_request_h request, void* arg) {
    Listener::onConnectionRequest(request, arg);
  }
};

// ---- Worker lifecycle -----------------------------------------------------------------

Worker::Worker(const WorkerConfig& config) : config_(config), guard_(std::make_unique<ConnectionGuard>()) {}

Result<std::shared_ptr<Worker>> Worker::create(const WorkerConfig& config) {
  std::shared_ptr<Worker> worker(new Worker(config));
  GENIE_RETURN_IF_ERROR(worker->init());
  return worker;
}

Status Worker::init() {
  driver_.store(std::this_thread::get_id());
  // The transports asked for: Genie's setting, else UCX's own environment variable.
  const char* env_tls = std::getenv("UCX_TLS");
  const std::string requested_tls = !config_.tls.empty() ? config_.tls : (env_tls ? env_tls : "");
  std::string tls = effectiveTls(requested_tls);
  if (tls != requested_tls) {
    // Shared memory asked for, tcp added only to set up connections: keep tcp out of the
    // rendezvous (RMA) lanes so that large payloads move by cma. A UCT setting, which
    // ucp_config_modify does not reach; an explicit UCX_TCP_PUT_ENABLE wins.
    setenv("UCX_TCP_PUT_ENABLE", "n", /*overwrite=*/0);
  }
  // A service restarted at once on its port (after a crash: its old connections are still in
  // TIME-WAIT there) can listen again, as servers do with SO_REUSEADDR. An explicit setting wins.
  setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
  ucp_config_t* ucx_config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &ucx_config);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "ucp_config_read");
  auto modify = [&](const char* name, const std::string& value) -> Status {
    ucs_status_t s = ucp_config_modify(ucx_config, name, value.c_str());
    if (s != UCS_OK) return GENIE_UCX_STATUS(s, "UCX setting {}={}", name, value);
    return Status::ok();
  };
  Status status;
  if (!tls.empty()) status = modify("TLS", tls);
  if (status && !config_.net_devices.empty()) status = modify("NET_DEVICES", config_.net_devices);
  // UCX's keepalive sees a dead peer process or a reset link (the shared-memory transports have
  // no connection to break); a quarter of the bound leaves room for the check itself. A stopped
  // peer or a silently cut link is left to the heartbeats (tickFromProgressThread).
  auto keepalive = config_.peer_timeout.count() == 0 ? int64_t{250} : std::max<int64_t>(config_.peer_timeout.count() / 4, 10);
  if (status) status = modify("KEEPALIVE_INTERVAL", fmt::format("{}ms", keepalive));
  if (status && config_.rndv_threshold) status = modify("RNDV_THRESH", std::to_string(config_.rndv_threshold));
  if (!status) {
    ucp_config_release(ucx_config);
    return status;
  }
  // Shared-memory transports refuse endpoints with peer error handling unless asked.
  if (status && usesSharedMemory(tls)) status = modify("MM_ERROR_HANDLING", "y");
  // Shared memory asked for, tcp added only to set up connections: keep tcp out of the
  // rendezvous (RMA) lanes so that large payloads move by cma / shared memory.

  if (!status) {
    ucp_config_release(ucx_config);
    return status;
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  params.name = config_.name.c_str();
  st = ucp_init(&params, ucx_config, &context_);
  ucp_config_release(ucx_config);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "ucp_init (UCX_TLS={})", tls.empty() ? "default" : tls);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_NAME;
  // One thread at a time, not always the same one: drive() hands the worker to a caller.
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  worker_params.name = config_.name.c_str();
  st = ucp_worker_create(context_, &worker_params, &worker_);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "ucp_worker_create");
  st = ucp_worker_get_efd(worker_, &worker_efd_);
  if (st != UCS_OK) return GENIE_UCX_STATUS(st, "ucp_worker_get_efd");

  ucp_worker_attr_t worker_attr{};
  worker_attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
  if (ucp_worker_query(worker_, &worker_attr) == UCS_OK) info_.max_am_header = worker_attr.max_am_header;
  ucp_context_attr_t context_attr{};
  context_attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_, &context_attr) == UCS_OK) {
    info_.cuda_memory = (context_attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  info_.ucx_version = fmt::format("{}.{}.{}", major, minor, release);
  info_.tls = tls;
  warnIfOlderThanTested(major, minor, release);

  auto set_handler = [&](unsigned id, ucp_am_recv_callback_t cb) -> Status {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    handler.cb = cb;
    handler.arg = this;
    ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &handler);
    if (s != UCS_OK) return GENIE_UCX_STATUS(s, "ucp_worker_set_am_recv_handler({})", id);
    return Status::ok();
  };
  GENIE_RETURN_IF_ERROR(set_handler(kAmMessage, &AmDispatch::onMessage));
  GENIE_RETURN_IF_ERROR(set_handler(kAmLargeHeader, &AmDispatch::onLargeHeader));
  GENIE_RETURN_IF_ERROR(set_handler(kAmHeartbeat, &AmDispatch::onHeartbeat));
  if (config_.peer_timeout.count() > 0) {
    tick_interval_ = std::max(config_.peer_timeout / 8, std::chrono::milliseconds(10));
  }
  last_tick_ = std::chrono::steady_clock::now();
  next_tick_ms_ = coarseMilliseconds() + tick_interval_.count();

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0) return GENIE_ERROR(kInternal, "eventfd/epoll: {}", std::strerror(errno));
  for (int fd : {worker_efd_, wake_fd_}) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &event) != 0) {
      return GENIE_ERROR(kInternal, "epoll_ctl: {}", std::strerror(errno));
    }
  }
  rcache_ = std::make_unique<RegistrationCache>(context_);
  SPDLOG_DEBUG("worker '{}': UCX {}, UCX_TLS={}, max AM header {} B, CUDA memory {}", config_.name,
               info_.ucx_version, tls.empty() ? "(default)" : tls, info_.max_am_header,
               info_.cuda_memory ? "yes" : "no");
  return Status::ok();
}

Worker::~Worker() {
  if (progress_thread_.joinable() && std::this_thread::get_id() == progress_thread_.get_id()) {
    SPDLOG_CRITICAL("Worker destroyed from its own progress thread: call Worker::shutdown() first");
    std::abort();
  }
  shutdown();
  rcache_.reset();
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void Worker::shutdown() {
  if (shut_down_ || worker_ == nullptr) return;
  if (progress_thread_.joinable()) {
    stop_ = true;
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    progress_thread_.join();
  }
  driver_.store(std::this_thread::get_id());
  runPostedTasks();
  runDeferred();
  // Force-close every endpoint: their pending requests complete with an error now.
  std::vector<std::shared_ptr<EndpointState>> open;
  for (auto& [ep, state] : endpoints_) open.push_back(state);
  for (auto& state : open) {
    if (!state->failed) state->error = GENIE_ERROR(kCancelled, "worker '{}' shut down", config_.name);
    closeEndpointFromProgressThread(state, /*force=*/true);
  }
  while (!pending_closes_.empty()) progress();  // bounded: progressCloses() abandons at the deadline
  endpoints_.clear();
  last_state_ = nullptr;
  runPostedTasks();
  shut_down_ = true;
}

void Worker::noteStaged(size_t n) {
  if (bytes_staged_.fetch_add(n, std::memory_order_relaxed) == 0) {
    SPDLOG_WARN("UCX {} cannot access CUDA memory: GPU tensors are staged through host memory "
                "(one extra copy each way; use a CUDA-aware UCX such as PyPI's libucx-cu13)",
                info_.ucx_version);
  }
}

void Worker::setMessageHandler(MessageHandler handler) { message_handler_ = std::move(handler); }
void Worker::setEndpointErrorHandler(EndpointErrorHandler handler) { error_handler_ = std::move(handler); }

// ---- progress -------------------------------------------------------------------------

unsigned Worker::runPostedTasks() {
  if (tasks_pending_.load(std::memory_order_acquire) == 0) return 0;
  {
    std::lock_guard<std::mutex> lock(tasks_mutex_);
    running_tasks_.swap(tasks_);
  }
  size_t n = running_tasks_.size();
  for (auto& task : running_tasks_) task();
  running_tasks_.clear();
  tasks_pending_.fetch_sub(n, std::memory_order_acq_rel);
  return static_cast<unsigned>(n);
}

unsigned Worker::progress() {
  // Called in a busy loop: the checks for empty queues stay inline (a few instructions).
  unsigned events = 0;
  if (tasks_pending_.load(std::memory_order_acquire) != 0) events += runPostedTasks();
  events += ucp_worker_progress(worker_);
  if (!deferred_.empty()) events += runDeferred();
  if (!pending_closes_.empty()) events += progressCloses();
  // After the messages that arrived were handled: a peer is not blamed for what UCX still held.
  tickIfDueFromProgressThread();
  return events;
}

void Worker::deferTaskFromProgressThread(std::function<void()> task) {
  deferFromProgressThread(
      [](void* arg) {
        std::unique_ptr<std::function<void()>> deferred(static_cast<std::function<void()>*>(arg));
        (*deferred)();
      },
      new std::function<void()>(std::move(task)));
}

unsigned Worker::runDeferred() {
  if (deferred_.empty()) return 0;
  running_deferred_.swap(deferred_);
  for (auto& [fn, arg] : running_deferred_) fn(arg);
  unsigned n = static_cast<unsigned>(running_deferred_.size());
  running_deferred_.clear();
  return n;
}

void Worker::post(std::function<void()> task) {
  if (isProgressThread()) {
    if (am_scope_ == nullptr) {
      task();
    } else {
      deferTaskFromProgressThread(std::move(task));
    }
    return;
  }
  if (shut_down_) {
    // No progress thread any more: run under the lock so UCX sees one thread at a time.
    std::lock_guard<std::mutex> lock(tasks_mutex_);
    task();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(tasks_mutex_);
    tasks_.push_back(std::move(task));
  }
  tasks_pending_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

bool Worker::drive(const std::function<void()>& start, const std::function<bool()>& done,
                   std::chrono::microseconds poll, Takeover takeover) {
  const auto deadline = std::chrono::steady_clock::now() + poll;
  if (isProgressThread()) {
    if (start) start();
    while (!done() && std::chrono::steady_clock::now() < deadline) progress();
    return done();
  }
  if (!progress_thread_.joinable() || shut_down_) {
    if (takeover != Takeover::kWait) return false;
    if (start) post(start);
    return false;
  }
  if (takeover == Takeover::kOnlyIfFree) {
    if (!drive_mutex_.try_lock()) return false;
    callers_.fetch_add(1, std::memory_order_seq_cst);
  } else {
    if (callers_.fetch_add(1, std::memory_order_seq_cst) != 0 && takeover == Takeover::kUnlessAnotherCaller) {
      callers_.fetch_sub(1, std::memory_order_seq_cst);
      return false;
    }
    // Ask the progress thread to stand aside; it checks between two progress rounds, and
    // holds nothing while it sleeps. Spin (yielding the core, which it may need) rather than
    // block: a futex wait here would cost a wake-up on the way in.
    drive_requests_.fetch_add(1, std::memory_order_seq_cst);
    while (!drive_mutex_.try_lock()) {
      if (!start && done()) {  // another thread's progress already did it
        drive_requests_.fetch_sub(1, std::memory_order_seq_cst);
        callers_.fetch_sub(1, std::memory_order_seq_cst);
        return true;
      }
      sched_yield();
    }
    drive_requests_.fetch_sub(1, std::memory_order_seq_cst);
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  // Tasks posted earlier (an earlier send on the same endpoint) go first: sends leave in the
  // order they were made.
  runPostedTasks();
  if (start) start();
  bool finished;
  // A caller that would not wait behind others (a leader) also steps down for one that waits.
  const bool step_down = takeover == Takeover::kUnlessAnotherCaller;
  while (!(finished = done()) && std::chrono::steady_clock::now() < deadline &&
         !(step_down && drive_requests_.load(std::memory_order_relaxed) != 0)) {
    progress();
  }
  driver_.store(std::thread::id(), std::memory_order_relaxed);
  drive_mutex_.unlock();
  callers_.fetch_sub(1, std::memory_order_seq_cst);
  return finished;
}

void Worker::retakeFromCaller(std::unique_lock<std::mutex>& held) {
  auto pause = std::chrono::microseconds(20);
  while (!held.try_lock()) {
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  driver_.store(std::this_thread::get_id(), std::memory_order_relaxed);
}

bool Worker::waitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  if (isProgressThread()) {
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      progress();
    }
    return true;
  }
  auto pause = std::chrono::microseconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
  return true;
}

Status Worker::startProgressThread() {
  if (progress_thread_.joinable()) return GENIE_ERROR(kAlreadyExists, "progress thread already running");
  if (shut_down_) return GENIE_ERROR(kCancelled, "worker '{}' is shut down", config_.name);
  // From now on no thread drives the worker until the progress thread takes it
  // (progressThreadMain); tasks posted meanwhile wait for it.
  driver_.store(std::thread::id());
  progress_thread_ = std::thread([this] { progressThreadMain(); });
  return Status::ok();
}

void Worker::progressThreadMain() {
  pthread_setname_np(pthread_self(), "genie-progress");
  // Held while this thread touches UCX; released while it sleeps and while a caller drives.
  std::unique_lock<std::mutex> held(drive_mutex_, std::defer_lock);
  retakeFromCaller(held);
  auto last_event = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_relaxed)) {
    if (drive_requests_.load(std::memory_order_seq_cst) != 0) {
      // A caller waits for a reply and drives the worker itself (drive()): stand aside.
      driver_.store(std::thread::id(), std::memory_order_relaxed);
      held.unlock();
      while (drive_requests_.load(std::memory_order_seq_cst) != 0 && !stop_.load(std::memory_order_relaxed)) {
        sched_yield();
      }
      retakeFromCaller(held);
      last_event = std::chrono::steady_clock::now();
      continue;
    }
    if (progress() != 0) {
      last_event = std::chrono::steady_clock::now();
      continue;
    }
    if (std::chrono::steady_clock::now() - last_event < config_.busy_poll) {
      if (config_.yield_while_polling) {
        sched_yield();
      } else if (yield_polls_ != 0) {
        --yield_polls_;
        sched_yield();
      }
      continue;
    }
    // Idle: arm the worker's event fd and sleep until UCX or post() wakes us.
    sleeping_.store(true, std::memory_order_seq_cst);
    if (tasks_pending_.load(std::memory_order_seq_cst) != 0 || !pending_closes_.empty()) {
      sleeping_ = false;
      continue;
    }
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_OK) {
      driver_.store(std::thread::id(), std::memory_order_relaxed);
      held.unlock();  // a caller may drive the worker while this thread sleeps
      epoll_event events[2];
      // Wakes for the liveness tick at the latest (heartbeats go out while idle too).
      epoll_wait(epoll_fd_, events, 2, static_cast<int>(std::min<int64_t>(tick_interval_.count(), 100)));
      retakeFromCaller(held);
    }
    tickIfDueFromProgressThread();
    sleeping_.store(false, std::memory_order_seq_cst);
    uint64_t drained;
    while (::read(wake_fd_, &drained, sizeof(drained)) > 0) {
    }
    last_event = std::chrono::steady_clock::now();
  }
}

// ---- endpoints ------------------------------------------------------------------------

EndpointState* Worker::stateFor(ucp_ep_h ep) {
  // Messages mostly come from the peer of the previous one: skip the hash lookup then.
  if (ep != last_ep_ || last_state_ == nullptr) {
    auto it = endpoints_.find(ep);
    if (it == endpoints_.end()) return nullptr;
    last_ep_ = ep;
    last_state_ = it->second.get();
  }
  return last_state_;
}

std::shared_ptr<Endpoint> Worker::endpointFor(ucp_ep_h ep) {
  EndpointState* state = stateFor(ep);
  return state ? state->owner.lock() : nullptr;
}

void Worker::tickIfDueFromProgressThread() {
  if (coarseMilliseconds() >= next_tick_ms_) tickFromProgressThread(std::chrono::steady_clock::now());
}

void Worker::tickFromProgressThread(std::chrono::steady_clock::time_point now) {
  next_tick_ms_ = coarseMilliseconds() + tick_interval_.count();
  // A tick much later than due means this process did not progress meanwhile (a long UCX call,
  // a busy machine, this process stopped): that time is not the peers' silence.
  const auto stalled = now - last_tick_ - tick_interval_;
  last_tick_ = now;
  const bool liveness = config_.peer_timeout.count() > 0;
  // Failures are reported after the walk: the error handler may close endpoints (erasing them).
  std::vector<std::pair<std::shared_ptr<EndpointState>, Status>> failed;
  for (auto& [ep, state] : endpoints_) {
    if (state->failed.load(std::memory_order_relaxed) || state->closed.load(std::memory_order_relaxed)) continue;
    if (state->admission_deadline != EndpointState::Clock::time_point{} && now >= state->admission_deadline) {
      failed.emplace_back(state, GENIE_ERROR(kTimeout, "{} was not admitted in time (no session): connection closed",
                                             state->peer));
      continue;
    }
    if (!liveness) continue;
    if (stalled > tick_interval_) state->last_heard += stalled;
    // last_heard is the tick that first saw a message, up to one tick after it arrived: the
    // silence is measured one tick short, so that a dead peer is declared within peer_timeout
    // plus one tick of its last message, after at least peer_timeout minus one tick of silence.
    if (state->messages_in != state->seen_in || (state->bulk_receives > 0 && now < state->bulk_until)) {
      state->seen_in = state->messages_in;
      state->last_heard = now;
    } else if (now - state->last_heard >= config_.peer_timeout - tick_interval_) {
      failed.emplace_back(state, GENIE_ERROR(kPeerUnreachable, "nothing heard from {} in {} ms (the peer stopped, hung "
                                                               "or the link is cut)", state->peer,
                                             std::chrono::duration_cast<std::chrono::milliseconds>(now - state->last_heard).count()));
      continue;
    }
    // Nothing sent since the last tick: a heartbeat, so that the peer hears from us.
    if (state->messages_out == state->seen_out) sendHeartbeatFromProgressThread(*state);
    state->seen_out = state->messages_out;
  }
  for (auto& [state, status] : failed) {
    SPDLOG_WARN("{}", status.message());  // onEndpointErrorFromProgressThread logs at info: a peer's close is routine
    onEndpointErrorFromProgressThread(state.get(), std::move(status));
  }
  if (!guard_->empty() && now >= next_guard_scan_) {
    next_guard_scan_ = now + std::chrono::milliseconds(250);
    guard_->scan(now, config_.connect_timeout, [this](const std::string& peer) {
      for (const auto& [ep, state] : endpoints_) {
        if (state->accepted && state->peer == peer) return true;
      }
      return false;
    });
  }
}

void Worker::guardPortFromProgressThread(uint16_t port, bool guard) {
  if (guard) {
    guard_->addPort(port);
  } else {
    guard_->removePort(port);
  }
}

void Worker::sendHeartbeatFromProgressThread(EndpointState& state) {
  // Its request, if UCX keeps one, is released by UCX when it completes.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  ucs_status_ptr_t request = ucp_am_send_nbx(state.ep, kAmHeartbeat, nullptr, 0, nullptr, 0, &param);
  if (UCS_PTR_IS_PTR(request)) ucp_request_free(request);
  ++state.messages_out;
}

void Worker::refuseOversizeFromProgressThread(EndpointState* state, size_t bytes) {
  onEndpointErrorFromProgressThread(
      state, GENIE_ERROR(kInvalidMessage, "{} sent a {}-byte message before it was admitted (at most {} bytes): "
                                          "connection closed", state->peer, bytes, state->max_inbound_bytes));
}

void Worker::forgetEndpointFromProgressThread(ucp_ep_h ep) {
  endpoints_.erase(ep);
  if (ep == last_ep_) last_state_ = nullptr;
}

std::shared_ptr<Endpoint> Worker::adoptEndpointFromProgressThread(std::shared_ptr<EndpointState> state) {
  auto endpoint = std::make_shared<Endpoint>(shared_from_this(), state);
  state->owner = endpoint;
  if (state->ep == last_ep_) last_state_ = nullptr;
  endpoints_[state->ep] = std::move(state);
  return endpoint;
}

void Worker::onEndpointErrorFromProgressThread(EndpointState* state, Status status) {
  if (state->failed.load()) return;
  state->error = status;  // written once, before `failed` publishes it to other threads
  state->failed.store(true, std::memory_order_release);
  SPDLOG_INFO("{}", status.message());
  auto endpoint = state->owner.lock();
  if (error_handler_ && endpoint) error_handler_(endpoint, status);
  // A failed ucp endpoint must be force-closed; do it after this callback returns.
  if (auto it = endpoints_.find(state->ep); it != endpoints_.end()) {
    deferTaskFromProgressThread([this, keep = it->second] { closeEndpointFromProgressThread(keep, /*force=*/true); });
  }
}

void Worker::closeEndpointFromProgressThread(const std::shared_ptr<EndpointState>& state, bool force) {
  if (state->ep == nullptr || state->close_started) return;
  state->close_started = true;
  state->closed = true;
  auto deadline = std::chrono::steady_clock::now() + config_.close_timeout;
  // Only an established, healthy connection is flushed: a flush pending while the connection
  // fails is released by UCX 1.22's error flow (ucp_ep_flush_resume_slow_path_callback on a
  // destroyed endpoint), and the request this worker still holds then points at freed memory
  // (perf/fuzz_connections.py --ports cm crashed the node in ucp_request_check_status here).
  if (state->failed.load() || !state->established.load()) force = true;
  if (!force) {
    // Graceful: flush what is pending first, bounded by close_timeout, then force-close
    // (progressCloses).
    ucp_request_param_t param{};
    ucs_status_ptr_t flush = ucp_ep_flush_nbx(state->ep, &param);
    if (UCS_PTR_IS_PTR(flush)) {
      pending_closes_.push_back({state, flush, deadline, PendingClose::Phase::kFlushing});
      return;
    }
  }
  issueCloseFromProgressThread(state, /*force=*/true, deadline);
}

void Worker::issueCloseFromProgressThread(const std::shared_ptr<EndpointState>& state, bool force,
                                          std::chrono::steady_clock::time_point deadline) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(state->ep, &param);
  if (UCS_PTR_IS_PTR(request)) {
    pending_closes_.push_back({state, request, deadline, PendingClose::Phase::kClosing});
    return;
  }
  forgetEndpointFromProgressThread(state->ep);
  state->ep = nullptr;
  state->close_done = true;
}

unsigned Worker::progressCloses() {
  if (pending_closes_.empty()) return 0;
  unsigned events = 0;
  auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < pending_closes_.size();) {
    PendingClose close = pending_closes_[i];
    ucs_status_t st = ucp_request_check_status(close.request);
    if (st == UCS_INPROGRESS && now < close.deadline) {
      ++i;
      continue;
    }
    pending_closes_[i] = pending_closes_.back();
    pending_closes_.pop_back();
    ++events;
    ucp_request_free(close.request);  // released by UCX once it completes
    if (close.phase == PendingClose::Phase::kFlushing) {
      // Flushed, failed, or timed out: force-close, so that whatever is still pending (a
      // rendezvous the peer never pulled) completes with an error now. A graceful UCX close
      // could wait on a silent peer forever.
      if (st == UCS_INPROGRESS) {
        SPDLOG_WARN("flushing the endpoint to {} took over {} ms: force-closing it", close.state->peer,
                    config_.close_timeout.count());
      }
      issueCloseFromProgressThread(close.state, /*force=*/true, now + config_.close_timeout);
      continue;
    }
    if (st == UCS_INPROGRESS) {
      SPDLOG_WARN("closing the endpoint to {} took over {} ms: abandoned", close.state->peer,
                  config_.close_timeout.count());
    }
    forgetEndpointFromProgressThread(close.state->ep);
    close.state->ep = nullptr;
    close.state->close_done = true;
  }
  return events;
}

Result<std::shared_ptr<Endpoint>> Worker::connect(const std::string& host, uint16_t port) {
  socklen_t length = 0;
  auto address = resolve(host, port, &length);
  if (!address) return address.status();
  std::string peer = fmt::format("{}:{}", host, port);
  Result<std::shared_ptr<Endpoint>> created = GENIE_ERROR(kInternal, "connect to {} did not run", peer);
  std::atomic<bool> created_done{false};  // release/acquire: `created` is visible once set
  post([&] {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.value());
    params.sockaddr.addrlen = length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &AmDispatch::onEndpointError;
    auto state = std::make_shared<EndpointState>();
    state->peer = peer;
    params.err_handler.arg = state.get();
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
    if (st != UCS_OK) {
      created = GENIE_UCX_STATUS(st, "connect to {}", peer);
    } else {
      state->ep = ep;
      created = adoptEndpointFromProgressThread(state);
    }
    created_done = true;
  });
  if (!waitUntil([&] { return created_done.load(); }, config_.connect_timeout)) {
    return GENIE_ERROR(kTimeout, "connect to {}: the progress thread did not answer in {} ms", peer,
                       config_.connect_timeout.count());
  }
  if (!created) return created.status();
  std::shared_ptr<Endpoint> endpoint = created.value();
  // Established once the peer's worker speaks: an accepting worker sends a heartbeat at once
  // (acceptFromProgressThread), so this also proves both directions work. Not a flush: a flush
  // still pending when the connection fails trips a use-after-free in UCX 1.22's error flow
  // (ucp_ep_flush_resume_slow_path_callback on a destroyed endpoint; docs/security.md).
  const std::shared_ptr<EndpointState>& state = endpoint->state();
  auto fail = [&](Status status) -> Result<std::shared_ptr<Endpoint>> {
    post([this, state] { closeEndpointFromProgressThread(state, /*force=*/true); });
    waitUntil([&] { return state->close_done.load(); }, config_.close_timeout);
    return status;
  };
  if (!waitUntil([&] { return state->established.load() || state->failed.load(); }, config_.connect_timeout)) {
    return fail(GENIE_ERROR(kTimeout, "connect to {}: no answer in {} ms", peer, config_.connect_timeout.count()));
  }
  if (state->failed.load()) {
    return fail(Status(StatusCode::kPeerUnreachable, fmt::format("connect to {} failed: {}", peer, state->error.message()),
                       __FILE__, __LINE__));
  }
  std::string lanes;
  std::atomic<bool> lanes_done{false};
  post([&] {
    lanes = describeEndpointLanes(endpoint->ucpEp());
    lanes_done = true;
  });
  waitUntil([&] { return lanes_done.load(); }, config_.connect_timeout);
  endpoint->state()->transports = lanes;
  SPDLOG_INFO("connected to {} over UCX {} [{}]", peer, info_.ucx_version, lanes);
  if (slowerThanRequested(info_.tls, lanes)) {
    SPDLOG_WARN("connection to {}: asked for UCX_TLS={} but data moves over tcp [{}]", peer, info_.tls, lanes);
  }
  return endpoint;
}

void Worker::acceptFromProgressThread(ucp_conn_request_h request, AcceptHandler& on_accept) {
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string peer = "unknown-client";
  if (ucp_conn_request_query(request, &attr) == UCS_OK) peer = formatAddress(attr.client_address);
  auto state = std::make_shared<EndpointState>();
  state->peer = peer;
  state->accepted = true;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &AmDispatch::onEndpointError;
  params.err_handler.arg = state.get();
  ucp_ep_h ep = nullptr;
  ucs_status_t st = ucp_ep_create(worker_, &params, &ep);
  if (st != UCS_OK) {
    SPDLOG_WARN("accepting a connection from {} failed: {}", peer, ucs_status_string(st));
    return;
  }
  state->ep = ep;
  // The connecting worker waits for this peer's first message (connect()): a heartbeat now.
  sendHeartbeatFromProgressThread(*state);
  auto endpoint = adoptEndpointFromProgressThread(std::move(state));
  SPDLOG_INFO("accepted a connection from {}", peer);
  if (on_accept) on_accept(std::move(endpoint));
}

Result<std::unique_ptr<Listener>> Worker::listen(const std::string& host, uint16_t port,
                                                 AcceptHandler on_accept) {
  auto listener = std::make_unique<Listener>(shared_from_this(), std::move(on_accept));
  Status status = GENIE_ERROR(kInternal, "listen did not run");
  std::atomic<bool> done{false};  // release/acquire: what the task wrote is visible once set
  post([&] {
    status = listener->startFromProgressThread(host, port);
    done = true;
  });
  if (!waitUntil([&] { return done.load(); }, config_.connect_timeout)) {
    return GENIE_ERROR(kTimeout, "listen on {}:{}: the progress thread did not answer", host, port);
  }
  if (!status) return status;
  return listener;
}

// ---- Listener -------------------------------------------------------------------------

Listener::Listener(std::shared_ptr<Worker> worker, AcceptHandler on_accept)
    : worker_(std::move(worker)), on_accept_(std::move(on_accept)) {}

Listener::~Listener() {
  if (listener_ == nullptr) return;
  ucp_listener_h listener = listener_;
  std::atomic<bool> done{false};  // release/acquire: what the task wrote is visible once set
  worker_->post([&] {
    worker_->guardPortFromProgressThread(port_, false);
    ucp_listener_destroy(listener);
    done = true;
  });
  worker_->waitUntil([&] { return done.load(); }, worker_->config().close_timeout);
}

Status Listener::startFromProgressThread(const std::string& host, uint16_t port) {
  socklen_t length = 0;
  auto address = resolve(host, port, &length);
  if (!address) return address.status();
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&address.value());
  params.sockaddr.addrlen = length;
  params.conn_handler.cb = &AmDispatch::onConnectionRequest;
  params.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(worker_->ucpWorker(), &params, &listener_);
  if (st != UCS_OK) {
    listener_ = nullptr;
    return GENIE_UCX_STATUS(st, "listen on {}:{}", host, port);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  if (ucp_listener_query(listener_, &attr) == UCS_OK) {
    address_ = formatAddress(attr.sockaddr);
    port_ = static_cast<uint16_t>(std::stoi(address_.substr(address_.rfind(':') + 1)));
    worker_->guardPortFromProgressThread(port_, true);
  }
  SPDLOG_INFO("listening on {}", address_);
  return Status::ok();
}

void Listener::onConnectionRequest(ucp_conn_request_h request, void* arg) {
  auto* listener = static_cast<Listener*>(arg);
  listener->worker_->acceptFromProgressThread(request, listener->on_accept_);
}

}  // namespace genie::transport
