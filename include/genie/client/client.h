// Client: the C++ client of genie-node (no torch). One connection, one session; blocking
// calls that send one request and wait for its reply (matched by request id), from any
// thread. Tensors are described by wire::TensorSlotArgs and travel as raw bytes.
//
// Errors: kPeerUnreachable / kTimeout from the data plane (naming the node's address). When
// the connection fails (the node died, stopped or hung, the link broke), every request still
// waiting fails at once with kPeerUnreachable: within the transport's peer timeout plus one
// tick (heartbeats; 2.25 s by default), not at its own timeout. After the node said Goodbye (a
// clean stop) every request fails with kPeerUnreachable "genie-node HOST:PORT is shutting
// down: ...". A reply not there after the timeout is waited for again as long as the node
// answers a Ping (its progress thread answers while a session thread runs a long graph):
// kTimeout only when the node answers neither within the timeout (a hung node);
// kRemote when the node answered with an Error: the Status message reads
// "<ErrorCode> [op <index> (<op name>)]: <node's message>" and remoteError() returns the parts.
//
// Received tensor bytes: the batch calls (getTensors, runGraphReply) hand out the reply's
// payload buffer itself (the transport received into it: rendezvous or one copy of eager
// data), so a caller can wrap tensors around it without another copy. The single-tensor calls
// (getTensor, runGraph) copy each tensor into its own vector.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "genie/status.h"
#include "genie/transport/config.h"
#include "genie/transport/types.h"
#include "genie/wire/codec.h"

namespace genie::client {


/// A tensor that came back: its descriptor and its bytes (contiguous, `desc.shape`).
struct ReturnedTensor {
  wire::Handle handle{};
  wire::DType dtype = wire::DType::Undefined;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

/// A reply's payload: 64-byte aligned bytes that tensors point into; shared by every tensor
/// of the reply (the buffer lives while any holder does).
struct PayloadBuffer {
  std::shared_ptr<std::byte> data;
  size_t size = 0;  // bytes
};

/// Tensors that came back in one reply: descriptors (handle, dtype, shape, strides,
/// storage_offset, payload_offset) and the payload they point into. Tensor i's bytes are
/// `bytesOf(i)`: its storage span (TensorDesc.nbytes, the storage_offset prefix included).
struct TensorBatch {
  PayloadBuffer payload;
  std::vector<wire::TensorSlotArgs> tensors;

  std::span<const std::byte> bytesOf(size_t i) const;
  /// Bytes of tensor i's storage span (wire::tensorSpanBytes of its descriptor).
  uint64_t nbytesOf(size_t i) const;
};

/// The reply to a RunGraph.
struct RunReply {
  TensorBatch outputs;                           // Return / ReturnAndKeep outputs, in OutputSpec order
  std::vector<wire::TensorSlotArgs> described;  // KeepAndDescribe outputs, in OutputSpec order (no bytes)
  uint64_t exec_us = 0;                          // the node's execution time (µs)
};

/// Cumulative traffic of one client (a snapshot). Bytes count headers and payloads.
struct ClientCounters {
  uint64_t bytes_sent = 0;      // every message sent (requests, one-way messages, Goodbye)
  uint64_t bytes_received = 0;  // every message received (replies and unsolicited messages)
  uint64_t messages_sent = 0;
  uint64_t round_trips = 0;     // requests that waited for a reply
  uint64_t async_runs = 0;      // RunGraphs sent with runGraphAsync (their replies are not waited for)
  uint64_t node_exec_us = 0;    // the node's execution time of every answered RunGraph (RunResult.exec_us), µs
};

/// A session's resident bytes on its node as the node's replies report them (bytes).
struct ResidentStat {
  uint64_t current = 0;    // as of the last reply that reports it
  uint64_t peak = 0;       // the largest reported since connecting or resetResidentPeak
  uint64_t allocated = 0;  // increases summed since connecting or resetResidentAccumulated
  uint64_t freed = 0;      // decreases summed, likewise
};

/// A RunGraph sent with runGraphAsync that failed (see Client::takeAsyncFailures).
struct AsyncFailure {
  uint64_t request_id = 0;  // as runGraphAsync returned it
  Status status;            // kRemote (the node's Error, with its RemoteDetail), kPeerUnreachable, kTimeout,
                            // kCancelled
};

struct ClientOptions {
  std::string name = "genie-client";
  std::string auth_token;
  /// How long the node may stay silent: a request fails with kTimeout when neither its reply
  /// nor the Pong of a Ping sent after this long came within it (ms).
  std::chrono::milliseconds timeout{60000};
  transport::WorkerConfig transport;
  /// Protocol version announced in Hello (tests use another to check refusal).
  uint32_t protocol_version = wire::kProtocolVersion;
  /// {0,0}: open a new session. Else the id of an existing session on the node (its Welcome's
  /// session_id, from the connection that owns it) to attach this connection to: its puts land
  /// in that session (Hello.attach_session; genie-node's node-to-node transfers). An attached
  /// connection may only put tensors; the node refuses an unknown id (Unauthenticated).
  wire::Handle attach_session{};
};

class Client {
 public:
  /// Connects and says Hello. Errors: kPeerUnreachable, kRemote (Unauthenticated,
  /// UnsupportedVersion), kTimeout.
  static Result<std::unique_ptr<Client>> connect(const std::string& host, uint16_t port, const ClientOptions& options);
  ~Client();

  const wire::Handle& sessionId() const;
  /// What the node said in Welcome (device "cpu" / "cuda:0", node name, memory limit in bytes).
  const wire::WelcomeArgs& welcome() const;
  /// "host:port" of the node.
  const std::string& address() const;
  /// A fresh random handle (128 bits from the OS).
  static wire::Handle newHandle();

  /// Stores one tensor: `bytes` is its storage span (desc's nbytes).
  Status putTensor(const wire::Handle& handle, const wire::TensorDescArgs& desc, wire::Residency residency,
                   std::span<const std::byte> bytes);
  /// Stores several tensors in one PutTensors: `slots[i].payload_offset` places tensor i's
  /// storage span (desc's nbytes) in `payload` (wire::PayloadLayout gives the offsets).
  Status putTensors(std::span<const wire::TensorSlotArgs> slots, std::span<const std::byte> payload);
  /// The same with the payload in `parts` (host memory, in order, their concatenation the
  /// payload; the gaps between tensors included): sent without a staging copy.
  Status putTensors(std::span<const wire::TensorSlotArgs> slots, std::vector<transport::ConstBuffer> parts);
  Result<ReturnedTensor> getTensor(const wire::Handle& handle);
  /// Fetches several tensors in one GetTensors, without copying their bytes (TensorBatch).
  Result<TensorBatch> getTensors(std::span<const wire::Handle> handles);
  /// With `want_reply` false the request is one-way: no round trip, unknown handles and
  /// errors are not reported (the node ignores unknown handles anyway).
  Status freeTensors(std::span<const wire::Handle> handles, bool want_reply = true);
  /// Registers serialized Graph bytes; returns the id the node computed.
  Result<wire::GraphId> registerGraph(std::span<const std::byte> graph_bytes);
  /// Runs a registered graph; `inline_payload` holds the bytes of inline inputs.
  Result<std::vector<ReturnedTensor>> runGraph(const wire::RunGraphArgs& run,
                                               std::span<const std::byte> inline_payload = {});
  /// The same, returning the whole reply: outputs without a copy, and the descriptors of
  /// KeepAndDescribe outputs.
  Result<RunReply> runGraphReply(const wire::RunGraphArgs& run, std::span<const std::byte> inline_payload = {});
  /// Sends a RunGraph and returns at once, without waiting for its reply: no round trip, so
  /// the caller goes on (recording the next ops) while the node runs it. The node runs one
  /// session's requests in order, so any later request's reply comes after this run finished.
  /// Outputs can only be kept resident (KeepResident): another action is kInvalidArgument.
  /// `inline_payload` is copied. Returns the request id; a failure of the run is reported by
  /// takeAsyncFailures(). Errors here: kInvalidArgument, kCancelled (closed), kPeerUnreachable.
  Result<uint64_t> runGraphAsync(const wire::RunGraphArgs& run, std::span<const std::byte> inline_payload = {});
  /// The asynchronous runs that failed since the last call, in the order they were answered.
  /// With `wait`, first waits until every run sent so far has been answered (as long as the
  /// node answers Pings; runs still unanswered when it stops are reported as kTimeout and
  /// forgotten).
  std::vector<AsyncFailure> takeAsyncFailures(bool wait);
  /// Asynchronous runs sent and not answered yet (any thread).
  size_t asyncInFlight() const;
  /// `parts`: graph ids of compiled parts whose facts StatsArgs::parts should hold (at most
  /// wire::kMaxStatsParts).
  Result<wire::StatsArgs> stats(std::span<const wire::GraphId> parts = {});
  Status ping();
  /// Node to node (SendTensors): the node sends the tensors `handles` of this session straight
  /// to session `peer_session` (that session's sessionId()) of the node at `peer` ("host:port",
  /// as this node reaches it; `auth_token`: that node's token), where they are stored under
  /// `peer_handles` (as many) with their residency. Their bytes never pass through this client:
  /// it sends one small request and gets an Ack. Errors (kRemote): UnknownHandle (a handle not
  /// in this session), PeerUnreachable (naming `peer`: down, refused, dead within the peer
  /// timeout), or the peer's own refusal (Unauthenticated for a wrong token or session id,
  /// DuplicateHandle, OutOfMemory), its message prefixed with the peer's address.
  Status sendTensors(const std::string& peer, const std::string& auth_token, const wire::Handle& peer_session,
                     std::span<const wire::Handle> handles, std::span<const wire::Handle> peer_handles);
  /// False once the connection failed or was closed (the node died, stopped, closed it).
  bool connected() const;
  /// Traffic so far (any thread).
  ClientCounters counters() const;
  /// This session's resident bytes on the node as of the last reply that reports them (Ack,
  /// RunResult, Stats), with their peak and running totals since connecting or the resets:
  /// no round trip (torch.remote_accelerator.memory_allocated). Any thread.
  ResidentStat residentStat() const;
  void resetResidentPeak();
  void resetResidentAccumulated();
  /// Says Goodbye and closes. Idempotent; also done by the destructor.
  void close();

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace genie::client
