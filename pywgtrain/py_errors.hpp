// Translates core exceptions into pywgtrain's Python exception types. Cython
// calls raise_py_error() inside a catch block (`except +raise_py_error`).
#pragma once
#include <Python.h>

#include <new>
#include <stdexcept>

#include "errors.hpp"

namespace pwt {

struct PyErrorTypes {
  PyObject* gpu = nullptr;
  PyObject* validation = nullptr;
  PyObject* out_of_memory = nullptr;
  PyObject* device_lost = nullptr;
};

inline PyErrorTypes& py_error_types() {
  static PyErrorTypes t;
  return t;
}

inline void set_py_error_types(PyObject* gpu, PyObject* validation, PyObject* oom, PyObject* lost) {
  auto& t = py_error_types();
  t.gpu = gpu; t.validation = validation; t.out_of_memory = oom; t.device_lost = lost;
}

inline void raise_py_error() {
  const auto& t = py_error_types();
  try {
    throw;
  } catch (const DeviceLostError& e) {
    PyErr_SetString(t.device_lost, e.what());
  } catch (const OutOfMemoryError& e) {
    PyErr_SetString(t.out_of_memory, e.what());
  } catch (const ValidationError& e) {
    PyErr_SetString(t.validation, e.what());
  } catch (const GpuError& e) {
    PyErr_SetString(t.gpu, e.what());
  } catch (const ArgumentError& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, "host memory exhausted");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
  }
}

}  // namespace pwt
