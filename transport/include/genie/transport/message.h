// InboundMessage: one received active message, handed to the Worker's MessageHandler.
//
// The header (a FlatBuffer, verified by the caller before use) is owned by the message.
// The payload stays with UCX until the receiver says where it goes: receivePayload() places
// it in the receiver's buffer (rendezvous: UCX writes straight into it; eager: one copy).
// A message may be moved to another thread and received from there. Dropping it without
// receiving releases the payload.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "genie/transport/types.h"

namespace genie::transport {

class Endpoint;
class Worker;

/// A message header, owned: inline up to kInline bytes (no allocation on the hot path),
/// on the heap beyond. Storage is 16-byte aligned, as FlatBuffers verification requires.
class HeaderBytes {
 public:
  static constexpr size_t kInline = 240;
  HeaderBytes() = default;
  explicit HeaderBytes(std::span<const std::byte> bytes);
  HeaderBytes(HeaderBytes&& other) noexcept { moveFrom(other); }
  HeaderBytes& operator=(HeaderBytes&& other) noexcept {
    if (this != &other) moveFrom(other);
    return *this;
  }
  const std::byte* data() const { return size_ <= kInline ? inline_ : heap_.data(); }
  size_t size() const { return size_; }

 private:
  void moveFrom(HeaderBytes& other) noexcept;
  alignas(16) std::byte inline_[kInline];
  std::vector<std::byte> heap_;
  size_t size_ = 0;
};

class InboundMessage {
 public:
  InboundMessage() = default;
  InboundMessage(InboundMessage&& other) noexcept;
  InboundMessage& operator=(InboundMessage&& other) noexcept;
  ~InboundMessage();

  std::span<const std::byte> header() const { return {header_.data(), header_.size()}; }
  /// Payload size in bytes (0 when the message has none).
  size_t payloadSize() const { return payload_size_; }
  /// True while the payload has not been received or released.
  bool hasPendingPayload() const { return payload_.pending(); }
  /// The endpoint it came on; reply through it (if it has failed or closed since, sends
  /// complete with its error). Null only in a moved-from message.
  const std::shared_ptr<Endpoint>& endpoint() const { return endpoint_; }

  /// Places the payload into `dst` (dst.size must equal payloadSize()). `done` runs on the
  /// progress thread. Errors: kInvalidArgument (size), kPeerUnreachable (sender died during
  /// a rendezvous), kUnsupported (CUDA destination without CUDA support).
  void receivePayload(Buffer dst, Callback done);
  /// Places the payload into `parts` in order (host memory; their sizes must add up to
  /// payloadSize()): a rendezvous lands in each part directly (UCX's iov datatype), eager data
  /// is copied into them. For a message carrying several tensors, with no staging buffer.
  /// Errors as above; kUnsupported for a part not in host memory (one part: any memory).
  void receivePayloadInParts(std::vector<Buffer> parts, Callback done);
  /// Drops the payload (e.g. the header was invalid). Also done by the destructor.
  void releasePayload();

  // internal: built by the Worker's active-message callback (progress thread). `endpoint`
  // is not null; it keeps its Worker alive for as long as the message lives.
  InboundMessage(std::shared_ptr<Endpoint> endpoint, std::span<const std::byte> header, void* payload_desc,
                 size_t payload_size, bool payload_is_rndv);
  /// An eager payload that UCX would not keep: copied into the message.
  void adoptEagerCopy(std::vector<std::byte> bytes);

 private:
  /// The payload's UCX state, moved out of the message when it is handed over.
  struct Payload {
    void* desc = nullptr;
    size_t size = 0;
    bool rndv = false;
    uint64_t generation = 0;  // of the active-message callback that delivered it
    std::vector<std::byte> eager_copy;
    bool pending() const { return desc != nullptr || !eager_copy.empty(); }
  };
  Payload takePayload();
  /// What a receive of a payload no longer pending completes with: OK for an empty one.
  Status nothingPending() const;
  static void receiveFromProgressThread(Worker& worker, std::shared_ptr<struct EndpointState> from,
                                        Payload payload, Buffer dst, Callback done);
  static void receivePartsFromProgressThread(Worker& worker, std::shared_ptr<struct EndpointState> from,
                                             Payload payload, std::vector<Buffer> parts, Callback done);
  /// Copies eager data UCX kept (host `dst` of the payload's size) and gives it back.
  static void copyEagerFromProgressThread(Worker& worker, const Payload& payload, Buffer dst);
  /// Gives UCX's eager descriptor back (or tells the running callback to).
  static void releaseFromProgressThread(Worker& worker, void* desc, uint64_t generation);

  Worker& worker() const;

  std::shared_ptr<Endpoint> endpoint_;  // null only in a moved-from or default message
  HeaderBytes header_;
  Payload payload_;
  size_t payload_size_ = 0;
};

}  // namespace genie::transport
