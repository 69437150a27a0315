// The `_orochi_engine` built-in module: the shared engine's tensors and ops as Python objects,
// compiled into every interpreter copy (pybind11). The `orochi` package re-exports it.
//
// Each copy has its own module, types and dtype objects; the tensors they wrap live in the one
// shared engine, so a tensor handed from one copy to another is the same storage.
#pragma once

#include <Python.h>

#include "orochi/engine/tensor.h"

namespace orochi::copy {

// Creates the module; registered with PyImport_AppendInittab before CPython starts.
PyObject* InitEngineModule();

// Frees what the bindings keep beyond CPython's life (pybind11's internals and the thread-local
// keys they hold, which would otherwise run out after some hundreds of copies). Call after
// Py_FinalizeEx.
void ReleaseEngineBindings();

// A new Python orochi.Tensor holding `tensor` (a view: no data is copied), or null with a
// Python error set. Needs the GIL.
PyObject* TensorToPython(engine::Tensor tensor);

// The engine tensor inside `object`, or null (no Python error set) when `object` is not an
// orochi.Tensor. Borrowed: valid while `object` lives. Needs the GIL.
const engine::Tensor* TensorFromPython(PyObject* object);

}  // namespace orochi::copy
