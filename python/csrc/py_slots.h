// Small CPython helpers shared by the C++ paths that read and make genie.graph objects
// (recorder_fast.cc, cut_fast.cc): a `__slots__` attribute read and written through its
// member descriptor, and an owning PyObject reference. No torch headers.
#pragma once

#include <Python.h>

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

}  // namespace genie::python
