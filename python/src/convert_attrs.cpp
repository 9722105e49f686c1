// Attribute dictionaries between Python and qg::Attrs.
//
// Python values are read with CPython's own checks and conversions, never with nanobind's
// casts: a cast that fails throws std::bad_cast / nb::cast_error (a bare RuntimeError in
// Python, without the attribute's name), and the type's name comes from tp_name rather than
// str(type), which runs Python code while a C++ exception is being built. Every value a user
// can write becomes an Attr or a qg::Error naming the attribute.
#include <Python.h>

#include <string>
#include <vector>

#include "convert.h"
#include "core/error.h"

namespace qgpy {
namespace {

const char* type_name(PyObject* o) {
  return Py_TYPE(o)->tp_name;
}

// The Python error just raised, as "Type: message" (and cleared): why a conversion failed.
std::string take_python_error() {
#if PY_VERSION_HEX >= 0x030C0000
  PyObject* error = PyErr_GetRaisedException();
#else
  PyObject *type = nullptr, *error = nullptr, *trace = nullptr;
  PyErr_Fetch(&type, &error, &trace);
  PyErr_NormalizeException(&type, &error, &trace);
  Py_XDECREF(type);
  Py_XDECREF(trace);
#endif
  if (error == nullptr) return "no Python error";
  std::string text = type_name(error);
  if (PyObject* s = PyObject_Str(error)) {
    if (const char* c = PyUnicode_AsUTF8(s)) text += std::string(": ") + c;
    Py_DECREF(s);
  }
  PyErr_Clear();
  Py_DECREF(error);
  return text;
}

// The decimal digits of a Python int (for the message of one that does not fit).
std::string int_text(PyObject* o) {
  std::string text = "?";
  if (PyObject* s = PyObject_Str(o)) {
    if (const char* c = PyUnicode_AsUTF8(s)) text = c;
    Py_DECREF(s);
  }
  PyErr_Clear();
  return text;
}

// An int, or anything with __index__ (NumPy's integer scalars), as int64. `what` names the
// attribute (and list item) in the error.
int64_t to_int64(PyObject* o, const std::string& what) {
  PyObject* index = PyNumber_Index(o);
  QG_CHECK(index != nullptr, "python", what, " has type ", type_name(o), ", not an integer (",
           take_python_error(), ")");
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(index, &overflow);
  std::string digits = overflow != 0 ? int_text(index) : "";
  Py_DECREF(index);
  QG_CHECK(overflow == 0, "python", what, " = ", digits, " does not fit in 64 bits");
  QG_CHECK(!(v == -1 && PyErr_Occurred()), "python", what, ": ", take_python_error());
  return static_cast<int64_t>(v);
}

bool is_numpy_bool(PyObject* o) {
  return std::string(type_name(o)) == "numpy.bool" || std::string(type_name(o)) == "numpy.bool_";
}

qg::Attr to_attr(PyObject* value, const std::string& name) {
  const std::string what = "attribute '" + name + "'";
  if (PyBool_Check(value) || is_numpy_bool(value)) return qg::Attr(PyObject_IsTrue(value) == 1);
  if (PyFloat_Check(value)) return qg::Attr(PyFloat_AsDouble(value));
  if (PyUnicode_Check(value)) {
    Py_ssize_t size = 0;
    const char* utf8 = PyUnicode_AsUTF8AndSize(value, &size);
    QG_CHECK(utf8 != nullptr, "python", what, " is not valid UTF-8 (", take_python_error(), ")");
    return qg::Attr(std::string(utf8, static_cast<size_t>(size)));
  }
  if (PyList_Check(value) || PyTuple_Check(value)) {
    std::vector<int64_t> ints;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(value);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(value, i);
      const std::string item_what = what + ": item " + std::to_string(i);
      QG_CHECK(PyLong_Check(item) && !PyBool_Check(item), "python", item_what, " has type ",
               type_name(item), " (list attributes hold integers)");
      ints.push_back(to_int64(item, item_what));
    }
    return qg::Attr(ints);
  }
  if (PyLong_Check(value) || (PyIndex_Check(value) && !PyFloat_Check(value)))
    return qg::Attr(to_int64(value, what));
  QG_FAIL("python", what, " has unsupported type ", type_name(value),
          " (int, float, bool, str or a list of ints)");
}

}  // namespace

int64_t to_int(const nb::handle& obj, const std::string& what) {
  PyObject* o = obj.ptr();
  QG_CHECK(!PyBool_Check(o) && (PyLong_Check(o) || (PyIndex_Check(o) && !PyFloat_Check(o))),
           "python", what, " must be an int, got ", type_name(o));
  return to_int64(o, what);
}

qg::Attrs to_attrs(const nb::handle& dict) {
  qg::Attrs attrs;
  if (dict.is_none()) return attrs;
  PyObject* d = dict.ptr();
  QG_CHECK(PyDict_Check(d), "python", "attributes are a dict, got ", type_name(d));
  // A snapshot of the items: __index__ of a value may run Python code that changes the dict.
  nb::object items = nb::steal(PyDict_Items(d));
  QG_CHECK(items.is_valid(), "python", "attributes: ", take_python_error());
  const Py_ssize_t n = PyList_GET_SIZE(items.ptr());
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* pair = PyList_GET_ITEM(items.ptr(), i);
    PyObject* key = PyTuple_GET_ITEM(pair, 0);
    QG_CHECK(PyUnicode_Check(key), "python", "attribute names are strings, got ", type_name(key));
    const char* name = PyUnicode_AsUTF8(key);
    QG_CHECK(name != nullptr, "python", "an attribute name is not valid UTF-8 (",
             take_python_error(), ")");
    attrs.set(name, to_attr(PyTuple_GET_ITEM(pair, 1), name));
  }
  return attrs;
}

nb::object attr_to_python(const qg::Attr& a) {
  switch (a.type()) {
    case qg::AttrType::integer:
      return nb::int_(a.as_int());
    case qg::AttrType::real:
      return nb::float_(a.as_real());
    case qg::AttrType::boolean:
      return nb::bool_(a.as_bool());
    case qg::AttrType::string:
      return nb::str(a.as_string().c_str());
    case qg::AttrType::int_list: {
      nb::list l;
      for (int64_t v : a.as_ints()) l.append(v);
      return l;
    }
  }
  return nb::none();
}

}  // namespace qgpy
