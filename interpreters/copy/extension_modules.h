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

}  // namespace orochi::copy

// What extension modules get for dlopen, dlsym, dlclose and dlerror (bound through the copy's
// symbol table, never used by the copy's own code). A library the system loader refuses because
// it needs CPython's C API is mapped by Orochi's loader for this copy instead, and a lookup in
// the program or RTLD_DEFAULT finds this copy's C API first: ctypes.CDLL of an extension module
// and ctypes.pythonapi then work as in a stock Python.
extern "C" {
void* orochi_copy_dlopen(const char* path, int flags);
void* orochi_copy_dlsym(void* handle, const char* name);
int orochi_copy_dlclose(void* handle);
char* orochi_copy_dlerror();
}
