#include "frontend/ir.h"

#include <c10/core/DefaultDtype.h>
#include <algorithm>
#include <atomic>
#include <sstream>

namespace genie::frontend {
namespace {

std::atomic<int64_t> g_sequence{0};

char hexDigit(unsigned v) { return "0123456789abcdef"[v & 15]; }

}  // namespace

Value::Value(c10::intrusive_ptr<Storage> storage_, at::ScalarType dtype_, uint32_t index_, Node* producer_)
    : storage(std::move(storage_)), dtype(dtype_), index(index_), producer(producer_) {}

Value::~Value() {
  if (error == nullptr) return;
  if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing to release
  PyGILState_STATE gil = PyGILState_Ensure();
  Py_CLEAR(error);
  PyGILState_Release(gil);
}

void Value::setError(PyObject* e) {
  Py_XINCREF(e);
  Py_XSETREF(error, e);
}

std::string Value::str() const {
  if (producer != nullptr) return "%" + std::to_string(producer->seq) + "." + std::to_string(index);
  if (!handle) return "<freed>";
  std::string hex = "<resident ";
  const uint64_t hi = handle->hi();
  for (int shift = 60; shift >= 32; shift -= 4) hex += hexDigit(static_cast<unsigned>(hi >> shift));
  return hex + ">";
}

namespace {

c10::SmallVector<ValuePtr, 2> makeOutputs(Node* node, c10::ArrayRef<OutputSpec> specs) {
  c10::SmallVector<ValuePtr, 2> outputs;
  for (size_t i = 0; i < specs.size(); ++i) {
    outputs.push_back(c10::make_intrusive<Value>(specs[i].storage, specs[i].dtype, static_cast<uint32_t>(i), node));
  }
  return outputs;
}

}  // namespace

Node::Node(c10::OperatorHandle op_, const OpFacts& facts_, std::vector<c10::IValue> args_,
           c10::ArrayRef<OutputSpec> specs, std::vector<StoragePtr> writes_, int64_t seq_)
    : op(std::move(op_)), facts(facts_), args(std::move(args_)), outputs(makeOutputs(this, specs)),
      writes(std::move(writes_)), seq(seq_), default_dtype(c10::typeMetaToScalarType(c10::get_default_dtype())) {
  for (const c10::IValue& arg : args) forEachValue(arg, [&](Value* v) { inputs_.push_back(v); });
}

NodePtr Node::make(c10::OperatorHandle op, const OpFacts& facts, std::vector<c10::IValue> args,
                   c10::ArrayRef<OutputSpec> outputs, std::vector<StoragePtr> writes) {
  const int64_t seq = g_sequence.fetch_add(1, std::memory_order_relaxed);
  return NodePtr::reclaim(new Node(std::move(op), facts, std::move(args), outputs, std::move(writes), seq));
}

int64_t nextSeq() { return g_sequence.load(std::memory_order_relaxed); }

uint32_t nextEpoch() {
  static uint32_t epoch = 0;
  return ++epoch == 0 ? ++epoch : epoch;  // 0 never: fields start at 0
}

std::string opNameOf(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::string Node::opName() const { return opNameOf(op); }

namespace {

void show(std::ostream& out, const c10::IValue& arg) {
  if (arg.isCapsule()) {
    out << valueOf(arg)->str();
  } else if (arg.isTensor()) {
    out << "const" << arg.toTensor().sizes();
  } else if (arg.isList()) {
    out << "[";
    bool first = true;
    for (const c10::IValue& x : arg.toListRef()) {
      if (!first) out << ", ";
      first = false;
      show(out, x);
    }
    out << "]";
  } else {
    out << arg;
  }
}

}  // namespace

namespace {

bool isDefault(const c10::Argument& argument, const c10::IValue& value) {
  const auto& fallback = argument.default_value();
  return fallback.has_value() && !value.isCapsule() && !value.isTensor() && *fallback == value;
}

}  // namespace

ShownArgs::ShownArgs(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args) : schema_(schema), args_(args) {
  const auto& arguments = schema.arguments();
  const size_t n = std::min(arguments.size(), args.size());
  while (positional_ < n && !arguments[positional_].kwarg_only()) ++positional_;
  shown_positional_ = positional_;
  while (shown_positional_ > 0 && isDefault(arguments[shown_positional_ - 1], args[shown_positional_ - 1])) {
    --shown_positional_;
  }
}

bool ShownArgs::operator[](size_t i) const {
  if (i < positional_) return i < shown_positional_;
  const auto& arguments = schema_.arguments();
  return i >= arguments.size() || !isDefault(arguments[i], args_[i]);
}

std::string Node::str() const {
  std::ostringstream out;
  for (size_t i = 0; i < outputs.size(); ++i) out << (i ? ", " : "") << "%" << seq << "." << i;
  out << (outputs.empty() ? "" : " = ") << opName() << "(";
  const auto& arguments = schema().arguments();
  const ShownArgs shown(schema(), args);
  bool first = true;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!shown[i]) continue;
    if (!first) out << ", ";
    first = false;
    if (i < arguments.size() && arguments[i].kwarg_only()) out << arguments[i].name() << "=";
    show(out, args[i]);
  }
  out << ")";
  return out.str();
}

c10::IValue capsuleOf(const ValuePtr& value) {
  return c10::IValue::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(value));
}

Value* valueOf(const c10::IValue& arg) {
  if (!arg.isCapsule()) return nullptr;
  return static_cast<Value*>(arg.toCapsule().get());
}

}  // namespace genie::frontend
