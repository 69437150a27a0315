// What keeps model code from stopping the server in ways that leave no trace. Both processes
// run as one user, so without this a model could end the whole server past any restart with
// one call: os.kill(os.getppid(), signal.SIGKILL), or SIGSTOP, or kill(-1) (every process of the
// user), or shrink the supervisor's limits with prlimit until the kernel kills it. And it could
// end its own process in ways that name no model (SIGKILL, SIGTERM to itself, a CPU limit, a
// timer's SIGALRM), which the supervisor can neither attribute nor quarantine: a crash loop,
// with restarts backing off to seconds.
//
// The serving process installs a seccomp filter, inherited by every process its models start,
// that refuses (EPERM, as the kernel refuses a signal to another user's process):
//   - calls that reach another process by pid when that pid is the supervisor's, its process
//     group, or "every process": kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo,
//     pidfd_open, prlimit64, ptrace, process_vm_readv and process_vm_writev; pidfd_send_signal
//     whatever its target, since a pidfd can be had from an open /proc/<pid> directory;
//   - clone with CLONE_PARENT (a child of the supervisor's, a zombie it would keep); clone3
//     answers ENOSYS, since its flags are out of a filter's sight (the C library then uses
//     clone);
//   - signals to the serving process itself or its group, but for probes (signal 0) and, to
//     its own threads, the signals the crash recorder attributes (crash_record.h);
//   - a CPU time limit (setrlimit, prlimit64 with RLIMIT_CPU);
//   - a descriptor's owner signal other than the default (F_SETSIG), which could be SIGKILL;
//   - a thread with a descriptor table of its own (clone with CLONE_THREAD but not CLONE_FILES,
//     unshare with CLONE_FILES), whose sockets /proc/<pid>/fd would not list: the management
//     API tells model code by them (peer_process.h);
//   - a signal the kernel would send on a timer's expiry or a message's arrival (timer_create,
//     mq_notify with an event: it could be SIGKILL);
//   - io_uring, whose operations (shutdown, socket options) no filter sees: its calls answer
//     ENOSYS, as on a kernel without it.
// Signals to processes its models forked and to any other process go through unchanged. The
// supervisor makes itself non-dumpable, which closes /proc/<pid>/mem and ptrace to processes
// of the same user that lack CAP_SYS_PTRACE.
//
// What the filter cannot see is listed in docs/HARDENING.md.
#pragma once

#include <sys/types.h>

#include "orochi/base/status.h"

namespace orochi::server {

// In the supervisor, before its first fork: makes the supervisor non-dumpable. The serving
// process sets itself dumpable again (ShieldSupervisorFrom), so its core dumps and /proc
// entries are as they would be.
void HideSupervisorMemory();

// In the serving process, right after the fork and before any model code runs: installs the
// filter described above for `supervisor` and `supervisor_group` (its process group), the
// calling process being the serving process, leader of its own group. The calling process
// must be single-threaded, so that every thread it starts has the filter. Unimplemented on a
// processor the filter is not written for; Internal if the kernel refuses the filter (a kernel
// without seccomp, a container runtime that forbids it).
Status ShieldSupervisorFrom(pid_t supervisor, pid_t supervisor_group);

// In the serving process: a handler that does nothing for each signal whose default action
// ends a process and that nothing in the server uses (SIGHUP, SIGUSR1/2, the timers' SIGALRM,
// SIGVTALRM and SIGPROF, SIGIO, SIGPWR, SIGXCPU, the real-time signals), so that a timer a model
// sets (signal.alarm, setitimer) cannot end every copy.
void IgnoreUnusedSignals();

}  // namespace orochi::server
