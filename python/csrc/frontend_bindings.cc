// genie._C's view of the frontend's C++ layers (python/csrc/frontend): the IR (Node, Value,
// Storage), a device's Recording with the passes that turn its pending graph into a RunGraph
// (Cut), LazyTensor state, the process lock and host evaluation. genie.graph, genie.runtime and
// genie.python_ops are their Python users; the runtime layer keeps the policy (connections,
// errors, recovery, asynchronous runs) and calls these for the mechanics.
//
// Handles and graph ids cross as 16 bytes (bindings.h). Every call that reads or changes a
// recording expects the caller to hold the process lock (genie.lazy.lock), as genie.runtime's
// entry points do.
//
// Over 600 lines: one function, bindFrontend, registering these classes and functions with their
// docstrings; the conversions at its top (handle bytes, dtypes, node arguments, a Cut's request)
// serve all of them, so splitting it would scatter one module's bindings and their conversions.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
// pybind11 first: it includes Python.h, which torch's Python headers expect.
#include <torch/csrc/Device.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Storage.h>
#include <c10/core/impl/COW.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "bindings.h"
#include "frontend/cut.h"
#include "frontend/device_storage.h"
#include "frontend/host_eval.h"
#include "frontend/lazy_tensor.h"
#include "frontend/lock.h"
#include "frontend/op_facts.h"
#include "frontend/recording.h"

namespace genie::python {

using frontend::Cut;
using frontend::Node;
using frontend::NodePtr;
using frontend::Recording;
using frontend::RecordingPtr;
using frontend::Storage;
using frontend::StoragePtr;
using frontend::Value;
using frontend::ValuePtr;


namespace {

py::object handleBytes(const std::optional<wire::Handle>& h) {
  if (!h) return py::none();
  return bytesOfId(*h);
}

py::object dtypeObject(at::ScalarType t) {
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
}

/// An IValue of a node's arguments as Python: a Value for a device tensor, the tensor for a
/// host constant, lists element by element.
py::object argObject(const c10::IValue& v, frontend::ArgKind kind) {
  if (v.isCapsule()) return py::cast(ValuePtr::reclaim_copy(frontend::valueOf(v)));
  if (v.isTensor()) return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.toTensor()));
  if (v.isInt()) {
    if (kind == frontend::ArgKind::kScalarType) return dtypeObject(static_cast<at::ScalarType>(v.toInt()));
  }
  if (v.isList() && !v.isIntList() && !v.isDoubleList() && !v.isBoolList()) {
    py::list out;
    for (const c10::IValue& x : v.toListRef()) out.append(argObject(x, frontend::ArgKind::kOther));
    return std::move(out);
  }
  return torch::jit::toPyObject(v);
}

/// (args, kwargs) of a node, as Python dispatch would show them.
std::pair<py::tuple, py::dict> nodeArguments(const Node& node) {
  const auto& facts = node.facts;
  const auto& arguments = node.schema().arguments();
  const frontend::ShownArgs shown(node.schema(), node.args);
  py::list args;
  py::dict kwargs;
  const size_t positional = shown.positional();
  const size_t shown_positional = shown.shownPositional();
  for (size_t i = 0; i < node.args.size(); ++i) {
    const auto kind = i < facts.args.size() ? facts.args[i] : frontend::ArgKind::kOther;
    if (i < shown_positional) {
      args.append(argObject(node.args[i], kind));
    } else if (i >= positional && shown[i]) {
      kwargs[arguments[i].name().c_str()] = argObject(node.args[i], kind);
    }
  }
  return {py::tuple(args), kwargs};
}

/// A Python argument of a node the runtime records itself, as its IValue: a Value (or a
/// LazyTensor: its value) becomes a capsule, a host tensor stays, anything else as the schema's
/// type says.
c10::IValue nodeArg(py::handle obj, const c10::Argument& argument) {
  if (py::isinstance<Value>(obj)) return frontend::capsuleOf(obj.cast<ValuePtr>());
  if (THPVariable_Check(obj.ptr())) {
    const at::Tensor& t = THPVariable_Unpack(obj.ptr());
    if (auto* impl = frontend::lazyState(t)) return frontend::capsuleOf(impl->value());
    return t;
  }
  const auto kind = argument.real_type()->kind();
  if ((PyList_Check(obj.ptr()) || PyTuple_Check(obj.ptr())) && kind == c10::TypeKind::ListType) {
    const auto element = argument.real_type()->cast<c10::ListType>()->getElementType();
    const bool tensors = element->kind() == c10::TypeKind::TensorType ||
                         (element->cast<c10::OptionalType>() &&
                          element->cast<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType);
    if (tensors) {
      c10::impl::GenericList out(c10::AnyType::get());
      for (py::handle x : py::reinterpret_borrow<py::sequence>(obj)) {
        out.push_back(x.is_none() ? c10::IValue() : nodeArg(x, c10::Argument("", c10::TensorType::get())));
      }
      return out;
    }
  }
  if (obj.is_none()) return c10::IValue();
  if (kind == c10::TypeKind::TensorType) {  // a Python number for a tensor: a wrapped number, as the recorder keeps it
    if (PyBool_Check(obj.ptr())) return obj.cast<bool>();
    if (PyLong_Check(obj.ptr())) return obj.cast<int64_t>();
    if (PyFloat_Check(obj.ptr())) return obj.cast<double>();
    if (PyComplex_Check(obj.ptr())) return c10::complex<double>(PyComplex_RealAsDouble(obj.ptr()), PyComplex_ImagAsDouble(obj.ptr()));
  }
  return torch::jit::toIValue(obj, argument.real_type());
}

}  // namespace

c10::OperatorHandle operatorOf(py::handle func) {
  py::object schema = func.attr("_schema");
  const auto name = schema.attr("name").cast<std::string>();
  const auto overload = schema.attr("overload_name").cast<std::string>();
  auto op = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!op) throw py::value_error("genie._C: no operator " + name + "." + overload);
  return *op;
}

namespace {

/// Recording.append_node(func, args, kwargs, dtypes, writes=(), storages=None) -> Node.
NodePtr appendNode(Recording& rec, py::handle func, py::sequence args, py::dict kwargs,
                   std::vector<py::object> dtypes, std::vector<StoragePtr> writes, std::optional<std::vector<StoragePtr>> storages) {
  const c10::OperatorHandle op = operatorOf(func);
  const auto& arguments = op.schema().arguments();
  std::vector<c10::IValue> values;
  values.reserve(arguments.size());
  const size_t positional = args.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto& argument = arguments[i];
    if (i < positional) {
      values.push_back(nodeArg(args[i], argument));
    } else if (kwargs.contains(argument.name().c_str())) {
      values.push_back(nodeArg(kwargs[argument.name().c_str()], argument));
    } else if (argument.default_value()) {
      values.push_back(*argument.default_value());
    } else {
      throw py::type_error("append_node: " + frontend::opNameOf(op) + " is missing argument '" + argument.name() + "'");
    }
  }
  std::vector<frontend::OutputSpec> specs;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (!THPDtype_Check(dtypes[i].ptr())) throw py::type_error("append_node: dtypes must be torch.dtype objects");
    StoragePtr storage = storages && i < storages->size() ? (*storages)[i] : c10::make_intrusive<Storage>();
    specs.push_back({std::move(storage), reinterpret_cast<THPDtype*>(dtypes[i].ptr())->scalar_type});
  }
  const frontend::OpFacts* facts;
  {
    frontend::LockGuard lock;
    facts = &frontend::opFacts(op);
  }
  NodePtr node = Node::make(op, *facts, std::move(values), specs, std::move(writes));
  rec.append(node);
  return node;
}

/// The device tensor `t`; TypeError naming `what` for anything else.
const at::Tensor& deviceTensorOf(py::handle t, const char* what) {
  if (THPVariable_Check(t.ptr())) {
    const at::Tensor& tensor = THPVariable_Unpack(t.ptr());
    if (frontend::isLazy(tensor)) return tensor;
  }
  throw py::type_error(std::string(what) + ": expected a remote_accelerator tensor, got " + typeName(t));
}

frontend::LazyState& lazyOf(py::handle t, const char* what) { return *frontend::lazyState(deviceTensorOf(t, what)); }

py::object numberObject(const frontend::Number& n) {
  return n.is_float ? py::object(py::float_(n.d)) : py::object(py::int_(n.i));
}

/// The RunGraph arguments of a cut: (graph_id, bindings, scalars, specs, frees).
py::tuple requestOf(const Cut& cut) {
  TORCH_CHECK(cut.prepared.graph_id.has_value(), "genie: the cut's graph is not registered");
  py::list bindings, scalars, specs, frees;
  for (size_t i = 0; i < cut.lowered.inputs.size(); ++i) {
    const auto& input = cut.lowered.inputs[i];
    if (input.kind == frontend::LoweredInput::kHandle) {
      bindings.append(py::make_tuple(i, bytesOfId(*input.value->handle)));
    } else if (input.kind == frontend::LoweredInput::kInline) {
      bindings.append(py::make_tuple(i, py::reinterpret_steal<py::object>(THPVariable_Wrap(input.tensor))));
    }
  }
  for (const auto& [slot, number] : cut.prepared.scalars) scalars.append(py::make_tuple(slot, numberObject(number)));
  for (const auto& row : cut.specs) {
    specs.append(py::make_tuple(row.value_id, static_cast<int>(row.action), handleBytes(row.handle), row.residency));
  }
  for (const auto& h : cut.frees) frees.append(bytesOfId(h));
  return py::make_tuple(bytesOfId(*cut.prepared.graph_id), bindings, scalars, specs, frees);
}

std::vector<ValuePtr> valuesOf(const py::sequence& seq) {
  std::vector<ValuePtr> out;
  out.reserve(seq.size());
  for (py::handle v : seq) out.push_back(v.cast<ValuePtr>());
  return out;
}

/// The process lock as Python sees it: acquire/release, a context manager, recursive.
struct PyLock {};

}  // namespace

void bindFrontend(py::module_& m) {
  py::class_<Storage, StoragePtr>(m, "Storage", "Values that alias one memory region (genie.graph).")
      .def(py::init([] { return c10::make_intrusive<Storage>(); }))
      .def_property_readonly("live", [](const Storage& s) { return s.live.load(); },
                             "LazyTensors whose current value is on this storage.")
      .def_property_readonly("written", [](const Storage& s) { return s.written(); },
                             "A recorded op writes it (then no value on it has a host copy).")
      .def("__hash__", [](const Storage& s) { return reinterpret_cast<uintptr_t>(&s); })
      .def("__eq__", [](const Storage& a, py::object b) {
        return py::isinstance<Storage>(b) && &a == b.cast<const Storage*>();
      });

  py::class_<Value, ValuePtr>(m, "Value", R"doc(One tensor value (genie.graph): pending (`node`,
output `index`) or resident on the node (`handle`). `tensors` counts the LazyTensors holding it;
`residency` is its wire class (0 activation, 1 weight, 2 KV cache, 3 gradient); `error` is set
when it is lost; `host` is its exact contents on the host when known.)doc")
      .def_static("resident", [](py::object storage, py::object dtype, py::bytes handle, int residency) {
        if (!THPDtype_Check(dtype.ptr())) throw py::type_error("Value.resident: dtype must be a torch.dtype");
        StoragePtr s = storage.is_none() ? c10::make_intrusive<Storage>() : storage.cast<StoragePtr>();
        auto v = c10::make_intrusive<Value>(std::move(s), reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type, 0, nullptr);
        v->handle = idOf<wire::Handle>(handle, "Value.resident");
        v->residency = static_cast<uint8_t>(residency);
        return v;
      }, py::arg("storage"), py::arg("dtype"), py::arg("handle"), py::arg("residency"),
         "A value resident on the node under `handle` (an upload), on `storage` (None: a new one).")
      .def_property("shape", [](const Value& v) -> py::object {
        if (!v.sized) return py::none();
        return py::tuple(py::cast(std::vector<int64_t>(v.sizes.begin(), v.sizes.end())));
      }, [](Value& v, py::object shape) {
        if (shape.is_none()) {
          v.sized = false;
          v.sizes.clear();
          return;
        }
        auto sizes = shape.cast<std::vector<int64_t>>();
        v.sizes.assign(sizes.begin(), sizes.end());
        v.sized = true;
      }, "Its sizes (a tuple of ints) when known, else None: set by the recorder's shape inference, by "
         "genie.uploads for an upload; an op only the node can describe leaves it None.")
      .def_property_readonly("node", [](const Value& v) -> py::object {
        if (v.producer == nullptr) return py::none();
        return py::cast(NodePtr::reclaim_copy(v.producer));
      })
      .def_readonly("index", &Value::index)
      .def_property("handle", [](const Value& v) { return handleBytes(v.handle); },
                    [](Value& v, py::object h) {
                      if (h.is_none()) {
                        v.handle.reset();
                      } else {
                        v.handle = idOf<wire::Handle>(h, "Value.handle");
                      }
                    })
      .def_property_readonly("storage", [](const Value& v) { return v.storage; })
      .def_property_readonly("tensors", [](const Value& v) { return v.tensors.load(); })
      .def_property("residency", [](const Value& v) { return v.residency; },
                    [](Value& v, int r) { v.residency = static_cast<uint8_t>(r); })
      .def_property("dtype", [](const Value& v) { return dtypeObject(v.dtype); },
                    [](Value& v, py::object dtype) {
                      if (!THPDtype_Check(dtype.ptr())) throw py::type_error("Value.dtype: expected a torch.dtype");
                      v.dtype = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
                    })
      .def_property("error", [](const Value& v) -> py::object {
        return v.error == nullptr ? py::none() : py::reinterpret_borrow<py::object>(v.error);
      }, [](Value& v, py::object e) { v.setError(e.is_none() ? nullptr : e.ptr()); })
      .def_property("host", [](const Value& v) -> py::object {
        if (!v.host.defined()) return py::none();
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(v.host));
      }, [](Value& v, py::object t) {
        v.host = t.is_none() ? at::Tensor() : THPVariable_Unpack(t.ptr());
      })
      .def("add_tensor", [](Value& v) {
        v.tensors.fetch_add(1);
        v.storage->live.fetch_add(1);
      }, "Counts one more tensor on the value (and its storage) that is not a device tensor of its own: "
         "a value only a queued op holds; Recording.note_dead counts it down.")
      .def("__hash__", [](const Value& v) { return reinterpret_cast<uintptr_t>(&v); })
      .def("__eq__", [](const Value& a, py::object b) { return py::isinstance<Value>(b) && &a == b.cast<const Value*>(); })
      .def("__repr__", &Value::str);

  py::class_<Node, NodePtr>(m, "Node", R"doc(One recorded op (genie.graph): `op` (the OpOverload),
`args`/`kwargs` as Python dispatch shows them (device tensors as their Values), `outputs` (its
Values), `writes` (the Storages it mutates), `seq` (program order). Immutable.)doc")
      .def_property_readonly("op", [](const Node& n) {
        return py::reinterpret_borrow<py::object>(torch::detail::getTorchApiFunction(n.op));
      })
      .def_property_readonly("args", [](const Node& n) { return nodeArguments(n).first; })
      .def_property_readonly("kwargs", [](const Node& n) { return nodeArguments(n).second; })
      .def_property_readonly("outputs", [](const Node& n) {
        py::tuple out(n.outputs.size());
        for (size_t i = 0; i < n.outputs.size(); ++i) out[i] = py::cast(n.outputs[i]);
        return out;
      })
      .def_property_readonly("num_outputs", [](const Node& n) { return n.outputs.size(); })
      .def_property_readonly("writes", [](const Node& n) {
        py::tuple out(n.writes.size());
        for (size_t i = 0; i < n.writes.size(); ++i) out[i] = py::cast(n.writes[i]);
        return out;
      })
      .def_readonly("seq", &Node::seq)
      .def_property_readonly("name", &Node::opName, "\"aten::add.Tensor\"")
      .def("inputs", [](const Node& n) {
        py::list out;
        for (Value* v : n.inputs()) out.append(py::cast(ValuePtr::reclaim_copy(v)));
        return out;
      }, "The Values this node reads, in argument order.")
      .def("__hash__", [](const Node& n) { return reinterpret_cast<uintptr_t>(&n); })
      .def("__eq__", [](const Node& a, py::object b) { return py::isinstance<Node>(b) && &a == b.cast<const Node*>(); })
      .def("__repr__", &Node::str);

  py::class_<Cut>(m, "Cut", "A prepared RunGraph request (python/csrc/frontend/cut.h).")
      .def_property_readonly("graph_id", [](const Cut& c) -> py::object {
        if (!c.prepared.graph_id) return py::none();
        return bytesOfId(*c.prepared.graph_id);
      })
      .def("encode", [](const Cut& c) {
        return py::bytes(frontend::encodeGraph(c.nodes, c.lowered, c.prepared.lifted));
      }, "The serialized wire Graph to register (scalar positions lifted).")
      .def("request", &requestOf, "(graph_id, bindings, scalars, specs, frees): Client.run_graph's arguments.")
      .def_property_readonly("spec_values", [](const Cut& c) { return c.spec_values; })
      .def_property_readonly("weights", [](const Cut& c) {
        py::list out;
        for (const auto& input : c.lowered.inputs) {
          if (input.kind == frontend::LoweredInput::kWeight) out.append(bytesOfId(*input.value->handle));
        }
        return py::tuple(out);
      }, "The weight handles its graph binds itself.")
      .def_property_readonly("nodes", [](const Cut& c) { return c.nodes; }, "The nodes that run, in order.")
      .def_property_readonly("needs_residency", [](const Cut& c) { return !c.prepared.residency.has_value(); },
                             "Its structure's semantic residency is not known yet (Recording.set_residency).")
      .def("value_id", [](const Cut& c, const ValuePtr& v) -> py::object {
        try {
          return py::int_(c.lowered.idOf(v.get()));
        } catch (const c10::Error&) {
          return py::none();
        }
      }, "The wire value id of `value` in this cut's graph (an input or a node's output), or None.");

  py::class_<Recording, RecordingPtr>(m, "Recording", R"doc(One device's pending graph and the books of its
values (python/csrc/frontend/recording.h). Call with the process lock held.)doc")
      .def(py::init([](int index, py::object runtime) {
        auto rec = c10::make_intrusive<Recording>(index);
        rec->runtime_ref = PyWeakref_NewRef(runtime.ptr(), nullptr);
        if (rec->runtime_ref == nullptr) throw py::error_already_set();
        frontend::setRecording(index, rec);
        return rec;
      }), py::arg("index"), py::arg("runtime"),
           "The recording of remote_accelerator:`index` for `runtime` (kept as a weak reference); it replaces "
           "any earlier one of that index for new tensors.")
      .def_readonly("device_index", &Recording::device_index)
      .def_property_readonly("runtime", [](const Recording& r) -> py::object {
        if (r.runtime_ref == nullptr) return py::none();
        return py::reinterpret_borrow<py::object>(PyWeakref_GetObject(r.runtime_ref));
      })
      .def_property_readonly("pending", [](const Recording& r) { return r.pending(); })
      .def_property_readonly("live_tensors", [](const Recording& r) { return r.live_tensors.load(); },
                             "LazyTensors of this device alive now.")
      .def_property_readonly("pending_count", [](const Recording& r) { return r.pending().size(); })
      .def_property_readonly("rng", [](const Recording& r) { return r.rng(); })
      .def_readwrite("async_chunk", &Recording::async_chunk)
      .def_readwrite("max_pending", &Recording::max_pending)
      .def_readwrite("cache_write_grace", &Recording::cache_write_grace)
      .def_readwrite("connected", &Recording::connected)
      .def_readwrite("colocation_group", &Recording::colocation_group,
                     "The co-location group of what the scheduler placed on this device (\"\": none): the KV "
                     "caches of later cuts carry it (with colocation_bytes, the group's resident bytes).")
      .def_readwrite("colocation_bytes", &Recording::colocation_bytes)
      .def_property("cpu_kernels", [](const Recording& r) { return r.cpu_kernels.load(); },
                    [](Recording& r, bool v) { r.cpu_kernels.store(v); })
      .def_property("logging", [](const Recording& r) { return r.logging; },
                    [](Recording& r, bool on) {
                      r.logging = on;
                      r.log.clear();
                    })
      .def_property_readonly("log", [](const Recording& r) { return r.log; })
      .def("append_node", &appendNode, py::arg("func"), py::arg("args"), py::arg("kwargs"), py::arg("dtypes"),
           py::arg("writes") = std::vector<StoragePtr>{}, py::arg("storages") = std::nullopt,
           "append_node(func, args, kwargs, dtypes, writes=(), storages=None) -> Node: records an op the "
           "runtime makes itself (args: Values, LazyTensors, host tensors, plain values), with one output per "
           "dtype (on `storages[i]`, or a new storage each), writing `writes`.")
      .def("discard_pending", [](Recording& r, py::object error) { r.discardPending(error.is_none() ? nullptr : error.ptr()); },
           py::arg("error") = py::none(),
           "Drops the pending graph; its values are lost with `error` (None: simply gone, for capture-only "
           "benchmarks).")
      .def("drop_last", [](Recording& r, const NodePtr& n) { return r.dropLast(n.get()); })
      .def("drain_dead", &Recording::drainDead)
      .def("note_dead", [](Recording& r, const ValuePtr& v) { r.noteDead(v); },
           "A tensor of `value` died (see Value.add_tensor).")
      .def("note_resident", &Recording::noteResident)
      .def("take_frees", [](Recording& r, const std::vector<py::bytes>& in_use) {
        frontend::HandleSet set;
        for (const auto& h : in_use) set.insert(idOf<wire::Handle>(h, "take_frees"));
        std::vector<py::bytes> out;
        for (const auto& h : r.takeFrees(set)) out.push_back(bytesOfId(h));
        return out;
      })
      .def_property_readonly("has_released", &Recording::hasReleased)
      .def("pending_writes", [](const Recording& r, const StoragePtr& s) { return r.pendingWrites(s.get()); })
      .def("live_handles", [](const Recording& r) {
        std::vector<py::bytes> out;
        for (const auto& h : r.liveHandles()) out.push_back(bytesOfId(h));
        return out;
      })
      .def("mark_lost", [](Recording& r, py::object error) { r.markLost(error.ptr()); })
      .def("clear_graphs", [](Recording& r) { r.graphs().clear(); })
      .def_property_readonly("graph_count", [](Recording& r) { return r.graphs().size(); })
      .def("take_cut", [](Recording& r, py::sequence returned, py::sequence described) {
        try {
          return frontend::takeCut(r, valuesOf(returned), valuesOf(described));
        } catch (const frontend::LostInput& lost) {
          PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(lost.value->error)), lost.value->error);
          throw py::error_already_set();
        }
      }, py::arg("returned"), py::arg("described"),
         "take_cut(returned, described) -> Cut: the passes on the pending graph (taken out of it). Raises a lost "
         "input's error; the pending graph is then as it was.")
      .def("capture_part", [](Recording& r, py::sequence inputs, py::sequence outputs, const std::string& name,
                              int64_t since_seq) -> py::object {
        auto captured = frontend::capturePart(r.pending(), valuesOf(inputs), valuesOf(outputs), name, since_seq);
        if (auto* why = std::get_if<std::string>(&captured)) return py::str(*why);
        auto& part = std::get<frontend::CapturedPart>(captured);
        py::list inline_inputs;
        for (const at::Tensor& t : part.inline_inputs) {
          inline_inputs.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
        }
        return py::make_tuple(py::bytes(part.graph), part.input_ids, inline_inputs, part.output_ids, part.written,
                              part.num_nodes);
      }, py::arg("inputs"), py::arg("outputs"), py::arg("name") = "", py::arg("since_seq") = INT64_MAX,
         "capture_part(inputs, outputs, name='', since_seq=max) -> (graph: bytes, input_ids, inline_inputs, output_ids, "
         "written, num_nodes) | str: the pending ops that compute `outputs` (Values) from `inputs` (Values), and the "
         "ops recorded from `since_seq` on (genie._C.next_seq()) that write an input with what they read, as a wire "
         "Graph whose inputs are `inputs` (graph input input_ids[i]), then `inline_inputs` (0-dim host tensors); output "
         "i is wire value output_ids[i]; `written`: positions in `inputs` whose storage the part writes. A str says "
         "why the part cannot stand alone (an output aliases an input, an op writes an input before since_seq or also "
         "another tensor, a value read is neither an input nor made by the part). The ops stay pending. `name`: the "
         "Graph's name (genie.compile: the compile mode).")
      .def("set_residency", [](Recording& r, Cut& cut, const std::map<uint32_t, int>& classes) {
        std::vector<std::pair<uint32_t, uint8_t>> sorted;  // std::map: ascending ids
        for (const auto& [id, cls] : classes) {
          if (cls < frontend::kActivation || cls > frontend::kGradient) {
            throw py::value_error("set_residency: class " + std::to_string(cls) + " of value " + std::to_string(id) +
                                  " is not 0..3");
          }
          sorted.emplace_back(id, static_cast<uint8_t>(cls));
        }
        r.graphs().rememberResidency(cut.lowered, sorted);
        cut.prepared.residency = sorted;
        frontend::markResidency(cut, sorted);
      }, py::arg("cut"), py::arg("classes"),
           "The semantic residency of the cut's structure, {wire value id: class} (genie.semantics: 2 KV cache, "
           "3 gradient): the output specs of those values get it, here and in every later cut of the structure.")
      .def("registered", [](Recording& r, Cut& cut, py::bytes graph_id) {
        cut.prepared.graph_id = idOf<wire::GraphId>(graph_id, "registered");
        r.graphs().remember(cut.lowered, cut.prepared.lifted, *cut.prepared.graph_id);
      }, "The cut's graph was registered as `graph_id`.")
      .def("restore", [](Recording& r, Cut& cut) { frontend::restore(r, cut); })
      .def("host_value", [](Recording& r, const ValuePtr& v) -> py::object {
        at::Tensor t = frontend::hostValue(*v);
        if (!t.defined()) return py::none();
        return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
      }, "The value's exact contents computed on the host (genie.host_eval), or None.")
      .def("host_leaves", [](Recording& r, const ValuePtr& v) { return frontend::hostLeaves(*v); },
           "host_leaves(value) -> list[Value]: the small resident values without host copies that host_value(value) "
           "lacks when the host could compute it with them (frontend/host_eval.h hostLeaves); [] otherwise.")
      .def("host_outputs", [](Recording& r, const NodePtr& node) -> py::object {
        auto outs = frontend::hostOutputs(*node);
        if (!outs) return py::none();
        py::list out;
        for (const at::Tensor& t : *outs) out.append(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)));
        return out;
      }, "host_outputs(node) -> list[Tensor] | None: the pending node's outputs computed on the host (an op whose "
         "outputs its values decide, such as masked_select), or None.")
      .def("host_leaves_of", [](Recording& r, const NodePtr& node) { return frontend::hostLeavesOf(*node); },
           "host_leaves_of(node) -> list[Value]: host_leaves for host_outputs(node).");

  m.def("next_seq", &frontend::nextSeq, "next_seq() -> int: the seq (program order) the next recorded op gets.");
  m.def("lazy_value", [](py::handle t) -> py::object {
    if (!THPVariable_Check(t.ptr())) return py::none();
    auto* impl = frontend::lazyState(THPVariable_Unpack(t.ptr()));
    if (impl == nullptr || !impl->value()) return py::none();
    return py::cast(impl->value());
  }, "lazy_value(tensor) -> Value | None: the value a device tensor holds now; None for any other tensor.");
  m.def("lazy_recording", [](py::handle t) -> py::object {
    if (!THPVariable_Check(t.ptr())) return py::none();
    auto* impl = frontend::lazyState(THPVariable_Unpack(t.ptr()));
    if (impl == nullptr) return py::none();
    return py::cast(impl->recordingPtr());
  }, "lazy_recording(tensor) -> Recording | None.");
  m.def("is_lazy", [](py::handle t) {
    return THPVariable_Check(t.ptr()) && frontend::lazyState(THPVariable_Unpack(t.ptr())) != nullptr;
  }, "is_lazy(obj) -> bool: a tensor on remote_accelerator (its TensorImpl holds a Genie state).");
  m.def("make_lazy", [](const ValuePtr& value, const RecordingPtr& rec, std::vector<int64_t> shape,
                        std::optional<std::vector<int64_t>> strides, int64_t offset, py::object base) {
    frontend::Desc desc;
    desc.sizes.assign(shape.begin(), shape.end());
    if (strides) {
      if (strides->size() != shape.size()) throw py::value_error("make_lazy: strides and shape differ in rank");
      desc.strides.assign(strides->begin(), strides->end());
      desc.offset = offset;
      desc.dtype = value->dtype;
      desc.finish();
    } else {
      desc = frontend::Desc();
      desc.sizes.assign(shape.begin(), shape.end());
      desc.strides.resize(shape.size());
      int64_t s = 1;
      for (size_t i = shape.size(); i-- > 0;) {
        desc.strides[i] = s;
        s *= std::max<int64_t>(shape[i], 1);
      }
      desc.dtype = value->dtype;
      desc.contiguous = true;
    }
    const at::Tensor* base_tensor = nullptr;
    if (!base.is_none()) {
      if (!THPVariable_Check(base.ptr())) throw py::type_error("make_lazy: base must be a tensor or None");
      base_tensor = &THPVariable_Unpack(base.ptr());
    }
    at::Tensor t;
    {
      frontend::LockGuard lock;
      t = frontend::makeLazy(value, desc, rec, base_tensor);
    }
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
  }, py::arg("value"), py::arg("recording"), py::arg("shape"), py::arg("strides") = std::nullopt,
     py::arg("offset") = 0, py::arg("base") = py::none(),
     "make_lazy(value, recording, shape, strides=None, offset=0, base=None) -> Tensor: a new device tensor holding "
     "`value` (dtype: the value's) with this geometry (strides None: contiguous); `base`: the tensor it is a view "
     "of (shares its storage and inference status).");
  m.def("rebind", [](py::handle t, const ValuePtr& value) {
    frontend::LockGuard lock;
    lazyOf(t, "rebind").rebind(value);
  }, "rebind(tensor, value): the device tensor holds `value` from now on (an in-place result on its storage).");
  m.def("set_storage", [](py::handle t, py::handle storage) {
    const at::Tensor& tensor = deviceTensorOf(t, "set_storage");
    if (!THPStorage_Check(storage.ptr())) throw py::type_error("set_storage: not a torch.UntypedStorage");
    tensor.unsafeGetTensorImpl()->set_storage_keep_dtype(THPStorage_Unpack(storage.ptr()));
  }, "set_storage(tensor, storage): the device tensor's storage becomes `storage` (aten::set_ onto a storage), as "
     "on any device; its value is the caller's to rebind.");
  m.def("storage_tensor", [](py::handle storage, py::handle make) -> py::object {
    if (!THPStorage_Check(storage.ptr())) throw py::type_error("storage_tensor: not a torch.UntypedStorage");
    const c10::Storage& s = THPStorage_Unpack(storage.ptr());
    frontend::StorageValue sv;
    {
      frontend::LockGuard lock;
      sv = frontend::storageValue(s);
    }
    if (sv.state == frontend::StorageValue::kNone) return py::none();
    if (sv.state == frontend::StorageValue::kUnbound) {
      py::object fresh = make(static_cast<int64_t>(s.nbytes()));  // uint8 [nbytes] on the storage's device
      const at::Tensor& made = deviceTensorOf(fresh, "storage_tensor");
      TORCH_CHECK(made.scalar_type() == at::kByte && made.numel() == static_cast<int64_t>(s.nbytes()),
                  "storage_tensor: make(nbytes) must give a uint8 tensor of nbytes elements");
      frontend::LockGuard lock;
      const frontend::LazyState& state = *frontend::lazyState(made);
      frontend::bindStorageValue(s, state.value(), state.recordingPtr());
      sv = frontend::storageValue(s);
    }
    at::Tensor t;
    {
      frontend::LockGuard lock;
      t = sv.byte_offset == 0 ? frontend::makeLazyOn(sv.value, sv.desc, sv.recording, s)
                              : frontend::makeLazy(sv.value, sv.desc, sv.recording, nullptr);
    }
    return py::make_tuple(py::reinterpret_steal<py::object>(THPVariable_Wrap(t)), sv.byte_offset);
  }, py::arg("storage"), py::arg("make"),
     "storage_tensor(storage, make) -> (Tensor, byte_offset) | None: for a torch.UntypedStorage on "
     "remote_accelerator, a tensor holding the value of its bytes (frontend/device_storage.h) and where the storage "
     "starts in that tensor's storage (a slice); a storage allocated from the host is bound at first use to the "
     "value of make(nbytes) (a new uint8 [nbytes] device tensor). None when no value is known.");
  m.def("lazy_clone_storage", [](py::handle t, py::handle source) {
    const at::Tensor& tensor = deviceTensorOf(t, "lazy_clone_storage");
    const at::Tensor& src = deviceTensorOf(source, "lazy_clone_storage");
    c10::intrusive_ptr<c10::StorageImpl> cow = c10::impl::cow::lazy_clone_storage(*src.storage().unsafeGetStorageImpl());
    TORCH_CHECK(cow, "_lazy_clone: the storage of this remote_accelerator tensor cannot be made copy-on-write");
    frontend::noteDeviceStorageCopy(const_cast<void*>(src.storage().data_ptr().get()));  // whichever storage ends with it
    tensor.unsafeGetTensorImpl()->set_storage_keep_dtype(c10::Storage(std::move(cow)));
  }, "lazy_clone_storage(tensor, source): `tensor` (the node's clone of `source`) takes a copy-on-write clone of "
     "`source`'s storage, as c10 lazy-clones one: same data address, each a COW storage until written.");
  m.def("set_geometry", [](py::handle t, std::vector<int64_t> shape, std::vector<int64_t> strides, int64_t offset) {
    const at::Tensor& tensor = deviceTensorOf(t, "set_geometry");
    frontend::Desc d;
    d.sizes.assign(shape.begin(), shape.end());
    d.strides.assign(strides.begin(), strides.end());
    d.offset = offset;
    d.dtype = tensor.scalar_type();
    frontend::LockGuard lock;
    frontend::setGeometry(tensor, d);
  }, "set_geometry(tensor, shape, strides, offset): a device tensor's sizes, strides and offset change (resize).");
  m.def("op_facts", [](py::handle func) {
    const c10::OperatorHandle op = operatorOf(func);
    frontend::LockGuard lock;
    const frontend::OpFacts& facts = frontend::opFacts(op);
    static const char* kKinds[] = {"new", "view", "write"};
    static const char* kRoutes[] = {"record", "python", "to_copy", "copy", "index", "same_value", "composite", "scalar"};
    py::list returns;
    for (const auto& r : facts.returns) returns.append(py::make_tuple(kKinds[r.kind], r.arg));
    py::dict d;
    d["returns"] = py::tuple(returns);
    d["writes"] = py::tuple(py::cast(facts.writes));
    d["list_return"] = facts.list_return;
    d["seeded"] = facts.seeded;
    d["route"] = kRoutes[static_cast<int>(facts.route)];
    return d;
  }, "op_facts(func) -> dict: what the operator's schema says (python/csrc/frontend/op_facts.h): returns "
     "((kind, argument index), ...) with kind 'new', 'view' or 'write'; writes (argument indices); list_return; "
     "seeded; route ('record', 'python', 'to_copy', 'copy', 'index', 'same_value', 'composite', 'scalar').");
  m.attr("HOST_EVAL_MAX_BYTES") = frontend::kHostEvalMaxBytes;
  m.def("forget_recordings", [] {
    for (int i = 0; i < 64; ++i) frontend::setRecording(i, {});
  }, "forget_recordings(): no device has a recording any more (genie.runtime.reset_runtimes).");
  m.def("set_host_eval", &frontend::setHostEvalEnabled, py::arg("enabled"),
        "set_host_eval(enabled): whether reads the host can answer exactly are answered there (genie.host_eval).");
  m.def("host_eval_enabled", &frontend::hostEvalEnabled, "host_eval_enabled() -> bool.");
  m.def("keeps_host_copy", [](py::object dtype, int64_t nbytes) {
    return frontend::keepsHostCopy(reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type, nbytes);
  }, "keeps_host_copy(dtype, nbytes) -> bool: whether an upload of this dtype and size keeps a host copy.");
  m.def("plan_count", [] {
    frontend::LockGuard lock;
    return frontend::planCache().size();
  }, "plan_count() -> int: keys in the recorder's plan cache.");
  m.def("shape_rule", [](py::handle func, py::tuple args, py::dict kwargs) -> py::object {
    const c10::OperatorHandle op = operatorOf(func);
    torch::jit::Stack stack = torch::jit::createStackForSchema(op.schema(), torch::jit::tuple_slice(std::move(args)),
                                                               py::kwargs(std::move(kwargs)), std::nullopt);
    const frontend::OpFacts* facts;
    {
      frontend::LockGuard lock;
      facts = &frontend::opFacts(op);
    }
    auto shapes = frontend::ruleShapes(op, *facts, stack);
    if (!shapes) return py::none();
    py::list out;
    for (const auto& d : shapes->outputs) {
      out.append(py::make_tuple(py::tuple(py::cast(std::vector<int64_t>(d.sizes.begin(), d.sizes.end()))),
                                py::tuple(py::cast(std::vector<int64_t>(d.strides.begin(), d.strides.end()))),
                                d.offset, dtypeObject(d.dtype)));
    }
    return std::move(out);
  }, "shape_rule(func, args, kwargs) -> [(shape, strides, offset, dtype)] | None: the C++ shape rule's answer "
     "for this call (python/csrc/frontend/shapes.h), None when no rule covers it.");

  // The process lock (python/csrc/frontend/lock.h).
  py::class_<PyLock>(m, "ProcessLock", "The process lock: recursive; waits with the GIL released.")
      .def("acquire", [](PyLock&, bool blocking, double timeout) {
        auto& lock = frontend::processLock();
        if (!blocking) return lock.try_lock();
        lock.lock();
        return true;
      }, py::arg("blocking") = true, py::arg("timeout") = -1.0)
      .def("release", [](PyLock&) { frontend::processLock().unlock(); })
      .def("__enter__", [](PyLock& self) {
        frontend::processLock().lock();
        return &self;
      }, py::return_value_policy::reference)
      .def("__exit__", [](PyLock&, py::args) { frontend::processLock().unlock(); })
      .def("_is_owned", [](PyLock&) { return frontend::processLock().heldByThisThread(); })
      .def("_at_fork_reinit", [](PyLock&) { frontend::processLock().reinitAfterFork(); });
  m.attr("process_lock") = py::cast(PyLock{}, py::return_value_policy::move);
}

}  // namespace genie::python
