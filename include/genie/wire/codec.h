// Wire codec: builds, verifies and hashes the FlatBuffers messages of schemas/genie.fbs.
//
// Every message is one FlatBuffer `Message` (identifier "GNIE") sent as a UCX active-message
// header; tensor bytes travel beside it as the active message's data, the *payload*, whose
// size the receiver knows before it reads them (`payload_bytes`). docs/wire_format.md
// describes the format; this header is the only code that should touch raw message bytes.
//
// Receiving: pass every received header to `verifyMessage` (release builds too) and use the
// returned `Message*` only if it is OK. Sending: build with the `build*` functions (or
// `finishMessage` for a hand-built body) so the envelope, identifier and alignment are right.
//
// Errors are values (`genie::Status`), never exceptions. Codes used here:
//   kInvalidMessage   the bytes are not a valid message (names the failing field)
//   kTooLarge         a header or payload over `VerifyLimits`
//   kInvalidArgument  a caller error: unaligned header storage, a bad tensor description
//                     handed to a builder
// Thread safety: every function is pure (no shared state) and may be called from any thread.
#pragma once

#include <flatbuffers/flatbuffers.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "genie/status.h"
#include "genie/wire/genie_generated.h"

namespace genie::wire {

// ---------------------------------------------------------------------------------------
// Constants

/// The protocol version this build speaks: the schema's ProtocolVersion::MAX.
inline constexpr uint32_t kProtocolVersion = static_cast<uint32_t>(ProtocolVersion::MAX);
/// FlatBuffers file identifier of every Message (bytes 4..7 of the header).
inline constexpr std::string_view kFileIdentifier = "GNIE";
/// Every `TensorSlot.payload_offset` is a multiple of this many bytes.
inline constexpr size_t kPayloadAlignment = 64;
/// Headers (and serialized Graphs) must start at an address that is a multiple of this;
/// the builders produce such buffers. Copy a received header elsewhere if it is not.
inline constexpr size_t kHeaderAlignment = 8;
/// Smallest possible header: a 4-byte root offset and the 4-byte identifier.
inline constexpr size_t kMinHeaderBytes = 8;

/// Caps checked by `checkGraph` (and so by `verifyMessage` on RegisterGraph).
inline constexpr uint32_t kMaxGraphNodes = 1'000'000;
inline constexpr uint32_t kMaxNodeArgs = 1024;
inline constexpr uint32_t kMaxNodeOutputs = 65'536;
inline constexpr uint64_t kMaxGraphValues = uint64_t{1} << 24;  // inputs + all node outputs
inline constexpr size_t kMaxNameChars = 256;  // Node.op, Node.overload, Argument.name
/// Largest tensor rank a TensorDesc may have.
inline constexpr size_t kMaxTensorRank = 64;
/// SendTensors.peer ("host:port") is at most this many chars.
inline constexpr size_t kMaxPeerChars = 512;
/// SendTensors.auth_token is at most this many chars: the Hello that carries it to the peer must
/// fit the peer's pre-session message limit (4 KiB by default, docs/security.md).
inline constexpr size_t kMaxPeerTokenChars = 2048;

// ---------------------------------------------------------------------------------------
// Names and sizes

/// Bytes per element of `dtype`; 0 for DType::Undefined and for values outside the enum.
size_t dtypeSize(DType dtype);
/// "Float32", ...; "Undefined" for Undefined, "unknown" outside the enum.
std::string_view dtypeName(DType dtype);
/// "PutTensors", ...; "NONE" for Body::NONE, "unknown" outside the enum.
std::string_view bodyName(Body body);
/// "UnknownHandle", ...; "unknown" outside the enum.
std::string_view errorCodeName(ErrorCode code);

// ---------------------------------------------------------------------------------------
// Errors of requests: a Status with a RemoteDetail (genie/status.h)

/// A request a node refuses or fails, as a Status (its code the nearest StatusCode to `code`,
/// its message `message`) carrying the RemoteDetail that buildError sends.
Status requestError(ErrorCode code, std::string message, int32_t op_index = -1, std::string op_name = {},
                    std::string error_class = {});
/// The wire ErrorCode of a failed Status: its RemoteDetail's, else the nearest to its code
/// (kInvalidMessage, kUnauthenticated, kOutOfMemory, kTooLarge, kTimeout, kPeerUnreachable:
/// the same names; Internal otherwise).
ErrorCode errorCodeOf(const Status& status);
/// The client's Status for an Error reply: kRemote, "<ErrorCode>[ op <i> (<op name>)]: <message>",
/// with the reply's parts as its RemoteDetail.
Status remoteStatus(const Error& error);
/// The characters of an optional wire string; empty when it is absent.
std::string_view stringOf(const flatbuffers::String* s);

/// Bytes of storage a strided view touches, counted from element 0 of its storage (so the
/// `storage_offset` prefix is included): (storage_offset + 1 + sum_i (shape[i]-1)*strides[i])
/// * dtypeSize, or 0 when any dimension is 0. This is PyTorch's `computeStorageNbytes`
/// (aten/src/ATen/EmptyTensor.cpp). `shape` and `strides` are in elements; `strides` empty
/// means contiguous (row-major). Errors (kInvalidArgument): Undefined/unknown dtype, a
/// negative dim, stride or storage_offset, rank over kMaxTensorRank, strides of another rank,
/// or a result that overflows int64.
Result<uint64_t> tensorSpanBytes(DType dtype, std::span<const int64_t> shape,
                                 std::span<const int64_t> strides = {}, int64_t storage_offset = 0);
/// The same for a (verified) wire TensorDesc; ignores its `nbytes`.
Result<uint64_t> tensorSpanBytes(const TensorDesc& desc);

// ---------------------------------------------------------------------------------------
// Handles and graph ids

/// True for {0,0}, which is never a valid handle.
bool isNull(const Handle& handle);
bool operator==(const Handle& a, const Handle& b);
bool operator==(const GraphId& a, const GraphId& b);
/// 32 lowercase hex digits: hi then lo ("0000000000000001000000000000002a").
std::string toString(const Handle& handle);
std::string toString(const GraphId& graph_id);

/// Hash and equality functors, so handles and graph ids can key unordered containers:
/// std::unordered_map<Handle, Tensor, HandleHash, HandleEqual>.
struct HandleHash {
  size_t operator()(const Handle& h) const;
};
struct HandleEqual {
  bool operator()(const Handle& a, const Handle& b) const { return a == b; }
};
struct GraphIdHash {
  size_t operator()(const GraphId& g) const;
};
struct GraphIdEqual {
  bool operator()(const GraphId& a, const GraphId& b) const { return a == b; }
};

/// A graph's id: XXH3-128 (xxhash) of its serialized Graph bytes, {hi: high64, lo: low64}.
GraphId hashGraph(std::span<const std::byte> graph_bytes);

// ---------------------------------------------------------------------------------------
// Verification (receiving)

/// Limits applied to untrusted buffers. Sizes in bytes.
struct VerifyLimits {
  size_t max_header_bytes = size_t{64} << 20;   // 64 MiB; FlatBuffers caps it below 2 GiB
  uint32_t max_depth = 64;                      // nesting of tables and vectors
  uint32_t max_tables = 1'000'000;              // tables per buffer (Message; nested Graph)
  size_t max_payload_bytes = size_t{64} << 30;  // 64 GiB
};

/// Verifies one received message and returns its root. The ONE entry point for every
/// received header, in release builds too. `header` is the active-message header (must start
/// at a kHeaderAlignment-aligned address and outlive the returned pointer); `payload_bytes`
/// is the size of the data that came (or will come) beside it.
///
/// Steps: (1) sizes: kMinHeaderBytes <= header.size() <= max_header_bytes, payload_bytes <=
/// max_payload_bytes (kTooLarge); (2) the "GNIE" identifier; (3) flatbuffers::Verifier with
/// max_depth / max_tables; (4) semantic checks: a known, non-NONE body; required fields
/// (handles non-null where required, every TensorDesc consistent: dtype defined, dims,
/// strides and storage_offset >= 0, nbytes == tensorSpanBytes); payload slots inside the
/// payload at kPayloadAlignment-aligned offsets (unless carried by RMA via `remote`);
/// payload_bytes == 0 for bodies without a payload (all but PutTensors, TensorData, RunGraph,
/// RunResult and the opaque Ping, Pong, BenchData); RegisterGraph's nested Graph verified
/// with the same limits and `checkGraph`ed; values of required unions never NONE;
/// RunGraph.free handles non-null; RunResult.described slots with a handle, payload_offset 0
/// and no `remote` (their bytes are not in the payload).
///
/// Errors: kInvalidMessage naming the field, e.g. "PutTensors.tensors[3].desc: nbytes 100
/// does not match shape [5,6] of Float32 (120 bytes)"; kTooLarge; kInvalidArgument when
/// `header` is not aligned.
Result<const Message*> verifyMessage(std::span<const std::byte> header, size_t payload_bytes,
                                     const VerifyLimits& limits = {});

/// Verifies serialized Graph bytes (RegisterGraph.graph; no file identifier) with
/// flatbuffers::Verifier under `limits` (max_header_bytes bounds their size), then
/// `checkGraph`. Same errors as verifyMessage; `graph_bytes` must be kHeaderAlignment-aligned.
Result<const Graph*> verifyGraph(std::span<const std::byte> graph_bytes,
                                 const VerifyLimits& limits = {});

/// Semantic checks of a FlatBuffers-verified Graph (use verifyGraph on raw bytes):
/// value ids are implicit and dense (graph inputs 0..num_inputs-1, then each node's
/// `num_outputs` outputs in node order), and a node may reference only graph inputs and
/// outputs of EARLIER nodes (TensorValue, TensorListValue, OptionalTensorListValue where -1
/// is None); ScalarInputValue.slot and IntListValue.scalar_slots (>= 0; -1 is a literal)
/// < num_scalar_inputs; scalar_slots empty or as long as v; every argument has a value (not
/// NONE); op non-empty; names at most kMaxNameChars; the kMax* caps above. Errors:
/// kInvalidMessage naming the field ("Graph.nodes[2].args[0].value: TensorValue 5 ...").
Status checkGraph(const Graph& graph);

/// Number of values (ids) in a graph: inputs + the sum of every node's num_outputs.
uint64_t graphNumValues(const Graph& graph);

// ---------------------------------------------------------------------------------------
// Building (sending)

/// Finishes `fbb` as a Message { request_id, body } with the "GNIE" identifier and
/// kHeaderAlignment. Send fbb.GetBufferPointer() / fbb.GetSize() (or fbb.Release()).
void finishMessage(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, Body type,
                   flatbuffers::Offset<void> body);
/// Typed form: the Body member is deduced from the table type (BodyTraits).
template <typename T>
void finishMessage(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                   flatbuffers::Offset<T> body) {
  static_assert(BodyTraits<T>::enum_value != Body::NONE, "T is not a member of union Body");
  finishMessage(fbb, request_id, BodyTraits<T>::enum_value, body.Union());
}

/// Finishes `fbb` as a standalone Graph (no identifier, kHeaderAlignment), the bytes that
/// RegisterGraph carries and hashGraph hashes.
void finishGraph(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<Graph> graph);

/// The bytes of a finished buffer, as verifyMessage / verifyGraph / hashGraph take them.
std::span<const std::byte> bytesOf(const flatbuffers::DetachedBuffer& buffer);

// Builder arguments are plain aggregates; every member has a default, so designated
// initializers may name only what differs: TensorDescArgs{.dtype = DType::Float32, .shape = {2}}.

/// A tensor's shape and layout as builders take it (units as in TensorDesc: elements).
struct TensorDescArgs {
  DType dtype = DType::Undefined;
  std::vector<int64_t> shape{};
  std::vector<int64_t> strides{};  // empty = contiguous
  int64_t storage_offset = 0;
  MemoryKind memory = MemoryKind::Host;
  int32_t device_index = 0;
};

/// Creates a TensorDesc whose nbytes is tensorSpanBytes(dtype, shape, strides,
/// storage_offset). Errors: those of tensorSpanBytes (kInvalidArgument).
Result<flatbuffers::Offset<TensorDesc>> createTensorDesc(
    flatbuffers::FlatBufferBuilder& fbb, DType dtype, std::span<const int64_t> shape,
    std::span<const int64_t> strides = {}, int64_t storage_offset = 0,
    MemoryKind memory = MemoryKind::Host, int32_t device_index = 0);
Result<flatbuffers::Offset<TensorDesc>> createTensorDesc(flatbuffers::FlatBufferBuilder& fbb,
                                                         const TensorDescArgs& desc);

/// A DoubleValue / ComplexValue that keeps the sign of a zero. FlatBuffers leaves out a scalar
/// field equal to its default (0.0), and -0.0 == 0.0, so CreateDoubleValue(fbb, -0.0) reads
/// back as +0.0 (and 1 / x changes sign). These write the field whenever it is not +0.0.
flatbuffers::Offset<DoubleValue> createDoubleValue(flatbuffers::FlatBufferBuilder& fbb, double v);
flatbuffers::Offset<ComplexValue> createComplexValue(flatbuffers::FlatBufferBuilder& fbb, double re, double im);

/// A buffer the receiver reaches by UCX RMA; `rkey` from ucp_rkey_pack.
struct RemoteBufferArgs {
  uint64_t address = 0;
  uint64_t length = 0;  // bytes
  std::vector<uint8_t> rkey{};
  MemoryKind memory = MemoryKind::Host;
};

/// One tensor of PutTensors / TensorData / RunResult / an inline RunGraph input.
/// A co-location hint (schemas/genie.fbs Colocation): the tensor's group and the group's
/// resident bytes on the node.
struct ColocationArgs {
  std::string group{};  // 1..kMaxColocationGroupBytes bytes
  uint64_t bytes = 0;
};
inline constexpr size_t kMaxColocationGroupBytes = 256;

struct TensorSlotArgs {
  Handle handle{};  // {0,0} only where the message allows it (RunResult, inline inputs)
  TensorDescArgs desc{};
  Residency residency = Residency::EphemeralActivation;
  uint64_t payload_offset = 0;  // bytes; a multiple of kPayloadAlignment (see PayloadLayout)
  std::optional<RemoteBufferArgs> remote{};  // set: bytes move by RMA, not in the payload
  std::optional<ColocationArgs> colocation{};  // PutTensors only
};

/// Lays tensors out in a payload in order, each at the next kPayloadAlignment offset.
class PayloadLayout {
 public:
  /// Reserves `nbytes` bytes and returns their offset.
  uint64_t add(uint64_t nbytes);
  /// Payload bytes so far: the end of the last tensor (what `payload_bytes` must be).
  uint64_t size() const { return size_; }

 private:
  uint64_t size_ = 0;
};

struct WelcomeArgs {
  Handle session_id{};
  std::string node_name{};
  std::string device{};           // "cpu", "cuda:0"
  uint64_t memory_limit = 0;      // bytes; 0 = unlimited
  uint64_t max_header_bytes = 0;  // bytes: the node's VerifyLimits::max_header_bytes
  uint32_t protocol_version = kProtocolVersion;
};

struct StatsArgs {
  uint32_t sessions = 0;
  std::vector<std::pair<Residency, uint64_t>> resident{};  // bytes per residency class
  uint64_t graphs_cached = 0;
  uint64_t ops_executed = 0;
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t memory_limit = 0;
  uint64_t uptime_us = 0;
  uint64_t session_resident = 0;  // bytes the asking session holds resident
  uint64_t device_free = 0;       // bytes free on the node's device (0: not known)
  uint64_t device_total = 0;      // bytes of the node's device (0: not known)
  uint64_t package_calls = 0;     // compiled parts run by an AOT Inductor package
  uint64_t executor_calls = 0;    // compiled parts run by the executor
  uint64_t packages_built = 0;
  uint64_t packages_loaded = 0;
  uint64_t compile_failures = 0;
  uint64_t peer_bytes_sent = 0;      // bytes (headers + payloads) sent to other nodes (SendTensors)
  uint64_t peer_bytes_received = 0;  // bytes received from other nodes on attached connections
  uint64_t peer_transfers = 0;       // SendTensors served plus PutTensors received from other nodes
  uint64_t cuda_graph_replays = 0;   // package calls run as a replay of the package's CUDA graph
  struct Colocated {
    std::string group;
    uint64_t bytes = 0;     // admitted with
    uint64_t resident = 0;  // held now
  };
  std::vector<Colocated> colocation{};  // the asking session's co-location groups
  struct Part {  // schemas/genie.fbs PartStats
    GraphId graph_id{};
    std::string inputs;
    std::string state;  // "package", "building", "executor"
    uint64_t package_calls = 0;
    uint64_t executor_calls = 0;
    uint64_t build_us = 0;
    bool from_cache = false;
    std::string reason;
    uint64_t cuda_graph_replays = 0;  // of package_calls
  };
  std::vector<Part> parts{};  // the parts of the graphs the request named
};
inline constexpr size_t kMaxStatsParts = 1024;  // StatsRequest.parts

/// SendTensors: tensors of the requesting session go to session `peer_session` on node `peer`.
struct SendTensorsArgs {
  std::string peer{};            // "host:port"
  std::string auth_token{};      // the peer node's token
  Handle peer_session{};         // the receiving session's id
  std::vector<Handle> handles{};       // in the requesting session
  std::vector<Handle> peer_handles{};  // their names in the receiving session (as many)
};

/// Binds graph input `input` to resident `handle`, or (when `inline_tensor` is set) to a
/// small tensor in this message's payload.
struct InputBindingArgs {
  uint32_t input = 0;
  Handle handle{};
  std::optional<TensorSlotArgs> inline_tensor{};
};
struct ScalarBindingArgs {
  uint32_t slot = 0;
  std::variant<int64_t, double, bool> value{};
};
struct OutputSpecArgs {
  uint32_t value = 0;
  OutputAction action = OutputAction::Return;
  Handle handle{};  // required for KeepResident / ReturnAndKeep / KeepAndDescribe
  Residency residency = Residency::EphemeralActivation;
  std::optional<ColocationArgs> colocation{};  // a kept value's group
};
struct RunGraphArgs {
  GraphId graph_id{};
  std::vector<InputBindingArgs> inputs{};
  std::vector<ScalarBindingArgs> scalars{};
  std::vector<OutputSpecArgs> outputs{};
  std::vector<Handle> free{};  // freed before the inputs are bound; unknown ones are ignored
};

/// One builder per message; each returns the finished header. Builders do not run
/// verifyMessage (the receiver does); those taking tensors fail (kInvalidArgument) only when
/// a tensor's span cannot be computed.
/// `attach_session` not {0,0}: the connection attaches to that existing session of the node
/// instead of opening one (Hello.attach_session).
flatbuffers::DetachedBuffer buildHello(uint64_t request_id, std::string_view client_name,
                                       std::string_view auth_token, int64_t pid,
                                       uint32_t protocol_version = kProtocolVersion,
                                       const Handle& attach_session = {});
flatbuffers::DetachedBuffer buildWelcome(uint64_t request_id, const WelcomeArgs& welcome);
Result<flatbuffers::DetachedBuffer> buildPutTensors(uint64_t request_id,
                                                    std::span<const TensorSlotArgs> tensors);
/// `remote` is empty or one buffer per handle.
flatbuffers::DetachedBuffer buildGetTensors(uint64_t request_id, std::span<const Handle> handles,
                                            std::span<const RemoteBufferArgs> remote = {});
Result<flatbuffers::DetachedBuffer> buildTensorData(uint64_t request_id,
                                                    std::span<const TensorSlotArgs> tensors);
flatbuffers::DetachedBuffer buildFreeTensors(uint64_t request_id, std::span<const Handle> handles,
                                             bool want_reply = true);
/// `graph_bytes`: a Graph finished with finishGraph; copied 8-byte aligned into the message.
flatbuffers::DetachedBuffer buildRegisterGraph(uint64_t request_id,
                                               std::span<const std::byte> graph_bytes);
flatbuffers::DetachedBuffer buildGraphRegistered(uint64_t request_id, const GraphId& graph_id,
                                                 uint32_t num_nodes);
Result<flatbuffers::DetachedBuffer> buildRunGraph(uint64_t request_id, const RunGraphArgs& run);
/// `described`: one slot per KeepAndDescribe output (handle and desc; payload_offset 0, no
/// bytes in the payload); RunResult.described is left absent when it is empty.
Result<flatbuffers::DetachedBuffer> buildRunResult(uint64_t request_id,
                                                   std::span<const TensorSlotArgs> outputs,
                                                   uint64_t exec_us,
                                                   std::span<const TensorSlotArgs> described = {},
                                                   uint64_t session_resident = 0);
flatbuffers::DetachedBuffer buildError(uint64_t request_id, ErrorCode code,
                                       std::string_view message, int32_t op_index = -1,
                                       std::string_view op_name = {}, std::string_view error_class = {});
/// The Error reply for a failed Status: its RemoteDetail when it has one, else its code's
/// nearest ErrorCode (errorCodeOf) and its message.
flatbuffers::DetachedBuffer buildError(uint64_t request_id, const Status& status);
/// `session_resident`: the bytes the session holds resident after the request (Ack and
/// RunResult carry it, so the client knows its use without asking).
flatbuffers::DetachedBuffer buildAck(uint64_t request_id, uint32_t count, uint64_t session_resident = 0);
/// `parts`: graph ids of compiled parts whose facts the Stats should give (at most kMaxStatsParts).
flatbuffers::DetachedBuffer buildStatsRequest(uint64_t request_id, std::span<const GraphId> parts = {});
flatbuffers::DetachedBuffer buildStats(uint64_t request_id, const StatsArgs& stats);
flatbuffers::DetachedBuffer buildPing(uint64_t request_id, uint64_t timestamp_ns);
flatbuffers::DetachedBuffer buildPong(uint64_t request_id, uint64_t timestamp_ns);
flatbuffers::DetachedBuffer buildGoodbye(uint64_t request_id, std::string_view reason);
flatbuffers::DetachedBuffer buildSendTensors(uint64_t request_id, const SendTensorsArgs& send);

}  // namespace genie::wire
