/* The boundary between the host process and one private CPython copy.
 *
 * This header is the only thing the host and the interpreter library share. It is C: plain
 * structs of function pointers, integer codes and NUL-terminated UTF-8 strings. No C++ type,
 * exception or allocation crosses it. The interpreter library exports exactly one dynamic
 * symbol, OROCHI_COPY_ENTRY_SYMBOL, which takes the host's table and returns the copy's.
 *
 * Ownership: every pointer passed in either direction is borrowed for the duration of the call.
 * Results travel back through an OrochiReply, a host-owned sink whose callbacks copy what they
 * are given before returning, so the copy never hands out memory the host must free.
 *
 * Threads: a copy is driven by one host thread at a time (the host serialises calls). Calls
 * made from different threads at different times are fine; the copy gives each OS thread its
 * own Python thread state.
 */
#ifndef OROCHI_INTERPRETERS_ABI_COPY_ABI_H_
#define OROCHI_INTERPRETERS_ABI_COPY_ABI_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change to the structs or functions below. */
#define OROCHI_COPY_ABI_VERSION 7u
#define OROCHI_COPY_ENTRY_SYMBOL "orochi_copy_entry"

/* With OrochiCopyConfig::redirect_output, the most characters of one line of output that a copy
 * hands over: past it the line is cut (see OrochiHostTable::write_output), so that output with
 * no newline cannot grow without bound. */
#define OROCHI_COPY_OUTPUT_LINE_LIMIT 4096

typedef enum OrochiOutputStream {
  OROCHI_OUTPUT_STDOUT = 1,
  OROCHI_OUTPUT_STDERR = 2,
} OrochiOutputStream;

typedef enum OrochiCopyCode {
  OROCHI_COPY_OK = 0,
  OROCHI_COPY_PYTHON_ERROR = 1,        /* uncaught Python exception; the reply holds the details */
  OROCHI_COPY_INVALID_ARGUMENT = 2,    /* a malformed request (bad target, bad value) */
  OROCHI_COPY_UNLOADED = 3,            /* answered by the host's stubs once the copy is gone */
  OROCHI_COPY_FAILED_PRECONDITION = 4, /* e.g. called before initialize */
  OROCHI_COPY_INTERNAL = 5,
} OrochiCopyCode;

/* A tensor of the shared engine (an orochi::engine::Tensor), opaque to C. The host and every
 * copy link the one engine library, so both sides read it with
 * orochi::engine::Tensor::FromHandle(); the receiver keeps its own reference (a view sharing
 * the storage), never a copy of the data. */
typedef struct OrochiTensor OrochiTensor;

typedef enum OrochiValueKind {
  OROCHI_VALUE_NONE = 0,
  OROCHI_VALUE_BOOL = 1,   /* int_value is 0 or 1 */
  OROCHI_VALUE_INT = 2,    /* int_value */
  OROCHI_VALUE_FLOAT = 3,  /* float_value */
  OROCHI_VALUE_STR = 4,    /* data/size: UTF-8 */
  OROCHI_VALUE_BYTES = 5,  /* data/size */
  OROCHI_VALUE_TENSOR = 6, /* tensor */
  OROCHI_VALUE_LIST = 7,   /* items/item_count: a Python list (or tuple, which arrives as a list) */
} OrochiValueKind;

typedef struct OrochiValue {
  int32_t kind; /* OrochiValueKind */
  int64_t int_value;
  double float_value;
  const char* data;
  size_t size;
  const OrochiTensor* tensor;
  const struct OrochiValue* items;
  size_t item_count;
} OrochiValue;

typedef struct OrochiError {
  const char* type_name; /* e.g. "ValueError", "json.decoder.JSONDecodeError" */
  const char* message;   /* str(exception) or a description of the failure */
  const char* traceback; /* the formatted Python traceback, or "" */
} OrochiError;

/* Host-owned sink for a call's outcome. The copy calls at most one setter per call. */
typedef struct OrochiReply {
  void* host_state;
  void (*set_value)(struct OrochiReply* reply, const OrochiValue* value);
  void (*set_error)(struct OrochiReply* reply, const OrochiError* error);
} OrochiReply;

/* A C symbol of a copy: its name and its address in that copy. */
typedef struct OrochiSymbol {
  const char* name;
  void* address;
} OrochiSymbol;

/* The address of `name` in `symbols`, a table sorted by name (strcmp order), or NULL. Used on
 * both sides of the boundary, so the copy and the host bind names the same way. */
static inline void* OrochiFindSymbol(const OrochiSymbol* symbols, size_t count, const char* name) {
  size_t low = 0;
  size_t high = count;
  while (low < high) {
    size_t middle = low + (high - low) / 2;
    int order = strcmp(symbols[middle].name, name);
    if (order == 0) return symbols[middle].address;
    if (order < 0) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return NULL; /* NOLINT(modernize-use-nullptr): a C header */
}

/* What the host offers a copy. Lives as long as the copy. */
typedef struct OrochiHostTable {
  uint32_t abi_version;
  uint32_t struct_size;
  void* host_state;
  /* Calls the host function registered under `name` with `payload`, on the calling thread and
   * with the copy's GIL held (so it must not call back into the same copy from another thread).
   * Returns an OrochiCopyCode; the function's result or error arrives through `reply`. */
  int32_t (*call_host)(void* host_state, const char* name, const char* payload, size_t payload_size,
                       OrochiReply* reply);
  /* Starts every thread the copy creates (the copy links with --wrap=pthread_create), with
   * pthread_create's contract. The host counts these threads until they have left the copy's
   * code for good, so that it never unmaps a copy under a thread still running in it. */
  int (*start_thread)(void* host_state, pthread_t* thread, const pthread_attr_t* attributes,
                      void* (*start_routine)(void*), void* argument);
  /* Loads the ELF shared object at `path` (a C extension module) for this copy with Orochi's
   * loader, binding its undefined symbols first to `symbols` (the copy's C API, sorted by name
   * with strcmp), then to its own definitions, its needed libraries and the process. Sets
   * *library to a handle that the host owns and releases after the copy is finalized, and
   * returns OROCHI_COPY_OK; otherwise writes a NUL-terminated message into `error` (at most
   * error_size bytes) and returns another code. */
  int32_t (*load_library)(void* host_state, const char* path, const OrochiSymbol* symbols,
                          size_t symbol_count, void** library, char* error, size_t error_size);
  /* The address of a symbol that `library` (from load_library) exports, or NULL. */
  void* (*library_symbol)(void* host_state, void* library, const char* name);
  /* With OrochiCopyConfig::redirect_output: one line that the copy's Python code wrote to
   * sys.stdout or sys.stderr (`stream`, an OrochiOutputStream), without its newline, as `size`
   * bytes of UTF-8 (not NUL-terminated); or the partial line it held when the stream was
   * flushed. `cut` is 1 when the line was longer than OROCHI_COPY_OUTPUT_LINE_LIMIT characters
   * and only its start is given. Called on the writing thread with the copy's GIL held: it
   * must return quickly and must not call into the copy. */
  void (*write_output)(void* host_state, int32_t stream, const char* text, size_t size,
                       int32_t cut);
} OrochiHostTable;

typedef struct OrochiCopyConfig {
  uint32_t struct_size;
  int32_t copy_id;
  /* The complete sys.path, in order (the embedded stdlib and Orochi's own package). */
  const char* const* module_search_paths;
  size_t module_search_path_count;
  /* sys.executable: the host binary. */
  const char* executable;
  /* Command-line style options, as the python command takes them (-W, -X, -O, -u, -v, -b). */
  const char* const* warn_options;
  size_t warn_option_count;
  const char* const* x_options;
  size_t x_option_count;
  int32_t optimization_level;
  int32_t unbuffered_stdio;
  int32_t verbose;
  int32_t bytes_warning;
  /* Install CPython's SIGINT handler (KeyboardInterrupt). Only for a single copy that owns the
   * process, such as `orochi python`: handlers are process-wide. */
  int32_t install_signal_handlers;
  /* Replace sys.stdout and sys.stderr with line-buffered writers that hand each line to
   * OrochiHostTable::write_output instead of writing to the process's file descriptors 1 and 2
   * (a server's log, where raw output would interleave with its records). */
  int32_t redirect_output;
} OrochiCopyConfig;

typedef enum OrochiRunKind {
  OROCHI_RUN_CODE = 0,        /* like `python -c CODE` */
  OROCHI_RUN_FILE = 1,        /* like `python FILE` */
  OROCHI_RUN_MODULE = 2,      /* like `python -m MODULE` */
  OROCHI_RUN_INTERACTIVE = 3, /* like `python` with no arguments */
} OrochiRunKind;

/* Runs a program the way the `python` command does: sets sys.argv and sys.path[0], prints an
 * uncaught exception's traceback to sys.stderr, flushes stdout and stderr, and replies with the
 * exit status (SystemExit's code, or 1 after an uncaught exception). */
typedef struct OrochiRunRequest {
  uint32_t struct_size;
  int32_t kind;            /* OrochiRunKind */
  const char* target;      /* code, file path or module name; NULL for interactive */
  const char* const* argv; /* sys.argv[1:] */
  size_t argc;
  /* Like python -P / -I: do not put the script's directory (or the cwd) first on sys.path. */
  int32_t safe_path;
} OrochiRunRequest;

/* What a copy offers the host. The host keeps its own copy of this table and swaps it for stubs
 * when the copy is unloaded. */
typedef struct OrochiCopyTable {
  uint32_t abi_version;
  uint32_t struct_size;
  /* Starts CPython in this copy. Called once, before anything else. */
  int32_t (*initialize)(const OrochiCopyConfig* config, OrochiReply* reply);
  /* Finalizes CPython (atexit handlers run, non-daemon threads joined). Nothing may be called
   * after it. */
  int32_t (*finalize)(OrochiReply* reply);
  int32_t (*run)(const OrochiRunRequest* request, OrochiReply* reply);
  /* Executes statements in the copy's __main__ namespace. */
  int32_t (*exec)(const char* code, const char* filename, OrochiReply* reply);
  /* Evaluates an expression in the copy's __main__ namespace; replies with its value. */
  int32_t (*eval)(const char* expression, OrochiReply* reply);
  /* Imports `module` of target "module:qualified.name", calls the callable with `args`
   * positionally and replies with its result. */
  int32_t (*call)(const char* target, const OrochiValue* args, size_t arg_count,
                  OrochiReply* reply);
  /* Raises TimeoutError in the thread running the copy's current call (run, exec, eval or
   * call), from any host thread; replies True if a call was running. It takes the copy's GIL,
   * so it waits while the running call holds it in C code: call it from a thread that may
   * block. An interrupt that arrives as the call ends is dropped, never left for the next. */
  int32_t (*interrupt)(OrochiReply* reply);
  /* Frees every allocation CPython left behind at finalization; replies with the byte count.
   * Only after finalize, and only once no thread of the copy runs any more. */
  int32_t (*release_memory)(OrochiReply* reply);
  /* Writes the Python stack of the copy's current call to `fd` when the calling thread is the
   * one running it, as CPython's faulthandler does ("Stack (most recent call first):", then a
   * "  File \"...\", line N in name" line per frame), and returns OROCHI_COPY_OK; otherwise
   * writes nothing and returns OROCHI_COPY_FAILED_PRECONDITION. Async-signal-safe: it is meant
   * for a fatal signal's handler on the thread that faulted in the copy's code, so it takes no
   * lock, allocates nothing and has no reply. */
  int32_t (*dump_traceback)(int fd);
  /* Frees the calling thread's Python thread state in this copy, if it has one, and replies
   * True if it had. For a host thread about to end: a copy keeps the thread state of every OS
   * thread that entered it (threading.local data live there) until it is finalized, so a thread
   * started for one call and gone after it would otherwise leave its state (and the first chunk
   * of its frame stack) behind on every such call. Not from within a call. */
  int32_t (*release_thread)(OrochiReply* reply);
} OrochiCopyTable;

typedef const OrochiCopyTable* (*OrochiCopyEntryFn)(const OrochiHostTable* host);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* OROCHI_INTERPRETERS_ABI_COPY_ABI_H_ */
