// State of one interpreter copy. Compiled into the interpreter library only.
//
// Every copy is a separately loaded instance of the library, so this state exists once per
// copy. It is reached through an inline function with a function-local static on purpose: that
// is exactly the kind of symbol GCC would otherwise mark STB_GNU_UNIQUE and the dynamic linker
// would then bind process-wide, merging the copies. The library is built with
// -fno-gnu-unique and hidden visibility; tests check, through _orochi._state_probe(), that two
// copies see two different objects.
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>

#include "copy_abi.h"

namespace orochi::copy {

struct CopyState {
  const OrochiHostTable* host = nullptr;
  int32_t copy_id = -1;
  bool initialized = false;
  bool finalized = false;
  PyObject* boot_module = nullptr;  // _orochi_boot, owned
  int64_t probe_counter = 0;        // bumped by _orochi._state_probe()
  // The OS thread running a host call (0 when none), and whether an interrupt was sent to it;
  // both change only with the GIL held.
  std::atomic<unsigned long> running_thread{0};
  // That thread's Python thread state, for dump_traceback (read from a signal handler).
  std::atomic<PyThreadState*> running_thread_state{nullptr};
  bool interrupt_pending = false;
};

inline CopyState& State() {
  static CopyState state;
  return state;
}

// Registers the copy's built-in modules; must run before Py_InitializeFromConfig.
bool RegisterBuiltinModules();

}  // namespace orochi::copy
