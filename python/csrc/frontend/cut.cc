// The passes of cut.h: liveness, lowering, the wire graph, scalar lifting and the request.
//
// Over 600 lines: one pipeline whose passes read the one before's output: `Lowered` (its value
// numbering, inputs and liftable numbers) is what encodeGraph, GraphCache and takeCut all index
// by, so the passes stay together in the order cut.h lists them.
#include "frontend/cut.h"

#include <flatbuffers/flatbuffers.h>
#include <sys/random.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "frontend/op_facts.h"
#include "frontend/shapes.h"
#include "genie/wire/torch_dtype.h"

namespace genie::frontend {

bool Number::operator==(const Number& o) const {
  if (is_float != o.is_float) return false;
  // A literal of the first graph can stand for a number only when equal and, for a zero, of the
  // same sign (1 / -0.0 is -inf); NaN never equals anything, so its position is lifted.
  return is_float ? (d == o.d && std::signbit(d) == std::signbit(o.d)) : i == o.i;
}

wire::Handle newHandle() {
  thread_local uint64_t pool[64];
  thread_local size_t left = 0;
  while (true) {
    if (left < 2) {
      size_t got = 0;
      while (got < sizeof pool) {
        const ssize_t n = getrandom(reinterpret_cast<char*>(pool) + got, sizeof pool - got, 0);
        if (n > 0) got += static_cast<size_t>(n);
      }
      left = 64;
    }
    const uint64_t hi = pool[--left], lo = pool[--left];
    if (hi != 0 || lo != 0) return wire::Handle(hi, lo);
  }
}

// ---- 1. liveness ----------------------------------------------------------------------------

std::vector<NodePtr> liveNodes(const std::vector<NodePtr>& pending, const std::vector<Value*>& wanted) {
  // `needed` and `read` are marks of this pass's epoch on the values and storages.
  const uint32_t epoch = nextEpoch();
  for (Value* v : wanted) v->needed_epoch = epoch;
  std::vector<NodePtr> keep;
  keep.reserve(pending.size());
  for (auto it = pending.rbegin(); it != pending.rend(); ++it) {
    const Node& node = **it;
    bool need = false;
    for (const ValuePtr& v : node.outputs) {
      if (v->needed_epoch == epoch || v->tensors.load(std::memory_order_relaxed) > 0) {
        need = true;
        break;
      }
    }
    for (size_t i = 0; !need && i < node.writes.size(); ++i) {
      const Storage* s = node.writes[i].get();
      need = s->read_epoch == epoch || s->live.load(std::memory_order_relaxed) > 0;
    }
    if (!need) continue;
    keep.push_back(*it);
    for (Value* v : node.inputs()) {
      v->storage->read_epoch = epoch;  // a read keeps the writes of its storage before it
      if (v->pending()) v->needed_epoch = epoch;
    }
  }
  std::reverse(keep.begin(), keep.end());
  return keep;
}

// ---- 3. lowering ----------------------------------------------------------------------------

namespace {

/// Key tags (see lower). Distinct from the numbers they precede by position, not value.
enum KeyTag : int64_t {
  kNodeTag = 1, kSkip, kNone, kBool, kInt, kFloat, kDType, kLayout, kMemoryFormat, kComplex, kString, kDevice,
  kIntList, kDoubleList, kBoolList, kTensorList, kInputRef, kOutputRef, kNoTensor, kWeightInput, kHandleInput,
  kInlineInput, kDefaultDType
};

int64_t bitsOf(double d) {
  int64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  return bits;
}

int64_t intOf(const c10::IValue& x) { return x.isInt() ? x.toInt() : x.toSymInt().expect_int(); }

/// Classifies one argument and hands its parts to `visitor` (lower and encodeGraph use the same
/// walk, so numbers and inputs come in the same order):
///   value(Value*) / inlineTensor(tensor) / noTensor() for tensors, between beginTensorList(n,
///   any_none) and endTensorList() for tensor lists; none(); boolean(b); number(Number) for a
///   liftable int or float; enumValue(tag, v) for dtypes, layouts, memory formats;
///   complex(c); string(s); device(type); intList(list) and doubleList(list) (every element
///   liftable; a float or Scalar list's elements as floats); boolList(list) (literal).
/// Throws c10::Error for an argument with no wire form, naming the op.
template <typename Visitor>
void walkArg(const c10::IValue& v, ArgKind kind, Visitor& visitor, const Node& node) {
  if (v.isCapsule()) {
    visitor.value(valueOf(v));
  } else if (v.isTensor()) {
    if (v.toTensor().defined()) {
      visitor.inlineTensor(v.toTensor());
    } else {
      visitor.none();
    }
  } else if (v.isNone()) {
    visitor.none();
  } else if (v.isBool()) {
    visitor.boolean(v.toBool());
  } else if (v.isInt() || v.isSymInt()) {
    const int64_t i = intOf(v);
    switch (kind) {
      case ArgKind::kScalarType: visitor.enumValue(kDType, i); break;
      case ArgKind::kLayout: visitor.enumValue(kLayout, i); break;
      case ArgKind::kMemoryFormat: visitor.enumValue(kMemoryFormat, i); break;
      default: visitor.number(Number{false, i, 0.0});
    }
  } else if (v.isDouble()) {
    visitor.number(Number{true, 0, v.toDouble()});
  } else if (v.isComplexDouble()) {
    visitor.complex(v.toComplexDouble());
  } else if (v.isString()) {
    visitor.string(v.toStringRef());
  } else if (v.isDevice()) {
    visitor.device(v.toDevice().type());
  } else if (v.isList()) {
    const auto list = v.toListRef();
    size_t tensors = 0, nones = 0, doubles = 0, ints = 0, bools = 0;
    for (const c10::IValue& x : list) {
      if (x.isCapsule() || (x.isTensor() && x.toTensor().defined())) {
        ++tensors;
      } else if (x.isNone() || x.isTensor()) {
        ++nones;
      } else if (x.isDouble()) {
        ++doubles;
      } else if (x.isBool()) {
        ++bools;
      } else if (x.isInt() || x.isSymInt()) {
        ++ints;
      }
    }
    const size_t n = list.size();
    if (n > 0 && tensors + nones == n && tensors > 0) {
      visitor.beginTensorList(n, nones > 0);
      for (const c10::IValue& x : list) {
        if (x.isCapsule()) {
          visitor.value(valueOf(x));
        } else if (x.isTensor() && x.toTensor().defined()) {
          visitor.inlineTensor(x.toTensor());
        } else {
          visitor.noTensor();
        }
      }
      visitor.endTensorList();
    } else if (bools == n && n > 0) {
      visitor.boolList(list);
    } else if (ints + doubles == n && doubles > 0) {
      visitor.doubleList(list);
    } else if (ints == n) {
      visitor.intList(list);
    } else {
      TORCH_CHECK(false, node.opName(), ": a list argument of mixed kinds has no wire form: ", v);
    }
  } else {
    TORCH_CHECK(false, node.opName(), ": an argument of type ", v.tagKind(), " has no wire form");
  }
}

double doubleOf(const c10::IValue& x) { return x.isDouble() ? x.toDouble() : static_cast<double>(intOf(x)); }

/// Builds the Lowered of a cut (step 3). Values are numbered through their scratch fields
/// (Value::lower_epoch, lower_id) under this lowering's epoch.
class Lowering {
 public:
  /// `capture`: lowering a captured part (capturePart): inputs may be pending and weights are
  /// bound per call like any input.
  explicit Lowering(Lowered& out, bool capture = false) : out_(out), epoch_(nextEpoch()), capture_(capture) {
    out_.epoch = epoch_;
    key_.reserve(4096);
  }

  void addInput(Value* v) {
    if (v->lower_epoch == epoch_) return;
    if (v->lost()) throw LostInput(ValuePtr::reclaim_copy(v));
    TORCH_CHECK(capture_ || v->handle.has_value(), "value ", v->str(), " is neither pending nor resident (lost)");
    const auto id = static_cast<uint32_t>(out_.inputs.size());
    v->lower_epoch = epoch_;
    v->lower_id = id;
    if (v->residency == kWeight && !capture_) {  // a weight's handle is part of the structure: bound in the graph
      out_.inputs.push_back({LoweredInput::kWeight, ValuePtr::reclaim_copy(v), {}});
      inputs_key_.insert(inputs_key_.end(), {kWeightInput, static_cast<int64_t>(v->handle->hi()),
                                             static_cast<int64_t>(v->handle->lo())});
    } else {
      out_.inputs.push_back({LoweredInput::kHandle, ValuePtr::reclaim_copy(v), {}});
      inputs_key_.insert(inputs_key_.end(), {kHandleInput, static_cast<int64_t>(v->dtype)});
    }
  }

  void node(const Node& n) {
    const ShownArgs shown(n.schema(), n.args);
    key_.insert(key_.end(), {kNodeTag, reinterpret_cast<int64_t>(&n.schema()), static_cast<int64_t>(n.outputs.size())});
    if (n.default_dtype != at::kFloat) key_.insert(key_.end(), {kDefaultDType, static_cast<int64_t>(n.default_dtype)});
    for (size_t i = 0; i < n.args.size(); ++i) {
      if (!shown[i]) {
        key_.push_back(kSkip);
        continue;
      }
      walkArg(n.args[i], i < n.facts.args.size() ? n.facts.args[i] : ArgKind::kOther, *this, n);
    }
    for (const ValuePtr& v : n.outputs) {
      v->lower_epoch = epoch_;
      v->lower_id = Value::kProduced | produced_++;
    }
  }

  void finish() {
    out_.num_inputs = static_cast<uint32_t>(out_.inputs.size());
    out_.key = std::move(inputs_key_);
    out_.key.insert(out_.key.end(), key_.begin(), key_.end());
    out_.key_hash = hashWords(out_.key);
  }

  // ---- the visitor of walkArg ----
  void value(Value* v) {
    if (v->lower_epoch == epoch_ && (v->lower_id & Value::kProduced) != 0) {
      key_.insert(key_.end(), {kOutputRef, static_cast<int64_t>(v->lower_id & ~Value::kProduced)});
      return;
    }
    TORCH_CHECK(capture_ || !v->pending() || v->lost(), "value ", v->str(), " is pending but its op is not in the cut");
    addInput(v);
    key_.insert(key_.end(), {kInputRef, static_cast<int64_t>(v->lower_id)});
  }
  void inlineTensor(const at::Tensor& t) { key_.insert(key_.end(), {kInputRef, inlineInput(t)}); }
  void noTensor() { key_.push_back(kNoTensor); }
  void beginTensorList(size_t n, bool) { key_.insert(key_.end(), {kTensorList, static_cast<int64_t>(n)}); }
  void endTensorList() {}
  void none() { key_.push_back(kNone); }
  void boolean(bool b) { key_.insert(key_.end(), {kBool, b}); }
  void number(const Number& n) {
    key_.push_back(n.is_float ? kFloat : kInt);
    out_.numbers.push_back(n);
  }
  void enumValue(KeyTag tag, int64_t v) { key_.insert(key_.end(), {tag, v}); }
  void complex(c10::complex<double> c) { key_.insert(key_.end(), {kComplex, bitsOf(c.real()), bitsOf(c.imag())}); }
  void string(const std::string& s) {
    key_.insert(key_.end(), {kString, static_cast<int64_t>(s.size())});
    for (size_t i = 0; i < s.size(); i += 8) {
      int64_t w = 0;
      std::memcpy(&w, s.data() + i, std::min<size_t>(8, s.size() - i));
      key_.push_back(w);
    }
  }
  void device(c10::DeviceType type) { key_.insert(key_.end(), {kDevice, static_cast<int64_t>(type)}); }
  void intList(c10::ArrayRef<c10::IValue> list) {
    key_.insert(key_.end(), {kIntList, static_cast<int64_t>(list.size())});
    for (const c10::IValue& x : list) out_.numbers.push_back(Number{false, intOf(x), 0.0});
  }
  void doubleList(c10::ArrayRef<c10::IValue> list) {
    key_.insert(key_.end(), {kDoubleList, static_cast<int64_t>(list.size())});
    for (const c10::IValue& x : list) out_.numbers.push_back(Number{true, 0, doubleOf(x)});
  }
  void boolList(c10::ArrayRef<c10::IValue> list) {
    key_.insert(key_.end(), {kBoolList, static_cast<int64_t>(list.size())});
    for (const c10::IValue& x : list) key_.push_back(x.toBool());
  }

 private:
  int64_t inlineInput(const at::Tensor& t) {
    auto found = out_.inline_ids.find(t.unsafeGetTensorImpl());
    if (found != out_.inline_ids.end()) return found->second;
    const auto id = static_cast<uint32_t>(out_.inputs.size());
    out_.inline_ids.emplace(t.unsafeGetTensorImpl(), id);
    out_.inputs.push_back({LoweredInput::kInline, {}, t});
    inputs_key_.insert(inputs_key_.end(), {kInlineInput, static_cast<int64_t>(t.scalar_type())});
    return id;
  }

  Lowered& out_;
  const uint32_t epoch_;
  const bool capture_;
  uint32_t produced_ = 0;
  std::vector<int64_t> inputs_key_;
  std::vector<int64_t> key_;
};

}  // namespace

Lowered lower(const std::vector<NodePtr>& nodes, const std::vector<ValuePtr>& extra_inputs) {
  Lowered out;
  Lowering lowering(out);
  for (const ValuePtr& v : extra_inputs) lowering.addInput(v.get());
  for (const NodePtr& node : nodes) lowering.node(*node);
  lowering.finish();
  return out;
}

std::variant<CapturedPart, std::string> capturePart(const std::vector<NodePtr>& pending,
                                                    const std::vector<ValuePtr>& inputs,
                                                    const std::vector<ValuePtr>& outputs, const std::string& name,
                                                    int64_t since_seq) {
  const uint32_t epoch = nextEpoch();
  std::unordered_set<const Storage*> input_storages;
  for (const ValuePtr& v : inputs) {
    v->needed_epoch = epoch;
    input_storages.insert(v->storage.get());
  }
  auto writesInput = [&](const Node& node) {
    return std::any_of(node.writes.begin(), node.writes.end(),
                       [&](const StoragePtr& s) { return input_storages.count(s.get()) != 0; });
  };
  // The nodes between: from the outputs back through producers, stopping at the inputs; and
  // from the write-backs (ops of the part, recorded from `since_seq` on, that write an input:
  // a functionalized graph's copy_ of an updated KV cache into the cache), which join it.
  std::unordered_set<const Node*> reached;
  std::vector<Value*> stack;
  for (const ValuePtr& v : outputs) {
    if (input_storages.count(v->storage.get()) != 0) return "output " + v->str() + " aliases an input";
    stack.push_back(v.get());
  }
  for (const NodePtr& node : pending) {
    if (node->seq < since_seq || !writesInput(*node)) continue;
    reached.insert(node.get());
    for (Value* in : node->inputs()) stack.push_back(in);
  }
  while (!stack.empty()) {
    Value* v = stack.back();
    stack.pop_back();
    if (v->needed_epoch == epoch) continue;
    v->needed_epoch = epoch;
    if (v->lost()) return "value " + v->str() + " is lost";
    if (!v->pending()) return "value " + v->str() + " is resident but not an input of the part";
    if (!reached.insert(v->producer).second) continue;
    for (Value* in : v->producer->inputs()) stack.push_back(in);
  }
  std::vector<NodePtr> nodes;
  std::unordered_set<const Storage*> written;
  for (const NodePtr& node : pending) {
    if (reached.count(node.get()) == 0) continue;
    if (writesInput(*node)) {
      if (node->seq < since_seq) return node->opName() + " writes an input before the part";
      for (const StoragePtr& s : node->writes) {
        if (input_storages.count(s.get()) == 0) return node->opName() + " writes an input and a tensor of its own";
        written.insert(s.get());
      }
    }
    nodes.push_back(node);
  }
  if (nodes.size() != reached.size()) return "an op of the part is not pending";
  Lowered lowered;
  Lowering lowering(lowered, /*capture=*/true);
  for (const ValuePtr& v : inputs) lowering.addInput(v.get());
  for (const NodePtr& node : nodes) lowering.node(*node);
  lowering.finish();
  CapturedPart part;
  for (const ValuePtr& v : inputs) part.input_ids.push_back(lowered.idOf(v.get()));
  for (const LoweredInput& input : lowered.inputs) {
    if (input.kind == LoweredInput::kInline) part.inline_inputs.push_back(input.tensor);
  }
  for (const ValuePtr& v : outputs) part.output_ids.push_back(lowered.idOf(v.get()));
  std::unordered_set<const Storage*> listed;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Storage* s = inputs[i]->storage.get();
    if (written.count(s) != 0 && listed.insert(s).second) part.written.push_back(static_cast<uint32_t>(i));
  }
  part.num_nodes = nodes.size();
  part.graph = encodeGraph(nodes, lowered, {}, name);
  return part;
}

uint32_t Lowered::idOf(const Value* v) const {
  TORCH_CHECK(v->lower_epoch == epoch, "genie: value ", v->str(), " is not numbered by this lowering (a stale cut)");
  return (v->lower_id & Value::kProduced) != 0 ? num_inputs + (v->lower_id & ~Value::kProduced) : v->lower_id;
}

// ---- the wire graph -------------------------------------------------------------------------

namespace {

namespace fb = flatbuffers;

/// Builds wire Values from walkArg's parts (encodeGraph).
class Encoder {
 public:
  Encoder(fb::FlatBufferBuilder& fbb, const Lowered& lowered, const std::vector<uint32_t>& lifted)
      : fbb_(fbb), lowered_(lowered) {
    for (size_t slot = 0; slot < lifted.size(); ++slot) slot_of_.emplace(lifted[slot], static_cast<int32_t>(slot));
  }

  std::pair<wire::Value, fb::Offset<void>> result;

  void value(Value* v) { tensorId(lowered_.idOf(v)); }
  void inlineTensor(const at::Tensor& t) { tensorId(lowered_.inline_ids.at(t.unsafeGetTensorImpl())); }
  void noTensor() { tensorId(-1); }
  void beginTensorList(size_t n, bool any_none) {
    in_list_ = true;
    list_any_none_ = any_none;
    list_ids_.clear();
    list_ids_.reserve(n);
  }
  void endTensorList() {
    in_list_ = false;
    if (list_any_none_) {
      result = {wire::Value::OptionalTensorListValue,
                wire::CreateOptionalTensorListValue(fbb_, fbb_.CreateVector(list_ids_)).Union()};
    } else {
      std::vector<uint32_t> values(list_ids_.begin(), list_ids_.end());
      result = {wire::Value::TensorListValue, wire::CreateTensorListValue(fbb_, fbb_.CreateVector(values)).Union()};
    }
  }
  void none() { result = {wire::Value::NoneValue, wire::CreateNoneValue(fbb_).Union()}; }
  void boolean(bool b) { result = {wire::Value::BoolValue, wire::CreateBoolValue(fbb_, b).Union()}; }
  void number(const Number& n) {
    const int32_t slot = nextSlot();
    if (slot >= 0) {
      result = {wire::Value::ScalarInputValue, wire::CreateScalarInputValue(fbb_, static_cast<uint32_t>(slot)).Union()};
    } else if (n.is_float) {
      result = {wire::Value::DoubleValue, wire::createDoubleValue(fbb_, n.d).Union()};
    } else {
      result = {wire::Value::IntValue, wire::CreateIntValue(fbb_, n.i).Union()};
    }
  }
  void enumValue(KeyTag tag, int64_t v) {
    if (tag == kDType) {
      const wire::DType dtype = wire::wireDTypeOf(static_cast<c10::ScalarType>(v));
      TORCH_CHECK(dtype != wire::DType::Undefined, "dtype ", static_cast<c10::ScalarType>(v), " has no wire dtype");
      result = {wire::Value::DTypeValue, wire::CreateDTypeValue(fbb_, dtype).Union()};
    } else if (tag == kLayout) {
      result = {wire::Value::LayoutValue, wire::CreateLayoutValue(fbb_, static_cast<int8_t>(v)).Union()};
    } else {
      result = {wire::Value::MemoryFormatValue, wire::CreateMemoryFormatValue(fbb_, static_cast<int8_t>(v)).Union()};
    }
  }
  void complex(c10::complex<double> c) {
    result = {wire::Value::ComplexValue, wire::createComplexValue(fbb_, c.real(), c.imag()).Union()};
  }
  void string(const std::string& s) {
    result = {wire::Value::StringValue, wire::CreateStringValue(fbb_, fbb_.CreateString(s)).Union()};
  }
  void device(c10::DeviceType type) {
    auto name = fbb_.CreateString(c10::DeviceTypeName(type, /*lower_case=*/true));
    result = {wire::Value::DeviceValue, wire::CreateDeviceValue(fbb_, name, -1).Union()};
  }
  void intList(c10::ArrayRef<c10::IValue> list) {
    auto [v, s] = liftable<int64_t>(list, intOf);
    result = {wire::Value::IntListValue, wire::CreateIntListValue(fbb_, v, s).Union()};
  }
  void doubleList(c10::ArrayRef<c10::IValue> list) {
    auto [v, s] = liftable<double>(list, doubleOf);
    result = {wire::Value::DoubleListValue, wire::CreateDoubleListValue(fbb_, v, s).Union()};
  }
  void boolList(c10::ArrayRef<c10::IValue> list) {
    std::vector<uint8_t> bytes;
    for (const c10::IValue& x : list) bytes.push_back(x.toBool());
    result = {wire::Value::BoolListValue, wire::CreateBoolListValue(fbb_, fbb_.CreateVector(bytes)).Union()};
  }

 private:
  void tensorId(int64_t id) {
    if (in_list_) {
      list_ids_.push_back(id);
    } else {
      result = {wire::Value::TensorValue, wire::CreateTensorValue(fbb_, static_cast<uint32_t>(id)).Union()};
    }
  }
  /// A list's elements and scalar slots: the executor takes element i from scalar input
  /// scalar_slots[i] when it is >= 0 (v[i] is then 0 and unused); with no slot, scalar_slots is
  /// left empty.
  template <typename T, typename Of>
  std::pair<fb::Offset<fb::Vector<T>>, fb::Offset<fb::Vector<int32_t>>> liftable(c10::ArrayRef<c10::IValue> list, Of of) {
    std::vector<T> values;
    std::vector<int32_t> slots;
    bool any_slot = false;
    for (const c10::IValue& x : list) {
      const int32_t slot = nextSlot();
      any_slot = any_slot || slot >= 0;
      values.push_back(slot >= 0 ? T{0} : static_cast<T>(of(x)));
      slots.push_back(slot);
    }
    auto v = fbb_.CreateVector(values);
    return {v, any_slot ? fbb_.CreateVector(slots) : fb::Offset<fb::Vector<int32_t>>()};
  }

  int32_t nextSlot() {
    auto found = slot_of_.find(position_++);
    return found == slot_of_.end() ? -1 : found->second;
  }

  fb::FlatBufferBuilder& fbb_;
  const Lowered& lowered_;
  std::unordered_map<uint32_t, int32_t> slot_of_;
  uint32_t position_ = 0;  // index into lowered.numbers, in walk order
  bool in_list_ = false;
  bool list_any_none_ = false;
  std::vector<int64_t> list_ids_;
};

}  // namespace

std::string encodeGraph(const std::vector<NodePtr>& nodes, const Lowered& lowered, const std::vector<uint32_t>& lifted,
                        const std::string& name) {
  fb::FlatBufferBuilder fbb(4096);
  std::vector<fb::Offset<wire::GraphInput>> inputs;
  for (const LoweredInput& input : lowered.inputs) {
    // No descriptors: graphs stay shape-generic (the node checks shapes as it runs ops).
    const wire::Handle* handle = input.kind == LoweredInput::kWeight ? &*input.value->handle : nullptr;
    inputs.push_back(wire::CreateGraphInput(fbb, wire::InputKind::Tensor, 0, handle));
  }
  Encoder encoder(fbb, lowered, lifted);
  std::vector<fb::Offset<wire::Node>> encoded;
  for (const NodePtr& node : nodes) {
    const auto& arguments = node->schema().arguments();
    const ShownArgs shown(node->schema(), node->args);
    std::vector<fb::Offset<wire::Argument>> args;
    for (size_t i = 0; i < node->args.size(); ++i) {
      if (!shown[i]) continue;
      walkArg(node->args[i], i < node->facts.args.size() ? node->facts.args[i] : ArgKind::kOther, encoder, *node);
      const bool keyword = i < arguments.size() && arguments[i].kwarg_only();
      auto name = keyword ? fbb.CreateString(arguments[i].name()) : fb::Offset<fb::String>();
      args.push_back(wire::CreateArgument(fbb, name, encoder.result.first, encoder.result.second));
    }
    const auto& op_name = node->op.operator_name();
    const wire::DType default_dtype =
        node->default_dtype == at::kFloat ? wire::DType::Undefined : wire::wireDTypeOf(node->default_dtype);
    encoded.push_back(wire::CreateNode(fbb, fbb.CreateString(op_name.name), fbb.CreateString(op_name.overload_name),
                                       fbb.CreateVector(args), static_cast<uint32_t>(node->outputs.size()),
                                       default_dtype));
  }
  auto graph = wire::CreateGraph(fbb, name.empty() ? fb::Offset<fb::String>() : fbb.CreateString(name),
                                 fbb.CreateVector(inputs),
                                 static_cast<uint32_t>(lifted.size()), fbb.CreateVector(encoded));
  wire::finishGraph(fbb, graph);
  auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(fbb.GetBufferPointer()), fbb.GetSize());
  auto verified = wire::verifyGraph(bytes);
  TORCH_CHECK(static_cast<bool>(verified), "genie: the lowered graph fails verification: ", verified.status().message());
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// ---- 4. scalar lifting ----------------------------------------------------------------------

size_t GraphCache::KeyHash::operator()(const std::vector<int64_t>& k) const { return hashWords(k); }

GraphCache::Family& GraphCache::familyOf(const Lowered& lowered) {
  // A loop runs one structure again and again: compare with the last key before hashing.
  if (last_ != nullptr && *last_key_ == lowered.key) return *last_;
  auto [it, inserted] = families_.try_emplace(lowered.key);
  if (inserted) {
    it->second.base = lowered.numbers;
    it->second.lifted.assign(lowered.numbers.size(), false);
  }
  last_key_ = &it->first;
  last_ = &it->second;
  return it->second;
}

GraphCache::Prepared GraphCache::prepare(const Lowered& lowered) {
  Family& family = familyOf(lowered);
  Prepared p;
  for (size_t i = 0; i < lowered.numbers.size(); ++i) {
    if (!family.lifted[i] && !(lowered.numbers[i] == family.base[i])) family.lifted[i] = true;
    if (family.lifted[i]) {
      p.scalars.emplace_back(static_cast<uint32_t>(p.lifted.size()), lowered.numbers[i]);
      p.lifted.push_back(static_cast<uint32_t>(i));
    }
  }
  auto found = family.ids.find(p.lifted);
  if (found != family.ids.end()) p.graph_id = found->second;
  p.residency = family.residency;
  return p;
}

void GraphCache::rememberResidency(const Lowered& lowered, std::vector<std::pair<uint32_t, uint8_t>> classes) {
  familyOf(lowered).residency = std::move(classes);
}

void GraphCache::remember(const Lowered& lowered, const std::vector<uint32_t>& lifted, const wire::GraphId& graph_id) {
  familyOf(lowered).ids[lifted] = graph_id;
}

void GraphCache::clear() {
  families_.clear();
  last_key_ = nullptr;
  last_ = nullptr;
}

size_t GraphCache::size() const {
  size_t n = 0;
  for (const auto& [key, family] : families_) n += family.ids.size();
  return n;
}

// ---- 5. the request -------------------------------------------------------------------------

namespace {

void addSpec(Cut& cut, const ValuePtr& v, OutputAction action) {
  OutputRow row;
  row.value_id = cut.lowered.idOf(v.get());
  row.action = action;
  row.residency = v->residency;
  if (action != OutputAction::kReturn) {
    row.handle = newHandle();
    cut.kept.push_back(v);
  }
  cut.specs.push_back(row);
  cut.spec_values.push_back(v);
}

}  // namespace

Cut takeCut(Recording& recording, const std::vector<ValuePtr>& returned, const std::vector<ValuePtr>& described) {
  Cut cut;
  std::vector<Value*> wanted;
  for (const ValuePtr& v : returned) wanted.push_back(v.get());
  for (const ValuePtr& v : described) wanted.push_back(v.get());
  cut.taken = recording.takePending();
  cut.colocation_group = recording.colocation_group;
  cut.colocation_bytes = recording.colocation_bytes;
  try {
    cut.nodes = liveNodes(cut.taken, wanted);
    std::vector<ValuePtr> extra;
    for (const ValuePtr& v : returned) {
      if (!v->pending()) extra.push_back(v);
    }
    cut.lowered = lower(cut.nodes, extra);
    cut.prepared = recording.graphs().prepare(cut.lowered);
  } catch (...) {
    recording.restorePending(std::move(cut.taken));
    throw;
  }
  HandleSet in_use;
  for (const LoweredInput& input : cut.lowered.inputs) {
    if (input.kind != LoweredInput::kInline) in_use.insert(*input.value->handle);
  }
  cut.frees = recording.takeFrees(in_use);
  // Values with a spec already are marked by a fresh epoch (the liveness marks are done with).
  const uint32_t seen = nextEpoch();
  for (const ValuePtr& v : returned) {
    const bool keep = v->tensors.load(std::memory_order_relaxed) > 0 && v->pending();
    addSpec(cut, v, keep ? OutputAction::kReturnAndKeep : OutputAction::kReturn);
    v->needed_epoch = seen;
  }
  for (const ValuePtr& v : described) {
    addSpec(cut, v, OutputAction::kKeepAndDescribe);
    v->needed_epoch = seen;
  }
  for (const NodePtr& node : cut.nodes) {
    for (const ValuePtr& v : node->outputs) {
      if (v->tensors.load(std::memory_order_relaxed) > 0 && v->needed_epoch != seen) {
        addSpec(cut, v, OutputAction::kKeep);
        v->needed_epoch = seen;
      }
    }
  }
  if (cut.prepared.residency) markResidency(cut, *cut.prepared.residency);
  return cut;
}

void markResidency(Cut& cut, const std::vector<std::pair<uint32_t, uint8_t>>& classes) {
  if (classes.empty()) return;
  for (OutputRow& row : cut.specs) {
    auto it = std::lower_bound(classes.begin(), classes.end(), row.value_id,
                               [](const std::pair<uint32_t, uint8_t>& c, uint32_t id) { return c.first < id; });
    if (it != classes.end() && it->first == row.value_id) row.residency = it->second;
  }
}

Cut::~Cut() {
  for (const NodePtr& node : taken) {
    for (const ValuePtr& v : node->outputs) {
      if (v->producer == node.get()) v->producer = nullptr;
    }
  }
}

void commit(Recording& recording, Cut& cut) {
  // Values of nodes the cut left out were never needed (dead): they stay without a handle.
  for (const NodePtr& node : cut.taken) {
    for (const ValuePtr& v : node->outputs) v->producer = nullptr;
  }
  for (size_t i = 0, k = 0; i < cut.specs.size(); ++i) {
    const OutputRow& row = cut.specs[i];
    if (!row.handle) continue;
    const ValuePtr& v = cut.kept[k++];
    v->handle = row.handle;
    v->residency = row.residency;
    recording.noteResident(v);
  }
}

void restore(Recording& recording, Cut& cut) { recording.restorePending(std::move(cut.taken)); }

void fail(Recording& recording, Cut& cut, int64_t op_index, PyObject* error) {
  const bool known = op_index >= 0 && op_index < static_cast<int64_t>(cut.nodes.size());
  std::unordered_set<const Value*> lost;
  std::unordered_set<const Node*> lost_nodes;
  if (known) {
    for (size_t i = 0; i < cut.nodes.size(); ++i) {
      const Node& node = *cut.nodes[i];
      bool is_lost = static_cast<int64_t>(i) == op_index || (static_cast<int64_t>(i) < op_index && !node.writes.empty());
      for (size_t j = 0; !is_lost && j < node.inputs().size(); ++j) is_lost = lost.count(node.inputs()[j]) != 0;
      if (!is_lost) continue;
      lost_nodes.insert(&node);
      for (const ValuePtr& v : node.outputs) lost.insert(v.get());
    }
  }
  std::unordered_set<const Node*> in_cut;
  for (const NodePtr& node : cut.nodes) in_cut.insert(node.get());
  std::vector<NodePtr> survivors;
  for (NodePtr& node : cut.taken) {
    const bool survives = known && in_cut.count(node.get()) != 0 && lost_nodes.count(node.get()) == 0;
    if (survives) {
      survivors.push_back(std::move(node));
      continue;
    }
    const bool failed = !known || lost_nodes.count(node.get()) != 0;
    for (const ValuePtr& v : node->outputs) {
      v->producer = nullptr;
      if (failed) v->setError(error);
    }
  }
  cut.taken.clear();
  recording.restorePending(std::move(survivors));
}

}  // namespace genie::frontend
