// C extension modules in a copy: loaded by the host's ELF loader (OrochiHostTable.load_library)
// and bound to this copy's CPython through its symbol table, then initialised the way CPython's
// own `_imp.create_dynamic` / `_imp.exec_dynamic` do. Compiled into the interpreter library only.
#pragma once

#include <Python.h>

namespace orochi::copy {

// _orochi.create_extension(spec) -> module: loads spec.origin and calls its PyInit function.
PyObject* CreateExtension(PyObject* module, PyObject* spec);
// _orochi.exec_extension(module) -> None: runs a multi-phase module's exec slots.
PyObject* ExecExtension(PyObject* module, PyObject* extension);
// _orochi.c_api_address(name) -> int | None: where this copy's C-API symbol `name` is (for
// ctypes.pythonapi, which would otherwise look in the process and find nothing).
PyObject* CApiAddress(PyObject* module, PyObject* name);

}  // namespace orochi::copy
