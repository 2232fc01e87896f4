#include "genie/transport/message.h"

#include <cstring>

#include <spdlog/spdlog.h>

#include "cuda_staging.h"
#include "genie/transport/endpoint.h"
#include "genie/transport/registration_cache.h"
#include "ucx_util.h"
#include "worker_internal.h"

namespace genie::transport {

HeaderBytes::HeaderBytes(std::span<const std::byte> bytes) : size_(bytes.size()) {
  if (size_ <= kInline) {
    if (size_) std::memcpy(inline_, bytes.data(), size_);
  } else {
    heap_.assign(bytes.begin(), bytes.end());
  }
}

void HeaderBytes::moveFrom(HeaderBytes& other) noexcept {
  size_ = other.size_;
  if (size_ <= kInline) {
    if (size_) std::memcpy(inline_, other.inline_, size_);
    heap_.clear();
  } else {
    heap_ = std::move(other.heap_);
  }
  other.size_ = 0;
}

InboundMessage::InboundMessage(std::shared_ptr<Endpoint> endpoint, std::span<const std::byte> header,
                               void* payload_desc, size_t payload_size, bool payload_is_rndv)
    : endpoint_(std::move(endpoint)), header_(header), payload_size_(payload_size) {
  payload_.desc = payload_desc;
  payload_.size = payload_size;
  payload_.rndv = payload_is_rndv;
  payload_.generation = worker().amGeneration();
}

InboundMessage::InboundMessage(InboundMessage&& other) noexcept
    : endpoint_(std::move(other.endpoint_)),
      header_(std::move(other.header_)),
      payload_(other.takePayload()),
      payload_size_(other.payload_size_) {}

InboundMessage& InboundMessage::operator=(InboundMessage&& other) noexcept {
  if (this != &other) {
    releasePayload();
    endpoint_ = std::move(other.endpoint_);
    header_ = std::move(other.header_);
    payload_ = other.takePayload();
    payload_size_ = other.payload_size_;
  }
  return *this;
}

Worker& InboundMessage::worker() const { return endpoint_->worker(); }

InboundMessage::~InboundMessage() { releasePayload(); }

void InboundMessage::adoptEagerCopy(std::vector<std::byte> bytes) {
  payload_size_ = bytes.size();
  payload_.size = bytes.size();
  payload_.eager_copy = std::move(bytes);
}

InboundMessage::Payload InboundMessage::takePayload() {
  Payload taken = std::move(payload_);
  payload_ = Payload{};
  return taken;
}

Status InboundMessage::nothingPending() const {
  return payload_size_ == 0 ? Status::ok() : GENIE_ERROR(kInvalidArgument, "payload was already received or released");
}

void InboundMessage::receivePayload(Buffer dst, Callback done) {
  if (dst.size != payload_size_) {
    releasePayload();
    done(GENIE_ERROR(kInvalidArgument, "payload is {} bytes but the receive buffer has {} bytes",
                     payload_size_, dst.size));
    return;
  }
  if (!payload_.pending()) return done(nothingPending());
  Worker& worker = this->worker();
  if (worker.isProgressThread()) {
    if (dst.memory == MemoryType::kHost && !payload_.rndv && payload_.desc != nullptr) {
      // The common small message, done now (no endpoint state or payload moved along).
      copyEagerFromProgressThread(worker, payload_, dst);
      payload_.desc = nullptr;
      done(Status::ok());
      return;
    }
    receiveFromProgressThread(worker, endpoint_->state(), takePayload(), dst, std::move(done));
    return;
  }
  // The UCX calls must run on the progress thread; the endpoint that the closure holds keeps
  // the worker alive.
  worker.post([endpoint = endpoint_, payload = takePayload(), dst, done = std::move(done)]() mutable {
    receiveFromProgressThread(endpoint->worker(), endpoint->state(), std::move(payload), dst, std::move(done));
  });
}

void InboundMessage::receivePayloadInParts(std::vector<Buffer> parts, Callback done) {
  if (parts.size() == 1) return receivePayload(parts[0], std::move(done));
  size_t total = 0;
  for (const Buffer& part : parts) {
    if (part.memory != MemoryType::kHost) {
      releasePayload();
      done(GENIE_ERROR(kUnsupported, "a payload received in parts goes to host memory only, not {}",
                       memoryTypeName(part.memory)));
      return;
    }
    total += part.size;
  }
  if (total != payload_size_) {
    releasePayload();
    done(GENIE_ERROR(kInvalidArgument, "payload is {} bytes but the {} receive buffers have {} bytes", payload_size_,
                     parts.size(), total));
    return;
  }
  if (!payload_.pending()) return done(nothingPending());
  Worker& worker = this->worker();
  if (worker.isProgressThread()) {
    receivePartsFromProgressThread(worker, endpoint_->state(), takePayload(), std::move(parts), std::move(done));
    return;
  }
  worker.post([endpoint = endpoint_, payload = takePayload(), parts = std::move(parts), done = std::move(done)]() mutable {
    receivePartsFromProgressThread(endpoint->worker(), endpoint->state(), std::move(payload), std::move(parts),
                                   std::move(done));
  });
}

void InboundMessage::releasePayload() {
  if (!payload_.pending() || !endpoint_) return;
  Worker& worker = this->worker();
  Payload payload = takePayload();  // an eager copy (large headers) is freed here
  if (payload.desc == nullptr) return;
  if (worker.isProgressThread()) {
    releaseFromProgressThread(worker, payload.desc, payload.generation);
    return;
  }
  worker.post([endpoint = endpoint_, desc = payload.desc, generation = payload.generation] {
    releaseFromProgressThread(endpoint->worker(), desc, generation);
  });
}

void InboundMessage::copyEagerFromProgressThread(Worker& worker, const Payload& payload, Buffer dst) {
  // Eager data that UCX kept for us (UCP_AM_FLAG_PERSISTENT_DATA): one copy, then released.
  std::memcpy(dst.data, payload.desc, payload.size);
  releaseFromProgressThread(worker, payload.desc, payload.generation);
}

void InboundMessage::releaseFromProgressThread(Worker& worker, void* desc, uint64_t generation) {
  if (desc == nullptr) return;
  if (auto* scope = AmCallbackScope::current(worker, generation)) {
    scope->disposition = AmCallbackScope::Disposition::kRelease;  // the callback returns UCS_OK
    return;
  }
  ucp_am_data_release(worker.ucpWorker(), desc);
}

namespace {

struct ReceiveOp {
  Callback done;
  size_t expected;
  std::shared_ptr<EndpointState> from;  // null if the endpoint closed before the receive
  std::vector<ucp_dt_iov_t> iov{};      // a receive in parts: UCX reads it until completion
};

/// Copies `bytes` (eager data) into `parts` in order; their sizes add up to its size.
void scatter(const std::byte* bytes, const std::vector<Buffer>& parts) {
  for (const Buffer& part : parts) {
    if (part.size != 0) std::memcpy(part.data, bytes, part.size);
    bytes += part.size;
  }
}

void onReceived(void* request, ucs_status_t status, size_t length, void* user_data) {
  std::unique_ptr<ReceiveOp> op(static_cast<ReceiveOp*>(user_data));
  if (op->from) endBulkReceive(*op->from);
  std::string peer = op->from ? op->from->peer : std::string("a closed endpoint");
  if (status == UCS_OK && length != op->expected) {
    op->done(GENIE_ERROR(kInvalidMessage, "rendezvous from {} delivered {} bytes, expected {}", peer, length,
                         op->expected));
  } else if (status != UCS_OK && op->from && op->from->failed.load()) {
    // UCX cancels the receive when the sender's endpoint fails: report the peer's failure.
    op->done(GENIE_ERROR(kPeerUnreachable, "receiving {} bytes from {} failed: {}", op->expected, peer,
                         op->from->error.message()));
  } else {
    op->done(status == UCS_OK ? Status::ok()
                              : GENIE_UCX_STATUS(status, "receiving {} bytes from {}", op->expected, peer));
  }
  if (request != nullptr) ucp_request_free(request);
}

}  // namespace

void InboundMessage::receiveFromProgressThread(Worker& worker, std::shared_ptr<EndpointState> from,
                                               Payload payload, Buffer dst, Callback done) {
  if (dst.memory == MemoryType::kCuda && !worker.info().cuda_memory) {
    if (!cudaStagingBuilt()) {
      releaseFromProgressThread(worker, payload.desc, payload.generation);
      done(copyHostToDevice(dst.data, nullptr, dst.size));  // kUnsupported, naming the size
      return;
    }
    // This UCX cannot write GPU memory: land in host memory, then one counted copy up.
    auto staged = std::make_shared<std::vector<std::byte>>(dst.size);
    Buffer host{staged->data(), dst.size, MemoryType::kHost};
    worker.noteStaged(dst.size);
    receiveFromProgressThread(worker, std::move(from), std::move(payload), host,
                              [staged, dst, done = std::move(done)](Status s) {
                                if (s) s = copyHostToDevice(dst.data, staged->data(), dst.size);
                                done(s);
                              });
    return;
  }
  if (!payload.eager_copy.empty()) {
    if (dst.memory == MemoryType::kCuda) {  // a small payload UCX delivered in host memory: one copy up
      done(copyHostToDevice(dst.data, payload.eager_copy.data(), payload.eager_copy.size()));
      return;
    }
    std::memcpy(dst.data, payload.eager_copy.data(), payload.eager_copy.size());
    done(Status::ok());
    return;
  }
  if (!payload.rndv) {
    if (dst.memory == MemoryType::kCuda) {
      Status copied = copyHostToDevice(dst.data, payload.desc, payload.size);
      releaseFromProgressThread(worker, payload.desc, payload.generation);
      done(copied);
      return;
    }
    copyEagerFromProgressThread(worker, payload, dst);
    done(Status::ok());
    return;
  }
  // Rendezvous: UCX moves the bytes straight into dst and takes the descriptor.
  worker.countReceived(payload.size);
  if (from) noteBulkReceive(*from, payload.size);
  auto* op = new ReceiveOp{std::move(done), payload.size, std::move(from)};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.recv_am = &onReceived;
  param.user_data = op;
  param.memory_type = ucsMemoryType(dst.memory);
  if (const MemoryRegion* region = worker.registrationCache().find(dst.data, dst.size)) {
    param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
    param.memh = region->memh;
  }
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker.ucpWorker(), payload.desc, dst.data, dst.size, &param);
  if (request == nullptr) {
    onReceived(nullptr, UCS_OK, payload.size, op);
  } else if (UCS_PTR_IS_ERR(request)) {
    onReceived(nullptr, UCS_PTR_STATUS(request), 0, op);
  }
}

void InboundMessage::receivePartsFromProgressThread(Worker& worker, std::shared_ptr<EndpointState> from,
                                                    Payload payload, std::vector<Buffer> parts, Callback done) {
  if (!payload.eager_copy.empty()) {
    scatter(payload.eager_copy.data(), parts);
    done(Status::ok());
    return;
  }
  if (!payload.rndv) {
    scatter(static_cast<const std::byte*>(payload.desc), parts);
    releaseFromProgressThread(worker, payload.desc, payload.generation);
    done(Status::ok());
    return;
  }
  // Rendezvous: UCX moves the bytes straight into each part (its iov datatype).
  worker.countReceived(payload.size);
  if (from) noteBulkReceive(*from, payload.size);
  auto* op = new ReceiveOp{std::move(done), payload.size, std::move(from)};
  op->iov.reserve(parts.size());
  for (const Buffer& part : parts) op->iov.push_back({part.data, part.size});
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE |
                       UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.cb.recv_am = &onReceived;
  param.user_data = op;
  param.datatype = ucp_dt_make_iov();
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker.ucpWorker(), payload.desc, op->iov.data(), op->iov.size(), &param);
  if (request == nullptr) {
    onReceived(nullptr, UCS_OK, payload.size, op);
  } else if (UCS_PTR_IS_ERR(request)) {
    onReceived(nullptr, UCS_PTR_STATUS(request), 0, op);
  }
}

}  // namespace genie::transport
