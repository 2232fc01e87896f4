// Executor (genie/node/executor.h) and the genie:: operators it adds to the dispatcher.
//
// Over 600 lines: compile() and run() are two halves of one representation, BoundArgument,
// defined only here: the Binder maps each wire argument onto its schema argument once, and run()
// builds the IValue stacks from what it made, so splitting them would split that format.
#include "genie/node/executor.h"

#include "genie/torch/sparse_ops.h"
#include "genie/wire/torch_dtype.h"

#include <ATen/ATen.h>
#include <ATen/core/stack.h>
#include <ATen/ScalarOps.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>
#include <fmt/format.h>
#include <torch/library.h>

#include <mutex>
#include <shared_mutex>
#include <optional>
#include <string_view>

// The operators genie-node adds to the dispatcher; graphs name them like any aten op and the
// executor runs them the same way (boxed, their Device argument rewritten to the node's
// device). They give the clients the node's random generator, which torch.manual_seed,
// torch.get_rng_state and torch.set_rng_state reach locally (python/genie/runtime.py). The
// generator is the node's: sessions that draw concurrently share it, as threads of one
// process share theirs.
//
// genie::manual_seed(Device device, int seed) -> ()
//   Seeds the default generator of `device`; `seed` is the uint64 seed's bits as int64.
// genie::get_rng_state(Device device) -> Tensor
//   Its state: a CPU uint8 tensor (Generator::get_state).
// genie::set_rng_state(Device device, Tensor state) -> ()
//   Restores a state get_rng_state returned (torch.utils.checkpoint does, to replay dropout).
namespace {

/// genie::sparse_parts (include/genie/torch/sparse_ops.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparseParts(const at::Tensor& self) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(self.device());
  if (self.layout() != c10::kSparse) return {at::empty({0}, longs), self, at::zeros({4}, longs)};
  std::vector<int64_t> facts_list{1, self.sparse_dim(), self.dense_dim(), int64_t{self.is_coalesced()}};
  facts_list.insert(facts_list.end(), self.sizes().begin(), self.sizes().end());
  const at::Tensor facts = at::tensor(facts_list, at::TensorOptions().dtype(at::kLong));
  return {self._indices(), self._values(), facts.to(self.device())};
}

}  // namespace

TORCH_LIBRARY(genie, m) {
  m.def(genie::sparse::kPartsSchema);
  m.impl("sparse_parts", torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd, TORCH_FN(sparseParts)));
  m.def("manual_seed(Device device, int seed) -> ()", [](c10::Device device, int64_t seed) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(static_cast<uint64_t>(seed));
  });
  m.def("get_rng_state(Device device) -> Tensor", [](c10::Device device) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  });
  m.def("set_rng_state(Device device, Tensor state) -> ()", [](c10::Device device, const at::Tensor& state) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(state.to(at::kCPU));
  });
}

namespace genie::node {

using wire::Value;

namespace {

/// A tensor with the quantized key set but another dtype: `q.view(torch.uint8)` keeps the key set
/// of a quantized `q` on a plain TensorImpl, and PyTorch's quantized kernels (as_strided, ...)
/// would then read it as a QTensorImpl and crash the process. Refused where an op makes one.
bool misreadQuantized(const at::Tensor& t) {
  return t.defined() && t.is_quantized() && !c10::isQIntType(t.scalar_type());
}
constexpr const char* kMisreadQuantized =
    "viewing a quantized tensor as a tensor of another dtype is not supported (PyTorch's quantized kernels "
    "would read the view as a quantized tensor); use int_repr()";

/// Held shared by every graph run, exclusively by one that changes the default dtype.
std::shared_mutex& defaultDtypeMutex() {
  static std::shared_mutex mutex;
  return mutex;
}

/// Restores the default dtype to float32 (the node's) when it goes out of scope.
struct DefaultDtypeRestore {
  ~DefaultDtypeRestore() { c10::set_default_dtype(c10::scalarTypeToTypeMeta(at::kFloat)); }
};

}  // namespace

/// How one schema argument gets its IValue at run time.
struct BoundArgument {
  enum class Kind : uint8_t {
    kLiteral,             // `literal` as is (ints, floats, None, dtype, device, ...)
    kTensor,              // values[value]
    kHostTensor,          // values[value] in host memory (see kHostTensorArgument)
    kTensorList,          // values[ids...]
    kOptionalTensorList,  // values[ids...], -1 = None
    kIntListWithSlots,    // ints, some taken from scalar slots
    kDoubleListWithSlots, // floats (float[], or Scalar[] as `slot_as` kNumber), some taken from scalar slots
    kScalarSlot,          // scalars[slot], converted to `slot_as`
  };
  enum class SlotAs : uint8_t { kInt, kFloat, kBool, kNumber, kTensor };

  Kind kind = Kind::kLiteral;
  c10::IValue literal;
  uint32_t value = 0;
  std::vector<int64_t> ids;
  std::vector<double> doubles;
  std::vector<int32_t> slots;
  int32_t slot = -1;
  SlotAs slot_as = SlotAs::kNumber;
};

namespace {


// ---- compile: wire argument -> BoundArgument ------------------------------------------

/// The tensor argument PyTorch keeps in host memory whatever the device: a packed sequence's
/// `batch_sizes` (aten::lstm.data, gru.data, _pad_packed_sequence; ATen reads it on the host).
/// Inline inputs are placed on the node's device, so such an argument is passed as a host copy.
constexpr std::string_view kHostTensorArgument = "batch_sizes";

class Binder {
 public:
  Binder(c10::Device device, uint32_t first_output_value) : device_(device), limit_(first_output_value) {}

  /// Binds `value` to an argument of `type`; on failure returns a message.
  std::optional<std::string> bind(const c10::Argument& argument, const c10::TypePtr& type,
                                  const wire::Argument& wire_arg, BoundArgument& out) const {
    const Value kind = wire_arg.value_type();
    if (type->kind() == c10::TypeKind::OptionalType) {
      if (kind == Value::NoneValue) {
        out.literal = c10::IValue();
        return std::nullopt;
      }
      return bind(argument, type->castRaw<c10::OptionalType>()->getElementType(), wire_arg, out);
    }
    if (kind == Value::ScalarInputValue) return bindSlot(type, wire_arg.value_as_ScalarInputValue()->slot(), out);
    switch (type->kind()) {
      case c10::TypeKind::TensorType:
        if (auto number = wrappedNumber(wire_arg)) return literal(*number, out);
        if (kind != Value::TensorValue) break;
        out.kind = argument.name() == kHostTensorArgument ? BoundArgument::Kind::kHostTensor
                                                          : BoundArgument::Kind::kTensor;
        out.value = wire_arg.value_as_TensorValue()->value();
        if (out.value >= limit_) return fmt::format("refers to value {}, not produced before this op", out.value);
        return std::nullopt;
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType:
        if (kind == Value::IntValue) return literal(wire_arg.value_as_IntValue()->v(), out);
        break;
      case c10::TypeKind::FloatType:
      case c10::TypeKind::SymFloatType:
        if (kind == Value::DoubleValue) return literal(wire_arg.value_as_DoubleValue()->v(), out);
        if (kind == Value::IntValue) return literal(static_cast<double>(wire_arg.value_as_IntValue()->v()), out);
        break;
      case c10::TypeKind::BoolType:
      case c10::TypeKind::SymBoolType:
        if (kind == Value::BoolValue) return literal(wire_arg.value_as_BoolValue()->v(), out);
        break;
      case c10::TypeKind::NumberType:
        if (kind == Value::IntValue) return literal(wire_arg.value_as_IntValue()->v(), out);
        if (kind == Value::DoubleValue) return literal(wire_arg.value_as_DoubleValue()->v(), out);
        if (kind == Value::BoolValue) return literal(wire_arg.value_as_BoolValue()->v(), out);
        [[fallthrough]];
      case c10::TypeKind::ComplexType:
        if (kind == Value::ComplexValue) {
          const auto* c = wire_arg.value_as_ComplexValue();
          return literal(c10::complex<double>(c->re(), c->im()), out);
        }
        break;
      case c10::TypeKind::StringType:
        if (kind == Value::StringValue) return literal(std::string(wire::stringOf(wire_arg.value_as_StringValue()->v())), out);
        break;
      case c10::TypeKind::ScalarTypeType: {
        if (kind == Value::IntValue) return literal(wire_arg.value_as_IntValue()->v(), out);
        if (kind != Value::DTypeValue) break;
        auto dtype = Executor::scalarType(wire_arg.value_as_DTypeValue()->v());
        if (!dtype) return std::string("dtype Undefined is not a torch dtype");
        return literal(static_cast<int64_t>(*dtype), out);
      }
      case c10::TypeKind::LayoutType:
        if (kind == Value::LayoutValue) return literal(static_cast<int64_t>(wire_arg.value_as_LayoutValue()->v()), out);
        if (kind == Value::IntValue) return literal(wire_arg.value_as_IntValue()->v(), out);
        break;
      case c10::TypeKind::MemoryFormatType:
        if (kind == Value::MemoryFormatValue) {
          return literal(static_cast<int64_t>(wire_arg.value_as_MemoryFormatValue()->v()), out);
        }
        if (kind == Value::IntValue) return literal(wire_arg.value_as_IntValue()->v(), out);
        break;
      case c10::TypeKind::DeviceObjType:
        // The documented rewrite: whatever device the client named, tensors live here.
        if (kind == Value::DeviceValue || kind == Value::StringValue) return literal(device_, out);
        break;
      case c10::TypeKind::ListType:
        return bindList(argument, type->castRaw<c10::ListType>()->getElementType(), wire_arg, out);
      default:
        return fmt::format("argument type {} is not supported by the executor", type->str());
    }
    return fmt::format("expects {}, got {}", type->str(), wire::EnumNameValue(kind));
  }

 private:
  template <typename T>
  static std::optional<std::string> literal(T v, BoundArgument& out) {
    out.kind = BoundArgument::Kind::kLiteral;
    out.literal = c10::IValue(std::move(v));
    return std::nullopt;
  }

  /// A Python number given for a Tensor argument (`x + 2` reaches __torch_dispatch__ as
  /// aten::add.Tensor(x, 2)): the 0-dim CPU "wrapped number" tensor PyTorch's argument parser
  /// makes, so type promotion treats it as a scalar.
  static std::optional<at::Tensor> wrappedNumber(const wire::Argument& wire_arg) {
    c10::Scalar scalar;
    switch (wire_arg.value_type()) {
      case Value::IntValue: scalar = wire_arg.value_as_IntValue()->v(); break;
      case Value::DoubleValue: scalar = wire_arg.value_as_DoubleValue()->v(); break;
      case Value::BoolValue: scalar = wire_arg.value_as_BoolValue()->v(); break;
      case Value::ComplexValue: {
        const auto* c = wire_arg.value_as_ComplexValue();
        scalar = c10::complex<double>(c->re(), c->im());
        break;
      }
      default: return std::nullopt;
    }
    return wrapNumber(scalar);
  }

 public:
  static at::Tensor wrapNumber(const c10::Scalar& scalar) {
    at::Tensor t = c10::scalar_to_tensor(scalar);
    t.unsafeGetTensorImpl()->set_wrapped_number(true);
    return t;
  }

 private:
  std::optional<std::string> bindSlot(const c10::TypePtr& type, uint32_t slot, BoundArgument& out) const {
    out.kind = BoundArgument::Kind::kScalarSlot;
    out.slot = static_cast<int32_t>(slot);
    switch (type->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType: out.slot_as = BoundArgument::SlotAs::kInt; return std::nullopt;
      case c10::TypeKind::FloatType:
      case c10::TypeKind::SymFloatType: out.slot_as = BoundArgument::SlotAs::kFloat; return std::nullopt;
      case c10::TypeKind::BoolType:
      case c10::TypeKind::SymBoolType: out.slot_as = BoundArgument::SlotAs::kBool; return std::nullopt;
      case c10::TypeKind::NumberType: out.slot_as = BoundArgument::SlotAs::kNumber; return std::nullopt;
      case c10::TypeKind::TensorType: out.slot_as = BoundArgument::SlotAs::kTensor; return std::nullopt;
      default: return fmt::format("a scalar input cannot fill an argument of type {}", type->str());
    }
  }

  /// A DoubleListValue with scalar slots: bound as kDoubleListWithSlots (true), else false.
  static bool doublesWithSlots(const wire::DoubleListValue& list, BoundArgument::SlotAs as, BoundArgument& out) {
    const auto* slots = list.scalar_slots();
    if (slots == nullptr || slots->size() == 0) return false;
    out.kind = BoundArgument::Kind::kDoubleListWithSlots;
    out.doubles = list.v() ? std::vector<double>(list.v()->begin(), list.v()->end()) : std::vector<double>{};
    out.slots.assign(slots->begin(), slots->end());
    out.slot_as = as;
    return true;
  }

  std::optional<std::string> bindList(const c10::Argument& argument, const c10::TypePtr& element,
                                      const wire::Argument& wire_arg, BoundArgument& out) const {
    const Value kind = wire_arg.value_type();
    const c10::TypeKind ek = element->kind();
    // A client that does not know a list's element type writes an empty list as an empty
    // IntListValue: it is the empty list of whatever the schema wants.
    if (kind == Value::IntListValue && isEmpty(*wire_arg.value_as_IntListValue())) return emptyList(element, out);
    if (ek == c10::TypeKind::IntType || ek == c10::TypeKind::SymIntType) {
      if (kind == Value::IntValue && argument.N()) {
        // `int[2] stride=1` given as one int: repeat it, as PyTorch's argument parser does.
        return literal(c10::List<int64_t>(std::vector<int64_t>(*argument.N(), wire_arg.value_as_IntValue()->v())), out);
      }
      if (kind != Value::IntListValue) return fmt::format("expects {}[], got {}", element->str(), wire::EnumNameValue(kind));
      const auto* list = wire_arg.value_as_IntListValue();
      std::vector<int64_t> ints = list->v() ? std::vector<int64_t>(list->v()->begin(), list->v()->end()) : std::vector<int64_t>{};
      const auto* slots = list->scalar_slots();
      if (slots == nullptr || slots->size() == 0) return literal(c10::List<int64_t>(ints), out);
      out.kind = BoundArgument::Kind::kIntListWithSlots;
      out.ids = std::move(ints);
      out.slots.assign(slots->begin(), slots->end());
      return std::nullopt;
    }
    if (ek == c10::TypeKind::FloatType) {
      if (kind == Value::IntListValue) {
        // Integral floats ([1, 2] for a float[] argument) as Python writes them.
        const auto* list = wire_arg.value_as_IntListValue();
        if (list->scalar_slots() && list->scalar_slots()->size()) {
          return std::string("expects float[], got an IntListValue with scalar slots (only int[] takes them)");
        }
        c10::List<double> doubles;
        for (uint32_t i = 0; list->v() && i < list->v()->size(); ++i) doubles.push_back(static_cast<double>(list->v()->Get(i)));
        return literal(std::move(doubles), out);
      }
      if (kind != Value::DoubleListValue) return fmt::format("expects float[], got {}", wire::EnumNameValue(kind));
      if (doublesWithSlots(*wire_arg.value_as_DoubleListValue(), BoundArgument::SlotAs::kFloat, out)) return std::nullopt;
      const auto* v = wire_arg.value_as_DoubleListValue()->v();
      return literal(c10::List<double>(v ? std::vector<double>(v->begin(), v->end()) : std::vector<double>{}), out);
    }
    if (ek == c10::TypeKind::NumberType) {
      // Scalar[] (aten::_foreach_div_.ScalarList: a step size per tensor): a list of numbers,
      // which ATen's unboxing reads from a generic list typed Scalar.
      c10::impl::GenericList scalars(c10::NumberType::get());
      if (kind == Value::DoubleListValue &&
          doublesWithSlots(*wire_arg.value_as_DoubleListValue(), BoundArgument::SlotAs::kNumber, out)) {
        return std::nullopt;
      }
      if (kind == Value::DoubleListValue) {
        const auto* v = wire_arg.value_as_DoubleListValue()->v();
        for (uint32_t i = 0; v && i < v->size(); ++i) scalars.push_back(v->Get(i));
      } else if (kind == Value::IntListValue && !wire_arg.value_as_IntListValue()->scalar_slots()) {
        const auto* v = wire_arg.value_as_IntListValue()->v();
        for (uint32_t i = 0; v && i < v->size(); ++i) scalars.push_back(v->Get(i));
      } else if (kind == Value::BoolListValue) {
        const auto* v = wire_arg.value_as_BoolListValue()->v();
        for (uint32_t i = 0; v && i < v->size(); ++i) scalars.push_back(static_cast<bool>(v->Get(i)));
      } else {
        return fmt::format("expects Scalar[], got {}", wire::EnumNameValue(kind));
      }
      return literal(std::move(scalars), out);
    }
    if (ek == c10::TypeKind::BoolType) {
      if (kind != Value::BoolListValue) return fmt::format("expects bool[], got {}", wire::EnumNameValue(kind));
      const auto* v = wire_arg.value_as_BoolListValue()->v();
      c10::List<bool> bools;
      for (uint32_t i = 0; v && i < v->size(); ++i) bools.push_back(v->Get(i));
      return literal(std::move(bools), out);
    }
    if (ek == c10::TypeKind::TensorType) {
      if (kind != Value::TensorListValue) return fmt::format("expects Tensor[], got {}", wire::EnumNameValue(kind));
      const auto* v = wire_arg.value_as_TensorListValue()->values();
      out.kind = BoundArgument::Kind::kTensorList;
      for (uint32_t i = 0; v && i < v->size(); ++i) {
        if (v->Get(i) >= limit_) return fmt::format("refers to value {}, not produced before this op", v->Get(i));
        out.ids.push_back(v->Get(i));
      }
      return std::nullopt;
    }
    if (isOptionalTensor(element)) {
      if (kind != Value::OptionalTensorListValue && kind != Value::TensorListValue) {
        return fmt::format("expects Tensor?[], got {}", wire::EnumNameValue(kind));
      }
      out.kind = BoundArgument::Kind::kOptionalTensorList;
      if (kind == Value::TensorListValue) {
        const auto* v = wire_arg.value_as_TensorListValue()->values();
        for (uint32_t i = 0; v && i < v->size(); ++i) out.ids.push_back(v->Get(i));
      } else {
        const auto* v = wire_arg.value_as_OptionalTensorListValue()->values();
        for (uint32_t i = 0; v && i < v->size(); ++i) out.ids.push_back(v->Get(i));
      }
      for (int64_t id : out.ids) {
        if (id >= static_cast<int64_t>(limit_)) return fmt::format("refers to value {}, not produced before this op", id);
      }
      return std::nullopt;
    }
    return fmt::format("argument type {}[] is not supported by the executor", element->str());
  }

  static bool isEmpty(const wire::IntListValue& list) { return list.v() == nullptr || list.v()->size() == 0; }

  static bool isOptionalTensor(const c10::TypePtr& element) {
    return element->kind() == c10::TypeKind::OptionalType &&
           element->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType;
  }

  /// The empty list of `element`s, typed as the schema wants it (int[], float[], bool[],
  /// Tensor[], Tensor?[], or a generic list of any other element type).
  static std::optional<std::string> emptyList(const c10::TypePtr& element, BoundArgument& out) {
    switch (element->kind()) {
      case c10::TypeKind::IntType:
      case c10::TypeKind::SymIntType: return literal(c10::List<int64_t>(), out);
      case c10::TypeKind::FloatType: return literal(c10::List<double>(), out);
      case c10::TypeKind::BoolType: return literal(c10::List<bool>(), out);
      case c10::TypeKind::TensorType: out.kind = BoundArgument::Kind::kTensorList; return std::nullopt;
      default: break;
    }
    if (isOptionalTensor(element)) {
      out.kind = BoundArgument::Kind::kOptionalTensorList;
      return std::nullopt;
    }
    return literal(c10::impl::GenericList(element), out);
  }

  c10::Device device_;
  uint32_t limit_;
};

std::string operatorName(const wire::Node& node) {
  std::string_view overload = wire::stringOf(node.overload());
  return fmt::format("{}.{}", wire::stringOf(node.op()), overload.empty() ? "default" : overload);
}

/// Flattens an op's returns into tensors: Tensor, Tensor[], tuples of them; a scalar becomes
/// a 0-dim CPU tensor; None an undefined tensor.
void flattenReturns(const c10::IValue& value, std::vector<at::Tensor>& out) {
  if (value.isTensor()) {
    out.push_back(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) out.push_back(t);
  } else if (value.isTuple()) {
    for (const c10::IValue& element : value.toTupleRef().elements()) flattenReturns(element, out);
  } else if (value.isNone()) {
    out.emplace_back();
  } else if (value.isScalar()) {
    out.push_back(c10::scalar_to_tensor(value.toScalar()));
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) flattenReturns(element, out);
  } else {
    out.emplace_back();
  }
}

}  // namespace

// ---- Executor -------------------------------------------------------------------------

Executor::Executor(c10::Device device) : device_(device) {}

std::optional<c10::ScalarType> Executor::scalarType(wire::DType dtype) { return wire::torchScalarType(dtype); }

wire::DType Executor::wireDType(c10::ScalarType type) { return wire::wireDTypeOf(type); }

Result<std::shared_ptr<const CompiledGraph>> Executor::compile(const wire::Graph& graph) const {
  auto compiled = std::make_shared<CompiledGraph>();
  compiled->num_inputs_ = graph.inputs() ? graph.inputs()->size() : 0;
  compiled->input_handles_.resize(compiled->num_inputs_);
  for (uint32_t i = 0; i < compiled->num_inputs_; ++i) {
    if (const wire::Handle* handle = graph.inputs()->Get(i)->handle()) compiled->input_handles_[i] = *handle;
  }
  compiled->num_scalar_inputs_ = graph.num_scalar_inputs();
  uint64_t next_value = compiled->num_inputs_;
  const auto* nodes = graph.nodes();
  for (uint32_t index = 0; nodes && index < nodes->size(); ++index) {
    const wire::Node& wire_node = *nodes->Get(index);
    std::string name = operatorName(wire_node);
    auto fail = [&](wire::ErrorCode code, std::string message) {
      return wire::requestError(code, std::move(message), static_cast<int32_t>(index), name);
    };
    std::optional<c10::OperatorHandle> op = c10::Dispatcher::singleton().findSchema(
        {std::string(wire::stringOf(wire_node.op())), std::string(wire::stringOf(wire_node.overload()))});
    if (!op) return fail(wire::ErrorCode::UnknownOp, "no such operator or overload is registered");
    const auto& schema_args = op->schema().arguments();
    std::vector<const wire::Argument*> assigned(schema_args.size(), nullptr);
    size_t positional = 0;
    const auto* args = wire_node.args();
    for (uint32_t a = 0; args && a < args->size(); ++a) {
      const wire::Argument* arg = args->Get(a);
      std::string_view arg_name = wire::stringOf(arg->name());
      size_t slot = 0;
      if (arg_name.empty()) {
        while (positional < schema_args.size() && schema_args[positional].kwarg_only()) ++positional;
        if (positional >= schema_args.size()) {
          return fail(wire::ErrorCode::SchemaMismatch,
                      fmt::format("{} positional arguments given, the schema takes {}", a + 1, schema_args.size()));
        }
        slot = positional++;
      } else {
        auto found = std::find_if(schema_args.begin(), schema_args.end(),
                                  [&](const c10::Argument& s) { return s.name() == arg_name; });
        if (found == schema_args.end()) {
          return fail(wire::ErrorCode::SchemaMismatch, fmt::format("the schema has no argument '{}'", arg_name));
        }
        slot = static_cast<size_t>(found - schema_args.begin());
      }
      if (assigned[slot] != nullptr) {
        return fail(wire::ErrorCode::SchemaMismatch, fmt::format("argument '{}' given twice", schema_args[slot].name()));
      }
      assigned[slot] = arg;
    }
    CompiledGraph::Node node{*op, name, {}, wire_node.num_outputs(), static_cast<uint32_t>(next_value)};
    Binder binder(device_, static_cast<uint32_t>(next_value));
    node.arguments.resize(schema_args.size());
    for (size_t s = 0; s < schema_args.size(); ++s) {
      const c10::Argument& schema_arg = schema_args[s];
      if (assigned[s] == nullptr) {
        if (!schema_arg.default_value()) {
          return fail(wire::ErrorCode::SchemaMismatch, fmt::format("missing argument '{}' ({})", schema_arg.name(),
                                                                  schema_arg.type()->str()));
        }
        node.arguments[s].literal = *schema_arg.default_value();
        // A device default (e.g. None) stays; devices given explicitly are rewritten.
        continue;
      }
      if (auto error = binder.bind(schema_arg, schema_arg.real_type(), *assigned[s], node.arguments[s])) {
        return fail(wire::ErrorCode::SchemaMismatch, fmt::format("argument '{}': {}", schema_arg.name(), *error));
      }
      const BoundArgument& bound = node.arguments[s];
      if (bound.kind == BoundArgument::Kind::kScalarSlot && bound.slot >= static_cast<int32_t>(compiled->num_scalar_inputs_)) {
        return fail(wire::ErrorCode::SchemaMismatch, fmt::format("argument '{}': scalar slot {} out of range",
                                                                schema_arg.name(), bound.slot));
      }
    }
    if (wire_node.default_dtype() != wire::DType::Undefined) {
      node.default_dtype = scalarType(wire_node.default_dtype());
      if (!node.default_dtype || !c10::isFloatingType(*node.default_dtype)) {
        return fail(wire::ErrorCode::SchemaMismatch,
                    fmt::format("default dtype {} is not a floating point dtype", wire::dtypeName(wire_node.default_dtype())));
      }
      compiled->sets_default_dtype_ = true;
    }
    next_value += node.num_outputs;
    compiled->nodes_.push_back(std::move(node));
  }
  compiled->num_values_ = next_value;
  // Last reader of each value (-1: none); a value nobody reads is dead once it is made.
  std::vector<int64_t> last(next_value, -1);
  for (size_t index = 0; index < compiled->nodes_.size(); ++index) {
    for (const BoundArgument& arg : compiled->nodes_[index].arguments) {
      if (arg.kind == BoundArgument::Kind::kTensor || arg.kind == BoundArgument::Kind::kHostTensor) {
        last[arg.value] = static_cast<int64_t>(index);
      } else if (arg.kind == BoundArgument::Kind::kTensorList || arg.kind == BoundArgument::Kind::kOptionalTensorList) {
        for (int64_t id : arg.ids) {
          if (id >= 0) last[static_cast<size_t>(id)] = static_cast<int64_t>(index);
        }
      }
    }
  }
  compiled->dead_after_.resize(compiled->nodes_.size());
  for (size_t index = 0; index < compiled->nodes_.size(); ++index) {
    const CompiledGraph::Node& node = compiled->nodes_[index];
    for (uint32_t k = 0; k < node.num_outputs; ++k) {
      if (last[node.first_output_value + k] < 0) last[node.first_output_value + k] = static_cast<int64_t>(index);
    }
  }
  for (size_t v = 0; v < last.size(); ++v) {
    if (last[v] >= 0) compiled->dead_after_[static_cast<size_t>(last[v])].push_back(static_cast<uint32_t>(v));
  }
  return std::shared_ptr<const CompiledGraph>(std::move(compiled));
}

namespace {

c10::IValue slotValue(const ScalarSlotValue& value, BoundArgument::SlotAs as) {
  return std::visit(
      [as](auto v) -> c10::IValue {
        switch (as) {
          case BoundArgument::SlotAs::kInt: return c10::IValue(static_cast<int64_t>(v));
          case BoundArgument::SlotAs::kFloat: return c10::IValue(static_cast<double>(v));
          case BoundArgument::SlotAs::kBool: return c10::IValue(static_cast<bool>(v));
          case BoundArgument::SlotAs::kNumber: return c10::IValue(v);
          case BoundArgument::SlotAs::kTensor: return c10::IValue(Binder::wrapNumber(c10::Scalar(v)));
        }
        return c10::IValue(v);
      },
      value);
}

int64_t slotInt(const ScalarSlotValue& value) {
  return std::visit([](auto v) { return static_cast<int64_t>(v); }, value);
}

double slotDouble(const ScalarSlotValue& value) {
  return std::visit([](auto v) { return static_cast<double>(v); }, value);
}

}  // namespace

Result<std::vector<at::Tensor>> Executor::run(const CompiledGraph& graph, std::span<const at::Tensor> inputs,
                                              std::span<const ScalarSlotValue> scalars,
                                              const std::optional<std::string>* out_of_memory,
                                              std::optional<std::span<const uint64_t>> needed) const {
  if (inputs.size() != graph.numInputs()) {
    return wire::requestError(wire::ErrorCode::SchemaMismatch,
                              fmt::format("the graph takes {} tensor inputs, {} given", graph.numInputs(), inputs.size()));
  }
  if (scalars.size() != graph.numScalarInputs()) {
    return wire::requestError(wire::ErrorCode::SchemaMismatch, fmt::format("the graph takes {} scalars, {} given",
                                                                           graph.numScalarInputs(), scalars.size()));
  }
  // Captured graphs are below autograd already (the frontend records at __torch_dispatch__,
  // where backward ops appear as ops of their own), so the node runs them without it.
  c10::InferenceMode no_autograd;
  std::vector<at::Tensor> values(graph.numValues());
  std::copy(inputs.begin(), inputs.end(), values.begin());
  std::vector<bool> keep;  // empty: keep every value
  if (needed) {
    keep.assign(values.size(), false);
    for (uint64_t v : *needed) {
      if (v < keep.size()) keep[v] = true;
    }
  }
  auto drop_dead = [&](size_t index) {
    if (keep.empty()) return;
    for (uint32_t v : graph.deadAfter(index)) {
      if (!keep[v]) values[v].reset();
    }
  };
  // The default dtype is the process's (c10::get_default_dtype): a graph whose ops run with
  // another one holds every other run off meanwhile, and restores float32 after.
  std::shared_lock<std::shared_mutex> shared_default(defaultDtypeMutex(), std::defer_lock);
  std::unique_lock<std::shared_mutex> own_default(defaultDtypeMutex(), std::defer_lock);
  std::optional<DefaultDtypeRestore> restore_default;
  if (graph.setsDefaultDtype()) {
    own_default.lock();
    restore_default.emplace();
  } else {
    shared_default.lock();
  }
  torch::jit::Stack stack;
  std::vector<at::Tensor> outputs;
  const auto& nodes = graph.nodes();
  for (size_t index = 0; index < nodes.size(); ++index) {
    const CompiledGraph::Node& node = nodes[index];
    if (restore_default) c10::set_default_dtype(c10::scalarTypeToTypeMeta(node.default_dtype.value_or(at::kFloat)));
    stack.clear();
    stack.reserve(node.arguments.size());
    for (const BoundArgument& arg : node.arguments) {
      switch (arg.kind) {
        case BoundArgument::Kind::kLiteral: stack.push_back(arg.literal); break;
        case BoundArgument::Kind::kTensor: stack.emplace_back(values[arg.value]); break;
        case BoundArgument::Kind::kHostTensor: {
          const at::Tensor& t = values[arg.value];
          stack.emplace_back(t.is_cpu() ? t : t.cpu());
          break;
        }
        case BoundArgument::Kind::kTensorList: {
          c10::List<at::Tensor> list;
          list.reserve(arg.ids.size());
          for (int64_t id : arg.ids) list.push_back(values[id]);
          stack.emplace_back(std::move(list));
          break;
        }
        case BoundArgument::Kind::kOptionalTensorList: {
          c10::List<std::optional<at::Tensor>> list;
          list.reserve(arg.ids.size());
          for (int64_t id : arg.ids) list.push_back(id < 0 ? std::nullopt : std::optional<at::Tensor>(values[id]));
          stack.emplace_back(std::move(list));
          break;
        }
        case BoundArgument::Kind::kIntListWithSlots: {
          std::vector<int64_t> ints = arg.ids;
          for (size_t i = 0; i < arg.slots.size() && i < ints.size(); ++i) {
            if (arg.slots[i] >= 0) ints[i] = slotInt(scalars[arg.slots[i]]);
          }
          stack.emplace_back(c10::List<int64_t>(ints));
          break;
        }
        case BoundArgument::Kind::kDoubleListWithSlots: {
          std::vector<double> doubles = arg.doubles;
          for (size_t i = 0; i < arg.slots.size() && i < doubles.size(); ++i) {
            if (arg.slots[i] >= 0) doubles[i] = slotDouble(scalars[arg.slots[i]]);
          }
          if (arg.slot_as == BoundArgument::SlotAs::kNumber) {
            c10::impl::GenericList numbers(c10::NumberType::get());
            for (double d : doubles) numbers.push_back(d);
            stack.emplace_back(std::move(numbers));
          } else {
            stack.emplace_back(c10::List<double>(doubles));
          }
          break;
        }
        case BoundArgument::Kind::kScalarSlot: stack.push_back(slotValue(scalars[arg.slot], arg.slot_as)); break;
      }
    }
    auto fail = [&](wire::ErrorCode code, std::string message, std::string error_class = {}) {
      return wire::requestError(code, std::move(message), static_cast<int32_t>(index), node.name,
                                std::move(error_class));
    };
    try {
      node.op.callBoxed(stack);
    } catch (const c10::OutOfMemoryError& e) {
      return fail(wire::ErrorCode::OutOfMemory, e.what_without_backtrace(), c10::demangle(typeid(e).name()));
    } catch (const c10::Error& e) {
      // The dynamic class (c10::IndexError, c10::ValueError, ...): the client raises the
      // Python exception eager would (torch/csrc/Exceptions.h maps them the same way).
      return fail(wire::ErrorCode::TorchError, e.what_without_backtrace(), c10::demangle(typeid(e).name()));
    } catch (const std::bad_alloc& e) {
      return fail(wire::ErrorCode::OutOfMemory, fmt::format("the host could not allocate memory ({})", e.what()),
                  "std::bad_alloc");
    } catch (const std::exception& e) {
      return fail(wire::ErrorCode::TorchError, e.what(), c10::demangle(typeid(e).name()));
    }
    if (out_of_memory != nullptr && out_of_memory->has_value()) {
      return fail(wire::ErrorCode::OutOfMemory, **out_of_memory);
    }
    if (stack.size() == 1 && stack[0].isTensor() && node.num_outputs == 1) {  // the common case
      if (misreadQuantized(stack[0].toTensor())) return fail(wire::ErrorCode::TorchError, kMisreadQuantized);
      values[node.first_output_value] = std::move(stack[0]).toTensor();
      drop_dead(index);
      continue;
    }
    outputs.clear();
    for (const c10::IValue& value : stack) flattenReturns(value, outputs);
    if (outputs.size() != node.num_outputs) {
      return fail(wire::ErrorCode::SchemaMismatch, fmt::format("produced {} tensors, the graph expects {}",
                                                              outputs.size(), node.num_outputs));
    }
    for (const at::Tensor& t : outputs) {
      if (misreadQuantized(t)) return fail(wire::ErrorCode::TorchError, kMisreadQuantized);
    }
    for (size_t k = 0; k < outputs.size(); ++k) values[node.first_output_value + k] = std::move(outputs[k]);
    drop_dead(index);
  }
  return values;
}

}  // namespace genie::node
