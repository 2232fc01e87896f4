#include "genie/transport/endpoint.h"

#include <cstring>

#include <spdlog/spdlog.h>
#include <ucp/api/ucp.h>

#include "cuda_staging.h"
#include "genie/transport/registration_cache.h"
#include "genie/transport/worker.h"
#include "ucx_util.h"

namespace genie::transport {

namespace {

/// One in-flight operation: owns what UCX needs until completion (the header copy).
/// Operations are recycled through a per-thread pool: they are made and completed on the
/// progress thread, and the hot path then allocates nothing.
struct Operation {
  Callback done;
  const char* verb = "";                 // for errors: "send to"
  std::shared_ptr<EndpointState> state;  // names the peer in errors
  std::vector<std::byte> header;
  std::vector<std::byte> data;           // large-header messages: FlatBuffer + payload
  uint64_t large_header_length = 0;
  std::vector<std::byte> staged;         // CUDA payload copied to host (UCX without CUDA)
  ConstBuffer payload;                   // sends (a send in parts: data null, the parts' size)
  std::vector<ucp_dt_iov_t> iov;         // a send in parts: UCX reads it until completion
  Worker* worker = nullptr;              // deferred sends
};

constexpr size_t kPoolLimit = 1024;
/// Payloads up to this size try the immediate send first (bytes); larger ones cannot complete
/// at once on any transport (UCX's short-message limits are a few KiB at most).
constexpr size_t kSendNowMaxBytes = 8192;
constexpr size_t kKeepCapacity = 4096;  // bytes of header kept by a pooled operation

/// Operations kept for reuse by one thread; freed when the thread ends.
struct OperationPool {
  std::vector<Operation*> free;
  ~OperationPool() {
    for (Operation* op : free) delete op;
  }
};

std::vector<Operation*>& operationPool() {
  thread_local OperationPool pool;
  return pool.free;
}

Operation* newOperation(Callback&& done, const char* verb, const std::shared_ptr<EndpointState>& state) {
  auto& pool = operationPool();
  Operation* op;
  if (pool.empty()) {
    op = new Operation;
  } else {
    op = pool.back();
    pool.pop_back();
  }
  op->done = std::move(done);
  op->verb = verb;
  op->state = state;
  return op;
}

void recycle(Operation* op) {
  op->done = nullptr;
  op->state.reset();
  op->header.clear();
  if (op->header.capacity() > kKeepCapacity) op->header.shrink_to_fit();
  // Only large-header and staged CUDA sends use these; most operations skip the frees.
  if (op->data.capacity() != 0) op->data = {};
  if (op->staged.capacity() != 0) op->staged = {};
  op->large_header_length = 0;
  op->payload = {};
  op->iov.clear();
  op->worker = nullptr;
  auto& pool = operationPool();
  if (pool.size() < kPoolLimit) {
    pool.push_back(op);
  } else {
    delete op;
  }
}

/// The Status an operation ended with; only errors build a message (naming the peer).
Status operationStatus(const Operation& op, ucs_status_t status) {
  if (status == UCS_OK) return Status::ok();
  const EndpointState* state = op.state.get();
  if (state == nullptr) return GENIE_UCX_STATUS(status, "{}", op.verb);
  if (state->failed.load()) {
    return GENIE_ERROR(kPeerUnreachable, "{} {} failed: {}", op.verb, state->peer, state->error.message());
  }
  return GENIE_UCX_STATUS(status, "{} {}", op.verb, state->peer);
}

/// Runs the operation's callback with its result. The operation goes back to the pool first,
/// so that a callback which starts the next operation reuses it.
void complete(Operation* op, ucs_status_t status) {
  Callback done = std::move(op->done);
  Status result = operationStatus(*op, status);
  recycle(op);
  if (done) done(std::move(result));
}

void onSendComplete(void* request, ucs_status_t status, void* user_data) {
  complete(static_cast<Operation*>(user_data), status);
  ucp_request_free(request);
}

/// Finishes an operation that UCX started: immediate success, immediate error, or pending.
void track(ucs_status_ptr_t request, Operation* op) {
  if (request == nullptr) {
    complete(op, UCS_OK);
  } else if (UCS_PTR_IS_ERR(request)) {
    complete(op, UCS_PTR_STATUS(request));
  }  // else: onSendComplete runs later
}

ucp_request_param_t requestParam(Worker& worker, Operation* op, const void* buffer, size_t size,
                                 MemoryType memory) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.send = &onSendComplete;
  param.user_data = op;
  param.memory_type = ucsMemoryType(memory);
  if (size != 0) {
    if (const MemoryRegion* region = worker.registrationCache().find(buffer, size)) {
      param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      param.memh = region->memh;
    }
  }
  return param;
}

}  // namespace

RemoteKey::~RemoteKey() {
  ucp_rkey_h rkey = rkey_;
  worker_->post([rkey] { ucp_rkey_destroy(rkey); });
}

Endpoint::Endpoint(std::shared_ptr<Worker> worker, std::shared_ptr<EndpointState> state)
    : worker_(std::move(worker)), state_(std::move(state)) {}

Endpoint::~Endpoint() {
  if (state_->closed.load()) return;
  // Graceful (unless failed), non-blocking close on the progress thread (this may run inside a
  // callback).
  worker_->post([worker = worker_.get(), state = state_] {
    worker->closeEndpointFromProgressThread(state, /*force=*/state->failed.load());
  });
}

Status Endpoint::error() const {
  if (state_->failed.load()) return state_->error;
  if (state_->closed.load()) return GENIE_ERROR(kCancelled, "endpoint to {} is closed", state_->peer);
  return Status::ok();
}

std::string Endpoint::transports() const { return state_->transports; }

Status Endpoint::checkUsable() const {
  if (state_->failed.load()) return state_->error;
  if (state_->closed.load() || state_->ep == nullptr) {
    return GENIE_ERROR(kCancelled, "endpoint to {} is closed", state_->peer);
  }
  return Status::ok();
}

void Endpoint::send(std::span<const std::byte> header, ConstBuffer payload, Callback done) {
  if (worker_->isProgressThread()) {
    sendFromProgressThread(header, payload, std::move(done));
    return;
  }
  std::vector<std::byte> copy(header.begin(), header.end());
  worker_->post([self = shared_from_this(), copy = std::move(copy), payload, done = std::move(done)]() mutable {
    self->sendFromProgressThread(copy, payload, std::move(done));
  });
}

namespace {

/// Hands a prepared send to UCX: the header in op->header (or op->data for large headers).
void issueSend(Worker& worker, Operation* op) {
  EndpointState& state = *op->state;
  if (state.ep == nullptr || state.failed.load()) {
    complete(op, state.failed.load() ? UCS_ERR_CONNECTION_RESET : UCS_ERR_CANCELED);
    return;
  }
  const ConstBuffer payload = op->payload;
  ucp_request_param_t param;
  ucs_status_ptr_t request;
  if (op->large_header_length == 0 && !op->iov.empty()) {  // in parts: UCX's iov datatype
    param = requestParam(worker, op, nullptr, 0, MemoryType::kHost);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    param.datatype = ucp_dt_make_iov();
    request = ucp_am_send_nbx(state.ep, kAmMessage, op->header.data(), op->header.size(), op->iov.data(),
                              op->iov.size(), &param);
  } else if (op->large_header_length == 0) {
    param = requestParam(worker, op, payload.data, payload.size, payload.memory);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    request = ucp_am_send_nbx(state.ep, kAmMessage, op->header.data(), op->header.size(), payload.data,
                              payload.size, &param);
  } else {
    param = requestParam(worker, op, nullptr, 0, MemoryType::kHost);
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    request = ucp_am_send_nbx(state.ep, kAmLargeHeader, &op->large_header_length, sizeof(uint64_t),
                              op->data.data(), op->data.size(), &param);
  }
  track(request, op);
}

/// Issues a prepared send now, or, inside an active-message callback (where UCX only queues
/// sends that it cannot complete at once: measured, milliseconds on shared memory), right
/// after the callback.
void issueNowOrAfterCallback(Worker& worker, Operation* op) {
  if (worker.amScope() != nullptr) {
    worker.deferFromProgressThread(
        [](void* arg) {
          Operation* deferred = static_cast<Operation*>(arg);
          issueSend(*deferred->worker, deferred);
        },
        op);
    op->worker = &worker;
    return;
  }
  issueSend(worker, op);
}

}  // namespace

namespace {

/// Sends a message that UCX can complete at once (a short active message: header and payload
/// fit the transport's inline limit), from the caller's header, without an Operation, a header
/// copy or a completion callback. Returns false where UCX would have to keep the request
/// (larger messages, no send resources, an error): the caller then takes the general path,
/// which reports errors. UCX keeps the order of sends on an endpoint either way.
bool trySendNow(ucp_ep_h ep, std::span<const std::byte> header, ConstBuffer payload) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_MEMORY_TYPE | UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t request = ucp_am_send_nbx(ep, kAmMessage, header.data(), header.size(), payload.data,
                                             payload.size, &param);
  return request == nullptr;
}

}  // namespace

void Endpoint::sendInParts(std::span<const std::byte> header, std::vector<ConstBuffer> parts, Callback done) {
  if (parts.size() <= 1) return send(header, parts.empty() ? ConstBuffer{} : parts[0], std::move(done));
  for (const ConstBuffer& part : parts) {
    if (part.memory != MemoryType::kHost) {
      done(GENIE_ERROR(kUnsupported, "send to {}: a payload in parts is read from host memory only, not {}",
                       state_->peer, memoryTypeName(part.memory)));
      return;
    }
  }
  auto issue = [self = shared_from_this(), copy = std::vector<std::byte>(header.begin(), header.end()),
                parts = std::move(parts), done = std::move(done)]() mutable {
    self->sendPartsFromProgressThread(copy, parts, std::move(done));
  };
  if (worker_->isProgressThread()) {
    issue();
  } else {
    worker_->post(std::move(issue));
  }
}

void Endpoint::sendPartsFromProgressThread(std::span<const std::byte> header, const std::vector<ConstBuffer>& parts,
                                           Callback&& done) {
  if (state_->failed.load() || state_->closed.load() || state_->ep == nullptr) {
    done(checkUsable());
    return;
  }
  size_t total = 0;
  for (const ConstBuffer& part : parts) total += part.size;
  ++state_->messages_out;
  Operation* op = newOperation(std::move(done), "send to", state_);
  worker_->countSent(header.size() + total);
  const size_t max_header = worker_->info().max_am_header;
  if (max_header == 0 || header.size() <= max_header) {
    op->header.assign(header.begin(), header.end());
    op->payload = {nullptr, total, MemoryType::kHost};
    op->iov.reserve(parts.size());
    for (const ConstBuffer& part : parts) op->iov.push_back({const_cast<void*>(part.data), part.size});
  } else {  // the FlatBuffer at the front of the data: one copy of everything (rare: huge headers)
    op->large_header_length = header.size();
    op->data.resize(header.size() + total);
    std::memcpy(op->data.data(), header.data(), header.size());
    size_t at = header.size();
    for (const ConstBuffer& part : parts) {
      if (part.size) std::memcpy(op->data.data() + at, part.data, part.size);
      at += part.size;
    }
  }
  issueNowOrAfterCallback(*worker_, op);
}

void Endpoint::sendFromProgressThread(std::span<const std::byte> header, ConstBuffer payload, Callback&& done) {
  if (state_->failed.load() || state_->closed.load() || state_->ep == nullptr) {
    done(checkUsable());
    return;
  }
  const size_t max_header = worker_->info().max_am_header;
  const bool header_fits = max_header == 0 || header.size() <= max_header;
  // A small message goes out now if UCX can complete it at once: the common case of requests
  // and replies, also inside an active-message callback (a reply to the message being
  // handled). Not while sends deferred earlier in this progress round wait: it would
  // overtake them.
  if (header_fits && payload.memory == MemoryType::kHost && payload.size <= kSendNowMaxBytes &&
      !worker_->hasDeferredFromProgressThread() && trySendNow(state_->ep, header, payload)) {
    ++state_->messages_out;
    worker_->countSent(header.size() + payload.size);
    if (done) done(Status::ok());
    return;
  }
  ++state_->messages_out;
  Operation* op = newOperation(std::move(done), "send to", state_);
  if (payload.memory == MemoryType::kCuda && !worker_->info().cuda_memory) {
    // This UCX cannot read GPU memory: one counted copy into host memory first.
    std::vector<std::byte> staged(payload.size);
    if (Status copied = copyDeviceToHost(staged.data(), payload.data, payload.size); !copied) {
      Callback failed = std::move(op->done);
      recycle(op);
      failed(Status(copied.code(), fmt::format("send to {}: {}", state_->peer, copied.message()), copied.file(),
                    copied.line()));
      return;
    }
    worker_->noteStaged(payload.size);
    op->staged = std::move(staged);
    payload = {op->staged.data(), payload.size, MemoryType::kHost};
  }
  worker_->countSent(header.size() + payload.size);
  if (header_fits) {
    op->header.assign(header.begin(), header.end());
    op->payload = payload;
  } else {
    // The FlatBuffer is larger than UCX's AM header limit: it travels at the front of the data.
    if (payload.memory != MemoryType::kHost) {
      complete(op, UCS_ERR_UNSUPPORTED);
      return;
    }
    op->large_header_length = header.size();
    op->data.resize(header.size() + payload.size);
    std::memcpy(op->data.data(), header.data(), header.size());
    if (payload.size) std::memcpy(op->data.data() + header.size(), payload.data, payload.size);
  }
  issueNowOrAfterCallback(*worker_, op);
}

void Endpoint::put(ConstBuffer local, uint64_t remote_address, std::shared_ptr<RemoteKey> rkey, Callback done) {
  worker_->post([self = shared_from_this(), local, remote_address, rkey = std::move(rkey),
                 done = std::move(done)]() mutable {
    if (Status usable = self->checkUsable(); !usable) return done(usable);
    Operation* op = newOperation(std::move(done), "put to", self->state_);
    self->worker_->countSent(local.size);
    ucp_request_param_t param = requestParam(*self->worker_, op, local.data, local.size, local.memory);
    track(ucp_put_nbx(self->state_->ep, local.data, local.size, remote_address, rkey->ucpRkey(), &param), op);
  });
}

void Endpoint::get(Buffer local, uint64_t remote_address, std::shared_ptr<RemoteKey> rkey, Callback done) {
  worker_->post([self = shared_from_this(), local, remote_address, rkey = std::move(rkey),
                 done = std::move(done)]() mutable {
    if (Status usable = self->checkUsable(); !usable) return done(usable);
    Operation* op = newOperation(std::move(done), "get from", self->state_);
    self->worker_->countReceived(local.size);
    ucp_request_param_t param = requestParam(*self->worker_, op, local.data, local.size, local.memory);
    track(ucp_get_nbx(self->state_->ep, local.data, local.size, remote_address, rkey->ucpRkey(), &param), op);
  });
}

void Endpoint::flush(Callback done) {
  worker_->post([self = shared_from_this(), done = std::move(done)]() mutable {
    if (Status usable = self->checkUsable(); !usable) return done(usable);
    Operation* op = newOperation(std::move(done), "flush of", self->state_);
    ucp_request_param_t param = requestParam(*self->worker_, op, nullptr, 0, MemoryType::kHost);
    track(ucp_ep_flush_nbx(self->state_->ep, &param), op);
  });
}

Result<std::shared_ptr<RemoteKey>> Endpoint::unpackRkey(std::span<const std::byte> packed) {
  Result<std::shared_ptr<RemoteKey>> result = GENIE_ERROR(kInternal, "rkey unpack did not run");
  std::atomic<bool> done{false};
  worker_->post([&] {
    if (Status usable = checkUsable(); !usable) {
      result = usable;
    } else {
      ucp_rkey_h rkey = nullptr;
      ucs_status_t st = ucp_ep_rkey_unpack(state_->ep, packed.data(), &rkey);
      if (st != UCS_OK) {
        result = GENIE_UCX_STATUS(st, "unpacking a {}-byte remote key from {}", packed.size(), state_->peer);
      } else {
        result = std::make_shared<RemoteKey>(worker_, rkey);
      }
    }
    done = true;
  });
  if (!worker_->waitUntil([&] { return done.load(); }, worker_->config().connect_timeout)) {
    return GENIE_ERROR(kTimeout, "rkey unpack for {}: the progress thread did not answer", state_->peer);
  }
  return result;
}

void Endpoint::requireAdmissionFromProgressThread(size_t max_message_bytes, std::chrono::milliseconds within) {
  state_->max_inbound_bytes = max_message_bytes;
  state_->admission_deadline = EndpointState::Clock::now() + within;
}

void Endpoint::admitFromProgressThread() {
  state_->max_inbound_bytes = SIZE_MAX;
  state_->admission_deadline = {};
}

void Endpoint::close() {
  if (state_->closed.exchange(true)) {
    worker_->waitUntil([&] { return state_->close_done.load(); }, worker_->config().close_timeout);
    return;
  }
  auto close_timeout = worker_->config().close_timeout;
  // Flush (bounded by close_timeout) unless the peer already failed, then force-close
  // (Worker::progressCloses). Returns after close_timeout (+ slack) at the latest.
  worker_->post([worker = worker_.get(), state = state_] {
    worker->closeEndpointFromProgressThread(state, /*force=*/state->failed.load());
  });
  if (!worker_->isProgressThread()) {
    worker_->waitUntil([&] { return state_->close_done.load(); }, close_timeout + std::chrono::milliseconds(100));
  }
}

}  // namespace genie::transport
