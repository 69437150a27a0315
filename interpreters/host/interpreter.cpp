#include "orochi/interpreters/interpreter.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "builtin_host_functions.h"
#include "copy_abi.h"
#include "copy_threads.h"
#include "embedded_assets.h"
#include "orochi/base/check.h"
#include "orochi/engine/ops.h"
#include "orochi/engine/threads.h"
#include "orochi/interpreters/elf_library.h"

namespace orochi::interpreters {
namespace {

static_assert(kOutputLineLimit == OROCHI_COPY_OUTPUT_LINE_LIMIT);

// Copies a value a copy hands over into host types, while the copy's memory is still valid.
Value FromAbiValue(const OrochiValue& value) {
  switch (value.kind) {
    case OROCHI_VALUE_BOOL:
      return value.int_value != 0;
    case OROCHI_VALUE_INT:
      return static_cast<int64_t>(value.int_value);
    case OROCHI_VALUE_FLOAT:
      return value.float_value;
    case OROCHI_VALUE_STR:
      return std::string(value.data, value.size);
    case OROCHI_VALUE_BYTES:
      return Bytes{std::string(value.data, value.size)};
    case OROCHI_VALUE_TENSOR:
      return engine::Tensor::FromHandle(value.tensor);
    case OROCHI_VALUE_LIST: {
      ValueList list;
      list.items.reserve(value.item_count);
      for (size_t i = 0; i < value.item_count; ++i) {
        list.items.push_back(FromAbiValue(value.items[i]));
      }
      return list;
    }
    default:
      return std::monostate{};
  }
}

// Collects what a copy replies.
struct ReplySink {
  OrochiReply reply{};
  Value value;
  std::string error_type;
  std::string error_message;
  std::string error_traceback;

  ReplySink() { reply = {this, &SetValue, &SetError}; }
  ReplySink(const ReplySink&) = delete;
  ReplySink& operator=(const ReplySink&) = delete;

  static ReplySink& Of(OrochiReply* reply) { return *static_cast<ReplySink*>(reply->host_state); }

  static void SetValue(OrochiReply* reply, const OrochiValue* value) {
    Of(reply).value = FromAbiValue(*value);
  }
  static void SetError(OrochiReply* reply, const OrochiError* error) {
    ReplySink& sink = Of(reply);
    sink.error_type = error->type_name != nullptr ? error->type_name : "";
    sink.error_message = error->message != nullptr ? error->message : "";
    sink.error_traceback = error->traceback != nullptr ? error->traceback : "";
  }

  Status ToStatus(int32_t code, int copy_id) const {
    switch (code) {
      case OROCHI_COPY_OK:
        return Status::Ok();
      case OROCHI_COPY_PYTHON_ERROR:
        return PythonError(error_message.empty() ? error_type : error_type + ": " + error_message,
                           error_traceback);
      case OROCHI_COPY_INVALID_ARGUMENT:
        return InvalidArgument(error_type + ": " + error_message);
      case OROCHI_COPY_UNLOADED:
        return Unavailable("interpreter copy " + std::to_string(copy_id) + " is unloaded");
      case OROCHI_COPY_FAILED_PRECONDITION:
        return FailedPrecondition(error_message);
      default:
        return Internal("interpreter copy " + std::to_string(copy_id) + ": " + error_message);
    }
  }
};

// What the host's table points at once a copy is gone: every call fails cleanly.
int32_t Unloaded(OrochiReply* reply) {
  OrochiError error{"RuntimeError", "the interpreter copy is unloaded", ""};
  reply->set_error(reply, &error);
  return OROCHI_COPY_UNLOADED;
}
int32_t UnloadedInitialize(const OrochiCopyConfig*, OrochiReply* reply) { return Unloaded(reply); }
int32_t UnloadedRun(const OrochiRunRequest*, OrochiReply* reply) { return Unloaded(reply); }
int32_t UnloadedExec(const char*, const char*, OrochiReply* reply) { return Unloaded(reply); }
int32_t UnloadedEval(const char*, OrochiReply* reply) { return Unloaded(reply); }
int32_t UnloadedCall(const char*, const OrochiValue*, size_t, OrochiReply* reply) {
  return Unloaded(reply);
}

int32_t UnloadedDumpTraceback(int) { return OROCHI_COPY_UNLOADED; }

const OrochiCopyTable kUnloadedTable = {
    OROCHI_COPY_ABI_VERSION,
    sizeof(OrochiCopyTable),
    UnloadedInitialize,
    Unloaded,
    UnloadedRun,
    UnloadedExec,
    UnloadedEval,
    UnloadedCall,
    Unloaded,
    Unloaded,
    UnloadedDumpTraceback,
    Unloaded,
};

// Builds OrochiValues for a call, keeping the arrays that nested lists point into alive until
// the builder goes.
class AbiValues {
 public:
  OrochiValue Convert(const Value& value) {
    OrochiValue result{};
    std::visit(
        [&](const auto& item) {
          using T = std::decay_t<decltype(item)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
            result.kind = OROCHI_VALUE_NONE;
          } else if constexpr (std::is_same_v<T, bool>) {
            result.kind = OROCHI_VALUE_BOOL;
            result.int_value = item ? 1 : 0;
          } else if constexpr (std::is_same_v<T, int64_t>) {
            result.kind = OROCHI_VALUE_INT;
            result.int_value = item;
          } else if constexpr (std::is_same_v<T, double>) {
            result.kind = OROCHI_VALUE_FLOAT;
            result.float_value = item;
          } else if constexpr (std::is_same_v<T, std::string>) {
            result.kind = OROCHI_VALUE_STR;
            result.data = item.data();
            result.size = item.size();
          } else if constexpr (std::is_same_v<T, Bytes>) {
            result.kind = OROCHI_VALUE_BYTES;
            result.data = item.data.data();
            result.size = item.data.size();
          } else if constexpr (std::is_same_v<T, engine::Tensor>) {
            result.kind = OROCHI_VALUE_TENSOR;
            result.tensor = item.handle();
          } else {
            static_assert(std::is_same_v<T, ValueList>);
            std::vector<OrochiValue>& items = arrays_.emplace_back();
            items.reserve(item.items.size());
            for (const Value& element : item.items) items.push_back(Convert(element));
            result.kind = OROCHI_VALUE_LIST;
            result.items = items.data();
            result.item_count = items.size();
          }
        },
        value);
    return result;
  }

 private:
  std::deque<std::vector<OrochiValue>> arrays_;
};

// sys.executable: a command that runs Python the way `python` does. The build (and an
// install) puts an `orochi-python` alias of the binary beside it.
std::string PythonExecutable() {
  std::error_code error;
  std::filesystem::path host = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return {};
  std::filesystem::path alias = host.parent_path() / "orochi-python";
  return std::filesystem::exists(alias, error) ? alias.string() : host.string();
}

std::vector<const char*> CStrings(const std::vector<std::string>& strings) {
  std::vector<const char*> pointers;
  pointers.reserve(strings.size());
  for (const std::string& text : strings) pointers.push_back(text.c_str());
  return pointers;
}

}  // namespace

struct Interpreter::Impl {
  void* library = nullptr;       // dlopen handle while loaded
  int library_fd = -1;           // its memfd, open while loaded so that no later copy
                                 // gets the same /proc/self/fd/N name (dlopen would then
                                 // hand back this copy instead of loading a new one)
  OrochiCopyTable copy_table{};  // the copy's own table, copied into host memory
  const OrochiCopyTable* table = &kUnloadedTable;  // what every call goes through
  OrochiHostTable host_table{};
  std::map<std::string, HostFunction, std::less<>> host_functions;
  OutputSink output;
  std::mutex caller_mutex;  // not mutex_: output arrives while a call holds that
  std::string caller;
  std::shared_ptr<CopyThreads> threads = std::make_shared<CopyThreads>();
  // C extension modules the copy imported, mapped by Orochi's loader; released once the copy
  // is finalized (its objects may point into them until then) and before its heap goes.
  std::mutex libraries_mutex;
  std::vector<std::unique_ptr<ElfLibrary>> libraries;
  // Each file is mapped once per copy, as dlopen does per process: an extension module that
  // ctypes later opens by path (CPython's own tests do) shares its globals with the module.
  std::map<std::string, ElfLibrary*, std::less<>> libraries_by_path;

  void ReleaseLibraries() {
    std::vector<std::unique_ptr<ElfLibrary>> released;
    {
      std::lock_guard lock(libraries_mutex);
      released.swap(libraries);
      libraries_by_path.clear();
    }
    while (!released.empty()) released.pop_back();  // in reverse order of loading
  }

  static int32_t LoadLibrary(void* state, const char* path, const OrochiSymbol* symbols,
                             size_t symbol_count, void** library, char* error, size_t error_size) {
    auto* self = static_cast<Impl*>(state);
    auto resolve = [symbols, symbol_count](const char* name) {
      return OrochiFindSymbol(symbols, symbol_count, name);
    };
    // Keyed by the path as given, as CPython keys its extension records.
    const std::string key = path;
    std::lock_guard lock(self->libraries_mutex);
    if (auto found = self->libraries_by_path.find(key); found != self->libraries_by_path.end()) {
      *library = found->second;
      return OROCHI_COPY_OK;
    }
    Result<std::unique_ptr<ElfLibrary>> loaded = ElfLibrary::Load(path, resolve);
    if (!loaded.ok()) {
      std::snprintf(error, error_size, "%s", loaded.status().message().c_str());
      return loaded.status().code() == StatusCode::kInvalidArgument
                 ? OROCHI_COPY_INVALID_ARGUMENT
                 : OROCHI_COPY_FAILED_PRECONDITION;
    }
    *library = loaded->get();
    self->libraries_by_path.emplace(key, loaded->get());
    self->libraries.push_back(std::move(loaded).value());
    return OROCHI_COPY_OK;
  }

  static void* LibrarySymbol(void* /*state*/, void* library, const char* name) {
    return static_cast<ElfLibrary*>(library)->FindSymbol(name);
  }

  void CloseLibrary() {
    dlclose(library);
    close(library_fd);
    library = nullptr;
    library_fd = -1;
  }

  static int StartThread(void* state, pthread_t* thread, const pthread_attr_t* attributes,
                         void* (*start_routine)(void*), void* argument) {
    return static_cast<Impl*>(state)->threads->Start(thread, attributes, start_routine, argument);
  }

  static void WriteOutput(void* state, int32_t stream, const char* text, size_t size,
                          int32_t cut) noexcept {
    auto* self = static_cast<Impl*>(state);
    const bool to_stderr = stream == OROCHI_OUTPUT_STDERR;
    if (!self->output) {  // the copy was not asked to redirect: where its output would go
      std::FILE* file = to_stderr ? stderr : stdout;
      std::fwrite(text, 1, size, file);
      std::fputc('\n', file);
      return;
    }
    try {
      std::lock_guard lock(self->caller_mutex);
      OutputLine line;
      line.stream = to_stderr ? OutputLine::Stream::kStderr : OutputLine::Stream::kStdout;
      line.text = std::string_view(text, size);
      line.cut = cut != 0;
      line.caller = self->caller;
      self->output(line);
    } catch (...) {  // nothing may cross back into the copy; a lost line is all it costs
    }
  }

  static int32_t CallHost(void* state, const char* name, const char* payload, size_t size,
                          OrochiReply* reply) {
    auto* self = static_cast<Impl*>(state);
    auto found = self->host_functions.find(std::string_view(name));
    const HostFunction* function =
        found != self->host_functions.end() ? &found->second : FindBuiltinHostFunction(name);
    if (function == nullptr) {
      std::string message = "no host function is registered as '" + std::string(name) + "'";
      OrochiError error{"LookupError", message.c_str(), ""};
      reply->set_error(reply, &error);
      return OROCHI_COPY_INVALID_ARGUMENT;
    }
    Result<Value> result = [&]() -> Result<Value> {
      try {
        return (*function)(std::string_view(payload != nullptr ? payload : "", size));
      } catch (const std::exception& exception) {
        return Internal(std::string("host function threw: ") + exception.what());
      }
    }();
    if (!result.ok()) {
      std::string message = result.status().ToString();
      OrochiError error{"RuntimeError", message.c_str(), ""};
      reply->set_error(reply, &error);
      return OROCHI_COPY_INTERNAL;
    }
    AbiValues values;
    OrochiValue value = values.Convert(*result);
    reply->set_value(reply, &value);
    return OROCHI_COPY_OK;
  }
};

Interpreter::Interpreter(int id) : id_(id), impl_(std::make_unique<Impl>()) {}

Interpreter::~Interpreter() {
  Status status = Unload();
  if (!status.ok()) {
    std::fprintf(stderr, "orochi: unloading interpreter copy %d: %s\n", id_,
                 status.ToString().c_str());
  }
}

Result<std::unique_ptr<Interpreter>> Interpreter::Create(InterpreterOptions options) {
  OROCHI_ASSIGN_OR_RETURN(std::vector<std::string> python_paths, EmbeddedPythonPaths());
  std::unique_ptr<Interpreter> interpreter(new Interpreter(options.id));
  Impl& impl = *interpreter->impl_;
  impl.host_functions = std::move(options.host_functions);
  impl.output = std::move(options.output);
  impl.host_table = {OROCHI_COPY_ABI_VERSION, sizeof(OrochiHostTable), &impl,
                     &Impl::CallHost,         &Impl::StartThread,      &Impl::LoadLibrary,
                     &Impl::LibrarySymbol,    &Impl::WriteOutput};

  // A fresh memfd gives the library a new inode, which makes the dynamic linker load a new
  // copy instead of handing back the one already loaded. The fd is closed once mapped.
  std::string name = "orochi-copy-" + std::to_string(options.id);
  OROCHI_ASSIGN_OR_RETURN(int fd, SealedMemfd(name.c_str(), EmbeddedCopyLibrary(), true));
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  impl.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (impl.library == nullptr) {
    close(fd);
    const char* error = dlerror();
    return Internal("loading interpreter copy " + std::to_string(options.id) + ": " +
                    (error != nullptr ? error : "dlopen failed"));
  }
  auto entry = reinterpret_cast<OrochiCopyEntryFn>(dlsym(impl.library, OROCHI_COPY_ENTRY_SYMBOL));
  const OrochiCopyTable* table = entry != nullptr ? entry(&impl.host_table) : nullptr;
  if (table == nullptr || table->abi_version != OROCHI_COPY_ABI_VERSION ||
      table->struct_size < sizeof(OrochiCopyTable)) {
    dlclose(impl.library);
    close(fd);
    impl.library = nullptr;
    return Internal("interpreter library has no compatible " OROCHI_COPY_ENTRY_SYMBOL
                    " (ABI version " +
                    std::to_string(OROCHI_COPY_ABI_VERSION) + " expected)");
  }
  impl.library_fd = fd;
  impl.copy_table = *table;
  impl.table = &impl.copy_table;

  python_paths.insert(python_paths.end(), options.flags.extra_paths.begin(),
                      options.flags.extra_paths.end());
  std::vector<const char*> search_paths = CStrings(python_paths);
  std::vector<const char*> warn_options = CStrings(options.flags.warn_options);
  std::vector<const char*> x_options = CStrings(options.flags.x_options);
  OrochiCopyConfig config{};
  config.struct_size = sizeof(config);
  config.copy_id = options.id;
  config.module_search_paths = search_paths.data();
  config.module_search_path_count = search_paths.size();
  config.install_signal_handlers = options.install_signal_handlers ? 1 : 0;
  config.redirect_output = impl.output ? 1 : 0;
  static const std::string executable = PythonExecutable();
  config.executable = executable.c_str();
  config.warn_options = warn_options.data();
  config.warn_option_count = warn_options.size();
  config.x_options = x_options.data();
  config.x_option_count = x_options.size();
  config.optimization_level = options.flags.optimization_level;
  config.unbuffered_stdio = options.flags.unbuffered_stdio ? 1 : 0;
  config.verbose = options.flags.verbose;
  config.bytes_warning = options.flags.bytes_warning;
  ReplySink sink;
  Status started = sink.ToStatus(impl.table->initialize(&config, &sink.reply), options.id);
  if (!started.ok()) {
    impl.table = &kUnloadedTable;
    impl.CloseLibrary();
    return Status(
        started.code(),
        "starting interpreter copy " + std::to_string(options.id) + ": " + started.message(),
        started.detail());
  }
  return interpreter;
}

void Interpreter::SetCaller(std::string_view caller) {
  std::lock_guard lock(impl_->caller_mutex);
  impl_->caller = caller;
}

bool Interpreter::loaded() const {
  std::lock_guard lock(mutex_);
  return impl_->library != nullptr;
}

Status Interpreter::Unload(std::chrono::milliseconds thread_grace) {
  std::lock_guard lock(mutex_);
  Impl& impl = *impl_;
  if (impl.library == nullptr) return Status::Ok();
  const OrochiCopyTable* live = impl.table;
  {
    std::lock_guard interrupt_lock(interrupt_mutex_);
    impl.table = &kUnloadedTable;  // from now on, late calls meet the stubs
  }
  ReplySink sink;
  Status finalized = sink.ToStatus(live->finalize(&sink.reply), id_);
  // Threads joined by Python may still be on their way out of the copy's code, and daemon
  // threads leave when they next reach for the GIL. Unmap only once all of them are gone.
  int64_t still_running = impl.threads->WaitUntilNoneRun(thread_grace);
  if (still_running > 0) {
    impl.library = nullptr;  // deliberately left mapped
    return FailedPrecondition("interpreter copy " + std::to_string(id_) + " still has " +
                              std::to_string(still_running) +
                              " thread(s) running (daemon threads); its memory stays mapped");
  }
  impl.ReleaseLibraries();
  ReplySink released;
  Status freed = released.ToStatus(live->release_memory(&released.reply), id_);
  impl.CloseLibrary();
  return finalized.ok() ? freed : finalized;
}

Result<int> Interpreter::Run(const Program& program) {
  std::vector<const char*> argv = CStrings(program.argv);
  OrochiRunRequest request{};
  request.struct_size = sizeof(request);
  switch (program.kind) {
    case Program::Kind::kCode:
      request.kind = OROCHI_RUN_CODE;
      break;
    case Program::Kind::kFile:
      request.kind = OROCHI_RUN_FILE;
      break;
    case Program::Kind::kModule:
      request.kind = OROCHI_RUN_MODULE;
      break;
    case Program::Kind::kInteractive:
      request.kind = OROCHI_RUN_INTERACTIVE;
      break;
  }
  request.target = program.kind == Program::Kind::kInteractive ? nullptr : program.target.c_str();
  request.argv = argv.data();
  request.argc = argv.size();
  request.safe_path = program.safe_path ? 1 : 0;
  std::lock_guard lock(mutex_);
  // The copy's Python code holds a core from here to the reply, between its engine calls too: the
  // engine's intra-op pool lends that core to no other call meanwhile.
  const engine::BusyCaller busy;
  ReplySink sink;
  OROCHI_RETURN_IF_ERROR(sink.ToStatus(impl_->table->run(&request, &sink.reply), id_));
  if (!std::holds_alternative<int64_t>(sink.value)) {
    return Internal("interpreter copy " + std::to_string(id_) + " returned no exit status");
  }
  return static_cast<int>(std::get<int64_t>(sink.value));
}

Status Interpreter::Exec(std::string_view code, std::string_view filename) {
  std::string code_text(code);
  std::string filename_text(filename);
  std::lock_guard lock(mutex_);
  ReplySink sink;
  return sink.ToStatus(impl_->table->exec(code_text.c_str(), filename_text.c_str(), &sink.reply),
                       id_);
}

Result<Value> Interpreter::Eval(std::string_view expression) {
  std::string expression_text(expression);
  std::lock_guard lock(mutex_);
  ReplySink sink;
  OROCHI_RETURN_IF_ERROR(
      sink.ToStatus(impl_->table->eval(expression_text.c_str(), &sink.reply), id_));
  return std::move(sink.value);
}

void Interpreter::ReleaseThread() {
  std::lock_guard lock(mutex_);
  ReplySink sink;
  (void)impl_->table->release_thread(&sink.reply);  // nothing to free is no failure
}

Interpreter::PythonStackWriter Interpreter::python_stack_writer() const {
  // The copy's own table, set once at load: a caller holding the copy for a call reads it
  // without the call's lock, which that call takes next.
  return impl_ != nullptr ? impl_->copy_table.dump_traceback : nullptr;
}

Result<bool> Interpreter::Interrupt() {
  // Not under mutex_: the call to interrupt holds it. Unload takes interrupt_mutex_ before it
  // swaps the table, so the copy cannot go away under an interrupt.
  std::lock_guard lock(interrupt_mutex_);
  ReplySink sink;
  OROCHI_RETURN_IF_ERROR(sink.ToStatus(impl_->table->interrupt(&sink.reply), id_));
  const bool* delivered = std::get_if<bool>(&sink.value);
  return delivered != nullptr && *delivered;
}

Result<Value> Interpreter::Call(std::string_view target, std::span<const Value> args) {
  std::string target_text(target);
  AbiValues values;
  std::vector<OrochiValue> abi_args;
  abi_args.reserve(args.size());
  for (const Value& arg : args) abi_args.push_back(values.Convert(arg));
  std::lock_guard lock(mutex_);
  // The copy's Python code holds a core from here to the reply, between its engine calls too: the
  // engine's intra-op pool lends that core to no other call meanwhile.
  const engine::BusyCaller busy;
  ReplySink sink;
  OROCHI_RETURN_IF_ERROR(sink.ToStatus(
      impl_->table->call(target_text.c_str(), abi_args.data(), abi_args.size(), &sink.reply), id_));
  return std::move(sink.value);
}

}  // namespace orochi::interpreters
