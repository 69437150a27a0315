// One private copy of CPython, loaded from memory into this process.
//
// Each Interpreter is a separate instance of the interpreter library (its own CPython, GIL,
// modules and C++ statics), written to its own memfd and opened with dlopen(RTLD_LOCAL). Its
// sys.path holds only the embedded stdlib and Orochi's Python package; it reads no PYTHON*
// environment variable and nothing under /usr/lib/python3*. sys.executable is the
// `orochi-python` alias beside the host binary when there is one (so `subprocess.run(
// [sys.executable, "-c", ...])` starts a fresh copy), else the host binary itself.
//
// Thread-safety: an Interpreter runs one call at a time. Calls from several threads are
// serialised (a second caller waits); calls made from different threads at different times
// are fine. Different Interpreters run fully in parallel.
//
// Every call goes through a function table that Unload() swaps for stubs, so a call that
// arrives after Unload() returns StatusCode::kUnavailable instead of touching unmapped code.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"
#include "orochi/interpreters/value.h"

namespace orochi::interpreters {

// The python command's start-up options that a copy honours. (-E, -s, -S and -B need no flag:
// a copy always ignores the environment, has no site and writes no .pyc.)
struct PythonFlags {
  std::vector<std::string> warn_options;  // -W
  std::vector<std::string> x_options;     // -X, e.g. "faulthandler", "dev"
  int optimization_level = 0;             // -O, -OO
  bool unbuffered_stdio = false;          // -u
  int verbose = 0;                        // -v
  int bytes_warning = 0;                  // -b, -bb
  // Directories or zips put on sys.path after the embedded stdlib and Orochi's package.
  std::vector<std::string> extra_paths;
};

// One line that Python code in a copy wrote to sys.stdout or sys.stderr (see
// InterpreterOptions::output).
struct OutputLine {
  enum class Stream { kStdout = 1, kStderr = 2 };
  Stream stream = Stream::kStdout;
  std::string_view text;  // UTF-8, without the newline; valid during the call only
  // Longer than kOutputLineLimit characters: only its start is in `text`.
  bool cut = false;
  // Whom the copy was last called for (Interpreter::SetCaller), e.g. a model's key; the
  // output of threads the copy's code started counts for it too.
  std::string_view caller;
};
// The most characters of one output line; the rest of the line is cut.
inline constexpr size_t kOutputLineLimit = 4096;
using OutputSink = std::function<void(const OutputLine& line)>;

struct InterpreterOptions {
  int id = 0;  // shown to Python as _orochi.copy_id() and in error messages
  // Functions Python code may call with orochi.call_host(name, payload).
  std::map<std::string, HostFunction, std::less<>> host_functions;
  // Install CPython's SIGINT handler (KeyboardInterrupt). Signal handlers are process-wide,
  // so only a copy that owns the process (`orochi python`) should ask for it.
  bool install_signal_handlers = false;
  PythonFlags flags;
  // When set, the copy's sys.stdout and sys.stderr are line-buffered writers that hand each
  // line here (on the writing thread, with the copy's GIL held: it must be quick and must not
  // call into the copy) instead of writing to the process's stdout and stderr. A server sets
  // it, so that model output becomes log records; `orochi python` does not.
  OutputSink output;
};

// A program run the way the `python` command runs it.
struct Program {
  enum class Kind { kCode, kFile, kModule, kInteractive };
  Kind kind = Kind::kCode;
  std::string target;             // the code, file path or module name
  std::vector<std::string> argv;  // sys.argv[1:]
  bool safe_path = false;         // python -P / -I: sys.path[0] is not the script's directory
};

class Interpreter {
 public:
  // Loads and starts a new copy. Fails with kInternal when the library cannot be loaded or
  // CPython cannot start.
  static Result<std::unique_ptr<Interpreter>> Create(InterpreterOptions options);

  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;
  ~Interpreter();  // unloads the copy if still loaded

  int id() const { return id_; }
  bool loaded() const;

  // Runs a program like `python`: sets sys.argv and sys.path[0], prints an uncaught exception's
  // traceback to stderr, and returns the exit status (SystemExit's code, 1 after an uncaught
  // exception). Program errors are exit statuses, not Status errors.
  Result<int> Run(const Program& program);

  // Executes statements in the copy's __main__ namespace. A Python exception gives
  // kPythonError with "Type: message" as the message and the traceback as the detail.
  Status Exec(std::string_view code, std::string_view filename = "<string>");

  // Evaluates an expression in __main__ and returns its value (None, bool, int, float, str or
  // bytes; anything else is kInvalidArgument).
  Result<Value> Eval(std::string_view expression);

  // Imports `module` from "module:qualified.name" and calls the callable with `args`.
  Result<Value> Call(std::string_view target, std::span<const Value> args = {});

  // Whom the following calls are for, reported with their output (OutputLine::caller) until
  // changed; e.g. a model's key, set before each call made for the model.
  void SetCaller(std::string_view caller);

  // Raises TimeoutError in the Python code of the call running in this copy, from any thread;
  // true if a call was running. Waits for the copy's GIL, so a copy stuck in C code that holds
  // it blocks the caller: call it from a thread that may wait.
  Result<bool> Interrupt();

  // Frees the calling thread's Python thread state in this copy, for a thread about to end
  // that made calls here (OrochiCopyTable::release_thread): the copy otherwise keeps it until
  // it is finalized. Its threading.local data go with it.
  void ReleaseThread();

  // The copy's writer of the Python stack of the call running in it, for a crash record
  // (ScopedCrashContext): from a fatal signal's handler on the thread running that call it
  // writes the frames to a descriptor, async-signal-safely (OrochiCopyTable::dump_traceback).
  // Null once the copy is unloaded; valid while a call runs in it.
  using PythonStackWriter = int32_t (*)(int fd);
  PythonStackWriter python_stack_writer() const;

  // Finalizes CPython (atexit handlers run, non-daemon threads are joined) and unmaps the
  // copy. Idempotent. Daemon threads end when they next reach for the GIL; Unload waits up to
  // `thread_grace` for every thread the copy started to be gone. If some still run, the copy's
  // memory is kept mapped rather than pulled from under them, and the result is
  // kFailedPrecondition.
  Status Unload(std::chrono::milliseconds thread_grace = std::chrono::seconds(2));

 private:
  struct Impl;  // the loaded library and its tables (interpreter.cpp)

  explicit Interpreter(int id);

  int id_;
  mutable std::mutex mutex_;    // serialises calls, guards impl_
  std::mutex interrupt_mutex_;  // keeps the table in place during Interrupt()
  std::unique_ptr<Impl> impl_;
};

// The descriptors every copy's Python archives (the stdlib, Orochi's package) are read from:
// made on first use and kept open for the life of the process, where a server keeps model code
// from closing or replacing them (a copy could not start again). Thread-safe.
Result<std::vector<int>> PythonArchiveDescriptors();

}  // namespace orochi::interpreters
