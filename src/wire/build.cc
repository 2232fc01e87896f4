// Wire codec, building: one builder per message, so callers never assemble envelopes by
// hand. See include/genie/wire/codec.h; verification is in codec.cc.
#include <algorithm>
#include <cmath>

#include "genie/wire/codec.h"

namespace genie::wire {
// ---------------------------------------------------------------------------------------
// Building

namespace {

flatbuffers::Offset<flatbuffers::String> createString(flatbuffers::FlatBufferBuilder& fbb,
                                                      std::string_view s) {
  return s.empty() ? 0 : fbb.CreateString(s);
}

template <typename T>
flatbuffers::DetachedBuffer finished(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                                     flatbuffers::Offset<T> body) {
  finishMessage(fbb, request_id, body);
  return fbb.Release();
}

flatbuffers::Offset<RemoteBuffer> createRemoteBuffer(flatbuffers::FlatBufferBuilder& fbb,
                                                     const RemoteBufferArgs& remote) {
  return CreateRemoteBuffer(fbb, remote.address, remote.length, fbb.CreateVector(remote.rkey),
                            remote.memory);
}

flatbuffers::Offset<Colocation> createColocation(flatbuffers::FlatBufferBuilder& fbb,
                                                 const std::optional<ColocationArgs>& colocation) {
  if (!colocation) return 0;
  return CreateColocation(fbb, createString(fbb, colocation->group), colocation->bytes);
}

Result<flatbuffers::Offset<TensorSlot>> createTensorSlot(flatbuffers::FlatBufferBuilder& fbb,
                                                         const TensorSlotArgs& slot) {
  auto desc = createTensorDesc(fbb, slot.desc);
  if (!desc) return desc.status();
  flatbuffers::Offset<RemoteBuffer> remote = 0;
  if (slot.remote) remote = createRemoteBuffer(fbb, *slot.remote);
  return CreateTensorSlot(fbb, isNull(slot.handle) ? nullptr : &slot.handle, *desc, slot.residency,
                          slot.payload_offset, remote, createColocation(fbb, slot.colocation));
}

Result<flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<TensorSlot>>>> createTensorSlots(
    flatbuffers::FlatBufferBuilder& fbb, std::span<const TensorSlotArgs> slots) {
  std::vector<flatbuffers::Offset<TensorSlot>> offsets;
  offsets.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    auto slot = createTensorSlot(fbb, slots[i]);
    if (!slot) {
      return GENIE_ERROR(kInvalidArgument, "tensors[{}]: {}", i, slot.status().message());
    }
    offsets.push_back(*slot);
  }
  return fbb.CreateVector(offsets);
}

flatbuffers::Offset<flatbuffers::Vector<const Handle*>> createHandles(
    flatbuffers::FlatBufferBuilder& fbb, std::span<const Handle> handles) {
  return fbb.CreateVectorOfStructs(handles.data(), handles.size());
}

flatbuffers::Offset<void> createScalar(flatbuffers::FlatBufferBuilder& fbb,
                                       const ScalarBindingArgs& scalar, Value* type) {
  if (const auto* i = std::get_if<int64_t>(&scalar.value)) {
    *type = Value::IntValue;
    return CreateIntValue(fbb, *i).Union();
  }
  if (const auto* d = std::get_if<double>(&scalar.value)) {
    *type = Value::DoubleValue;
    return createDoubleValue(fbb, *d).Union();
  }
  *type = Value::BoolValue;
  return CreateBoolValue(fbb, std::get<bool>(scalar.value)).Union();
}

}  // namespace

void finishMessage(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, Body type,
                   flatbuffers::Offset<void> body) {
  auto message = CreateMessage(fbb, request_id, type, body);
  fbb.TrackMinAlign(kHeaderAlignment);  // the buffer's size and start become 8-byte multiples
  FinishMessageBuffer(fbb, message);
}

void finishGraph(flatbuffers::FlatBufferBuilder& fbb, flatbuffers::Offset<Graph> graph) {
  fbb.TrackMinAlign(kHeaderAlignment);
  fbb.Finish(graph);
}

std::span<const std::byte> bytesOf(const flatbuffers::DetachedBuffer& buffer) {
  return std::as_bytes(std::span<const uint8_t>(buffer.data(), buffer.size()));
}

Result<flatbuffers::Offset<TensorDesc>> createTensorDesc(flatbuffers::FlatBufferBuilder& fbb,
                                                         DType dtype,
                                                         std::span<const int64_t> shape,
                                                         std::span<const int64_t> strides,
                                                         int64_t storage_offset, MemoryKind memory,
                                                         int32_t device_index) {
  auto nbytes = tensorSpanBytes(dtype, shape, strides, storage_offset);
  if (!nbytes) return nbytes.status();
  auto shape_vec = fbb.CreateVector(shape.data(), shape.size());
  auto strides_vec = strides.empty() ? 0 : fbb.CreateVector(strides.data(), strides.size());
  return CreateTensorDesc(fbb, dtype, shape_vec, strides_vec, storage_offset, *nbytes, memory,
                          device_index);
}

Result<flatbuffers::Offset<TensorDesc>> createTensorDesc(flatbuffers::FlatBufferBuilder& fbb,
                                                         const TensorDescArgs& desc) {
  return createTensorDesc(fbb, desc.dtype, desc.shape, desc.strides, desc.storage_offset,
                          desc.memory, desc.device_index);
}

uint64_t PayloadLayout::add(uint64_t nbytes) {
  const uint64_t offset = (size_ + kPayloadAlignment - 1) / kPayloadAlignment * kPayloadAlignment;
  size_ = offset + nbytes;
  return offset;
}

flatbuffers::DetachedBuffer buildHello(uint64_t request_id, std::string_view client_name,
                                       std::string_view auth_token, int64_t pid,
                                       uint32_t protocol_version, const Handle& attach_session) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = CreateHello(fbb, protocol_version, createString(fbb, client_name),
                          createString(fbb, auth_token), pid,
                          isNull(attach_session) ? nullptr : &attach_session);
  return finished(fbb, request_id, body);
}

flatbuffers::DetachedBuffer buildWelcome(uint64_t request_id, const WelcomeArgs& w) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = CreateWelcome(fbb, w.protocol_version, &w.session_id, createString(fbb, w.node_name),
                            createString(fbb, w.device), w.memory_limit, w.max_header_bytes);
  return finished(fbb, request_id, body);
}

Result<flatbuffers::DetachedBuffer> buildPutTensors(uint64_t request_id,
                                                    std::span<const TensorSlotArgs> tensors) {
  flatbuffers::FlatBufferBuilder fbb;
  auto slots = createTensorSlots(fbb, tensors);
  if (!slots) return slots.status();
  return finished(fbb, request_id, CreatePutTensors(fbb, *slots));
}

flatbuffers::DetachedBuffer buildGetTensors(uint64_t request_id, std::span<const Handle> handles,
                                            std::span<const RemoteBufferArgs> remote) {
  flatbuffers::FlatBufferBuilder fbb;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<RemoteBuffer>>> remote_vec = 0;
  if (!remote.empty()) {
    std::vector<flatbuffers::Offset<RemoteBuffer>> offsets;
    for (const auto& r : remote) offsets.push_back(createRemoteBuffer(fbb, r));
    remote_vec = fbb.CreateVector(offsets);
  }
  auto handles_vec = createHandles(fbb, handles);
  return finished(fbb, request_id, CreateGetTensors(fbb, handles_vec, remote_vec));
}

Result<flatbuffers::DetachedBuffer> buildTensorData(uint64_t request_id,
                                                    std::span<const TensorSlotArgs> tensors) {
  flatbuffers::FlatBufferBuilder fbb;
  auto slots = createTensorSlots(fbb, tensors);
  if (!slots) return slots.status();
  return finished(fbb, request_id, CreateTensorData(fbb, *slots));
}

flatbuffers::DetachedBuffer buildFreeTensors(uint64_t request_id, std::span<const Handle> handles,
                                             bool want_reply) {
  flatbuffers::FlatBufferBuilder fbb;
  auto handles_vec = createHandles(fbb, handles);
  return finished(fbb, request_id, CreateFreeTensors(fbb, handles_vec, want_reply));
}

flatbuffers::DetachedBuffer buildRegisterGraph(uint64_t request_id,
                                               std::span<const std::byte> graph_bytes) {
  flatbuffers::FlatBufferBuilder fbb(graph_bytes.size() + 128);
  // The nested Graph is read in place: its first byte must be 8-byte aligned like a header.
  fbb.ForceVectorAlignment(graph_bytes.size(), sizeof(uint8_t), kHeaderAlignment);
  auto graph =
      fbb.CreateVector(reinterpret_cast<const uint8_t*>(graph_bytes.data()), graph_bytes.size());
  return finished(fbb, request_id, CreateRegisterGraph(fbb, graph));
}

flatbuffers::DetachedBuffer buildGraphRegistered(uint64_t request_id, const GraphId& graph_id,
                                                 uint32_t num_nodes) {
  flatbuffers::FlatBufferBuilder fbb;
  return finished(fbb, request_id, CreateGraphRegistered(fbb, &graph_id, num_nodes));
}

Result<flatbuffers::DetachedBuffer> buildRunGraph(uint64_t request_id, const RunGraphArgs& run) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<InputBinding>> inputs;
  for (size_t i = 0; i < run.inputs.size(); ++i) {
    const InputBindingArgs& in = run.inputs[i];
    if (!in.inline_tensor) {
      inputs.push_back(CreateInputBinding(fbb, in.input, BindingKind::Handle, &in.handle));
      continue;
    }
    auto slot = createTensorSlot(fbb, *in.inline_tensor);
    if (!slot) return GENIE_ERROR(kInvalidArgument, "inputs[{}]: {}", i, slot.status().message());
    inputs.push_back(CreateInputBinding(fbb, in.input, BindingKind::Inline, nullptr, *slot));
  }
  std::vector<flatbuffers::Offset<ScalarBinding>> scalars;
  for (const ScalarBindingArgs& s : run.scalars) {
    Value type = Value::NONE;
    auto value = createScalar(fbb, s, &type);
    scalars.push_back(CreateScalarBinding(fbb, s.slot, type, value));
  }
  std::vector<flatbuffers::Offset<OutputSpec>> outputs;
  // The specs of one group share one Colocation table (a decode step keeps every layer's
  // cache in the same group: one table, an offset per spec).
  std::vector<std::pair<const ColocationArgs*, flatbuffers::Offset<Colocation>>> colocations;
  for (const OutputSpecArgs& o : run.outputs) {
    flatbuffers::Offset<Colocation> colocation = 0;
    if (o.colocation) {
      auto same = std::find_if(colocations.begin(), colocations.end(), [&](const auto& c) {
        return c.first->group == o.colocation->group && c.first->bytes == o.colocation->bytes;
      });
      colocation = same != colocations.end() ? same->second : createColocation(fbb, o.colocation);
      if (same == colocations.end()) colocations.emplace_back(&*o.colocation, colocation);
    }
    outputs.push_back(CreateOutputSpec(fbb, o.value, o.action,
                                       isNull(o.handle) ? nullptr : &o.handle, o.residency, colocation));
  }
  auto free_vec = run.free.empty() ? 0 : createHandles(fbb, run.free);
  auto body = CreateRunGraph(fbb, &run.graph_id, fbb.CreateVector(inputs),
                             fbb.CreateVector(scalars), fbb.CreateVector(outputs), free_vec);
  return finished(fbb, request_id, body);
}

Result<flatbuffers::DetachedBuffer> buildRunResult(uint64_t request_id,
                                                   std::span<const TensorSlotArgs> outputs,
                                                   uint64_t exec_us,
                                                   std::span<const TensorSlotArgs> described,
                                                   uint64_t session_resident) {
  flatbuffers::FlatBufferBuilder fbb;
  auto slots = createTensorSlots(fbb, outputs);
  if (!slots) return slots.status();
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<TensorSlot>>> described_vec = 0;
  if (!described.empty()) {
    auto d = createTensorSlots(fbb, described);
    if (!d) return GENIE_ERROR(kInvalidArgument, "described: {}", d.status().message());
    described_vec = *d;
  }
  return finished(fbb, request_id, CreateRunResult(fbb, *slots, exec_us, described_vec, session_resident));
}

flatbuffers::DetachedBuffer buildError(uint64_t request_id, ErrorCode code,
                                       std::string_view message, int32_t op_index,
                                       std::string_view op_name, std::string_view error_class) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = CreateError(fbb, code, createString(fbb, message), op_index, createString(fbb, op_name),
                          createString(fbb, error_class));
  return finished(fbb, request_id, body);
}

flatbuffers::DetachedBuffer buildError(uint64_t request_id, const Status& status) {
  if (const RemoteDetail* detail = status.remote()) {
    return buildError(request_id, static_cast<ErrorCode>(detail->code), detail->message, detail->op_index,
                      detail->op_name, detail->error_class);
  }
  return buildError(request_id, errorCodeOf(status), status.message());
}

flatbuffers::DetachedBuffer buildAck(uint64_t request_id, uint32_t count, uint64_t session_resident) {
  flatbuffers::FlatBufferBuilder fbb;
  return finished(fbb, request_id, CreateAck(fbb, count, session_resident));
}

flatbuffers::DetachedBuffer buildStatsRequest(uint64_t request_id, std::span<const GraphId> parts) {
  flatbuffers::FlatBufferBuilder fbb;
  auto ids = parts.empty() ? 0 : fbb.CreateVectorOfStructs(parts.data(), parts.size());
  return finished(fbb, request_id, CreateStatsRequest(fbb, ids));
}

flatbuffers::DetachedBuffer buildStats(uint64_t request_id, const StatsArgs& s) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<ResidentBytes>> resident;
  for (const auto& [residency, bytes] : s.resident) {
    resident.push_back(CreateResidentBytes(fbb, residency, bytes));
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<ColocationBytes>>> colocation = 0;
  if (!s.colocation.empty()) {
    std::vector<flatbuffers::Offset<ColocationBytes>> groups;
    for (const auto& g : s.colocation) groups.push_back(CreateColocationBytes(fbb, createString(fbb, g.group), g.bytes, g.resident));
    colocation = fbb.CreateVector(groups);
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<PartStats>>> parts = 0;
  if (!s.parts.empty()) {
    std::vector<flatbuffers::Offset<PartStats>> out;
    for (const auto& p : s.parts) {
      out.push_back(CreatePartStats(fbb, &p.graph_id, createString(fbb, p.inputs), createString(fbb, p.state),
                                    p.package_calls, p.executor_calls, p.build_us, p.from_cache,
                                    createString(fbb, p.reason), p.cuda_graph_replays));
    }
    parts = fbb.CreateVector(out);
  }
  auto body = CreateStats(fbb, s.sessions, fbb.CreateVector(resident), s.graphs_cached,
                          s.ops_executed, s.bytes_in, s.bytes_out, s.memory_limit, s.uptime_us,
                          s.session_resident, s.device_free, s.device_total, s.package_calls,
                          s.executor_calls, s.packages_built, s.packages_loaded, s.compile_failures,
                          s.peer_bytes_sent, s.peer_bytes_received, s.peer_transfers, colocation, parts,
                          s.cuda_graph_replays);
  return finished(fbb, request_id, body);
}

flatbuffers::DetachedBuffer buildPing(uint64_t request_id, uint64_t timestamp_ns) {
  flatbuffers::FlatBufferBuilder fbb;
  return finished(fbb, request_id, CreatePing(fbb, timestamp_ns));
}

flatbuffers::DetachedBuffer buildPong(uint64_t request_id, uint64_t timestamp_ns) {
  flatbuffers::FlatBufferBuilder fbb;
  return finished(fbb, request_id, CreatePong(fbb, timestamp_ns));
}

flatbuffers::DetachedBuffer buildGoodbye(uint64_t request_id, std::string_view reason) {
  flatbuffers::FlatBufferBuilder fbb;
  return finished(fbb, request_id, CreateGoodbye(fbb, createString(fbb, reason)));
}

flatbuffers::DetachedBuffer buildSendTensors(uint64_t request_id, const SendTensorsArgs& send) {
  flatbuffers::FlatBufferBuilder fbb;
  auto peer = createString(fbb, send.peer);
  auto token = createString(fbb, send.auth_token);
  auto handles = createHandles(fbb, send.handles);
  auto peer_handles = createHandles(fbb, send.peer_handles);
  return finished(fbb, request_id,
                  CreateSendTensors(fbb, peer, token, isNull(send.peer_session) ? nullptr : &send.peer_session,
                                    handles, peer_handles));
}

flatbuffers::Offset<DoubleValue> createDoubleValue(flatbuffers::FlatBufferBuilder& fbb, double v) {
  DoubleValueBuilder builder(fbb);
  if (std::signbit(v) || v != 0.0) builder.fbb_.AddElement<double>(DoubleValue::VT_V, v);  // -0.0 too
  return builder.Finish();
}

flatbuffers::Offset<ComplexValue> createComplexValue(flatbuffers::FlatBufferBuilder& fbb, double re, double im) {
  ComplexValueBuilder builder(fbb);
  if (std::signbit(im) || im != 0.0) builder.fbb_.AddElement<double>(ComplexValue::VT_IM, im);
  if (std::signbit(re) || re != 0.0) builder.fbb_.AddElement<double>(ComplexValue::VT_RE, re);
  return builder.Finish();
}

}  // namespace genie::wire
