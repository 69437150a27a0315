// What keeps model code from ending the serving process by exiting it.
//
// os._exit is refused in Python (the copies' boot replaces it), but C can reach the kernel
// directly: a thread a model started that calls exit_group through ctypes' syscall once made
// the serving process exit cleanly, which leaves no crash record. The supervisor restarted it
// at once, for ever, and quarantined nothing, since a clean exit names no model.
//
// So every exit_group made in the serving process, or in any process it starts, waits on a
// seccomp user notification that one thread of the serving process (the warden) answers:
//   - from a thread of the serving process: refused with EPERM, and logged with the thread's id
//     and name;
//   - from any other process (a fork, a program a model runs): let through unchanged, whatever
//     its threads, so what models start exits as it would anywhere.
// The server's own exits (ExitServingProcess) carry a random word in the upper half of
// exit_group's argument, which the kernel ignores and the filter lets through without asking:
// they need no warden, so a warden lost (its descriptor closed by model code) costs only the
// check, never the server's exit. A refused exit_group returns -1 to its caller. (glibc's _exit
// then ends the calling thread alone: model code that calls the C library's exit or _exit loses
// that thread.)
//
// Thread-safety: InstallExitFilter and StartExitWarden are called once, in that order, by the
// serving process's first thread; ExitServingProcess from any thread, at any time.
#pragma once

#include "orochi/base/status.h"

namespace orochi::server {

// In the serving process while it is single-threaded, before ShieldSupervisorFrom (whose filter
// refuses any later one): installs the filter, inherited by every thread and process started
// from then on. Internal if the kernel refuses it (older than 5.5, or a runtime that forbids
// seccomp): exits then go through unchecked. Until StartExitWarden, an exit_group would wait.
Status InstallExitFilter();

// Starts the warden thread; does nothing if InstallExitFilter failed.
void StartExitWarden();

// Ends the process with `code` (as std::_Exit does, after flushing stdio): the server's own
// exits (the end of a run, a failed start, a shutdown past its deadline, a lost listener), with
// or without the filter.
[[noreturn]] void ExitServingProcess(int code);

}  // namespace orochi::server
