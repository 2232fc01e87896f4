// Endpoint: one connection to a peer. Whoever holds the last shared_ptr keeps it open;
// dropping it closes the connection gracefully (bounded by WorkerConfig::close_timeout).
//
// All operations are asynchronous, may be called from any thread, and complete through a
// Callback on the worker's progress thread. Buffers handed to an operation must stay valid
// until its callback ran.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "genie/status.h"
#include "genie/transport/types.h"

typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_rkey* ucp_rkey_h;

namespace genie::transport {

class Worker;

/// Active-message ids on the wire.
enum AmId : uint16_t {
  kAmMessage = 0,      // header = FlatBuffer, data = payload
  kAmLargeHeader = 1,  // header = uint64 header length, data = FlatBuffer then payload
  kAmHeartbeat = 2,    // no header, no data: "still here" (Worker liveness)
};

/// The least bandwidth a rendezvous receive is expected to reach (bytes per second): it bounds
/// how long a peer's messages may queue behind its data (EndpointState::bulk_until).
constexpr uint64_t kMinBulkBytesPerSecond = uint64_t{64} << 20;

/// Shared between an Endpoint and its Worker (progress thread), alive until the ucp endpoint
/// is closed.
struct EndpointState {
  using Clock = std::chrono::steady_clock;

  ucp_ep_h ep = nullptr;
  std::string peer;                  // "127.0.0.1:13337"
  std::weak_ptr<class Endpoint> owner;
  Status error;                      // first error, set on the progress thread
  std::atomic<bool> failed{false};
  std::atomic<bool> closed{false};      // close started
  std::atomic<bool> close_done{false};  // ucp endpoint released
  bool close_started = false;           // ucp_ep_close_nbx called (progress thread only)
  std::string transports;            // "am: tcp/lo; rma: tcp/lo" once connected
  bool accepted = false;             // made from a listener's connection request (peer = its socket's)

  // Liveness (progress thread only): active messages counted as they arrive and leave
  // (heartbeats included); the worker's liveness tick compares them with what it saw last.
  uint64_t messages_in = 0;
  std::atomic<bool> established{false};  // the peer's first message arrived (any thread reads)
  uint64_t messages_out = 0;
  uint64_t seen_in = 0;
  uint64_t seen_out = 0;
  Clock::time_point last_heard = Clock::now();
  // Rendezvous receives from this peer in flight, and how long they may take at the least
  // bandwidth expected (kMinBulkBytesPerSecond): while data flows, messages (heartbeats) queue
  // behind it on some transports (UCX's fragmented rendezvous over shared memory), so the
  // silence is not held against the peer until then.
  uint32_t bulk_receives = 0;
  Clock::time_point bulk_until{};

  // Admission (progress thread only): a connection accepted from an unknown peer is on
  // probation until admitted (Endpoint::requireAdmissionFromProgressThread).
  size_t max_inbound_bytes = SIZE_MAX;      // header + payload of one message, bytes
  Clock::time_point admission_deadline{};   // the epoch: none
};

/// A peer's memory unpacked for RMA on one endpoint. Destroyed with the endpoint.
class RemoteKey {
 public:
  RemoteKey(std::shared_ptr<Worker> worker, ucp_rkey_h rkey) : worker_(std::move(worker)), rkey_(rkey) {}
  ~RemoteKey();
  RemoteKey(const RemoteKey&) = delete;
  RemoteKey& operator=(const RemoteKey&) = delete;
  ucp_rkey_h ucpRkey() const { return rkey_; }

 private:
  std::shared_ptr<Worker> worker_;
  ucp_rkey_h rkey_;
};

class Endpoint : public std::enable_shared_from_this<Endpoint> {
 public:
  Endpoint(std::shared_ptr<Worker> worker, std::shared_ptr<EndpointState> state);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  /// "host:port" of the peer, for logs and error messages.
  const std::string& peer() const { return state_->peer; }
  /// False once the peer failed or close() was called.
  bool isConnected() const { return !state_->failed.load() && !state_->closed.load(); }
  /// The error that ended the connection (OK while connected).
  Status error() const;
  /// UCX lanes chosen for this endpoint, e.g. "am=tcp/lo rma=tcp/lo" (after connect).
  std::string transports() const;
  Worker& worker() { return *worker_; }

  /// Sends one message: `header` (copied; at most any size, headers over the worker's
  /// max_am_header travel in the data) and `payload` (not copied; kept valid until `done`).
  /// Payloads at or over the rendezvous threshold are pulled by the receiver into its
  /// own buffer. Errors via `done`: kPeerUnreachable, kCancelled, kUnsupported (CUDA memory
  /// without CUDA support in this build).
  void send(std::span<const std::byte> header, ConstBuffer payload, Callback done);
  /// The same with a payload in `parts` (host memory, not copied, each kept valid until
  /// `done`), sent as one message whose payload is their concatenation (UCX's iov datatype):
  /// several tensors without a staging copy. Errors as send; kUnsupported for device memory.
  void sendInParts(std::span<const std::byte> header, std::vector<ConstBuffer> parts, Callback done);

  /// RMA: writes `local` to the peer's [remote_address, +local.size) (registered there and
  /// described by `rkey`). Completion means `local` may be reused; call flush() for remote
  /// completion.
  void put(ConstBuffer local, uint64_t remote_address, std::shared_ptr<RemoteKey> rkey,
           Callback done);
  /// RMA: reads the peer's [remote_address, +local.size) into `local`.
  void get(Buffer local, uint64_t remote_address, std::shared_ptr<RemoteKey> rkey, Callback done);
  /// Completes when every operation issued before it on this endpoint completed remotely.
  void flush(Callback done);
  /// Unpacks a packed rkey (RegistrationCache::packRkey on the peer) for this endpoint.
  /// Blocking (posts to the progress thread). Errors: kInvalidArgument for a bad blob.
  Result<std::shared_ptr<RemoteKey>> unpackRkey(std::span<const std::byte> packed);

  /// Flushes (bounded by close_timeout), then closes; force-closes if the flush did not
  /// finish in time. Idempotent; blocking unless called on the progress thread.
  void close();

  /// Puts a connection accepted from a not yet trusted peer on probation (progress thread,
  /// typically in the AcceptHandler, before any of its messages is handled): until
  /// admitFromProgressThread(), a message whose header plus payload exceeds
  /// `max_message_bytes` fails the connection (kInvalidMessage) without its payload being
  /// received or allocated, and the connection fails (kTimeout) when `within` has passed.
  /// Both go to the worker's EndpointErrorHandler, as a dead peer does.
  void requireAdmissionFromProgressThread(size_t max_message_bytes, std::chrono::milliseconds within);
  /// Ends the probation (progress thread; e.g. the peer authenticated).
  void admitFromProgressThread();

  // internal (progress thread)
  ucp_ep_h ucpEp() const { return state_->ep; }
  const std::shared_ptr<EndpointState>& state() const { return state_; }
  void sendFromProgressThread(std::span<const std::byte> header, ConstBuffer payload, Callback&& done);
  void sendPartsFromProgressThread(std::span<const std::byte> header, const std::vector<ConstBuffer>& parts,
                                   Callback&& done);

 private:
  void closeFromProgressThread(bool force);
  Status checkUsable() const;

  std::shared_ptr<Worker> worker_;
  std::shared_ptr<EndpointState> state_;
};

}  // namespace genie::transport
