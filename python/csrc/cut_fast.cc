// genie._C.live_nodes and genie._C.lower: the cut of the pending graph, in C++.
//
// At a read, genie.runtime picks the pending nodes that the read needs (live_nodes) and lowers
// them to the structure of a wire graph (lower: value numbering, inputs, the structural key and
// the liftable numbers; genie.lower's docstring says what each is for). Both walk every node
// and every argument of the cut: in Python that was ~0.4 and ~0.7-1.1 ms per GPT-2 decode step
// (~500 nodes) on the development VM, a tenth of Genie's client time per step. The results are
// the same Python objects the Python code made (tests/python/test_c_extension.py checks them
// against a plain-Python reading of the same rules).
//
//  - live_nodes(pending, wanted) -> list[Node]: genie.runtime.Runtime._live_nodes. `pending`
//    is the list of pending Nodes in program order, `wanted` a sequence of Values to be read.
//  - lower(nodes, extra_inputs) -> (key, numbers, inputs, value_ids, num_inputs, ops): the
//    fields of genie.lower.Lowered, in order. Raises a lost input's error (Value.error), and
//    RuntimeError for a value that is neither pending nor resident.
//
// configure_cut(Node, Value, Storage, Constant, Ref, INT, FLOAT, input_refs, output_refs,
// torch.device) gives it the classes, the markers and genie.lower's shared Ref lists, once,
// when genie.lower is imported. Slots are read through their member descriptors (py_slots.h).
// Called with the GIL held and under genie.runtime.lock. Objects are keyed by address while the
// pending graph holds them (as the Python code keyed them by id()). No torch headers.
#include <pybind11/pybind11.h>

#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "bindings.h"
#include "py_slots.h"

namespace genie::python {
namespace {

struct CutClasses {
  PyObject* node = nullptr;          // genie.graph.Node
  PyObject* value = nullptr;         // genie.graph.Value
  PyObject* storage = nullptr;       // genie.graph.Storage
  PyObject* constant = nullptr;      // genie.graph.Constant
  PyObject* ref = nullptr;           // genie.lower.Ref
  PyObject* int_marker = nullptr;    // genie.lower.INT
  PyObject* float_marker = nullptr;  // genie.lower.FLOAT
  PyObject* input_refs = nullptr;    // genie.lower._INPUT_REFS: Ref(False, i) at i
  PyObject* output_refs = nullptr;   // genie.lower._OUTPUT_REFS: Ref(True, i) at i
  PyObject* device_type = nullptr;   // torch.device
  Slot n_op, n_args, n_kwargs, n_num_outputs, n_outputs, n_writes;
  Slot v_node, v_storage, v_tensors, v_error, v_handle, v_residency, v_dtype;
  Slot s_live;
  Slot k_tensor;
  PyObject *s_weight = nullptr, *s_handle = nullptr, *s_inline = nullptr, *s_dtype = nullptr, *s_type = nullptr;
};
CutClasses c;

bool configured() {
  if (c.node != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "genie._C: configure_cut was not called (import genie first)");
  return false;
}

bool isValue(PyObject* a) { return reinterpret_cast<PyObject*>(Py_TYPE(a)) == c.value; }

/// obj.<slot> > 0 for an int slot; -1 with an error set on failure.
int positive(const Slot& slot, PyObject* obj) {
  Ref v(slot.get(obj));
  if (!v) return -1;
  const long n = PyLong_AsLong(v.get());
  if (n == -1 && PyErr_Occurred()) return -1;
  return n > 0 ? 1 : 0;
}

// ---- live_nodes ----------------------------------------------------------------------------

struct Liveness {
  std::unordered_set<PyObject*> needed;  // Values a kept node (or the read) needs
  std::unordered_set<PyObject*> read;    // Storages that kept nodes read

  bool noteRead(PyObject* v) {
    Ref storage(c.v_storage.get(v));
    Ref node(storage ? c.v_node.get(v) : nullptr);
    if (!node) return false;
    read.insert(storage.get());  // the value keeps its storage alive
    if (node.get() != Py_None) needed.insert(v);
    return true;
  }

  /// Every Value among `args` (a tuple, or a dict's values) and in their lists and tuples.
  bool noteArgs(PyObject* items_seq) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(items_seq);
    PyObject** items = PySequence_Fast_ITEMS(items_seq);
    for (Py_ssize_t i = 0; i < size; ++i) {
      PyObject* a = items[i];
      if (isValue(a)) {
        if (!noteRead(a)) return false;
      } else if (PyList_CheckExact(a) || PyTuple_CheckExact(a)) {
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        PyObject** xs = PySequence_Fast_ITEMS(a);
        for (Py_ssize_t j = 0; j < n; ++j) {
          if (isValue(xs[j]) && !noteRead(xs[j])) return false;
        }
      }
    }
    return true;
  }

  /// A node is needed when a live tensor holds one of its outputs, one of its outputs is
  /// needed, or it writes a storage that a live tensor aliases or that a kept node reads.
  int isNeeded(PyObject* node) {
    const int by_outputs = anyMarkedOrLive(c.n_outputs.get(node), needed, c.v_tensors);
    return by_outputs != 0 ? by_outputs : anyMarkedOrLive(c.n_writes.get(node), read, c.s_live);
  }

  /// 1 if an item of `items` (a new reference to a tuple) is in `marked` or has a positive
  /// `count` slot, 0 if none, -1 with an error set on failure.
  static int anyMarkedOrLive(PyObject* items, const std::unordered_set<PyObject*>& marked, const Slot& count) {
    Ref tuple(items);
    if (!tuple || !PyTuple_Check(tuple.get())) return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple.get()); ++i) {
      PyObject* item = PyTuple_GET_ITEM(tuple.get(), i);
      if (marked.count(item) != 0) return 1;
      const int live = positive(count, item);
      if (live != 0) return live;
    }
    return 0;
  }
};

PyObject* liveNodesPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!configured()) return nullptr;
  if (nargs != 2 || !PyList_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "live_nodes(pending: list[Node], wanted: sequence of Value)");
    return nullptr;
  }
  PyObject* pending = args[0];
  Ref wanted(PySequence_Fast(args[1], "live_nodes: wanted must be a sequence of Values"));
  if (!wanted) return nullptr;
  Liveness live;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(wanted.get()); ++i) {
    live.needed.insert(PySequence_Fast_GET_ITEM(wanted.get(), i));
  }
  Ref keep(PyList_New(0));
  if (!keep) return nullptr;
  for (Py_ssize_t i = PyList_GET_SIZE(pending) - 1; i >= 0; --i) {
    PyObject* node = PyList_GET_ITEM(pending, i);
    const int need = live.isNeeded(node);
    if (need < 0) return nullptr;
    if (need == 0) continue;
    if (PyList_Append(keep.get(), node) < 0) return nullptr;
    Ref node_args(c.n_args.get(node));
    if (!node_args || !PyTuple_Check(node_args.get()) || !live.noteArgs(node_args.get())) return nullptr;
    Ref kwargs(c.n_kwargs.get(node));
    if (!kwargs) return nullptr;
    if (PyDict_Check(kwargs.get()) && PyDict_GET_SIZE(kwargs.get()) != 0) {
      Ref values(PyDict_Values(kwargs.get()));
      if (!values || !live.noteArgs(values.get())) return nullptr;
    }
  }
  if (PyList_Reverse(keep.get()) < 0) return nullptr;
  return keep.release();
}

// ---- lower ---------------------------------------------------------------------------------

/// Ref(output, i) for every i < n in `cache` (genie.lower._refs).
bool growRefs(PyObject* cache, bool output, Py_ssize_t n) {
  for (Py_ssize_t i = PyList_GET_SIZE(cache); i < n; ++i) {
    Ref ref(PyObject_CallFunction(c.ref, "On", output ? Py_True : Py_False, i));
    if (!ref || PyList_Append(cache, ref.get()) < 0) return false;
  }
  return true;
}

/// A (a, b) tuple; steals neither.
PyObject* pair(PyObject* a, PyObject* b) { return PyTuple_Pack(2, a, b); }

class Lowering {
 public:
  Ref inputs{PyList_New(0)};      // ("weight" | "handle", handle) or ("inline", tensor)
  Ref input_keys{PyList_New(0)};  // ("weight", handle), ("handle", dtype), ("inline", dtype)
  Ref numbers{PyList_New(0)};     // liftable ints and floats, in walk order
  std::unordered_map<PyObject*, Py_ssize_t> input_ids;   // Value or Constant -> input index
  std::unordered_map<PyObject*, Py_ssize_t> output_ids;  // Value -> index among produced values

  bool ok() const { return inputs && input_keys && numbers; }

  /// The Ref of input `a` (a Value or Constant), added on first use. New reference.
  PyObject* addInput(PyObject* a) {
    const auto found = input_ids.find(a);
    if (found != input_ids.end()) return newItem(c.input_refs, found->second);
    Ref entry, key;
    if (reinterpret_cast<PyObject*>(Py_TYPE(a)) == c.constant) {
      Ref tensor(c.k_tensor.get(a));
      Ref dtype(tensor ? PyObject_GetAttr(tensor.get(), c.s_dtype) : nullptr);
      if (!dtype) return nullptr;
      entry.reset(pair(c.s_inline, tensor.get()));
      key.reset(pair(c.s_inline, dtype.get()));
    } else {
      Ref error(c.v_error.get(a));
      if (!error) return nullptr;
      if (error.get() != Py_None) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.get())), error.get());
        return nullptr;
      }
      Ref handle(c.v_handle.get(a));
      if (!handle) return nullptr;
      if (handle.get() == Py_None) {
        PyErr_Format(PyExc_RuntimeError, "value %R is neither pending nor resident (lost)", a);
        return nullptr;
      }
      Ref residency(c.v_residency.get(a));
      if (!residency) return nullptr;
      const long cls = PyLong_AsLong(residency.get());
      if (cls == -1 && PyErr_Occurred()) return nullptr;
      if (cls == 1) {  // PERSISTENT_WEIGHT: the handle is part of the structure
        entry.reset(pair(c.s_weight, handle.get()));
        key.reset(pair(c.s_weight, handle.get()));
      } else {
        Ref dtype(c.v_dtype.get(a));
        if (!dtype) return nullptr;
        entry.reset(pair(c.s_handle, handle.get()));
        key.reset(pair(c.s_handle, dtype.get()));
      }
    }
    if (!entry || !key || PyList_Append(inputs.get(), entry.get()) < 0 ||
        PyList_Append(input_keys.get(), key.get()) < 0) {
      return nullptr;
    }
    const Py_ssize_t i = PyList_GET_SIZE(inputs.get()) - 1;
    input_ids.emplace(a, i);
    if (i >= PyList_GET_SIZE(c.input_refs) && !growRefs(c.input_refs, false, 2 * i + 16)) return nullptr;
    return newItem(c.input_refs, i);
  }

  /// genie.lower's encoding of one argument. New reference.
  PyObject* encode(PyObject* a, bool in_float_list) {
    PyTypeObject* t = Py_TYPE(a);
    if (reinterpret_cast<PyObject*>(t) == c.value) {
      const auto found = output_ids.find(a);
      return found != output_ids.end() ? newItem(c.output_refs, found->second) : addInput(a);
    }
    if (t == &PyLong_Type) {
      if (in_float_list) return Py_NewRef(a);
      return PyList_Append(numbers.get(), a) < 0 ? nullptr : Py_NewRef(c.int_marker);
    }
    if (t == &PyFloat_Type && !in_float_list) {
      return PyList_Append(numbers.get(), a) < 0 ? nullptr : Py_NewRef(c.float_marker);
    }
    if (t == &PyList_Type || t == &PyTuple_Type) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
      PyObject** xs = PySequence_Fast_ITEMS(a);
      bool has_float = false;
      for (Py_ssize_t i = 0; i < n && !has_float; ++i) has_float = PyFloat_CheckExact(xs[i]);
      Ref out(PyTuple_New(n));
      if (!out) return nullptr;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* x = encode(xs[i], has_float);
        if (x == nullptr) return nullptr;
        PyTuple_SET_ITEM(out.get(), i, x);
      }
      return out.release();
    }
    if (reinterpret_cast<PyObject*>(t) == c.constant) return addInput(a);
    if (reinterpret_cast<PyObject*>(t) == c.device_type) {  // the node rewrites it to its own device
      Ref type(PyObject_GetAttr(a, c.s_type));
      return type ? PyObject_CallOneArg(c.device_type, type.get()) : nullptr;
    }
    return Py_NewRef(a);
  }

  /// (id(op), args, kwargs as ((name, arg), ...), num_outputs) of one node; its outputs numbered.
  PyObject* entry(PyObject* node, PyObject* ops) {
    Ref args(c.n_args.get(node));
    if (!args || !PyTuple_Check(args.get())) return nullptr;
    const Py_ssize_t nargs = PyTuple_GET_SIZE(args.get());
    Ref encoded(PyTuple_New(nargs));
    if (!encoded) return nullptr;
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      PyObject* x = encode(PyTuple_GET_ITEM(args.get(), i), false);
      if (x == nullptr) return nullptr;
      PyTuple_SET_ITEM(encoded.get(), i, x);
    }
    Ref kwargs(c.n_kwargs.get(node));
    if (!kwargs) return nullptr;
    Ref kw;
    if (PyDict_Check(kwargs.get()) && PyDict_GET_SIZE(kwargs.get()) != 0) {
      kw.reset(PyTuple_New(PyDict_GET_SIZE(kwargs.get())));
      if (!kw) return nullptr;
      Py_ssize_t pos = 0, i = 0;
      PyObject *name, *value;
      while (PyDict_Next(kwargs.get(), &pos, &name, &value)) {
        Ref x(encode(value, false));
        if (!x) return nullptr;
        PyObject* item = pair(name, x.get());
        if (item == nullptr) return nullptr;
        PyTuple_SET_ITEM(kw.get(), i++, item);
      }
    } else {
      kw.reset(PyTuple_New(0));
    }
    Ref op(c.n_op.get(node));
    Ref op_id(op ? PyLong_FromVoidPtr(op.get()) : nullptr);
    Ref num_outputs(c.n_num_outputs.get(node));
    Ref outputs(c.n_outputs.get(node));
    if (!kw || !op_id || !num_outputs || !outputs || !PyTuple_Check(outputs.get()) ||
        PyList_Append(ops, op.get()) < 0) {
      return nullptr;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(outputs.get()); ++i) {
      const Py_ssize_t produced = static_cast<Py_ssize_t>(output_ids.size());
      output_ids.emplace(PyTuple_GET_ITEM(outputs.get(), i), produced);
    }
    const auto produced = static_cast<Py_ssize_t>(output_ids.size());
    if (produced > PyList_GET_SIZE(c.output_refs) && !growRefs(c.output_refs, true, 2 * produced + 64)) return nullptr;
    return PyTuple_Pack(4, op_id.get(), encoded.get(), kw.get(), num_outputs.get());
  }

 private:
  static PyObject* newItem(PyObject* list, Py_ssize_t i) { return Py_NewRef(PyList_GET_ITEM(list, i)); }
};

/// {id(value): wire value id}: produced values num_inputs + i, then inputs i (inputs win).
PyObject* valueIds(const Lowering& l, Py_ssize_t num_inputs) {
  Ref ids(PyDict_New());
  if (!ids) return nullptr;
  const auto add = [&](PyObject* obj, Py_ssize_t id) {
    Ref k(PyLong_FromVoidPtr(obj));
    Ref v(PyLong_FromSsize_t(id));
    return k && v && PyDict_SetItem(ids.get(), k.get(), v.get()) == 0;
  };
  for (const auto& [obj, i] : l.output_ids) {
    if (!add(obj, num_inputs + i)) return nullptr;
  }
  for (const auto& [obj, i] : l.input_ids) {
    if (!add(obj, i)) return nullptr;
  }
  return ids.release();
}

PyObject* lowerPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!configured()) return nullptr;
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "lower(nodes: sequence of Node, extra_inputs: sequence of Value)");
    return nullptr;
  }
  Ref nodes(PySequence_Fast(args[0], "lower: nodes must be a sequence of Nodes"));
  Ref extra(nodes ? PySequence_Fast(args[1], "lower: extra_inputs must be a sequence of Values") : nullptr);
  if (!extra) return nullptr;
  Lowering l;
  Ref ops(PyList_New(0));
  const Py_ssize_t num_nodes = PySequence_Fast_GET_SIZE(nodes.get());
  Ref entries(PyTuple_New(num_nodes));
  if (!l.ok() || !ops || !entries) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(extra.get()); ++i) {
    Ref ref(l.addInput(PySequence_Fast_GET_ITEM(extra.get(), i)));
    if (!ref) return nullptr;
  }
  for (Py_ssize_t i = 0; i < num_nodes; ++i) {
    PyObject* e = l.entry(PySequence_Fast_GET_ITEM(nodes.get(), i), ops.get());
    if (e == nullptr) return nullptr;
    PyTuple_SET_ITEM(entries.get(), i, e);
  }
  const Py_ssize_t num_inputs = PyList_GET_SIZE(l.inputs.get());
  Ref input_keys(PyList_AsTuple(l.input_keys.get()));
  Ref key(input_keys ? pair(input_keys.get(), entries.get()) : nullptr);
  Ref value_ids(key ? valueIds(l, num_inputs) : nullptr);
  if (!value_ids) return nullptr;
  return Py_BuildValue("(OOOOnO)", key.get(), l.numbers.get(), l.inputs.get(), value_ids.get(), num_inputs, ops.get());
}

PyObject* configureCutPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_Format(PyExc_TypeError, "configure_cut(Node, Value, Storage, Constant, Ref, INT, FLOAT, input_refs, "
                 "output_refs, device_type) takes 10 arguments, got %zd", nargs);
    return nullptr;
  }
  if (!PyList_CheckExact(args[7]) || !PyList_CheckExact(args[8])) {
    PyErr_SetString(PyExc_TypeError, "configure_cut: input_refs and output_refs must be lists");
    return nullptr;
  }
  const bool ok = configure(
      "configure_cut", args, {0, 1, 2, 3, 4, 9},
      {{args[0], {{"op", &c.n_op}, {"args", &c.n_args}, {"kwargs", &c.n_kwargs}, {"num_outputs", &c.n_num_outputs},
                  {"outputs", &c.n_outputs}, {"writes", &c.n_writes}}},
       {args[1], {{"node", &c.v_node}, {"storage", &c.v_storage}, {"tensors", &c.v_tensors}, {"error", &c.v_error},
                  {"handle", &c.v_handle}, {"residency", &c.v_residency}, {"dtype", &c.v_dtype}}},
       {args[2], {{"live", &c.s_live}}},
       {args[3], {{"tensor", &c.k_tensor}}}},
      {&c.node, &c.value, &c.storage, &c.constant, &c.ref, &c.int_marker, &c.float_marker, &c.input_refs,
       &c.output_refs, &c.device_type});
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"configure_cut", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&configureCutPy)), METH_FASTCALL,
     "configure_cut(Node, Value, Storage, Constant, Ref, INT, FLOAT, input_refs, output_refs, device_type): the "
     "classes, markers and Ref caches live_nodes and lower use (genie.lower calls it once at import). TypeError "
     "when a class lacks one of the __slots__ attributes they read."},
    {"live_nodes", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&liveNodesPy)), METH_FASTCALL,
     "live_nodes(pending: list[Node], wanted: sequence of Value) -> list[Node]\n\n"
     "The pending nodes a read of `wanted` or a live tensor needs, in program order "
     "(genie.runtime.Runtime._live_nodes)."},
    {"lower", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&lowerPy)), METH_FASTCALL,
     "lower(nodes: sequence of Node, extra_inputs: sequence of Value) -> (key, numbers, inputs, value_ids, "
     "num_inputs, ops)\n\nThe fields of genie.lower.Lowered. Raises a lost input's error, RuntimeError for a "
     "value that is neither pending nor resident."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bindCutFast(py::module_& m) {
  c.s_weight = PyUnicode_InternFromString("weight");
  c.s_handle = PyUnicode_InternFromString("handle");
  c.s_inline = PyUnicode_InternFromString("inline");
  c.s_dtype = PyUnicode_InternFromString("dtype");
  c.s_type = PyUnicode_InternFromString("type");
  if (!addFunctions(m.ptr(), g_methods)) throw py::error_already_set();
}

}  // namespace genie::python
