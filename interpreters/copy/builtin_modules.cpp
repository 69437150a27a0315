// Built-in modules compiled into every interpreter copy:
//   _orochi       the copy's side of the host boundary (host functions, copy identity)
//   _orochi_engine  the shared engine's tensors and ops (python_engine.h)
//   _contextvars  re-exports the context-variable types that live in CPython's core; Debian
//                 ships this module as a separate .so, which a copy cannot load, and without
//                 it `contextvars` and so `asyncio` would not import.
#include <Python.h>
#include <pthread.h>

#include <cstdio>
#include <string>

#include "copy_state.h"
#include "extension_modules.h"
#include "python_engine.h"

namespace orochi::copy {
namespace {

struct HostReply {
  OrochiReply reply{};
  PyObject* result = nullptr;  // new reference, or null with a Python error set
};

void ReplySetValue(OrochiReply* reply, const OrochiValue* value) {
  auto* self = static_cast<HostReply*>(reply->host_state);
  switch (value->kind) {
    case OROCHI_VALUE_NONE:
      self->result = Py_NewRef(Py_None);
      break;
    case OROCHI_VALUE_BOOL:
      self->result = PyBool_FromLong(value->int_value != 0);
      break;
    case OROCHI_VALUE_INT:
      self->result = PyLong_FromLongLong(value->int_value);
      break;
    case OROCHI_VALUE_FLOAT:
      self->result = PyFloat_FromDouble(value->float_value);
      break;
    case OROCHI_VALUE_STR:
      self->result = PyUnicode_DecodeUTF8(value->data, static_cast<Py_ssize_t>(value->size),
                                          "surrogateescape");
      break;
    case OROCHI_VALUE_TENSOR:
      self->result = TensorToPython(engine::Tensor::FromHandle(value->tensor));
      break;
    default:
      self->result = PyBytes_FromStringAndSize(value->data, static_cast<Py_ssize_t>(value->size));
  }
}

void ReplySetError(OrochiReply* reply, const OrochiError* error) {
  auto* self = static_cast<HostReply*>(reply->host_state);
  PyErr_Format(PyExc_RuntimeError, "host function failed: %s", error->message);
  self->result = nullptr;
}

// _orochi.call_host(name, payload=b"") -> bytes | str | int | float | bool | None
//
// Deliberately keeps this copy's GIL for the whole call: host functions are short, and tests
// use this to show that copies hold independent GILs at the same moment.
PyObject* CallHost(PyObject* /*module*/, PyObject* args) {
  const char* name = nullptr;
  Py_buffer payload{};
  payload.buf = nullptr;
  if (!PyArg_ParseTuple(args, "s|s*:call_host", &name, &payload)) return nullptr;
  const CopyState& state = State();
  HostReply host_reply;
  host_reply.reply = {&host_reply, ReplySetValue, ReplySetError};
  int32_t code =
      state.host->call_host(state.host->host_state, name, static_cast<const char*>(payload.buf),
                            static_cast<size_t>(payload.len), &host_reply.reply);
  if (payload.obj != nullptr || payload.buf != nullptr) PyBuffer_Release(&payload);
  if (code != OROCHI_COPY_OK && host_reply.result == nullptr && !PyErr_Occurred()) {
    PyErr_Format(PyExc_RuntimeError, "host function '%s' failed with code %d", name, code);
  }
  if (host_reply.result == nullptr && !PyErr_Occurred()) host_reply.result = Py_NewRef(Py_None);
  return host_reply.result;
}

// _orochi.write_output(stream, line, cut): one line of sys.stdout (1) or sys.stderr (2) to the
// host. Text the host cannot take as UTF-8 (lone surrogates) goes as backslash escapes.
PyObject* WriteOutput(PyObject* /*module*/, PyObject* args) {
  int stream = 0;
  PyObject* line = nullptr;
  int cut = 0;
  if (!PyArg_ParseTuple(args, "iU|p:write_output", &stream, &line, &cut)) return nullptr;
  if (stream != OROCHI_OUTPUT_STDOUT && stream != OROCHI_OUTPUT_STDERR) {
    PyErr_Format(PyExc_ValueError, "stream must be 1 (stdout) or 2 (stderr), not %d", stream);
    return nullptr;
  }
  PyObject* encoded = PyUnicode_AsEncodedString(line, "utf-8", "backslashreplace");
  if (encoded == nullptr) return nullptr;
  const OrochiHostTable* host = State().host;
  host->write_output(host->host_state, stream, PyBytes_AS_STRING(encoded),
                     static_cast<size_t>(PyBytes_GET_SIZE(encoded)), cut != 0 ? 1 : 0);
  Py_DECREF(encoded);
  Py_RETURN_NONE;
}

// _orochi.run_file(path, globals): runs a program file as CPython's own runner does, through
// the tokenizer reading the file, so that source it cannot decode is reported as CPython reports
// it ("Non-UTF-8 code starting with ... in file ..."), not as compile()'s "(unicode error)".
PyObject* RunFile(PyObject* /*module*/, PyObject* args) {
  PyObject* path = nullptr;
  PyObject* globals = nullptr;
  if (!PyArg_ParseTuple(args, "O&O!:run_file", PyUnicode_FSConverter, &path, &PyDict_Type,
                        &globals)) {
    return nullptr;
  }
  const char* path_bytes = PyBytes_AS_STRING(path);
  FILE* file = std::fopen(path_bytes, "rb");
  if (file == nullptr) {
    PyErr_SetFromErrnoWithFilename(PyExc_OSError, path_bytes);
    Py_DECREF(path);
    return nullptr;
  }
  PyCompilerFlags flags = _PyCompilerFlags_INIT;
  PyObject* result =
      PyRun_FileExFlags(file, path_bytes, Py_file_input, globals, globals, /*closeit=*/1, &flags);
  Py_DECREF(path);
  return result;
}

PyObject* CopyId(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyLong_FromLong(State().copy_id);
}

// Returns (address of this copy's CopyState, its probe counter after incrementing it).
PyObject* StateProbe(PyObject* /*module*/, PyObject* /*unused*/) {
  CopyState& state = State();
  state.probe_counter += 1;
  return Py_BuildValue("(KL)", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(&state)),
                       static_cast<long long>(state.probe_counter));
}

PyMethodDef kOrochiMethods[] = {
    {"call_host", CallHost, METH_VARARGS,
     "call_host(name, payload=b'') -> result of the host function registered as `name`"},
    {"copy_id", CopyId, METH_NOARGS, "copy_id() -> the number of this interpreter copy"},
    {"run_file", RunFile, METH_VARARGS,
     "run_file(path, globals) -> None: runs a program file as CPython's file runner does"},
    {"write_output", WriteOutput, METH_VARARGS,
     "write_output(stream, line, cut=False): one line of sys.stdout (1) or sys.stderr (2) to "
     "the host; only when the host redirects the copy's output"},
    {"_state_probe", StateProbe, METH_NOARGS,
     "_state_probe() -> (address, counter) of this copy's private C++ state; for tests"},
    {"create_extension", CreateExtension, METH_O,
     "create_extension(spec) -> module: a C extension module loaded into this copy"},
    {"exec_extension", ExecExtension, METH_O,
     "exec_extension(module): runs a multi-phase extension module's exec slots"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kOrochiModule = {
    PyModuleDef_HEAD_INIT,
    "_orochi",
    "The interpreter copy's side of the boundary with the Orochi host process.",
    0,
    kOrochiMethods,
};

PyObject* InitOrochiModule() {
  PyObject* module = PyModule_Create(&kOrochiModule);
  if (module == nullptr) return nullptr;
  if (PyModule_AddIntConstant(module, "ABI_VERSION", OROCHI_COPY_ABI_VERSION) < 0 ||
      PyModule_AddIntConstant(module, "OUTPUT_LINE_LIMIT", OROCHI_COPY_OUTPUT_LINE_LIMIT) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}

PyObject* CopyContext(PyObject* /*module*/, PyObject* /*unused*/) {
  return PyContext_CopyCurrent();
}

PyMethodDef kContextVarsMethods[] = {
    {"copy_context", CopyContext, METH_NOARGS, "copy_context() -> a copy of the current Context"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kContextVarsModule = {
    PyModuleDef_HEAD_INIT, "_contextvars", "Context variables (CPython core types).", 0,
    kContextVarsMethods,
};

PyObject* InitContextVarsModule() {
  PyObject* module = PyModule_Create(&kContextVarsModule);
  if (module == nullptr) return nullptr;
  if (PyModule_AddType(module, &PyContext_Type) < 0 ||
      PyModule_AddType(module, &PyContextVar_Type) < 0 ||
      PyModule_AddType(module, &PyContextToken_Type) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}

}  // namespace

bool RegisterBuiltinModules() {
  return PyImport_AppendInittab("_orochi", InitOrochiModule) == 0 &&
         PyImport_AppendInittab("_orochi_engine", InitEngineModule) == 0 &&
         PyImport_AppendInittab("_contextvars", InitContextVarsModule) == 0;
}

}  // namespace orochi::copy

// Every thread CPython starts in this copy is started by the host (see OrochiHostTable), which
// knows when the thread has left this copy's code and so when the copy may be unmapped.
extern "C" int __wrap_pthread_create(pthread_t* thread, const pthread_attr_t* attributes,
                                     void* (*start_routine)(void*), void* argument) {
  const OrochiHostTable* host = orochi::copy::State().host;
  return host->start_thread(host->host_state, thread, attributes, start_routine, argument);
}
