// What keeps model code from ending or replacing the serving process.
//
// os._exit is refused in Python (the copies' boot replaces it), but C reaches the kernel
// directly: a thread a model started that called exit_group through ctypes' syscall made the
// serving process exit cleanly, which leaves no crash record, and the supervisor restarted it
// for ever, quarantining nothing. An execve does the same (the new program's exit is clean
// too), and worse: a program exec'd with the listeners made inheritable answered every port
// as the server, and nothing noticed.
//
// A listening socket is shared with the supervisor, and model code that shut one down (or
// that shut down a copy of one) made the serving process exit to have it bound again, at every
// start: a restart loop that names no model.
//
// So every exit_group, execve and execveat made in the serving process, or in any process it
// starts, waits on a seccomp user notification that the supervisor answers (ExitWarden), out
// of model code's reach; as do the calls that would shut down, close (close_range too), copy
// (dup, dup2, dup3, fcntl's F_DUPFD, pidfd_getfd) or replace (dup2 and dup3 onto it) a
// listener, or another descriptor the server keeps, by its number:
//   - from a thread of the serving process: refused with EPERM, and logged;
//   - from any other process (a fork, a program a model runs): let through unchanged, so what
//     models start runs and exits as it would anywhere.
// The same listener carries the serving process's reports of its loads at a start (SendReport):
// the supervisor believes them from its first thread alone, which runs no model code.
// The server's own exits (ExitServingProcess) carry a random word in the upper half of
// exit_group's argument, which the kernel ignores and the filter lets through without asking:
// they need no supervisor, so a serving process whose supervisor was killed still exits. Its
// own closes of its listeners (CloseListener) carry the word too.
// Where the listener is gone (the supervisor's death), the calls it would answer fail with
// ENOSYS. A filter sees numbers only: a listener's copy passed to the process itself over a
// socket (SCM_RIGHTS) gets a number the filter does not know (see docs/HARDENING.md). (glibc's
// _exit, refused, ends the calling thread alone. The C library's exit() would run the process's
// exit handlers before it asks: the server binds its own exit() in its place, which parks the
// calling thread in the serving process, exit_guard.cpp.)
//
// Thread-safety: InstallExitFilter once, by the serving process's first thread;
// ExitServingProcess from any thread; an ExitWarden from the supervisor's one thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "orochi/base/status.h"

struct seccomp_notif;

namespace orochi::server {

// In the serving process while it is single-threaded, before ShieldSupervisorFrom (whose filter
// refuses any later one): installs the filter, inherited by every thread and process started
// from then on, and returns its listener, for HandListener. `kept` are the numbers of the
// descriptors the server keeps for its life: its listening sockets, and the archives every new
// copy reads (a model that put /dev/null in their place left no copy able to start). Internal if
// the kernel refuses it (older than 5.5, or a runtime that forbids seccomp): the calls then go
// through unchecked.
Result<int> InstallExitFilter(const std::vector<int>& kept);

// Sends `listener` over the socket `channel` (SCM_RIGHTS) and closes it here; with
// `listener` < 0, says there is none.
void HandListener(int channel, int listener);

// Closes `fd`, a listening socket of the server's own, past the filter, which asks the
// supervisor about any other close of a listener's number. Under the filter the number stays
// taken (by /dev/null) until the process ends; without it, a plain close.
void CloseListener(int fd);

// Ends the process with `code` (as std::_Exit does, after flushing stdio unless
// `flush_streams` is false, for a caller that must not wait on a stream's lock): the server's
// own exits (the end of a run, a failed start, a shutdown past its deadline, a lost listener),
// with or without the filter.
[[noreturn]] void ExitServingProcess(int code, bool flush_streams = true);

// Tells the supervisor `line` (a report line, with its newline): through the filter's listener,
// where the supervisor takes it only from the serving process's first thread, which runs no
// model code (model code can write to `pipe`, and once wrote "loading" lines naming another
// model to have its own deaths put on it); through `pipe` where there is no filter or no
// supervisor answering it. Call from the first thread only; elsewhere it falls back to `pipe`.
void SendReport(int pipe, std::string_view line);

// The supervisor's side: answers the notifications of one serving process's filter.
class ExitWarden {
 public:
  ExitWarden() = default;
  ~ExitWarden() { Close(); }
  ExitWarden(const ExitWarden&) = delete;
  ExitWarden& operator=(const ExitWarden&) = delete;

  // Receives the listener HandListener sent over `channel` (waiting up to a few seconds for
  // it), for the serving process `serving`; none if it sent none or died first.
  void Receive(int channel, pid_t serving);

  // The listener, to poll for input; -1 without one.
  int descriptor() const { return listener_; }

  // Answers a notification, once descriptor() polls readable.
  void AnswerOne();

  // Closes the listener: calls that wait on it, and later ones, fail with ENOSYS.
  void Close();

  // Whether report lines come through the listener (SendReport), so that lines on the report
  // pipe that should come this way are model code's.
  bool takes_reports() const { return listener_ >= 0 && !reports_unreadable_; }

  // Whether the serving process's memory could not be read for a report (a ptrace policy that
  // keeps a parent out): its reports then come on the pipe alone.
  bool reports_unreadable() const { return reports_unreadable_; }

  // The report lines taken since the last call, in order.
  std::string TakeReports();

 private:
  bool TakeReport(const seccomp_notif& request);

  int listener_ = -1;
  pid_t serving_ = 0;
  std::vector<std::byte> request_;   // a seccomp_notif, as large as the kernel's
  std::vector<std::byte> response_;  // a seccomp_notif_resp, likewise
  uint64_t refused_ = 0;
  std::string reports_;  // taken from the first thread, not yet read (at most 64 KiB)
  bool reports_unreadable_ = false;
};

}  // namespace orochi::server
