// genie._C.record_single, prepare_fast, make_lazy: the recorder's hottest path in C++.
//
// Recording one op in Python (genie.recorder: dispatch -> record_op ->
// _prepare -> LazyTensor._make) cost ~10 µs per op inside a HuggingFace GPT-2 decode step on
// the development VM, a third of the step's recording. Most ops of a model step are the same
// ops on the same shapes as the step before ("plan" hits, genie.recorder._plans) with one
// output that is new or a view of an argument (`_Plan.single`). This file records exactly those
// ops, with the same objects as the Python path makes (Node, Value, Storage, Cell and the
// LazyTensor, genie.graph and genie.lazy), so that everything after recording (the cut,
// lowering, the runtime's books) sees no difference:
//
//  - prepare_fast(func, args, kwargs): recorder._prepare for calls whose arguments are all of
//    the common kinds (LazyTensors of one device, ints, strs, None, dtypes, floats, bools, and
//    lists or tuples of ints) and no keyword arguments: (runtime, node args, {}, key), with the
//    key recorder._record_form makes for them (the two must agree: tests/python compare them).
//    None when a call is not of that form (then the Python path decides, and raises PyTorch's
//    errors where it must).
//  - record_single(func, args, kwargs): the whole record_op for a plan hit with `single` set.
//    For a call prepare_fast covers that is not such a hit, what prepare_fast returns, so that
//    the Python recorder does not walk the arguments again; NotImplemented for the rest (ops
//    with a special handler, calls of another form: the caller runs the Python path).
//  - make_lazy(cls, desc, contiguous, value, runtime, base=None): LazyTensor._make.
//
// configure_recorder(LazyTensor, Cell, Node, Value, Storage, plans, special, torch.dtype,
// genie.graph._sequence) gives it the classes, the recorder's dictionaries and the node
// counter, once, when genie.recorder is imported. Node, Value and Storage are made without
// running their Python __init__ (a Python frame each): the object is allocated and every slot
// that __init__ sets is set through its member descriptor, as is Cell's `value` (no lookup by
// name). A LazyTensor's own state (cell, runtime, descriptor) is read from its TensorImpl
// (LazyState, lazy_wrapper.cc). So the slots named here must be what
// the classes' __init__ set: configure_recorder checks that each is a slot, and
// tests/python/test_c_extension.py that the objects equal those __init__ makes.
// Called with the GIL held and under genie.runtime.lock (dispatch_fallback.cc). No torch
// headers: the wrapper itself is made by lazy_wrapper.cc.
#include <pybind11/pybind11.h>

#include <utility>
#include <vector>

#include "bindings.h"
#include "py_slots.h"

namespace genie::python {
namespace {

/// The classes and dictionaries of genie.lazy, genie.graph and genie.recorder (strong refs),
/// and the slots this file reads and writes.
struct Recorder {
  PyObject* lazy_tensor = nullptr;  // genie.lazy.LazyTensor
  PyObject* cell = nullptr;         // genie.lazy.Cell
  PyObject* node = nullptr;         // genie.graph.Node
  PyObject* value = nullptr;        // genie.graph.Value
  PyObject* storage = nullptr;      // genie.graph.Storage
  PyObject* plans = nullptr;        // recorder._plans: key -> _Plan
  PyObject* special = nullptr;      // recorder._SPECIAL: id(func) -> handler
  PyObject* dtype_type = nullptr;   // torch.dtype
  PyObject* sequence = nullptr;     // genie.graph._sequence: Node.seq
  // LazyTensor
  // Cell
  Slot c_value;
  // Node (all of Node.__init__'s)
  Slot n_op, n_args, n_kwargs, n_num_outputs, n_seq, n_outputs, n_writes;
  // Value (all of Value.__init__'s)
  Slot v_node, v_index, v_handle, v_storage, v_tensors, v_residency, v_dtype, v_error, v_host;
  // Storage
  Slot s_live, s_written;
};
Recorder g;

/// Interned attribute names, made once.
struct Names {
  PyObject *single, *index, *record, *dead, *refs, *nan;
};
Names n;

PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

bool configured() {
  if (g.lazy_tensor != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "genie._C: configure_recorder was not called (import genie first)");
  return false;
}

bool allInts(PyObject* seq) {
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  for (Py_ssize_t i = 0; i < size; ++i) {
    if (!PyLong_CheckExact(items[i])) return false;
  }
  return true;
}

/// The result of prepare: key and node args and kwargs, and the runtime (borrowed from an argument).
struct Prepared {
  Ref key;     // tuple
  Ref rec;     // tuple
  Ref kwargs;  // dict
  PyObject* runtime = nullptr;
};

/// recorder._record_form of one argument `a` for the common kinds: appends its part of the key
/// and returns its node form (a new reference). nullptr with no Python error set when `a` is
/// not of those kinds (or names another runtime, or holds a lost value: Python raises then),
/// nullptr with an error set on failure. `runtime`: the call's runtime so far (borrowed).
PyObject* convert(PyObject* a, PyObject* key, PyObject*& runtime) {
  PyTypeObject* t = Py_TYPE(a);
  if (reinterpret_cast<PyObject*>(t) == g.lazy_tensor) {
    const LazyState* state = lazyStateOf(a);
    if (state == nullptr || state->cell == nullptr) return nullptr;  // not recorded by Genie: Python decides
    if (runtime != nullptr && runtime != state->runtime) return nullptr;  // Python raises the device error
    runtime = state->runtime;  // borrowed: the argument keeps it
    if (PyList_Append(key, state->desc) < 0) return nullptr;
    Ref value(g.c_value.get(state->cell));
    if (!value) return nullptr;
    Ref error(g.v_error.get(value.get()));
    if (!error || error.get() != Py_None) return nullptr;  // a lost value: Python raises its error
    return value.release();
  }
  if (t == &PyLong_Type || t == &PyUnicode_Type || a == Py_None || reinterpret_cast<PyObject*>(t) == g.dtype_type) {
    if (PyList_Append(key, a) < 0) return nullptr;
    Py_INCREF(a);
    return a;
  }
  if (t == &PyFloat_Type || t == &PyBool_Type) {
    // Tagged with the type: 1 == 1.0 == True (recorder._record_form).
    if (PyList_Append(key, reinterpret_cast<PyObject*>(t)) < 0) return nullptr;
    const bool nan = t == &PyFloat_Type && PyFloat_AS_DOUBLE(a) != PyFloat_AS_DOUBLE(a);
    if (PyList_Append(key, nan ? n.nan : a) < 0) return nullptr;
    Py_INCREF(a);
    return a;
  }
  if (t == &PyList_Type || t == &PyTuple_Type) {
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(a);
    PyObject** items = PySequence_Fast_ITEMS(a);
    if (PyList_Append(key, reinterpret_cast<PyObject*>(t)) < 0) return nullptr;
    if (allInts(a)) {
      for (Py_ssize_t j = 0; j < size; ++j) {
        if (PyList_Append(key, items[j]) < 0) return nullptr;
      }
      Ref len(PyLong_FromSsize_t(size));
      if (!len || PyList_Append(key, len.get()) < 0) return nullptr;
      if (t == &PyList_Type) return PyList_GetSlice(a, 0, size);  // a copy: the program may change its list
      Py_INCREF(a);
      return a;
    }
    // A list of tensors (aten::cat) or of mixed kinds: each element's form; ints stand for themselves.
    Ref out(t == &PyList_Type ? PyList_New(size) : PyTuple_New(size));
    if (!out) return nullptr;
    for (Py_ssize_t j = 0; j < size; ++j) {
      PyObject* item;
      if (PyLong_CheckExact(items[j])) {
        if (PyList_Append(key, items[j]) < 0) return nullptr;
        Py_INCREF(items[j]);
        item = items[j];
      } else {
        item = convert(items[j], key, runtime);
        if (item == nullptr) return nullptr;
      }
      if (t == &PyList_Type) {
        PyList_SET_ITEM(out.get(), j, item);  // steals
      } else {
        PyTuple_SET_ITEM(out.get(), j, item);
      }
    }
    Ref len(PyLong_FromSsize_t(size));
    if (!len || PyList_Append(key, len.get()) < 0) return nullptr;
    return out.release();
  }
  return nullptr;
}

/// recorder._prepare's common cases (see the top of this file). Returns false with no Python
/// error set when the call is not of that form, false with an error set on failure.
bool prepare(PyObject* func_id, PyObject* args, PyObject* kwargs, Prepared& out) {
  if (!PyTuple_CheckExact(args)) return false;
  if (kwargs != nullptr && kwargs != Py_None && !PyDict_Check(kwargs)) return false;
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  Ref key(PyList_New(0));
  Ref rec(PyTuple_New(nargs));
  Ref rec_kwargs(PyDict_New());
  if (!key || !rec || !rec_kwargs) return false;
  if (PyList_Append(key.get(), func_id) < 0) return false;
  PyObject* runtime = nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* item = convert(PyTuple_GET_ITEM(args, i), key.get(), runtime);
    if (item == nullptr) return false;
    PyTuple_SET_ITEM(rec.get(), i, item);  // steals
  }
  if (kwargs != nullptr && kwargs != Py_None) {
    PyObject *name, *a;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kwargs, &pos, &name, &a)) {
      if (PyList_Append(key.get(), name) < 0) return false;
      Ref item(convert(a, key.get(), runtime));
      if (!item || PyDict_SetItem(rec_kwargs.get(), name, item.get()) < 0) return false;
    }
  }
  if (runtime == nullptr) return false;
  out.key.reset(PyList_AsTuple(key.get()));
  if (!out.key) return false;
  out.rec.reset(rec.release());
  out.kwargs.reset(rec_kwargs.release());
  out.runtime = runtime;
  return true;
}

/// obj.<slot> += delta for an int slot.
bool addToInt(PyObject* obj, const Slot& slot, long delta) {
  Ref v(slot.get(obj));
  if (!v) return false;
  const long current = PyLong_AsLong(v.get());
  if (current == -1 && PyErr_Occurred()) return false;
  Ref updated(PyLong_FromLong(current + delta));
  return updated && slot.set(obj, updated.get());
}

/// A new instance of `cls` (a class with __slots__) whose `__init__` has not run: the caller
/// sets every slot its `__init__` would.
PyObject* allocate(PyObject* cls) {
  PyTypeObject* type = reinterpret_cast<PyTypeObject*>(cls);
  return type->tp_alloc(type, 0);
}

/// Node(op, args, kwargs, num_outputs) (genie.graph.Node.__init__), writes ().
PyObject* newNode(PyObject* op, PyObject* args, PyObject* kwargs, PyObject* num_outputs) {
  Ref node(allocate(g.node));
  Ref seq(node ? PyIter_Next(g.sequence) : nullptr);
  Ref empty(PyTuple_New(0));
  if (!seq || !empty) return nullptr;
  if (!g.n_op.set(node.get(), op) || !g.n_args.set(node.get(), args) || !g.n_kwargs.set(node.get(), kwargs) ||
      !g.n_num_outputs.set(node.get(), num_outputs) || !g.n_seq.set(node.get(), seq.get()) ||
      !g.n_outputs.set(node.get(), empty.get()) || !g.n_writes.set(node.get(), empty.get())) {
    return nullptr;
  }
  return node.release();
}

/// Value(node, index, storage, dtype) (genie.graph.Value.__init__).
PyObject* newValue(PyObject* node, PyObject* index, PyObject* storage, PyObject* dtype) {
  static PyObject* const zero = PyLong_FromLong(0);
  Ref value(allocate(g.value));
  if (!value) return nullptr;
  PyObject* v = value.get();
  if (!g.v_node.set(v, node) || !g.v_index.set(v, index) || !g.v_handle.set(v, Py_None) ||
      !g.v_storage.set(v, storage) || !g.v_tensors.set(v, zero) || !g.v_residency.set(v, zero) ||
      !g.v_dtype.set(v, dtype) || !g.v_error.set(v, Py_None) || !g.v_host.set(v, Py_None)) {
    return nullptr;
  }
  return value.release();
}

/// Storage() (genie.graph.Storage.__init__).
PyObject* newStorage() {
  static PyObject* const zero = PyLong_FromLong(0);
  Ref storage(allocate(g.storage));
  if (!storage || !g.s_live.set(storage.get(), zero) || !g.s_written.set(storage.get(), Py_False)) return nullptr;
  return storage.release();
}

/// Gives `state` a new Cell on `value` in `runtime`: one more tensor on the value and its
/// storage, the cell registered in runtime._refs (Runtime.track). False with an error set.
bool attachValue(LazyState& state, PyObject* value, PyObject* runtime) {
  Ref cell(allocate(g.cell));
  if (!cell || !g.c_value.set(cell.get(), value)) return false;
  if (!addToInt(value, g.v_tensors, 1)) return false;
  Ref storage(g.v_storage.get(value));
  if (!storage || !addToInt(storage.get(), g.s_live, 1)) return false;
  Ref refs(PyObject_GetAttr(runtime, n.refs));
  Ref cell_id(PyLong_FromVoidPtr(cell.get()));  // keyed by id: the runtime's books
  if (!refs || !cell_id || PyObject_SetItem(refs.get(), cell_id.get(), cell.get()) < 0) return false;
  Py_INCREF(runtime);
  Py_XSETREF(state.runtime, runtime);
  Py_XSETREF(state.cell, cell.release());
  return true;
}

}  // namespace

bool attachCopy(const LazyState& source, LazyState& copy) {
  if (!configured()) return false;
  Ref value(g.c_value.get(source.cell));
  if (!value) return false;
  Py_XINCREF(source.desc);
  Py_XSETREF(copy.desc, source.desc);
  return attachValue(copy, value.get(), source.runtime);
}

void releaseState(LazyState& state) {
  PyObject *type, *error, *traceback;
  PyErr_Fetch(&type, &error, &traceback);  // a destructor may run while an error is being raised
  if (state.cell != nullptr && state.runtime != nullptr) {
    // Runtime._on_tensor_dead, inlined: no Python code runs (destructors run anywhere).
    Ref refs(PyObject_GetAttr(state.runtime, n.refs));
    Ref cell_id(PyLong_FromVoidPtr(state.cell));
    if (refs && cell_id && PyDict_Check(refs.get()) && PyDict_DelItem(refs.get(), cell_id.get()) < 0) PyErr_Clear();
    Ref dead(PyObject_GetAttr(state.runtime, n.dead));
    Ref value(g.c_value.get(state.cell));
    if (dead && value && PyList_Append(dead.get(), value.get()) < 0) PyErr_Clear();
    PyErr_Clear();
  }
  Py_CLEAR(state.cell);
  Py_CLEAR(state.runtime);
  Py_CLEAR(state.desc);
  PyErr_Restore(type, error, traceback);
}

namespace {

/// LazyTensor._make (genie.lazy): a new LazyTensor of type `cls` for `value` with descriptor
/// `desc` = (shape, strides, offset, dtype); `base` (or None): the tensor it is a view of.
PyObject* makeLazy(PyObject* cls, PyObject* desc, bool contiguous, PyObject* value, PyObject* runtime,
                   PyObject* base) {
  if (!PyTuple_Check(desc) || PyTuple_GET_SIZE(desc) != 4) {
    PyErr_SetString(PyExc_TypeError, "make_lazy: desc must be a tuple (shape, strides, offset, dtype)");
    return nullptr;
  }
  Ref index(PyObject_GetAttr(runtime, n.index));
  if (!index) return nullptr;
  static PyObject* const zero = PyLong_FromLong(0);
  PyObject* wrapper_args[7] = {cls,
                               PyTuple_GET_ITEM(desc, 0),
                               contiguous ? Py_None : PyTuple_GET_ITEM(desc, 1),
                               contiguous ? zero : PyTuple_GET_ITEM(desc, 2),
                               PyTuple_GET_ITEM(desc, 3),
                               index.get(),
                               base};
  const bool has_base = base != nullptr && base != Py_None;
  Ref r(makeWrapperFast(wrapper_args, has_base ? 7 : 6));
  if (!r) return nullptr;
  LazyState* state = lazyStateOf(r.get());
  if (state == nullptr) {
    PyErr_SetString(PyExc_TypeError, "make_lazy: the wrapper is not a LazyTensor's");
    return nullptr;
  }
  Py_INCREF(desc);
  Py_XSETREF(state->desc, desc);
  if (!attachValue(*state, value, runtime)) return nullptr;
  return r.release();
}

/// lazy_state(tensor) -> (cell, runtime, desc) | None.
PyObject* lazyStatePy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_Format(PyExc_TypeError, "lazy_state(tensor) takes 1 argument, got %zd", nargs);
    return nullptr;
  }
  const LazyState* state = lazyStateOf(args[0]);
  if (state == nullptr || state->cell == nullptr) Py_RETURN_NONE;
  return PyTuple_Pack(3, state->cell, state->runtime, state->desc);
}

/// set_lazy_desc(tensor, desc): a LazyTensor's descriptor after its geometry changed.
PyObject* setLazyDescPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[1]) || PyTuple_GET_SIZE(args[1]) != 4) {
    PyErr_SetString(PyExc_TypeError, "set_lazy_desc(tensor, desc): desc must be a tuple (shape, strides, offset, dtype)");
    return nullptr;
  }
  LazyState* state = lazyStateOf(args[0]);
  if (state == nullptr) {
    PyErr_Format(PyExc_TypeError, "set_lazy_desc: expected a LazyTensor, got %s", Py_TYPE(args[0])->tp_name);
    return nullptr;
  }
  Py_INCREF(args[1]);
  Py_XSETREF(state->desc, args[1]);
  Py_RETURN_NONE;
}

PyObject* makeLazyPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 && nargs != 6) {
    PyErr_Format(PyExc_TypeError, "make_lazy(cls, desc, contiguous, value, runtime[, base]) takes 5 or 6 arguments, "
                 "got %zd", nargs);
    return nullptr;
  }
  if (!configured()) return nullptr;
  const int contiguous = PyObject_IsTrue(args[2]);
  if (contiguous < 0) return nullptr;
  return makeLazy(args[0], args[1], contiguous != 0, args[3], args[4], nargs == 6 ? args[5] : nullptr);
}

/// (runtime, node args, {}, key): recorder._prepare's result.
PyObject* preparedTuple(const Prepared& p) {
  return PyTuple_Pack(4, p.runtime, p.rec.get(), p.kwargs.get(), p.key.get());
}

PyObject* prepareFastPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "prepare_fast(func, args, kwargs) takes 3 arguments, got %zd", nargs);
    return nullptr;
  }
  if (!configured()) return nullptr;
  Ref id(PyLong_FromVoidPtr(args[0]));  // id(func)
  Prepared p;
  if (!id || !prepare(id.get(), args[1], args[2], p)) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NONE;
  }
  return preparedTuple(p);
}

}  // namespace

/// recorder.record_op for a plan hit with `single` set; the prepared call for another call
/// prepare covers; NotImplemented otherwise (see the top of this file).
PyObject* recordCall(PyObject* func, PyObject* call_args, PyObject* call_kwargs) {
  if (!configured()) return nullptr;
  Ref id(PyLong_FromVoidPtr(func));  // id(func)
  if (!id) return nullptr;
  if (PyDict_GetItemWithError(g.special, id.get()) != nullptr) Py_RETURN_NOTIMPLEMENTED;  // borrowed
  if (PyErr_Occurred()) return nullptr;
  Prepared p;
  if (!prepare(id.get(), call_args, call_kwargs, p)) {
    if (PyErr_Occurred()) return nullptr;
    Py_RETURN_NOTIMPLEMENTED;
  }
  PyObject* plan = PyDict_GetItemWithError(g.plans, p.key.get());  // borrowed
  if (plan == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    return preparedTuple(p);
  }
  Ref single(PyObject_GetAttr(plan, n.single));
  if (!single) return nullptr;
  if (single.get() == Py_None) return preparedTuple(p);
  // single = (desc, contiguous, view_of); from here on, recorder.record_op's `single` branch.
  PyObject* desc = PyTuple_GET_ITEM(single.get(), 0);
  const int contiguous = PyObject_IsTrue(PyTuple_GET_ITEM(single.get(), 1));
  if (contiguous < 0) return nullptr;
  const long view_of = PyLong_AsLong(PyTuple_GET_ITEM(single.get(), 2));
  if (view_of == -1 && PyErr_Occurred()) return nullptr;

  Ref one(PyLong_FromLong(1));
  if (!one) return nullptr;
  Ref node(newNode(func, p.rec.get(), p.kwargs.get(), one.get()));
  if (!node) return nullptr;
  {
    Ref recorded(PyObject_CallMethodOneArg(p.runtime, n.record, node.get()));
    if (!recorded) return nullptr;
  }
  PyObject* base = nullptr;
  if (view_of >= 0 && view_of < PyTuple_GET_SIZE(call_args) &&
      lazyStateOf(PyTuple_GET_ITEM(call_args, view_of)) != nullptr) {
    base = PyTuple_GET_ITEM(call_args, view_of);
  }
  Ref storage;
  if (base == nullptr) {
    storage.reset(newStorage());
  } else {
    Ref value(g.c_value.get(lazyStateOf(base)->cell));
    storage.reset(value ? g.v_storage.get(value.get()) : nullptr);
  }
  if (!storage) return nullptr;
  Ref zero(PyLong_FromLong(0));
  if (!zero) return nullptr;
  Ref value(newValue(node.get(), zero.get(), storage.get(), PyTuple_GET_ITEM(desc, 3)));
  if (!value) return nullptr;
  Ref outputs(PyTuple_Pack(1, value.get()));
  if (!outputs || !g.n_outputs.set(node.get(), outputs.get())) return nullptr;
  return makeLazy(g.lazy_tensor, desc, contiguous != 0, value.get(), p.runtime, base);
}

namespace {

PyObject* recordSinglePy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "record_single(func, args, kwargs) takes 3 arguments, got %zd", nargs);
    return nullptr;
  }
  return recordCall(args[0], args[1], args[2]);
}

PyObject* configurePy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_Format(PyExc_TypeError, "configure_recorder(LazyTensor, Cell, Node, Value, Storage, plans, special, "
                 "dtype_type, sequence) takes 9 arguments, got %zd", nargs);
    return nullptr;
  }
  if (!PyDict_Check(args[5]) || !PyDict_Check(args[6]) || !PyIter_Check(args[8])) {
    PyErr_SetString(PyExc_TypeError, "configure_recorder: plans and special must be dicts, sequence an iterator");
    return nullptr;
  }
  const bool ok = configure(
      "configure_recorder", args, {0, 1, 2, 3, 4, 7},
      {{args[1], {{"value", &g.c_value}}},
       {args[2], {{"op", &g.n_op}, {"args", &g.n_args}, {"kwargs", &g.n_kwargs}, {"num_outputs", &g.n_num_outputs},
                  {"seq", &g.n_seq}, {"outputs", &g.n_outputs}, {"writes", &g.n_writes}}},
       {args[3], {{"node", &g.v_node}, {"index", &g.v_index}, {"handle", &g.v_handle}, {"storage", &g.v_storage},
                  {"tensors", &g.v_tensors}, {"residency", &g.v_residency}, {"dtype", &g.v_dtype},
                  {"error", &g.v_error}, {"host", &g.v_host}}},
       {args[4], {{"live", &g.s_live}, {"written", &g.s_written}}}},
      {&g.lazy_tensor, &g.cell, &g.node, &g.value, &g.storage, &g.plans, &g.special, &g.dtype_type, &g.sequence});
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"configure_recorder", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&configurePy)), METH_FASTCALL,
     "configure_recorder(LazyTensor, Cell, Node, Value, Storage, plans, special, dtype_type, sequence): the "
     "classes, dictionaries and Node.seq counter record_single uses (genie.recorder calls it once at import). "
     "TypeError when a class lacks one of the __slots__ attributes it sets."},
    {"prepare_fast", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&prepareFastPy)), METH_FASTCALL,
     "prepare_fast(func, args, kwargs) -> (runtime, node args, {}, key) | None\n\n"
     "genie.recorder._prepare for calls of the common form (python/csrc/recorder_fast.cc); None otherwise."},
    {"record_single", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&recordSinglePy)), METH_FASTCALL,
     "record_single(func, args, kwargs) -> LazyTensor | tuple | NotImplemented\n\n"
     "Records `func` when its shape plan is cached and it makes one new tensor or one view "
     "(genie.recorder.record_op's `single` case). Any other call prepare_fast covers: prepare_fast's "
     "tuple, for recorder.record_op(func, args, kwargs, prepared). NotImplemented for the rest "
     "(special ops, other argument kinds)."},
    {"lazy_state", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&lazyStatePy)), METH_FASTCALL,
     "lazy_state(tensor) -> (cell, runtime, desc) | None: the recording state a LazyTensor's TensorImpl holds "
     "(genie.lazy.Cell, genie.runtime.Runtime, (shape, strides, offset, dtype)); None for any other tensor."},
    {"set_lazy_desc", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&setLazyDescPy)), METH_FASTCALL,
     "set_lazy_desc(tensor, desc): sets a LazyTensor's descriptor (after its geometry changed: resize, set_data). "
     "TypeError for another tensor or a malformed desc."},
    {"make_lazy", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&makeLazyPy)), METH_FASTCALL,
     "make_lazy(cls, desc, contiguous, value, runtime[, base]) -> LazyTensor (genie.lazy.LazyTensor._make)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bindRecorderFast(py::module_& m) {
  n = Names{intern("single"), intern("index"), intern("record"), intern("dead"), intern("_refs"),
            intern("nan")};
  if (!addFunctions(m.ptr(), g_methods)) throw py::error_already_set();
}

}  // namespace genie::python
