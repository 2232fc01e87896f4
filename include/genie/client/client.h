// Client: the C++ client of genie-node (no torch). One connection, one session; blocking
// calls that send one request and wait for its reply (matched by request id), from any
// thread. Tensors are described by wire::TensorSlotArgs and travel as raw bytes.
//
// Errors: kPeerUnreachable / kTimeout from the data plane (naming the node's address);
// kRemote when the node answered with an Error: the Status message reads
// "<ErrorCode> [op <index> (<op name>)]: <node's message>" and remoteError() returns the parts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "genie/status.h"
#include "genie/transport/config.h"
#include "genie/wire/codec.h"

namespace genie::client {

/// The parts of the last Error reply.
struct RemoteError {
  wire::ErrorCode code = wire::ErrorCode::Unknown;
  int32_t op_index = -1;
  std::string op_name;
  std::string message;
};

/// A tensor that came back: its descriptor and its bytes (contiguous, `desc.shape`).
struct ReturnedTensor {
  wire::Handle handle{};
  wire::DType dtype = wire::DType::Undefined;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
};

struct ClientOptions {
  std::string name = "genie-client";
  std::string auth_token;
  std::chrono::milliseconds timeout{60000};  // per request
  transport::WorkerConfig transport;
  /// Protocol version announced in Hello (tests use another to check refusal).
  uint32_t protocol_version = wire::kProtocolVersion;
};

class Client {
 public:
  /// Connects and says Hello. Errors: kPeerUnreachable, kRemote (Unauthenticated,
  /// UnsupportedVersion), kTimeout.
  static Result<std::unique_ptr<Client>> connect(const std::string& host, uint16_t port, const ClientOptions& options);
  ~Client();

  const wire::Handle& sessionId() const;
  /// A fresh random handle (128 bits from the OS).
  static wire::Handle newHandle();

  /// Stores one tensor: `bytes` is its storage span (desc's nbytes).
  Status putTensor(const wire::Handle& handle, const wire::TensorDescArgs& desc, wire::Residency residency,
                   std::span<const std::byte> bytes);
  Result<ReturnedTensor> getTensor(const wire::Handle& handle);
  Status freeTensors(std::span<const wire::Handle> handles);
  /// Registers serialized Graph bytes; returns the id the node computed.
  Result<wire::GraphId> registerGraph(std::span<const std::byte> graph_bytes);
  /// Runs a registered graph; `inline_payload` holds the bytes of inline inputs.
  Result<std::vector<ReturnedTensor>> runGraph(const wire::RunGraphArgs& run,
                                               std::span<const std::byte> inline_payload = {});
  Result<wire::StatsArgs> stats();
  Status ping();
  /// Says Goodbye and closes. Idempotent; also done by the destructor.
  void close();

  /// The parts of the last Error reply (valid after a kRemote status).
  const RemoteError& lastRemoteError() const;

  struct Impl;

 private:
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace genie::client
