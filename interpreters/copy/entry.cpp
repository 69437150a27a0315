// The interpreter library's entry point and the table of functions it gives the host.
//
// Every table function catches everything: no C++ exception may cross the C boundary, and a
// Python error always becomes an OrochiError with the formatted traceback.
#include <Python.h>

#include <cstring>
#include <deque>
#include <exception>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "copy_abi.h"
#include "copy_heap.h"
#include "copy_state.h"

// CPython's traceback writer for faulthandler (Include/internal/pycore_traceback.h, exported
// by libpython but not in its public headers): writes "Stack (most recent call first):" and a
// "  File \"...\", line N in function" line per frame of `thread_state` to `fd`.
extern "C" void _Py_DumpTraceback(int fd, PyThreadState* thread_state);
#include "python_engine.h"

namespace orochi::copy {
namespace {

// Owns one reference to a Python object.
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(PyObject* object) : object_(object) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyRef(PyRef&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  PyRef& operator=(PyRef&& other) noexcept {
    std::swap(object_, other.object_);
    return *this;
  }
  ~PyRef() { Py_XDECREF(object_); }
  PyObject* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  PyObject* object_ = nullptr;
};

PyInterpreterState* g_interpreter = nullptr;

// Whether the calling OS thread holds this copy's GIL. Not PyGILState_Check(): CPython turns
// that check off for good once a subinterpreter has been created (from then on it answers yes to
// every thread), and a program in a copy may create one (_testcapi.run_in_subinterp).
bool ThisThreadHoldsGil() {
  const PyThreadState* current = _PyThreadState_UncheckedGet();
  return current != nullptr && current->thread_id == PyThread_get_thread_ident();
}

// Takes this copy's GIL on the calling OS thread. Each OS thread gets its own Python thread
// state the first time it enters and keeps it, so threading.local data survives between calls;
// CPython frees them all at finalization, and a host thread that ends before then frees its own
// with ReleaseThread. Returns false when the thread already holds the GIL
// (a host function calling back in), in which case there is nothing to release.
bool AcquireGil() {
  if (ThisThreadHoldsGil()) return false;
  PyThreadState* thread_state = PyGILState_GetThisThreadState();
  if (thread_state == nullptr) thread_state = PyThreadState_New(g_interpreter);
  PyEval_RestoreThread(thread_state);
  return true;
}

class GilScope {
 public:
  GilScope() : acquired_(AcquireGil()) {}
  GilScope(const GilScope&) = delete;
  GilScope& operator=(const GilScope&) = delete;
  ~GilScope() {
    if (acquired_) PyEval_SaveThread();
  }

 private:
  bool acquired_;
};

int32_t ReplyError(OrochiReply* reply, int32_t code, const char* type_name,
                   const std::string& message, const char* traceback = "") {
  OrochiError error{type_name, message.c_str(), traceback};
  reply->set_error(reply, &error);
  return code;
}

std::string Utf8OrRepr(PyObject* object) {
  if (object == nullptr) return "<null>";
  PyRef text(PyObject_Str(object));
  if (!text) {
    PyErr_Clear();
    return "<unprintable object>";
  }
  const char* utf8 = PyUnicode_AsUTF8(text.get());
  if (utf8 == nullptr) {
    PyErr_Clear();
    return "<unprintable object>";
  }
  return utf8;
}

// "Type: message" of the pending Python error, which it clears.
std::string DescribeCurrentError() {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  PyRef owned_type(type);
  PyRef owned_value(value);
  PyRef owned_traceback(traceback);
  std::string text = type != nullptr ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "error";
  if (value != nullptr) text += ": " + Utf8OrRepr(value);
  return text;
}

// Turns the pending Python exception into an OrochiError (type, message, full traceback).
int32_t ReplyPythonError(OrochiReply* reply) {
  PyObject* type = nullptr;
  PyObject* value = nullptr;
  PyObject* traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (value == nullptr) {
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return ReplyError(reply, OROCHI_COPY_PYTHON_ERROR, "SystemError",
                      "a call failed without setting an exception");
  }
  if (traceback != nullptr) PyException_SetTraceback(value, traceback);
  PyRef owned_type(type);
  PyRef owned_value(value);
  PyRef owned_traceback(traceback);

  PyRef description;
  if (State().boot_module != nullptr) {
    description = PyRef(PyObject_CallMethod(State().boot_module, "describe_exception", "O", value));
  }
  if (description && PyTuple_Check(description.get()) && PyTuple_GET_SIZE(description.get()) == 3) {
    std::string name = Utf8OrRepr(PyTuple_GET_ITEM(description.get(), 0));
    std::string message = Utf8OrRepr(PyTuple_GET_ITEM(description.get(), 1));
    std::string text = Utf8OrRepr(PyTuple_GET_ITEM(description.get(), 2));
    return ReplyError(reply, OROCHI_COPY_PYTHON_ERROR, name.c_str(), message, text.c_str());
  }
  PyErr_Clear();
  std::string name = reinterpret_cast<PyTypeObject*>(type)->tp_name;
  return ReplyError(reply, OROCHI_COPY_PYTHON_ERROR, name.c_str(), Utf8OrRepr(value));
}

// Converts Python objects to OrochiValues that stay valid until the converter goes: it holds
// the buffers, tensors and item arrays they point into. On failure a Python error is set.
class AbiConverter {
 public:
  AbiConverter() = default;
  AbiConverter(const AbiConverter&) = delete;
  AbiConverter& operator=(const AbiConverter&) = delete;
  ~AbiConverter() {
    for (Py_buffer& view : buffers_) PyBuffer_Release(&view);
  }

  bool Convert(PyObject* object, OrochiValue* value) {
    *value = OrochiValue{};
    if (object == Py_None) {
      value->kind = OROCHI_VALUE_NONE;
    } else if (PyBool_Check(object)) {
      value->kind = OROCHI_VALUE_BOOL;
      value->int_value = object == Py_True ? 1 : 0;
    } else if (PyLong_Check(object)) {
      int overflow = 0;
      value->kind = OROCHI_VALUE_INT;
      value->int_value = PyLong_AsLongLongAndOverflow(object, &overflow);
      if (overflow != 0) {
        PyErr_Format(PyExc_OverflowError, "an int that does not fit in 64 bits: %R", object);
        return false;
      }
    } else if (PyFloat_Check(object)) {
      value->kind = OROCHI_VALUE_FLOAT;
      value->float_value = PyFloat_AS_DOUBLE(object);
    } else if (PyUnicode_Check(object)) {
      Py_ssize_t size = 0;
      const char* data = PyUnicode_AsUTF8AndSize(object, &size);
      if (data == nullptr) return false;
      value->kind = OROCHI_VALUE_STR;
      value->data = data;
      value->size = static_cast<size_t>(size);
    } else if (const engine::Tensor* tensor = TensorFromPython(object)) {
      // Memory lent by this copy's Python objects must not outlive the copy: copy it out.
      const engine::Tensor& shared =
          tensor->storage()->borrowed() ? tensors_.emplace_back(tensor->Clone()) : *tensor;
      value->kind = OROCHI_VALUE_TENSOR;
      value->tensor = shared.handle();
    } else if (PyList_Check(object) || PyTuple_Check(object)) {
      PyRef sequence(PySequence_Fast(object, "a list"));
      if (!sequence) return false;
      Py_ssize_t count = PySequence_Fast_GET_SIZE(sequence.get());
      std::vector<OrochiValue>& items = arrays_.emplace_back(static_cast<size_t>(count));
      for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(sequence.get(), i);
        if (!Convert(item, &items[static_cast<size_t>(i)])) return false;
      }
      sequences_.push_back(std::move(sequence));  // keeps str items' UTF-8 alive
      value->kind = OROCHI_VALUE_LIST;
      value->items = items.data();
      value->item_count = items.size();
    } else if (PyObject_CheckBuffer(object)) {
      Py_buffer& view = buffers_.emplace_back();
      if (PyObject_GetBuffer(object, &view, PyBUF_SIMPLE) < 0) {
        buffers_.pop_back();
        return false;
      }
      value->kind = OROCHI_VALUE_BYTES;
      value->data = static_cast<const char*>(view.buf);
      value->size = static_cast<size_t>(view.len);
    } else {
      PyErr_Format(PyExc_TypeError,
                   "a copy can only hand the host None, bool, int, float, str, bytes-like "
                   "objects, orochi.Tensor and lists or tuples of these, not %s",
                   Py_TYPE(object)->tp_name);
      return false;
    }
    return true;
  }

 private:
  std::deque<Py_buffer> buffers_;
  std::deque<engine::Tensor> tensors_;
  std::deque<std::vector<OrochiValue>> arrays_;
  std::deque<PyRef> sequences_;
};

// Converts a Python result to an OrochiValue and hands it to the reply.
int32_t ReplyObject(OrochiReply* reply, PyObject* object) {
  AbiConverter converter;
  OrochiValue value{};
  if (!converter.Convert(object, &value)) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "TypeError",
                      "the result cannot be handed to the host: " + DescribeCurrentError());
  }
  reply->set_value(reply, &value);
  return OROCHI_COPY_OK;
}

PyObject* ValueToPython(const OrochiValue& value) {
  switch (value.kind) {
    case OROCHI_VALUE_NONE:
      return Py_NewRef(Py_None);
    case OROCHI_VALUE_BOOL:
      return PyBool_FromLong(value.int_value != 0);
    case OROCHI_VALUE_INT:
      return PyLong_FromLongLong(value.int_value);
    case OROCHI_VALUE_FLOAT:
      return PyFloat_FromDouble(value.float_value);
    case OROCHI_VALUE_STR:
      return PyUnicode_DecodeUTF8(value.data, static_cast<Py_ssize_t>(value.size), "strict");
    case OROCHI_VALUE_BYTES:
      return PyBytes_FromStringAndSize(value.data, static_cast<Py_ssize_t>(value.size));
    case OROCHI_VALUE_TENSOR:
      return TensorToPython(engine::Tensor::FromHandle(value.tensor));
    case OROCHI_VALUE_LIST: {
      PyRef list(PyList_New(static_cast<Py_ssize_t>(value.item_count)));
      if (!list) return nullptr;
      for (size_t i = 0; i < value.item_count; ++i) {
        PyObject* item = ValueToPython(value.items[i]);
        if (item == nullptr) return nullptr;
        PyList_SET_ITEM(list.get(), static_cast<Py_ssize_t>(i), item);
      }
      return Py_NewRef(list.get());
    }
    default:
      PyErr_Format(PyExc_TypeError, "unknown argument kind %d", static_cast<int>(value.kind));
      return nullptr;
  }
}

int32_t CheckReady(OrochiReply* reply) {
  const CopyState& state = State();
  if (!state.initialized || state.finalized) {
    return ReplyError(reply, OROCHI_COPY_FAILED_PRECONDITION, "RuntimeError",
                      state.finalized ? "the interpreter copy is finalized"
                                      : "the interpreter copy is not initialized");
  }
  return OROCHI_COPY_OK;
}

int32_t ReplyPyStatus(OrochiReply* reply, const PyStatus& status) {
  std::string message = "CPython failed to start";
  if (status.func != nullptr) message += std::string(" in ") + status.func;
  if (status.err_msg != nullptr) message += std::string(": ") + status.err_msg;
  if (PyStatus_IsExit(status)) message += " (exit code " + std::to_string(status.exitcode) + ")";
  return ReplyError(reply, OROCHI_COPY_INTERNAL, "RuntimeError", message);
}

PyStatus AppendAll(PyWideStringList* list, const char* const* items, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    wchar_t* item = Py_DecodeLocale(items[i], nullptr);
    if (item == nullptr) return PyStatus_Error("a configuration string is not valid UTF-8");
    PyStatus status = PyWideStringList_Append(list, item);
    PyMem_RawFree(item);
    if (PyStatus_Exception(status)) return status;
  }
  return PyStatus_Ok();
}

// Builds the isolated configuration: no environment variables, no site, no user directories,
// no bytecode writing, the host's C stdio left untouched, UTF-8 everywhere, and a sys.path that
// holds only what the host gave us. Setting every prefix keeps CPython from searching the
// filesystem for its "home".
PyStatus Configure(PyConfig* config, const OrochiCopyConfig& copy_config) {
  PyConfig_InitIsolatedConfig(config);
  config->install_signal_handlers = copy_config.install_signal_handlers != 0 ? 1 : 0;
  config->site_import = 0;
  config->user_site_directory = 0;
  config->use_environment = 0;
  config->write_bytecode = 0;
  config->configure_c_stdio = 0;
  config->parse_argv = 0;
  config->pathconfig_warnings = 0;
  config->safe_path = 1;
  config->use_frozen_modules = 1;
  config->module_search_paths_set = 1;
  // -1: let CPython read -X faulthandler and -X tracemalloc (isolated configs force them off).
  config->faulthandler = -1;
  config->tracemalloc = -1;
  config->optimization_level = copy_config.optimization_level;
  config->buffered_stdio = copy_config.unbuffered_stdio != 0 ? 0 : 1;
  config->verbose = copy_config.verbose;
  config->bytes_warning = copy_config.bytes_warning;

  PyStatus status;
  const wchar_t* kPrefix = L"/orochi";
  for (wchar_t** field : {&config->prefix, &config->base_prefix, &config->exec_prefix,
                          &config->base_exec_prefix, &config->home}) {
    status = PyConfig_SetString(config, field, kPrefix);
    if (PyStatus_Exception(status)) return status;
  }
  // A non-empty executable also stops CPython from searching $PATH for its program name.
  const char* executable = copy_config.executable != nullptr && copy_config.executable[0] != '\0'
                               ? copy_config.executable
                               : "/proc/self/exe";
  for (wchar_t** field : {&config->executable, &config->base_executable}) {
    status = PyConfig_SetBytesString(config, field, executable);
    if (PyStatus_Exception(status)) return status;
  }
  status = PyConfig_SetString(config, &config->program_name, L"orochi");
  if (PyStatus_Exception(status)) return status;
  status = PyConfig_SetString(config, &config->stdio_encoding, L"utf-8");
  if (PyStatus_Exception(status)) return status;
  status = AppendAll(&config->module_search_paths, copy_config.module_search_paths,
                     copy_config.module_search_path_count);
  if (PyStatus_Exception(status)) return status;
  status = AppendAll(&config->warnoptions, copy_config.warn_options, copy_config.warn_option_count);
  if (PyStatus_Exception(status)) return status;
  // CPython reads -X faulthandler, -X dev, ... from xoptions itself.
  return AppendAll(&config->xoptions, copy_config.x_options, copy_config.x_option_count);
}

// In a server's copy, an audit hook refuses new audit hooks. Every model loaded in a copy
// shares its hooks, and one model's hook runs inside the others' code: a hook that killed the
// process at another model's load (its "compile" event) had that innocent model quarantined,
// and every other in turn. CPython swallows the error (the hook is just not added): the boot's
// sys.addaudithook says why (_orochi_boot.py), this stops the rest (PySys_AddAuditHook).
int RefuseAuditHooks(const char* event, PyObject* /*args*/, void* /*data*/) {
  if (std::strcmp(event, "sys.addaudithook") != 0) return 0;
  PyErr_SetString(PyExc_PermissionError,
                  "sys.addaudithook: an audit hook would run inside every other model's code "
                  "in this interpreter (its loads and its requests); the server refuses new ones");
  return -1;
}

int32_t Initialize(const OrochiCopyConfig* copy_config, OrochiReply* reply) {
  CopyState& state = State();
  if (state.initialized) {
    return ReplyError(reply, OROCHI_COPY_FAILED_PRECONDITION, "RuntimeError",
                      "the interpreter copy is already initialized");
  }
  if (copy_config == nullptr || copy_config->struct_size < sizeof(OrochiCopyConfig)) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "ValueError",
                      "the copy configuration is missing or from an older ABI");
  }
  state.copy_id = copy_config->copy_id;

  InstallHeapTracking();
  PyPreConfig preconfig;
  PyPreConfig_InitIsolatedConfig(&preconfig);
  preconfig.utf8_mode = 1;  // never depend on (or change) the host's locale
  PyStatus status = Py_PreInitialize(&preconfig);
  if (PyStatus_Exception(status)) return ReplyPyStatus(reply, status);
  if (!RegisterBuiltinModules()) {
    return ReplyError(reply, OROCHI_COPY_INTERNAL, "RuntimeError",
                      "could not register the copy's built-in modules");
  }

  PyConfig config;
  status = Configure(&config, *copy_config);
  if (!PyStatus_Exception(status)) status = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(status)) return ReplyPyStatus(reply, status);

  state.boot_module = PyImport_ImportModule("_orochi_boot");
  if (state.boot_module == nullptr) {
    int32_t code = ReplyPythonError(reply);
    state.finalized = true;
    Py_FinalizeEx();
    ReleaseEngineBindings();
    return code;
  }
  if (copy_config->redirect_output != 0) {  // a server's copy
    PySys_AddAuditHook(RefuseAuditHooks, nullptr);
    PyRef redirected(PyObject_CallMethod(state.boot_module, "redirect_output", nullptr));
    if (!redirected) {
      int32_t code = ReplyPythonError(reply);
      Py_CLEAR(state.boot_module);
      state.finalized = true;
      Py_FinalizeEx();
      ReleaseEngineBindings();
      return code;
    }
  }
  g_interpreter = PyInterpreterState_Get();
  state.initialized = true;
  PyEval_SaveThread();  // from here on, every call takes the GIL through GilScope
  OrochiValue none{};
  reply->set_value(reply, &none);
  return OROCHI_COPY_OK;
}

int32_t Finalize(OrochiReply* reply) {
  if (int32_t code = CheckReady(reply); code != OROCHI_COPY_OK) return code;
  CopyState& state = State();
  AcquireGil();  // Py_FinalizeEx ends with no thread state, so nothing is released afterwards
  PyRef prepared(PyObject_CallMethod(state.boot_module, "prepare_finalize", nullptr));
  if (!prepared) PyErr_Print();
  Py_CLEAR(state.boot_module);
  state.finalized = true;
  int flush_failed = Py_FinalizeEx();
  ReleaseEngineBindings();
  OrochiValue none{};
  reply->set_value(reply, &none);
  if (flush_failed != 0) {
    return ReplyError(reply, OROCHI_COPY_PYTHON_ERROR, "RuntimeError",
                      "flushing sys.stdout or sys.stderr failed during finalization");
  }
  return OROCHI_COPY_OK;
}

int32_t ReleaseMemory(OrochiReply* reply) {
  if (!State().finalized) {
    return ReplyError(reply, OROCHI_COPY_FAILED_PRECONDITION, "RuntimeError",
                      "memory can be released only after finalization");
  }
  OrochiValue released{};
  released.kind = OROCHI_VALUE_INT;
  released.int_value = static_cast<int64_t>(ReleaseHeap());
  reply->set_value(reply, &released);
  return OROCHI_COPY_OK;
}

// Calls _orochi_boot.<function>(*args) and replies with the result or the error.
int32_t CallBoot(const char* function, PyObject* args, OrochiReply* reply) {
  if (args == nullptr) return ReplyPythonError(reply);
  PyRef owned_args(args);
  PyRef callable(PyObject_GetAttrString(State().boot_module, function));
  if (!callable) return ReplyPythonError(reply);
  PyRef result(PyObject_Call(callable.get(), args, nullptr));
  if (!result) return ReplyPythonError(reply);
  return ReplyObject(reply, result.get());
}

PyObject* StringList(const char* const* items, size_t count) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(count));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < count; ++i) {
    PyObject* item = PyUnicode_DecodeFSDefault(items[i]);
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// Marks the calling thread as the one running this copy's current host call, for interrupt().
// Constructed and destroyed with the GIL held.
class RunningCall {
 public:
  RunningCall() {
    State().running_thread_state.store(PyThreadState_Get());
    State().running_thread.store(PyThread_get_thread_ident());
  }
  RunningCall(const RunningCall&) = delete;
  RunningCall& operator=(const RunningCall&) = delete;
  ~RunningCall() {
    CopyState& state = State();
    if (state.interrupt_pending) {
      // Not yet raised (the call ended first): withdraw it, or the next call would get it.
      PyThreadState_SetAsyncExc(state.running_thread.load(), nullptr);
      state.interrupt_pending = false;
    }
    state.running_thread.store(0);
    state.running_thread_state.store(nullptr);
  }
};

int32_t Run(const OrochiRunRequest* request, OrochiReply* reply) {
  if (int32_t code = CheckReady(reply); code != OROCHI_COPY_OK) return code;
  if (request == nullptr || request->struct_size < sizeof(OrochiRunRequest) ||
      (request->kind != OROCHI_RUN_INTERACTIVE && request->target == nullptr)) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "ValueError",
                      "a run request needs a target (code, file or module)");
  }
  GilScope gil;
  RunningCall running;
  PyObject* argv = StringList(request->argv, request->argc);
  if (argv == nullptr) return ReplyPythonError(reply);
  const char* target = request->target != nullptr ? request->target : "";
  return CallBoot("run_program",
                  Py_BuildValue("(isNO)", request->kind, target, argv,
                                request->safe_path != 0 ? Py_True : Py_False),
                  reply);
}

int32_t Exec(const char* code, const char* filename, OrochiReply* reply) {
  if (int32_t status = CheckReady(reply); status != OROCHI_COPY_OK) return status;
  if (code == nullptr) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "ValueError", "no code to execute");
  }
  GilScope gil;
  RunningCall running;
  return CallBoot("exec_main",
                  Py_BuildValue("(ss)", code, filename != nullptr ? filename : "<string>"), reply);
}

int32_t Eval(const char* expression, OrochiReply* reply) {
  if (int32_t status = CheckReady(reply); status != OROCHI_COPY_OK) return status;
  if (expression == nullptr) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "ValueError", "no expression");
  }
  GilScope gil;
  RunningCall running;
  return CallBoot("eval_main", Py_BuildValue("(s)", expression), reply);
}

int32_t Call(const char* target, const OrochiValue* args, size_t arg_count, OrochiReply* reply) {
  if (int32_t status = CheckReady(reply); status != OROCHI_COPY_OK) return status;
  if (target == nullptr || (arg_count > 0 && args == nullptr)) {
    return ReplyError(reply, OROCHI_COPY_INVALID_ARGUMENT, "ValueError",
                      "a call needs a target \"module:name\"");
  }
  GilScope gil;
  RunningCall running;
  PyRef arguments(PyTuple_New(static_cast<Py_ssize_t>(arg_count)));
  if (!arguments) return ReplyPythonError(reply);
  for (size_t i = 0; i < arg_count; ++i) {
    PyObject* item = ValueToPython(args[i]);
    if (item == nullptr) return ReplyPythonError(reply);
    PyTuple_SET_ITEM(arguments.get(), static_cast<Py_ssize_t>(i), item);
  }
  return CallBoot("call_target", Py_BuildValue("(sO)", target, arguments.get()), reply);
}

int32_t Interrupt(OrochiReply* reply) {
  CopyState& state = State();
  OrochiValue result{};
  result.kind = OROCHI_VALUE_BOOL;
  if (state.initialized && !state.finalized && state.running_thread.load() != 0) {
    PyGILState_STATE gil = PyGILState_Ensure();
    const unsigned long target = state.running_thread.load();
    if (target != 0 && PyThreadState_SetAsyncExc(target, PyExc_TimeoutError) > 0) {
      state.interrupt_pending = true;
      result.int_value = 1;
    }
    PyGILState_Release(gil);
  }
  reply->set_value(reply, &result);
  return OROCHI_COPY_OK;
}

// Async-signal-safe: called from a fatal signal's handler on the thread that faulted. CPython's
// own traceback dumper (what faulthandler uses) reads the frames without allocating or taking a
// lock, and writes with write(2); only the thread running this copy's call has a stack here.
int32_t DumpTraceback(int fd) {
  CopyState& state = State();
  PyThreadState* thread_state = state.running_thread_state.load();
  if (thread_state == nullptr || state.running_thread.load() != PyThread_get_thread_ident()) {
    return OROCHI_COPY_FAILED_PRECONDITION;
  }
  _Py_DumpTraceback(fd, thread_state);
  return OROCHI_COPY_OK;
}

int32_t ReleaseThread(OrochiReply* reply) {
  CopyState& state = State();
  OrochiValue result{};
  result.kind = OROCHI_VALUE_BOOL;
  if (state.initialized && !state.finalized && !ThisThreadHoldsGil()) {
    if (PyThreadState* thread_state = PyGILState_GetThisThreadState(); thread_state != nullptr) {
      PyEval_RestoreThread(thread_state);
      PyThreadState_Clear(thread_state);
      PyThreadState_DeleteCurrent();  // releases the GIL; forgets the thread's state for good
      result.int_value = 1;
    }
  }
  reply->set_value(reply, &result);
  return OROCHI_COPY_OK;
}

// Wraps a table function so that no C++ exception escapes into the host.
template <auto Function>
struct NoThrow;

template <typename... Args, int32_t (*Function)(Args...)>
struct NoThrow<Function> {
  static int32_t Call(Args... args) noexcept {
    OrochiReply* reply = LastReply(args...);
    try {
      return Function(args...);
    } catch (const std::exception& error) {
      return ReplyError(reply, OROCHI_COPY_INTERNAL, "RuntimeError",
                        std::string("C++ exception inside the interpreter copy: ") + error.what());
    } catch (...) {
      return ReplyError(reply, OROCHI_COPY_INTERNAL, "RuntimeError",
                        "unknown C++ exception inside the interpreter copy");
    }
  }

 private:
  template <typename... Rest>
  static OrochiReply* LastReply(Rest... rest) {
    return std::get<sizeof...(Rest) - 1>(std::tuple<Rest...>(rest...));
  }
};

const OrochiCopyTable kCopyTable = {
    OROCHI_COPY_ABI_VERSION,      sizeof(OrochiCopyTable), NoThrow<Initialize>::Call,
    NoThrow<Finalize>::Call,      NoThrow<Run>::Call,      NoThrow<Exec>::Call,
    NoThrow<Eval>::Call,          NoThrow<Call>::Call,     NoThrow<Interrupt>::Call,
    NoThrow<ReleaseMemory>::Call, DumpTraceback,           NoThrow<ReleaseThread>::Call,
};

}  // namespace
}  // namespace orochi::copy

// The one symbol the interpreter library exports (see copy.map).
extern "C" __attribute__((visibility("default"))) const OrochiCopyTable* orochi_copy_entry(
    const OrochiHostTable* host) {
  if (host == nullptr || host->abi_version != OROCHI_COPY_ABI_VERSION ||
      host->struct_size < sizeof(OrochiHostTable)) {
    return nullptr;
  }
  orochi::copy::State().host = host;
  return &orochi::copy::kCopyTable;
}
