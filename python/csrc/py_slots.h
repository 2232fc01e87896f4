// Small CPython helpers shared by the C++ paths that read and make genie.graph objects
// (recorder_fast.cc, cut_fast.cc): a `__slots__` attribute read and written through its
// member descriptor, an owning PyObject reference, the configure_* step that looks the slots
// up and keeps the classes, and module-function registration. No torch headers.
#pragma once

#include <Python.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace genie::python {

/// One `__slots__` attribute of a class: its member descriptor, read and written directly (no
/// attribute lookup by name). get: a new reference, or nullptr with AttributeError when unset.
struct Slot {
  PyObject* descr = nullptr;
  PyObject* get(PyObject* obj) const {
    return Py_TYPE(descr)->tp_descr_get(descr, obj, reinterpret_cast<PyObject*>(Py_TYPE(obj)));
  }
  bool set(PyObject* obj, PyObject* value) const { return Py_TYPE(descr)->tp_descr_set(descr, obj, value) == 0; }
};

/// Steals a new reference; Py_XDECREF at scope exit.
struct Ref {
  PyObject* p;
  explicit Ref(PyObject* o = nullptr) : p(o) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(p); }
  PyObject* get() const { return p; }
  void reset(PyObject* o) {
    Py_XDECREF(p);
    p = o;
  }
  PyObject* release() {
    PyObject* o = p;
    p = nullptr;
    return o;
  }
  explicit operator bool() const { return p != nullptr; }
};

/// The member descriptor of `cls`'s slot `name` into `slot`; false with TypeError naming
/// `caller` when `name` is not a `__slots__` attribute of `cls`.
inline bool slotOf(PyObject* cls, const char* name, Slot& slot, const char* caller) {
  Ref descr(PyObject_GetAttrString(cls, name));
  if (!descr) return false;
  if (!PyObject_TypeCheck(descr.get(), &PyMemberDescr_Type)) {
    PyErr_Format(PyExc_TypeError, "%s: %s.%s is not a __slots__ attribute", caller,
                 reinterpret_cast<PyTypeObject*>(cls)->tp_name, name);
    return false;
  }
  Py_XSETREF(slot.descr, descr.release());
  return true;
}

/// A class and the slots of it to look up: (name, where its descriptor goes).
struct ClassSlots {
  PyObject* cls;
  std::vector<std::pair<const char*, Slot*>> slots;
};

/// Configuring a C++ path from Python (`configure_recorder`, `configure_cut`): TypeError
/// naming `caller` unless every args[i] for i in `classes` is a class; then every slot of
/// `lookups` found (slotOf); then a new reference to args[i] kept in *keep[i], replacing the
/// one kept before. False with the error set on failure (nothing kept).
inline bool configure(const char* caller, PyObject* const* args, std::initializer_list<int> classes,
                      std::initializer_list<ClassSlots> lookups, std::initializer_list<PyObject**> keep) {
  for (int i : classes) {
    if (!PyType_Check(args[i])) {
      PyErr_Format(PyExc_TypeError, "%s: argument %d must be a class, got %s", caller, i, Py_TYPE(args[i])->tp_name);
      return false;
    }
  }
  for (const ClassSlots& lookup : lookups) {
    for (const auto& [name, slot] : lookup.slots) {
      if (!slotOf(lookup.cls, name, *slot, caller)) return false;
    }
  }
  int i = 0;
  for (PyObject** into : keep) {
    Py_INCREF(args[i]);
    Py_XSETREF(*into, args[i]);
    ++i;
  }
  return true;
}

/// Adds `methods` (up to the entry with a null name) to `module` as module functions.
/// False with the error set on failure.
inline bool addFunctions(PyObject* module, PyMethodDef* methods) {
  for (PyMethodDef* def = methods; def->ml_name != nullptr; ++def) {
    PyObject* function = PyCFunction_NewEx(def, nullptr, module);
    if (function == nullptr || PyModule_AddObject(module, def->ml_name, function) < 0) {
      Py_XDECREF(function);
      return false;
    }
  }
  return true;
}

}  // namespace genie::python
