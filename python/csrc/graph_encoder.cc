// encode_graph: Python node lists -> a serialized wire Graph (schemas/genie.fbs), the bytes
// RegisterGraph carries. Values map to the wire's Value union by Python type; the node's
// executor then binds each value against the op's schema (src/node/executor.cc).
// The result is verified (wire::verifyGraph) before it is returned, so a malformed graph fails
// here (ValueError) rather than on the node.
// decode_graph: the inverse, a serialized Graph -> the same Python lists (verified first).
#include <pybind11/pybind11.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include <torch/csrc/Device.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Layout.h>
#include <torch/csrc/MemoryFormat.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "genie/wire/codec.h"
#include "genie/wire/torch_dtype.h"

namespace genie::python {
namespace {

namespace fb = flatbuffers;
using wire::Value;

/// Marks an argument as graph value `value` (a graph input or an earlier node's output).
struct TensorRef {
  uint32_t value = 0;
};
/// Marks an argument (or an int-list element) as scalar input `slot` (RunGraph.scalars).
struct ScalarSlot {
  uint32_t slot = 0;
};

using Encoded = std::pair<Value, fb::Offset<void>>;

/// Where an argument is, for error messages: "nodes[3] (aten::add.Tensor) argument 1 ('alpha')".
struct ArgumentPlace {
  size_t node = 0;
  std::string op;
  size_t arg = 0;
  std::string name;
  const char* function = "encode_graph";

  std::string str() const {
    return std::string(function) + ": nodes[" + std::to_string(node) + "] (" + op + ") argument " + std::to_string(arg) +
           (name.empty() ? "" : " ('" + name + "')");
  }
};

class Encoder {
 public:
  explicit Encoder(fb::FlatBufferBuilder& fbb) : fbb_(fbb) {}

  Encoded value(py::handle v, const ArgumentPlace& place) {
    PyObject* o = v.ptr();
    if (v.is_none()) return {Value::NoneValue, wire::CreateNoneValue(fbb_).Union()};
    if (py::isinstance<TensorRef>(v)) {
      return {Value::TensorValue, wire::CreateTensorValue(fbb_, v.cast<const TensorRef&>().value).Union()};
    }
    if (py::isinstance<ScalarSlot>(v)) {
      return {Value::ScalarInputValue, wire::CreateScalarInputValue(fbb_, v.cast<const ScalarSlot&>().slot).Union()};
    }
    if (PyBool_Check(o)) return {Value::BoolValue, wire::CreateBoolValue(fbb_, o == Py_True).Union()};
    if (PyLong_Check(o)) return {Value::IntValue, wire::CreateIntValue(fbb_, intOf(v, place)).Union()};
    if (PyFloat_Check(o)) return {Value::DoubleValue, wire::createDoubleValue(fbb_, PyFloat_AsDouble(o)).Union()};
    if (PyComplex_Check(o)) {
      return {Value::ComplexValue,
              wire::createComplexValue(fbb_, PyComplex_RealAsDouble(o), PyComplex_ImagAsDouble(o)).Union()};
    }
    if (PyUnicode_Check(o)) {
      auto s = fbb_.CreateString(v.cast<std::string>());
      return {Value::StringValue, wire::CreateStringValue(fbb_, s).Union()};
    }
    if (THPDtype_Check(o)) {
      const c10::ScalarType type = reinterpret_cast<THPDtype*>(o)->scalar_type;
      const wire::DType dtype = wire::wireDTypeOf(type);
      if (dtype == wire::DType::Undefined) {
        throw py::type_error(place.str() + ": dtype " + std::string(c10::toString(type)) + " has no wire dtype");
      }
      return {Value::DTypeValue, wire::CreateDTypeValue(fbb_, dtype).Union()};
    }
    if (THPLayout_Check(o)) {
      const auto layout = static_cast<int8_t>(reinterpret_cast<THPLayout*>(o)->layout);
      return {Value::LayoutValue, wire::CreateLayoutValue(fbb_, layout).Union()};
    }
    if (THPMemoryFormat_Check(o)) {
      const auto format = static_cast<int8_t>(reinterpret_cast<THPMemoryFormat*>(o)->memory_format);
      return {Value::MemoryFormatValue, wire::CreateMemoryFormatValue(fbb_, format).Union()};
    }
    if (THPDevice_Check(o)) {
      const c10::Device device = reinterpret_cast<THPDevice*>(o)->device;
      auto type = fbb_.CreateString(c10::DeviceTypeName(device.type(), /*lower_case=*/true));
      return {Value::DeviceValue, wire::CreateDeviceValue(fbb_, type, device.index()).Union()};
    }
    if (PyList_Check(o) || PyTuple_Check(o)) return list(py::reinterpret_borrow<py::sequence>(v), place);
    throw py::type_error(place.str() + ": cannot encode a value of Python type " + typeName(v));
  }

 private:
  int64_t intOf(py::handle v, const ArgumentPlace& place) const {
    int overflow = 0;
    const long long i = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
    if (overflow != 0) throw py::value_error(place.str() + ": int " + std::string(py::str(v)) + " does not fit int64");
    return i;
  }

  /// Lists by their elements' types (see encode_graph's docstring).
  Encoded list(const py::sequence& items, const ArgumentPlace& place) {
    size_t refs = 0, nones = 0, bools = 0, ints = 0, slots = 0, floats = 0;
    for (py::handle item : items) {
      PyObject* o = item.ptr();
      if (py::isinstance<TensorRef>(item)) {
        ++refs;
      } else if (item.is_none()) {
        ++nones;
      } else if (PyBool_Check(o)) {
        ++bools;
      } else if (PyLong_Check(o)) {
        ++ints;
      } else if (py::isinstance<ScalarSlot>(item)) {
        ++slots;
      } else if (PyFloat_Check(o)) {
        ++floats;
      } else {
        throw py::type_error(place.str() + ": cannot encode a list element of Python type " + typeName(item));
      }
    }
    const size_t n = items.size();
    if (n == 0) return {Value::IntListValue, wire::CreateIntListValue(fbb_, fbb_.CreateVector<int64_t>({})).Union()};
    if (refs == n) {
      std::vector<uint32_t> values;
      for (py::handle item : items) values.push_back(item.cast<const TensorRef&>().value);
      return {Value::TensorListValue, wire::CreateTensorListValue(fbb_, fbb_.CreateVector(values)).Union()};
    }
    if (refs + nones == n && nones > 0) {
      std::vector<int64_t> values;
      for (py::handle item : items) values.push_back(item.is_none() ? int64_t{-1} : int64_t{item.cast<const TensorRef&>().value});
      return {Value::OptionalTensorListValue,
              wire::CreateOptionalTensorListValue(fbb_, fbb_.CreateVector(values)).Union()};
    }
    if (bools == n) {
      std::vector<uint8_t> values;
      for (py::handle item : items) values.push_back(item.ptr() == Py_True);
      return {Value::BoolListValue, wire::CreateBoolListValue(fbb_, fbb_.CreateVector(values)).Union()};
    }
    if (ints + slots == n) {
      // The executor takes element i from scalar input scalar_slots[i] when it is >= 0
      // (v[i] is then 0 and unused); with no ScalarSlot, scalar_slots is left empty.
      std::vector<int64_t> values;
      std::vector<int32_t> slot_of;
      for (py::handle item : items) {
        const bool is_slot = py::isinstance<ScalarSlot>(item);
        values.push_back(is_slot ? 0 : intOf(item, place));
        slot_of.push_back(is_slot ? static_cast<int32_t>(item.cast<const ScalarSlot&>().slot) : -1);
      }
      auto v = fbb_.CreateVector(values);
      auto s = slots > 0 ? fbb_.CreateVector(slot_of) : fb::Offset<fb::Vector<int32_t>>();
      return {Value::IntListValue, wire::CreateIntListValue(fbb_, v, s).Union()};
    }
    if (ints + floats == n) {
      std::vector<double> values;
      for (py::handle item : items) values.push_back(py::cast<double>(item));
      return {Value::DoubleListValue, wire::CreateDoubleListValue(fbb_, fbb_.CreateVector(values)).Union()};
    }
    throw py::type_error(place.str() + ": cannot encode a list mixing these element types (" +
                         std::to_string(refs) + " TensorRef, " + std::to_string(nones) + " None, " +
                         std::to_string(bools) + " bool, " + std::to_string(ints) + " int, " + std::to_string(slots) +
                         " ScalarSlot, " + std::to_string(floats) + " float)");
  }

  fb::FlatBufferBuilder& fbb_;
};

py::tuple tupleOf(py::handle obj, size_t n, const std::string& what) {
  if (!PyTuple_Check(obj.ptr()) && !PyList_Check(obj.ptr())) {
    throw py::type_error(what + ": expected a tuple of " + std::to_string(n) + ", got " + typeName(obj));
  }
  py::tuple t = py::tuple(py::reinterpret_borrow<py::sequence>(obj));
  if (t.size() != n) {
    throw py::value_error(what + ": expected a tuple of " + std::to_string(n) + ", got " + std::to_string(t.size()));
  }
  return t;
}

fb::Offset<wire::GraphInput> encodeInput(fb::FlatBufferBuilder& fbb, py::handle item, size_t i) {
  const std::string what = "encode_graph: inputs[" + std::to_string(i) + "]";
  py::tuple input = tupleOf(item, 2, what);
  fb::Offset<wire::TensorDesc> desc;
  if (!input[0].is_none()) {
    if (!THPDtype_Check(input[0].ptr())) {
      throw py::type_error(what + ": expected a torch.dtype or None, got " + typeName(input[0]));
    }
    const c10::ScalarType type = reinterpret_cast<THPDtype*>(input[0].ptr())->scalar_type;
    const wire::DType dtype = wire::wireDTypeOf(type);
    if (dtype == wire::DType::Undefined) {
      throw py::type_error(what + ": dtype " + std::string(c10::toString(type)) + " has no wire dtype");
    }
    desc = *wire::createTensorDesc(fbb, dtype, {});  // the dtype only: shape unknown (empty)
  }
  std::optional<wire::Handle> handle;
  if (!input[1].is_none()) handle = idOf<wire::Handle>(input[1], what + " handle");
  return wire::CreateGraphInput(fbb, wire::InputKind::Tensor, desc, handle ? &*handle : nullptr);
}

fb::Offset<wire::Node> encodeNode(fb::FlatBufferBuilder& fbb, Encoder& encoder, py::handle item, size_t i) {
  const std::string what = "encode_graph: nodes[" + std::to_string(i) + "]";
  py::tuple node = tupleOf(item, 4, what);
  const auto op = node[0].cast<std::string>();
  const auto overload = node[1].cast<std::string>();
  if (!PyList_Check(node[2].ptr()) && !PyTuple_Check(node[2].ptr())) {
    throw py::type_error(what + ": args must be a list of (name, value), got " + typeName(node[2]));
  }
  const auto num_outputs = node[3].cast<uint32_t>();
  ArgumentPlace place{i, op + "." + (overload.empty() ? "default" : overload), 0, {}};
  std::vector<fb::Offset<wire::Argument>> args;
  size_t index = 0;
  for (py::handle arg_item : py::reinterpret_borrow<py::sequence>(node[2])) {
    place.arg = index++;
    py::tuple arg = tupleOf(arg_item, 2, place.str());
    place.name = arg[0].cast<std::string>();
    auto [type, value] = encoder.value(arg[1], place);
    auto name = place.name.empty() ? fb::Offset<fb::String>() : fbb.CreateString(place.name);
    args.push_back(wire::CreateArgument(fbb, name, type, value));
  }
  auto op_offset = fbb.CreateString(op);
  auto overload_offset = fbb.CreateString(overload);
  auto args_offset = fbb.CreateVector(args);
  return wire::CreateNode(fbb, op_offset, overload_offset, args_offset, num_outputs);
}

py::bytes encodeGraph(const py::list& inputs, uint32_t num_scalar_inputs, const py::list& nodes,
                      const std::string& name) {
  fb::FlatBufferBuilder fbb(1024);
  std::vector<fb::Offset<wire::GraphInput>> input_offsets;
  for (size_t i = 0; i < inputs.size(); ++i) input_offsets.push_back(encodeInput(fbb, inputs[i], i));
  Encoder encoder(fbb);
  std::vector<fb::Offset<wire::Node>> node_offsets;
  for (size_t i = 0; i < nodes.size(); ++i) node_offsets.push_back(encodeNode(fbb, encoder, nodes[i], i));
  auto name_offset = name.empty() ? fb::Offset<fb::String>() : fbb.CreateString(name);
  auto graph = wire::CreateGraph(fbb, name_offset, fbb.CreateVector(input_offsets), num_scalar_inputs,
                                 fbb.CreateVector(node_offsets));
  wire::finishGraph(fbb, graph);
  auto bytes = std::span<const std::byte>(reinterpret_cast<const std::byte*>(fbb.GetBufferPointer()), fbb.GetSize());
  auto verified = wire::verifyGraph(bytes);
  if (!verified) throw py::value_error("encode_graph: " + verified.status().message());
  return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}


// ---- decode_graph: wire Graph -> Python lists (the inverse of the above) ---------------

class Decoder {
 public:
  py::object value(const wire::Argument& arg, const ArgumentPlace& place) const {
    switch (arg.value_type()) {
      case Value::NoneValue: return py::none();
      case Value::TensorValue: return py::cast(TensorRef{arg.value_as_TensorValue()->value()});
      case Value::ScalarInputValue: return py::cast(ScalarSlot{arg.value_as_ScalarInputValue()->slot()});
      case Value::IntValue: return py::int_(arg.value_as_IntValue()->v());
      case Value::DoubleValue: return py::float_(arg.value_as_DoubleValue()->v());
      case Value::BoolValue: return py::bool_(arg.value_as_BoolValue()->v());
      case Value::ComplexValue: {
        const auto* c = arg.value_as_ComplexValue();
        return py::reinterpret_steal<py::object>(PyComplex_FromDoubles(c->re(), c->im()));
      }
      case Value::StringValue: return py::str(std::string(wire::stringOf(arg.value_as_StringValue()->v())));
      case Value::DTypeValue: return dtype(arg.value_as_DTypeValue()->v(), place.str());
      case Value::LayoutValue: {
        const int8_t v = arg.value_as_LayoutValue()->v();
        if (v < 0 || v >= static_cast<int8_t>(c10::Layout::NumOptions)) {
          throw py::value_error(place.str() + ": layout " + std::to_string(v) + " is not a torch.layout");
        }
        return borrowed(reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v))));
      }
      case Value::MemoryFormatValue: {
        const int8_t v = arg.value_as_MemoryFormatValue()->v();
        if (v < 0 || v >= static_cast<int8_t>(c10::MemoryFormat::NumOptions)) {
          throw py::value_error(place.str() + ": memory format " + std::to_string(v) + " is not a torch.memory_format");
        }
        return borrowed(torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v)));
      }
      case Value::DeviceValue: return device(*arg.value_as_DeviceValue(), place);
      case Value::IntListValue: return liftableList<py::int_>(*arg.value_as_IntListValue());
      case Value::DoubleListValue: return liftableList<py::float_>(*arg.value_as_DoubleListValue());
      case Value::BoolListValue: {
        py::list out;
        const auto* v = arg.value_as_BoolListValue()->v();
        for (uint32_t i = 0; v && i < v->size(); ++i) out.append(py::bool_(v->Get(i) != 0));
        return out;
      }
      case Value::TensorListValue: {
        py::list out;
        const auto* v = arg.value_as_TensorListValue()->values();
        for (uint32_t i = 0; v && i < v->size(); ++i) out.append(py::cast(TensorRef{v->Get(i)}));
        return out;
      }
      case Value::OptionalTensorListValue: {
        py::list out;
        const auto* v = arg.value_as_OptionalTensorListValue()->values();
        for (uint32_t i = 0; v && i < v->size(); ++i) {
          const int64_t id = v->Get(i);
          out.append(id < 0 ? py::none() : py::cast(TensorRef{static_cast<uint32_t>(id)}));
        }
        return out;
      }
      default: break;  // NONE and unknown members: rejected by verifyGraph
    }
    throw py::value_error(place.str() + ": cannot decode a " + std::string(wire::EnumNameValue(arg.value_type())));
  }

  static py::object dtype(wire::DType dtype, const std::string& where) {
    const auto type = wire::torchScalarType(dtype);
    if (!type) throw py::value_error(where + ": " + std::string(wire::dtypeName(dtype)) + " is not a torch dtype");
    return borrowed(reinterpret_cast<PyObject*>(torch::getTHPDtype(*type)));
  }

 private:
  /// getTHP* return borrowed references, null when torch has no object for the value.
  static py::object borrowed(PyObject* o) {
    if (o == nullptr) throw py::value_error("decode_graph: torch has no Python object for this value");
    return py::reinterpret_borrow<py::object>(o);
  }

  /// An int or float list: its elements, ScalarSlot(s) where scalar_slots[i] >= 0.
  template <typename PyT, typename List>
  static py::list liftableList(const List& list) {
    const auto* slots = list.scalar_slots();
    py::list out;
    for (uint32_t i = 0; list.v() && i < list.v()->size(); ++i) {
      const bool is_slot = slots && slots->size() > i && slots->Get(i) >= 0;
      out.append(is_slot ? py::cast(ScalarSlot{static_cast<uint32_t>(slots->Get(i))}) : py::object(PyT(list.v()->Get(i))));
    }
    return out;
  }

  /// torch.device(type, index), or the type string as is when torch does not know the type.
  static py::object device(const wire::DeviceValue& d, const ArgumentPlace& place) {
    const std::string type(wire::stringOf(d.type()));
    if (d.index() < -1 || d.index() > std::numeric_limits<c10::DeviceIndex>::max()) {
      throw py::value_error(place.str() + ": device index " + std::to_string(d.index()) + " is out of range");
    }
    std::optional<c10::Device> parsed;
    try {
      parsed = c10::Device(type);
      if (d.index() >= 0) parsed = c10::Device(parsed->type(), static_cast<c10::DeviceIndex>(d.index()));
    } catch (const c10::Error&) {
      return py::str(type);
    }
    return py::reinterpret_steal<py::object>(THPDevice_New(*parsed));
  }
};

py::tuple decodeGraph(const py::bytes& graph_bytes) {
  std::string_view bytes = graph_bytes;
  // verifyGraph wants kHeaderAlignment-aligned storage; a bytes object's data need not be.
  std::vector<uint64_t> aligned((bytes.size() + sizeof(uint64_t) - 1) / sizeof(uint64_t));
  if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
  auto verified = wire::verifyGraph(std::as_bytes(std::span<const uint64_t>(aligned)).first(bytes.size()));
  if (!verified) throw py::value_error("decode_graph: " + verified.status().message());
  const wire::Graph& graph = **verified;

  py::list inputs;
  for (uint32_t i = 0; graph.inputs() && i < graph.inputs()->size(); ++i) {
    const wire::GraphInput& input = *graph.inputs()->Get(i);
    py::object dtype = py::none();
    if (input.desc() && input.desc()->dtype() != wire::DType::Undefined) {
      dtype = Decoder::dtype(input.desc()->dtype(), "decode_graph: inputs[" + std::to_string(i) + "]");
    }
    py::object handle = input.handle() ? py::object(bytesOfId(*input.handle())) : py::none();
    inputs.append(py::make_tuple(dtype, handle));
  }
  Decoder decoder;
  py::list nodes;
  for (uint32_t i = 0; graph.nodes() && i < graph.nodes()->size(); ++i) {
    const wire::Node& node = *graph.nodes()->Get(i);
    const std::string op(wire::stringOf(node.op()));
    const std::string overload(wire::stringOf(node.overload()));
    ArgumentPlace place{i, op + "." + (overload.empty() ? "default" : overload), 0, {}, "decode_graph"};
    py::list args;
    for (uint32_t a = 0; node.args() && a < node.args()->size(); ++a) {
      const wire::Argument& arg = *node.args()->Get(a);
      place.arg = a;
      place.name = std::string(wire::stringOf(arg.name()));
      args.append(py::make_tuple(place.name, decoder.value(arg, place)));
    }
    nodes.append(py::make_tuple(op, overload, args, node.num_outputs()));
  }
  return py::make_tuple(inputs, graph.num_scalar_inputs(), nodes);
}

}  // namespace

void bindGraphEncoder(py::module_& m) {
  py::class_<TensorRef>(m, "TensorRef", "A graph value as an op argument (encode_graph): .value is its id.")
      .def(py::init([](uint32_t value) { return TensorRef{value}; }), py::arg("value"))
      .def_readonly("value", &TensorRef::value)
      .def("__repr__", [](const TensorRef& r) { return "TensorRef(" + std::to_string(r.value) + ")"; });
  py::class_<ScalarSlot>(m, "ScalarSlot", "A scalar input slot as an op argument (encode_graph): .slot.")
      .def(py::init([](uint32_t slot) { return ScalarSlot{slot}; }), py::arg("slot"))
      .def_readonly("slot", &ScalarSlot::slot)
      .def("__repr__", [](const ScalarSlot& s) { return "ScalarSlot(" + std::to_string(s.slot) + ")"; });

  m.def("encode_graph", &encodeGraph, py::arg("inputs"), py::arg("num_scalar_inputs"), py::arg("nodes"),
        py::arg("name") = "", R"doc(
encode_graph(inputs, num_scalar_inputs, nodes, name="") -> bytes

Serializes a Graph FlatBuffer (RegisterGraph's content; its XXH3-128 is the graph id, so equal
arguments give equal bytes and ids).

inputs: list[tuple[torch.dtype | None, bytes | None]], one per graph input (value ids
  0..len(inputs)-1): the expected dtype (None: not given), and a 16-byte handle that binds the
  input to that resident tensor of the running session (GraphInput.handle) or None.
num_scalar_inputs: int, how many scalar slots RunGraph binds (ScalarSlot(i), i < this).
nodes: list[tuple[str, str, list[tuple[str, object]], int]]: (op schema name "aten::add",
  overload "Tensor" or "" for the default, args, number of tensor outputs). Node k's outputs
  get the next value ids in order. Each arg is (keyword name, or "" for positional, value):
    None -> None; bool; int (int64); float (double); complex; str; torch.dtype; torch.layout;
    torch.memory_format; torch.device (the node substitutes its own); TensorRef(v) -> a graph
    value; ScalarSlot(s) -> a scalar bound at run time;
    list/tuple: all TensorRef -> Tensor[]; TensorRef and None -> Tensor?[]; all bool ->
    bool[]; int and ScalarSlot -> int[] (ScalarSlot elements bound at run time); int and
    float with a float -> float[]; empty -> int[].
Raises TypeError naming the node index, op, argument position and Python type of a value it
cannot encode; ValueError when the graph fails verification (e.g. a TensorRef to a value not
produced before its node).
)doc");

  m.def("decode_graph", &decodeGraph, py::arg("graph"), R"doc(
decode_graph(graph: bytes) -> tuple[inputs, num_scalar_inputs, nodes]

The inverse of encode_graph: the lists it takes, from serialized Graph bytes, so
encode_graph(*decode_graph(b)) re-encodes the graph (Graph.name is not returned).

inputs: list[tuple[torch.dtype | None, bytes | None]]: each GraphInput's desc dtype (None when
  absent or Undefined) and its 16-byte handle (None when absent). Only the dtype of a desc is
  returned (encode_graph writes no shape).
num_scalar_inputs: int.
nodes: list[tuple[str, str, list[tuple[str, object]], int]]: (op, overload or "", args,
  num_outputs), each arg (name or "", value):
    NoneValue -> None; IntValue -> int; DoubleValue -> float; BoolValue -> bool;
    ComplexValue -> complex; StringValue -> str; DTypeValue -> torch.dtype;
    LayoutValue -> torch.layout; MemoryFormatValue -> torch.memory_format;
    DeviceValue -> torch.device (the type string as is when torch does not know it);
    TensorValue -> TensorRef(v); ScalarInputValue -> ScalarSlot(s);
    IntListValue -> list of int, ScalarSlot(s) where scalar_slots[i] >= 0;
    DoubleListValue -> list of float, ScalarSlot(s) where scalar_slots[i] >= 0; BoolListValue -> list of bool;
    TensorListValue -> list of TensorRef; OptionalTensorListValue -> TensorRef or None (-1).
Raises ValueError with wire::verifyGraph's message when the bytes are not a valid Graph
(e.g. "decode_graph: Graph: failed FlatBuffers verification ..."), and naming the node and
argument for a layout, memory format or device index torch has no value for.
)doc");
}

}  // namespace genie::python
