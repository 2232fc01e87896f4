// Wire codec, verification and names: see include/genie/wire/codec.h and
// docs/wire_format.md. The builders are in build.cc.
//
// Verification happens in two passes: flatbuffers::Verifier proves every offset, vector and
// string lies inside the header (so reading is memory-safe), then the semantic pass below
// proves the message means something (required fields, consistent tensor descriptors,
// payload ranges, graph references). The semantic pass builds strings only on failure: the
// `Path` of the field being checked lives on the stack and is rendered into the error.
//
// Over 600 lines: the semantic pass over every message body, whose checks of tensors, graphs,
// buffers and bodies nest (a RunGraph's slots, a RegisterGraph's graph) and share `Path`, with
// the names, tensor sizes and handle functions they use (bodyName, tensorSpanBytes, isNull).
#include "genie/wire/codec.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <limits>

namespace genie::wire {

static_assert(FLATBUFFERS_LITTLEENDIAN, "the codec reads wire vectors in place");

std::string_view stringOf(const flatbuffers::String* s) {
  return s ? std::string_view(s->c_str(), s->size()) : std::string_view();
}

namespace {

template <typename E>
bool inEnum(E e) {
  return !flatbuffers::IsOutRange(e, E::MIN, E::MAX);
}

template <typename E>
int enumValue(E e) {
  return static_cast<int>(static_cast<std::underlying_type_t<E>>(e));
}

std::string_view orUnknown(const char* name) {
  return (name && *name) ? std::string_view(name) : std::string_view("unknown");
}

/// The field being checked, e.g. PutTensors.tensors[3].desc; rendered only on error.
class Path {
 public:
  explicit Path(std::string_view root) : name_(root) {}
  Path(const Path& parent, std::string_view name, int64_t index = -1)
      : parent_(&parent), name_(name), index_(index) {}

  std::string str() const {
    std::string s = parent_ ? parent_->str() + "." : std::string();
    s += name_;
    if (index_ >= 0) s += fmt::format("[{}]", index_);
    return s;
  }

 private:
  const Path* parent_ = nullptr;
  std::string_view name_;
  int64_t index_ = -1;
};

#define GENIE_INVALID(path, ...) \
  GENIE_ERROR(kInvalidMessage, "{}: {}", (path).str(), ::fmt::format(__VA_ARGS__))

std::string dtypeLabel(DType dtype) {
  return inEnum(dtype) ? std::string(dtypeName(dtype)) : fmt::format("DType({})", enumValue(dtype));
}

std::string describeTensor(DType dtype, std::span<const int64_t> shape,
                           std::span<const int64_t> strides, int64_t storage_offset) {
  std::string s = fmt::format("shape [{}]", fmt::join(shape, ","));
  if (!strides.empty()) s += fmt::format(" strides [{}]", fmt::join(strides, ","));
  if (storage_offset != 0) s += fmt::format(" storage_offset {}", storage_offset);
  return s + " of " + dtypeLabel(dtype);
}

std::span<const int64_t> spanOf(const flatbuffers::Vector<int64_t>* v) {
  return v ? std::span<const int64_t>(v->data(), v->size()) : std::span<const int64_t>();
}

/// Scalars wider than 4 bytes inside a vector: flatbuffers 2.0.8's Verifier checks only the
/// 4-byte length prefix, so a hostile buffer could make in-place reads misaligned (UB). An
/// empty vector has nothing to read, and FlatBuffers builders do not always align it (an
/// empty [int64] may sit 4 bytes off): it passes.
template <typename V>
Status checkAligned(const V* v, size_t align, const Path& p) {
  if (v && v->size() != 0 && reinterpret_cast<uintptr_t>(v->Data()) % align != 0) {
    return GENIE_INVALID(p, "elements are not {}-byte aligned", align);
  }
  return Status::ok();
}

template <typename V>
Status checkMaxSize(const V* v, size_t max, const Path& p) {
  if (v && v->size() > max) return GENIE_INVALID(p, "has {} entries (at most {})", v->size(), max);
  return Status::ok();
}

Status checkName(const flatbuffers::String* s, const Path& p) {
  if (s && s->size() > kMaxNameChars) {
    return GENIE_INVALID(p, "is {} chars (at most {})", s->size(), kMaxNameChars);
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// Tensors

Status checkHandle(const Handle* h, const Path& p) {
  if (!h) return GENIE_INVALID(p, "missing (required)");
  if (isNull(*h)) return GENIE_INVALID(p, "{{0,0}} is not a valid handle");
  return Status::ok();
}

Status checkHandles(const flatbuffers::Vector<const Handle*>* handles, const Path& parent) {
  GENIE_RETURN_IF_ERROR(checkAligned(handles, alignof(Handle), Path(parent, "handles")));
  for (uint32_t i = 0; handles && i < handles->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkHandle(handles->Get(i), Path(parent, "handles", i)));
  }
  return Status::ok();
}

Status checkTensorDesc(const TensorDesc* desc, const Path& p, uint64_t* nbytes) {
  if (!desc) return GENIE_INVALID(p, "missing (required)");
  GENIE_RETURN_IF_ERROR(checkAligned(desc->shape(), sizeof(int64_t), Path(p, "shape")));
  GENIE_RETURN_IF_ERROR(checkAligned(desc->strides(), sizeof(int64_t), Path(p, "strides")));
  if (!inEnum(desc->memory())) {
    return GENIE_INVALID(Path(p, "memory"), "{} is not a MemoryKind", enumValue(desc->memory()));
  }
  if (desc->device_index() < 0) {
    return GENIE_INVALID(Path(p, "device_index"), "{} is negative", desc->device_index());
  }
  const auto shape = spanOf(desc->shape());
  const auto strides = spanOf(desc->strides());
  auto span = tensorSpanBytes(desc->dtype(), shape, strides, desc->storage_offset());
  if (!span) return GENIE_INVALID(p, "{}", span.status().message());
  if (desc->nbytes() != *span) {
    return GENIE_INVALID(p, "nbytes {} does not match {} ({} bytes)", desc->nbytes(),
                         describeTensor(desc->dtype(), shape, strides, desc->storage_offset()),
                         *span);
  }
  *nbytes = *span;
  return Status::ok();
}

Status checkRemoteBuffer(const RemoteBuffer* remote, const Path& p, uint64_t min_length) {
  if (!remote->rkey() || remote->rkey()->size() == 0) {
    return GENIE_INVALID(Path(p, "rkey"), "missing (required)");
  }
  if (!inEnum(remote->memory())) {
    return GENIE_INVALID(Path(p, "memory"), "{} is not a MemoryKind", enumValue(remote->memory()));
  }
  if (remote->length() < min_length) {
    return GENIE_INVALID(Path(p, "length"), "{} is less than the tensor's nbytes {}",
                         remote->length(), min_length);
  }
  return Status::ok();
}

enum class HandleRule { kRequired, kOptional };

/// A co-location hint, when present: a group of 1..kMaxColocationGroupBytes bytes.
Status checkColocation(const Colocation* colocation, const Path& p) {
  if (!colocation) return Status::ok();
  const size_t n = colocation->group() ? colocation->group()->size() : 0;
  if (n == 0 || n > kMaxColocationGroupBytes) {
    return GENIE_INVALID(Path(p, "group"), "{} bytes, not 1..{}", n, kMaxColocationGroupBytes);
  }
  return Status::ok();
}

/// What every TensorSlot must satisfy: present, its handle (when `rule` requires one), its
/// descriptor (`nbytes` gets the bytes it describes) and its residency.
Status checkSlotHead(const TensorSlot* slot, const Path& p, HandleRule rule, uint64_t* nbytes) {
  if (!slot) return GENIE_INVALID(p, "missing (required)");
  if (rule == HandleRule::kRequired) {
    GENIE_RETURN_IF_ERROR(checkHandle(slot->handle(), Path(p, "handle")));
  }
  GENIE_RETURN_IF_ERROR(checkTensorDesc(slot->desc(), Path(p, "desc"), nbytes));
  if (!inEnum(slot->residency())) {
    return GENIE_INVALID(Path(p, "residency"), "{} is not a Residency", enumValue(slot->residency()));
  }
  return checkColocation(slot->colocation(), Path(p, "colocation"));
}

Status checkTensorSlot(const TensorSlot* slot, const Path& p, HandleRule rule,
                       size_t payload_bytes) {
  uint64_t nbytes = 0;
  GENIE_RETURN_IF_ERROR(checkSlotHead(slot, p, rule, &nbytes));
  const DType dtype = slot->desc()->dtype();
  if (dtype == DType::QInt8 || dtype == DType::QUInt8 || dtype == DType::QInt32 || dtype == DType::QUInt4x2 ||
      dtype == DType::QUInt2x4) {  // bytes without their quantizer
    return GENIE_INVALID(Path(Path(p, "desc"), "dtype"), "{} tensors carry no bytes (a quantized tensor travels as its "
                         "integer representation)", dtypeName(dtype));
  }
  if (slot->remote()) return checkRemoteBuffer(slot->remote(), Path(p, "remote"), nbytes);
  const uint64_t offset = slot->payload_offset();
  if (offset % kPayloadAlignment != 0) {
    return GENIE_INVALID(Path(p, "payload_offset"), "{} is not a multiple of {}", offset,
                         kPayloadAlignment);
  }
  if (offset > payload_bytes || nbytes > payload_bytes - offset) {
    return GENIE_INVALID(p, "payload_offset {} + nbytes {} exceeds the payload of {} bytes", offset,
                         nbytes, payload_bytes);
  }
  return Status::ok();
}

/// A slot that describes a tensor kept on the node (RunResult.described): handle and desc,
/// no bytes anywhere (payload_offset 0, no remote).
Status checkDescribedSlot(const TensorSlot* slot, const Path& p) {
  uint64_t nbytes = 0;
  GENIE_RETURN_IF_ERROR(checkSlotHead(slot, p, HandleRule::kRequired, &nbytes));
  if (slot->payload_offset() != 0) {
    return GENIE_INVALID(Path(p, "payload_offset"),
                         "{} for a described tensor (its bytes stay on the node; must be 0)",
                         slot->payload_offset());
  }
  if (slot->remote()) {
    return GENIE_INVALID(Path(p, "remote"), "set for a described tensor (its bytes stay on the node)");
  }
  return Status::ok();
}

Status checkTensorSlots(const flatbuffers::Vector<flatbuffers::Offset<TensorSlot>>* slots,
                        const Path& parent, std::string_view field, HandleRule rule,
                        size_t payload_bytes) {
  if (!slots) return Status::ok();
  for (uint32_t i = 0; i < slots->size(); ++i) {
    GENIE_RETURN_IF_ERROR(
        checkTensorSlot(slots->Get(i), Path(parent, field, i), rule, payload_bytes));
  }
  return Status::ok();
}

Status checkRunResult(const RunResult& result, const Path& p, size_t payload_bytes) {
  GENIE_RETURN_IF_ERROR(
      checkTensorSlots(result.outputs(), p, "outputs", HandleRule::kOptional, payload_bytes));
  const auto* described = result.described();
  for (uint32_t i = 0; described && i < described->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkDescribedSlot(described->Get(i), Path(p, "described", i)));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// Graphs

/// What a node's arguments may reference: ids below `defined`, scalar slots below
/// `num_scalar_inputs`.
struct GraphScope {
  uint64_t defined = 0;
  uint32_t num_scalar_inputs = 0;
};

std::string definedIds(uint64_t defined) {
  return defined == 0 ? std::string("no value is") : fmt::format("ids 0..{} are", defined - 1);
}

Status checkValueId(uint64_t id, const GraphScope& scope, const Path& p, std::string_view kind) {
  if (id >= scope.defined) {
    return GENIE_INVALID(p, "{} {} is not defined before this node ({})", kind, id,
                         definedIds(scope.defined));
  }
  return Status::ok();
}

Status checkScalarSlot(int64_t slot, const GraphScope& scope, const Path& p) {
  if (slot < 0 || slot >= scope.num_scalar_inputs) {
    return GENIE_INVALID(p, "scalar slot {} is out of range (num_scalar_inputs {})", slot,
                         scope.num_scalar_inputs);
  }
  return Status::ok();
}

/// An int or float list's scalar slots: none, or one per element, each -1 (the literal) or a
/// scalar input of the graph.
template <typename List>
Status checkListSlots(const List& list, const GraphScope& scope, const Path& p) {
  const auto* slots = list.scalar_slots();
  if (!slots || slots->size() == 0) return Status::ok();
  const uint32_t n = list.v() ? list.v()->size() : 0;
  if (slots->size() != n) {
    return GENIE_INVALID(Path(p, "scalar_slots"), "has {} entries but v has {}", slots->size(), n);
  }
  for (uint32_t i = 0; i < n; ++i) {
    const int32_t slot = slots->Get(i);
    if (slot == -1) continue;  // a literal from v
    GENIE_RETURN_IF_ERROR(checkScalarSlot(slot, scope, Path(p, "scalar_slots", i)));
  }
  return Status::ok();
}

Status checkIntList(const IntListValue& list, const GraphScope& scope, const Path& p) {
  GENIE_RETURN_IF_ERROR(checkAligned(list.v(), sizeof(int64_t), Path(p, "v")));
  return checkListSlots(list, scope, p);
}

Status checkDoubleList(const DoubleListValue& list, const GraphScope& scope, const Path& p) {
  GENIE_RETURN_IF_ERROR(checkAligned(list.v(), sizeof(double), Path(p, "v")));
  return checkListSlots(list, scope, p);
}

Status checkValue(const Argument& arg, const GraphScope& scope, const Path& p) {
  const Value type = arg.value_type();
  if (type == Value::NONE) return GENIE_INVALID(p, "NONE (use NoneValue for None)");
  if (!inEnum(type)) return GENIE_INVALID(p, "type {} is not a known Value", enumValue(type));
  if (!arg.value()) return GENIE_INVALID(p, "missing {} table", EnumNameValue(type));
  switch (type) {
    case Value::TensorValue:
      return checkValueId(arg.value_as_TensorValue()->value(), scope, p, "TensorValue");
    case Value::TensorListValue: {
      const auto* ids = arg.value_as_TensorListValue()->values();
      for (uint32_t i = 0; ids && i < ids->size(); ++i) {
        GENIE_RETURN_IF_ERROR(checkValueId(ids->Get(i), scope, Path(p, "values", i), "id"));
      }
      return Status::ok();
    }
    case Value::OptionalTensorListValue: {
      const auto* ids = arg.value_as_OptionalTensorListValue()->values();
      GENIE_RETURN_IF_ERROR(checkAligned(ids, sizeof(int64_t), Path(p, "values")));
      for (uint32_t i = 0; ids && i < ids->size(); ++i) {
        const int64_t id = ids->Get(i);
        if (id == -1) continue;  // None
        if (id < 0) return GENIE_INVALID(Path(p, "values", i), "{} is negative (-1 is None)", id);
        GENIE_RETURN_IF_ERROR(
            checkValueId(static_cast<uint64_t>(id), scope, Path(p, "values", i), "id"));
      }
      return Status::ok();
    }
    case Value::ScalarInputValue:
      return checkScalarSlot(arg.value_as_ScalarInputValue()->slot(), scope, Path(p, "slot"));
    case Value::IntListValue: return checkIntList(*arg.value_as_IntListValue(), scope, p);
    case Value::DoubleListValue: return checkDoubleList(*arg.value_as_DoubleListValue(), scope, p);
    case Value::DTypeValue: {
      const DType dtype = arg.value_as_DTypeValue()->v();
      if (dtypeSize(dtype) == 0) {
        return GENIE_INVALID(Path(p, "v"), "{} is not a defined DType", dtypeLabel(dtype));
      }
      return Status::ok();
    }
    default: return Status::ok();  // literals: nothing to cross-check
  }
}

Status checkNode(const Node& node, GraphScope& scope, const Path& p) {
  if (!node.op() || node.op()->size() == 0) return GENIE_INVALID(Path(p, "op"), "empty");
  GENIE_RETURN_IF_ERROR(checkName(node.op(), Path(p, "op")));
  GENIE_RETURN_IF_ERROR(checkName(node.overload(), Path(p, "overload")));
  GENIE_RETURN_IF_ERROR(checkMaxSize(node.args(), kMaxNodeArgs, Path(p, "args")));
  for (uint32_t i = 0; node.args() && i < node.args()->size(); ++i) {
    const Argument& arg = *node.args()->Get(i);
    const Path ap(p, "args", i);
    GENIE_RETURN_IF_ERROR(checkName(arg.name(), Path(ap, "name")));
    GENIE_RETURN_IF_ERROR(checkValue(arg, scope, Path(ap, "value")));
  }
  if (node.num_outputs() > kMaxNodeOutputs) {
    return GENIE_INVALID(Path(p, "num_outputs"), "{} is over {}", node.num_outputs(),
                         kMaxNodeOutputs);
  }
  scope.defined += node.num_outputs();
  if (scope.defined > kMaxGraphValues) {
    return GENIE_INVALID(p, "the graph has more than {} values", kMaxGraphValues);
  }
  return Status::ok();
}

Status checkGraphAt(const Graph& graph, const Path& p) {
  GENIE_RETURN_IF_ERROR(checkMaxSize(graph.inputs(), kMaxGraphValues, Path(p, "inputs")));
  GENIE_RETURN_IF_ERROR(checkMaxSize(graph.nodes(), kMaxGraphNodes, Path(p, "nodes")));
  const auto* inputs = graph.inputs();
  for (uint32_t i = 0; inputs && i < inputs->size(); ++i) {
    const GraphInput& input = *inputs->Get(i);
    const Path ip(p, "inputs", i);
    if (!inEnum(input.kind())) {
      return GENIE_INVALID(Path(ip, "kind"), "{} is not an InputKind", enumValue(input.kind()));
    }
    uint64_t nbytes = 0;
    if (input.desc()) {
      GENIE_RETURN_IF_ERROR(checkTensorDesc(input.desc(), Path(ip, "desc"), &nbytes));
    }
  }
  GraphScope scope{inputs ? inputs->size() : 0u, graph.num_scalar_inputs()};
  const auto* nodes = graph.nodes();
  for (uint32_t i = 0; nodes && i < nodes->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkNode(*nodes->Get(i), scope, Path(p, "nodes", i)));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------
// Buffers

size_t maxHeaderBytes(const VerifyLimits& limits) {
  return std::min<size_t>(limits.max_header_bytes, FLATBUFFERS_MAX_BUFFER_SIZE - 1);
}

flatbuffers::Verifier::Options verifierOptions(const VerifyLimits& limits) {
  flatbuffers::Verifier::Options opts;
  opts.max_depth = limits.max_depth;
  opts.max_tables = limits.max_tables;
  opts.check_alignment = true;
  opts.check_nested_flatbuffers = false;  // done by verifyGraphAt, with these limits
  return opts;
}

bool isAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHeaderAlignment == 0; }

/// Verifies aligned Graph bytes; `p` names where they are (RegisterGraph.graph or Graph).
Result<const Graph*> verifyGraphAt(std::span<const std::byte> bytes, const VerifyLimits& limits,
                                   const Path& p) {
  if (bytes.size() > maxHeaderBytes(limits)) {
    return GENIE_ERROR(kTooLarge, "{}: {} bytes exceeds max_header_bytes {}", p.str(), bytes.size(),
                       maxHeaderBytes(limits));
  }
  const auto* buf = reinterpret_cast<const uint8_t*>(bytes.data());
  flatbuffers::Verifier verifier(buf, bytes.size(), verifierOptions(limits));
  if (!verifier.VerifyBuffer<Graph>(nullptr)) {
    return GENIE_INVALID(p,
                         "failed FlatBuffers verification of a Graph ({} bytes; bad offset, "
                         "size or alignment, nesting over {} or more than {} tables)",
                         bytes.size(), limits.max_depth, limits.max_tables);
  }
  const Graph* graph = flatbuffers::GetRoot<Graph>(buf);
  GENIE_RETURN_IF_ERROR(checkGraphAt(*graph, p));
  return graph;
}

std::string printableIdentifier(const uint8_t* id) {
  std::string s;
  for (size_t i = 0; i < flatbuffers::kFileIdentifierLength; ++i) {
    const char c = static_cast<char>(id[i]);
    s += (c >= 0x20 && c < 0x7f) ? std::string(1, c) : fmt::format("\\x{:02x}", id[i]);
  }
  return s;
}

// ---------------------------------------------------------------------------------------
// Bodies

Status checkNoPayload(const Path& p, size_t payload_bytes) {
  if (payload_bytes != 0) {
    return GENIE_INVALID(p, "carries no tensors but payload_bytes is {}", payload_bytes);
  }
  return Status::ok();
}

Status checkGetTensors(const GetTensors& get, const Path& p) {
  GENIE_RETURN_IF_ERROR(checkHandles(get.handles(), p));
  const auto* remote = get.remote();
  if (!remote || remote->size() == 0) return Status::ok();
  const uint32_t n = get.handles() ? get.handles()->size() : 0;
  if (remote->size() != n) {
    return GENIE_INVALID(Path(p, "remote"), "has {} entries but handles has {}", remote->size(), n);
  }
  for (uint32_t i = 0; i < n; ++i) {
    GENIE_RETURN_IF_ERROR(checkRemoteBuffer(remote->Get(i), Path(p, "remote", i), 0));
  }
  return Status::ok();
}

Status checkInputBinding(const InputBinding& binding, const Path& p, size_t payload_bytes) {
  switch (binding.kind()) {
    case BindingKind::Handle: return checkHandle(binding.handle(), Path(p, "handle"));
    case BindingKind::Inline:
      return checkTensorSlot(binding.inline_(), Path(p, "inline"), HandleRule::kOptional,
                             payload_bytes);
  }
  return GENIE_INVALID(Path(p, "kind"), "{} is not a BindingKind", enumValue(binding.kind()));
}

Status checkScalarBinding(const ScalarBinding& binding, const Path& p) {
  const Value type = binding.value_type();
  if (type != Value::IntValue && type != Value::DoubleValue && type != Value::BoolValue) {
    return GENIE_INVALID(
        p, "{} is not IntValue, DoubleValue or BoolValue",
        type == Value::NONE ? std::string_view("NONE") : orUnknown(EnumNameValue(type)));
  }
  if (!binding.value()) return GENIE_INVALID(p, "missing {} table", EnumNameValue(type));
  return Status::ok();
}

Status checkOutputSpec(const OutputSpec& out, const Path& p) {
  switch (out.action()) {
    case OutputAction::Return: break;
    case OutputAction::KeepResident:
    case OutputAction::ReturnAndKeep:
    case OutputAction::KeepAndDescribe:
      GENIE_RETURN_IF_ERROR(checkHandle(out.handle(), Path(p, "handle")));
      break;
    default:
      return GENIE_INVALID(Path(p, "action"), "{} is not an OutputAction", enumValue(out.action()));
  }
  if (!inEnum(out.residency())) {
    return GENIE_INVALID(Path(p, "residency"), "{} is not a Residency", enumValue(out.residency()));
  }
  return checkColocation(out.colocation(), Path(p, "colocation"));
}

Status checkRunGraph(const RunGraph& run, const Path& p, size_t payload_bytes) {
  if (!run.graph_id()) return GENIE_INVALID(Path(p, "graph_id"), "missing (required)");
  for (uint32_t i = 0; run.inputs() && i < run.inputs()->size(); ++i) {
    GENIE_RETURN_IF_ERROR(
        checkInputBinding(*run.inputs()->Get(i), Path(p, "inputs", i), payload_bytes));
  }
  for (uint32_t i = 0; run.scalars() && i < run.scalars()->size(); ++i) {
    GENIE_RETURN_IF_ERROR(
        checkScalarBinding(*run.scalars()->Get(i), Path(Path(p, "scalars", i), "value")));
  }
  for (uint32_t i = 0; run.outputs() && i < run.outputs()->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkOutputSpec(*run.outputs()->Get(i), Path(p, "outputs", i)));
  }
  const auto* free = run.free();
  GENIE_RETURN_IF_ERROR(checkAligned(free, alignof(Handle), Path(p, "free")));
  for (uint32_t i = 0; free && i < free->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkHandle(free->Get(i), Path(p, "free", i)));
  }
  return Status::ok();
}

Status checkRegisterGraph(const RegisterGraph& reg, const Path& p, const std::byte* header,
                          const VerifyLimits& limits) {
  const Path gp(p, "graph");
  const auto* bytes = reg.graph();
  if (!bytes || bytes->size() == 0) return GENIE_INVALID(gp, "missing (required)");
  if (!isAligned(bytes->data())) {
    return GENIE_INVALID(gp, "nested Graph at header offset {} is not {}-byte aligned",
                         reinterpret_cast<const std::byte*>(bytes->data()) - header,
                         kHeaderAlignment);
  }
  auto graph = verifyGraphAt(std::as_bytes(std::span<const uint8_t>(bytes->data(), bytes->size())),
                             limits, gp);
  return graph ? Status::ok() : graph.status();
}

/// A vector of required, non-null handles named `field` of `parent`.
Status checkHandleList(const flatbuffers::Vector<const Handle*>* handles, const Path& parent,
                       std::string_view field) {
  GENIE_RETURN_IF_ERROR(checkAligned(handles, alignof(Handle), Path(parent, field)));
  for (uint32_t i = 0; handles && i < handles->size(); ++i) {
    GENIE_RETURN_IF_ERROR(checkHandle(handles->Get(i), Path(parent, field, i)));
  }
  return Status::ok();
}

Status checkSendTensors(const SendTensors& send, const Path& p) {
  const auto* peer = send.peer();
  if (!peer || peer->size() == 0) return GENIE_INVALID(Path(p, "peer"), "missing (required)");
  if (peer->size() > kMaxPeerChars) {
    return GENIE_INVALID(Path(p, "peer"), "is {} chars (at most {})", peer->size(), kMaxPeerChars);
  }
  if (send.auth_token() && send.auth_token()->size() > kMaxPeerTokenChars) {
    return GENIE_INVALID(Path(p, "auth_token"), "is {} chars (at most {})", send.auth_token()->size(),
                         kMaxPeerTokenChars);
  }
  GENIE_RETURN_IF_ERROR(checkHandle(send.peer_session(), Path(p, "peer_session")));
  const auto* handles = send.handles();
  const auto* peer_handles = send.peer_handles();
  if (!handles || handles->size() == 0) return GENIE_INVALID(Path(p, "handles"), "missing (required)");
  if (!peer_handles || peer_handles->size() != handles->size()) {
    return GENIE_INVALID(Path(p, "peer_handles"), "has {} entries but handles has {}",
                         peer_handles ? peer_handles->size() : 0, handles->size());
  }
  GENIE_RETURN_IF_ERROR(checkHandleList(handles, p, "handles"));
  return checkHandleList(peer_handles, p, "peer_handles");
}

Status checkStats(const Stats& stats, const Path& p) {
  for (uint32_t i = 0; stats.resident() && i < stats.resident()->size(); ++i) {
    const Residency r = stats.resident()->Get(i)->residency();
    if (!inEnum(r)) {
      return GENIE_INVALID(Path(Path(p, "resident", i), "residency"), "{} is not a Residency",
                           enumValue(r));
    }
  }
  return Status::ok();
}

Status checkBody(const Message& msg, const std::byte* header, size_t payload_bytes,
                 const VerifyLimits& limits) {
  const Body type = msg.body_type();
  if (type == Body::NONE) return GENIE_INVALID(Path("Message.body"), "NONE");
  if (!inEnum(type)) {
    return GENIE_INVALID(Path("Message.body"), "type {} is not a known Body", enumValue(type));
  }
  if (!msg.body()) return GENIE_INVALID(Path(bodyName(type)), "missing body table");
  switch (type) {
    case Body::BenchData:
    case Body::Ping:
    case Body::Pong:
      return Status::ok();  // the payload is opaque bytes (genie-bench; Pong echoes Ping's size)
    default: break;
  }
  const Path p(bodyName(type));
  switch (type) {
    case Body::PutTensors:
      return checkTensorSlots(msg.body_as_PutTensors()->tensors(), p, "tensors",
                              HandleRule::kRequired, payload_bytes);
    case Body::TensorData:
      return checkTensorSlots(msg.body_as_TensorData()->tensors(), p, "tensors",
                              HandleRule::kRequired, payload_bytes);
    case Body::RunResult: return checkRunResult(*msg.body_as_RunResult(), p, payload_bytes);
    case Body::RunGraph: return checkRunGraph(*msg.body_as_RunGraph(), p, payload_bytes);
    default: break;
  }
  GENIE_RETURN_IF_ERROR(checkNoPayload(p, payload_bytes));
  switch (type) {
    case Body::Welcome:
      return checkHandle(msg.body_as_Welcome()->session_id(), Path(p, "session_id"));
    case Body::GetTensors: return checkGetTensors(*msg.body_as_GetTensors(), p);
    case Body::FreeTensors: return checkHandles(msg.body_as_FreeTensors()->handles(), p);
    case Body::RegisterGraph:
      return checkRegisterGraph(*msg.body_as_RegisterGraph(), p, header, limits);
    case Body::GraphRegistered:
      if (!msg.body_as_GraphRegistered()->graph_id()) {
        return GENIE_INVALID(Path(p, "graph_id"), "missing (required)");
      }
      return Status::ok();
    case Body::Stats: return checkStats(*msg.body_as_Stats(), p);
    case Body::SendTensors: return checkSendTensors(*msg.body_as_SendTensors(), p);
    case Body::StatsRequest: {
      const auto* parts = msg.body_as_StatsRequest()->parts();
      if (parts && parts->size() > kMaxStatsParts) {
        return GENIE_INVALID(Path(p, "parts"), "{} graph ids, more than {}", parts->size(),
                             kMaxStatsParts);
      }
      return Status::ok();
    }
    default: return Status::ok();  // Hello, Error, Ack, Ping, Pong, Goodbye, Bench*
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Names and sizes

size_t dtypeSize(DType dtype) {
  switch (dtype) {
    case DType::Undefined: return 0;
    case DType::Int8:
    case DType::UInt8:
    case DType::Bool:
    case DType::Float8_e4m3fn:
    case DType::Float8_e5m2:
    case DType::Float8_e4m3fnuz:
    case DType::Float8_e5m2fnuz:
    case DType::Float8_e8m0fnu:
    case DType::Float4_e2m1fn_x2:
    case DType::Bits1x8:
    case DType::Bits2x4:
    case DType::Bits4x2:
    case DType::Bits8:
    case DType::QInt8:
    case DType::QUInt8:
    case DType::QUInt4x2:
    case DType::QUInt2x4: return 1;
    case DType::Float16:
    case DType::BFloat16:
    case DType::Int16:
    case DType::UInt16:
    case DType::Bits16: return 2;
    case DType::Float32:
    case DType::Int32:
    case DType::UInt32:
    case DType::QInt32:
    case DType::ComplexHalf: return 4;
    case DType::Float64:
    case DType::Int64:
    case DType::UInt64:
    case DType::Complex64: return 8;
    case DType::Complex128: return 16;
  }
  return 0;
}

std::string_view dtypeName(DType dtype) { return orUnknown(EnumNameDType(dtype)); }
std::string_view bodyName(Body body) { return orUnknown(EnumNameBody(body)); }
std::string_view errorCodeName(ErrorCode code) { return orUnknown(EnumNameErrorCode(code)); }

namespace {

StatusCode statusCodeFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::InvalidMessage: return StatusCode::kInvalidMessage;
    case ErrorCode::UnsupportedVersion:
    case ErrorCode::UnknownOp: return StatusCode::kUnsupported;
    case ErrorCode::Unauthenticated:
    case ErrorCode::NotInSession: return StatusCode::kUnauthenticated;
    case ErrorCode::UnknownHandle:
    case ErrorCode::UnknownGraph: return StatusCode::kNotFound;
    case ErrorCode::DuplicateHandle: return StatusCode::kAlreadyExists;
    case ErrorCode::SchemaMismatch:
    case ErrorCode::TorchError: return StatusCode::kInvalidArgument;
    case ErrorCode::OutOfMemory: return StatusCode::kOutOfMemory;
    case ErrorCode::TooLarge: return StatusCode::kTooLarge;
    case ErrorCode::ShuttingDown: return StatusCode::kCancelled;
    case ErrorCode::Timeout: return StatusCode::kTimeout;
    case ErrorCode::PeerUnreachable: return StatusCode::kPeerUnreachable;
    case ErrorCode::Unknown:
    case ErrorCode::Internal: break;
  }
  return StatusCode::kInternal;
}

}  // namespace

Status requestError(ErrorCode code, std::string message, int32_t op_index, std::string op_name,
                    std::string error_class) {
  Status status(statusCodeFor(code), message);
  return status.withRemote({static_cast<uint16_t>(code), op_index, std::move(op_name), std::move(message),
                            std::move(error_class)});
}

ErrorCode errorCodeOf(const Status& status) {
  if (const RemoteDetail* detail = status.remote()) return static_cast<ErrorCode>(detail->code);
  switch (status.code()) {
    case StatusCode::kInvalidMessage: return ErrorCode::InvalidMessage;
    case StatusCode::kUnauthenticated: return ErrorCode::Unauthenticated;
    case StatusCode::kOutOfMemory: return ErrorCode::OutOfMemory;
    case StatusCode::kTooLarge: return ErrorCode::TooLarge;
    case StatusCode::kTimeout: return ErrorCode::Timeout;
    case StatusCode::kPeerUnreachable: return ErrorCode::PeerUnreachable;
    default: return ErrorCode::Internal;
  }
}

Status remoteStatus(const Error& error) {
  RemoteDetail detail{static_cast<uint16_t>(error.code()), error.op_index(), std::string(stringOf(error.op_name())),
                      std::string(stringOf(error.message())), std::string(stringOf(error.error_class()))};
  std::string where = detail.op_index >= 0 ? fmt::format(" op {} ({})", detail.op_index, detail.op_name) : std::string();
  Status status(StatusCode::kRemote, fmt::format("{}{}: {}", errorCodeName(error.code()), where, detail.message),
                __FILE__, __LINE__);
  return status.withRemote(std::move(detail));
}

Result<uint64_t> tensorSpanBytes(DType dtype, std::span<const int64_t> shape,
                                 std::span<const int64_t> strides, int64_t storage_offset) {
  const uint64_t item = dtypeSize(dtype);
  if (item == 0) {
    return GENIE_ERROR(kInvalidArgument, "dtype {} is not a defined element type",
                       dtypeLabel(dtype));
  }
  if (shape.size() > kMaxTensorRank) {
    return GENIE_ERROR(kInvalidArgument, "rank {} is over {}", shape.size(), kMaxTensorRank);
  }
  if (!strides.empty() && strides.size() != shape.size()) {
    return GENIE_ERROR(kInvalidArgument, "strides has rank {} but shape [{}] has rank {}",
                       strides.size(), fmt::join(shape, ","), shape.size());
  }
  if (storage_offset < 0) {
    return GENIE_ERROR(kInvalidArgument, "storage_offset {} is negative", storage_offset);
  }
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return GENIE_ERROR(kInvalidArgument, "shape[{}] is {} (negative)", i, shape[i]);
    }
    if (!strides.empty() && strides[i] < 0) {
      return GENIE_ERROR(kInvalidArgument, "strides[{}] is {} (negative)", i, strides[i]);
    }
    empty = empty || shape[i] == 0;
  }
  if (empty) return uint64_t{0};  // touches no storage, as computeStorageNbytes

  // `last`: index of the last element touched, relative to storage_offset.
  uint64_t last = 0;
  bool overflow = false;
  if (strides.empty()) {
    uint64_t numel = 1;
    for (int64_t d : shape) overflow |= __builtin_mul_overflow(numel, uint64_t(d), &numel);
    last = numel - 1;
  } else {
    for (size_t i = 0; i < shape.size(); ++i) {
      uint64_t term = 0;
      overflow |= __builtin_mul_overflow(uint64_t(shape[i] - 1), uint64_t(strides[i]), &term);
      overflow |= __builtin_add_overflow(last, term, &last);
    }
  }
  uint64_t elements = 0;
  uint64_t bytes = 0;
  overflow |= __builtin_add_overflow(last, uint64_t(storage_offset) + 1, &elements);
  overflow |= __builtin_mul_overflow(elements, item, &bytes);
  if (overflow || bytes > uint64_t(std::numeric_limits<int64_t>::max())) {
    return GENIE_ERROR(kInvalidArgument, "span of {} overflows int64",
                       describeTensor(dtype, shape, strides, storage_offset));
  }
  return bytes;
}

Result<uint64_t> tensorSpanBytes(const TensorDesc& desc) {
  return tensorSpanBytes(desc.dtype(), spanOf(desc.shape()), spanOf(desc.strides()),
                         desc.storage_offset());
}

// ---------------------------------------------------------------------------------------
// Handles and graph ids

bool isNull(const Handle& handle) { return handle.hi() == 0 && handle.lo() == 0; }

bool operator==(const Handle& a, const Handle& b) { return a.hi() == b.hi() && a.lo() == b.lo(); }
bool operator==(const GraphId& a, const GraphId& b) { return a.hi() == b.hi() && a.lo() == b.lo(); }

std::string toString(const Handle& h) { return fmt::format("{:016x}{:016x}", h.hi(), h.lo()); }
std::string toString(const GraphId& g) { return fmt::format("{:016x}{:016x}", g.hi(), g.lo()); }

// Handles and graph ids are uniformly random (CSPRNG, XXH3), so mixing the halves suffices.
size_t HandleHash::operator()(const Handle& h) const {
  return static_cast<size_t>(h.hi() ^ (h.lo() * 0x9e3779b97f4a7c15ull));
}
size_t GraphIdHash::operator()(const GraphId& g) const {
  return static_cast<size_t>(g.hi() ^ (g.lo() * 0x9e3779b97f4a7c15ull));
}

GraphId hashGraph(std::span<const std::byte> graph_bytes) {
  const XXH128_hash_t h = XXH3_128bits(graph_bytes.data(), graph_bytes.size());
  return GraphId(h.high64, h.low64);
}

// ---------------------------------------------------------------------------------------
// Verification

Result<const Message*> verifyMessage(std::span<const std::byte> header, size_t payload_bytes,
                                     const VerifyLimits& limits) {
  if (!isAligned(header.data())) {
    return GENIE_ERROR(kInvalidArgument,
                       "Message: header at {} is not {}-byte aligned; copy it to aligned storage",
                       fmt::ptr(header.data()), kHeaderAlignment);
  }
  if (header.size() < kMinHeaderBytes) {
    return GENIE_ERROR(kInvalidMessage,
                       "Message: header of {} bytes is too small (at least {}: root offset and "
                       "identifier)",
                       header.size(), kMinHeaderBytes);
  }
  if (header.size() > maxHeaderBytes(limits)) {
    return GENIE_ERROR(kTooLarge, "Message: header of {} bytes exceeds max_header_bytes {}",
                       header.size(), maxHeaderBytes(limits));
  }
  if (payload_bytes > limits.max_payload_bytes) {
    return GENIE_ERROR(kTooLarge, "Message: payload of {} bytes exceeds max_payload_bytes {}",
                       payload_bytes, limits.max_payload_bytes);
  }
  const auto* buf = reinterpret_cast<const uint8_t*>(header.data());
  // Bytes 4..7; memcmp of a constant length compiles to one compare (strncmp is a call).
  static_assert(kFileIdentifier.size() == flatbuffers::kFileIdentifierLength);
  if (std::memcmp(buf + sizeof(flatbuffers::uoffset_t), kFileIdentifier.data(), kFileIdentifier.size()) != 0) {
    return GENIE_ERROR(kInvalidMessage, "Message: file identifier is \"{}\", expected \"{}\"",
                       printableIdentifier(buf + sizeof(flatbuffers::uoffset_t)), kFileIdentifier);
  }
  flatbuffers::Verifier verifier(buf, header.size(), verifierOptions(limits));
  // The identifier was checked just above; nullptr skips FlatBuffers' second comparison.
  if (!verifier.VerifyBuffer<Message>(nullptr)) {
    return GENIE_ERROR(kInvalidMessage,
                       "Message: failed FlatBuffers verification ({} bytes; bad offset, size or "
                       "alignment, nesting over {} or more than {} tables)",
                       header.size(), limits.max_depth, limits.max_tables);
  }
  const Message* msg = flatbuffers::GetRoot<Message>(buf);
  GENIE_RETURN_IF_ERROR(checkBody(*msg, header.data(), payload_bytes, limits));
  return msg;
}

Result<const Graph*> verifyGraph(std::span<const std::byte> graph_bytes,
                                 const VerifyLimits& limits) {
  if (!isAligned(graph_bytes.data())) {
    return GENIE_ERROR(kInvalidArgument,
                       "Graph: bytes at {} are not {}-byte aligned; copy them to aligned storage",
                       fmt::ptr(graph_bytes.data()), kHeaderAlignment);
  }
  return verifyGraphAt(graph_bytes, limits, Path("Graph"));
}

Status checkGraph(const Graph& graph) { return checkGraphAt(graph, Path("Graph")); }

uint64_t graphNumValues(const Graph& graph) {
  uint64_t n = graph.inputs() ? graph.inputs()->size() : 0;
  for (uint32_t i = 0; graph.nodes() && i < graph.nodes()->size(); ++i) {
    n += graph.nodes()->Get(i)->num_outputs();
  }
  return n;
}

}  // namespace genie::wire
