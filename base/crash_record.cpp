#include "orochi/base/crash_record.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace orochi {
namespace {

constexpr size_t kModelChars = 160;
constexpr size_t kActivityChars = 24;
constexpr char kThreadPrefix[] = "thread:";

struct Mark {
  bool set = false;
  int copy = -1;
  char model[kModelChars] = {};
  char activity[kActivityChars] = {};
  ScopedCrashContext::PythonStackWriter python_stack = nullptr;
};

// Initial-exec TLS in the executable: read from a signal handler without allocating.
thread_local Mark current_mark;

// A thread's alternate signal stack, made on its first mark and removed when the thread ends.
struct AlternateStack {
  void* memory = nullptr;
  ~AlternateStack() {
    if (memory == nullptr) return;
    stack_t disable{};
    disable.ss_flags = SS_DISABLE;
    sigaltstack(&disable, nullptr);
    std::free(memory);
  }
  void Ensure() {
    if (memory != nullptr) return;
    const size_t size = std::max<size_t>(SIGSTKSZ, size_t{64} * 1024);
    memory = std::malloc(size);
    if (memory == nullptr) return;
    stack_t stack{};
    stack.ss_sp = memory;
    stack.ss_size = size;
    if (sigaltstack(&stack, nullptr) != 0) {
      std::free(memory);
      memory = nullptr;
    }
  }
};
thread_local AlternateStack alternate_stack;

int crash_fd = -1;

void Copy(char* target, size_t capacity, std::string_view text) {
  const size_t length = std::min(text.size(), capacity - 1);
  std::memcpy(target, text.data(), length);
  target[length] = '\0';
}

// SIGTRAP: a breakpoint instruction (code patched, a debugging aid left in), SIGSYS: a bad call.
constexpr int kRecordedSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS};

// Appends to a fixed line; async-signal-safe.
struct Line {
  char text[320] = {};
  size_t length = 0;
  void Append(const char* part) {
    while (*part != '\0' && length < sizeof(text) - 1) text[length++] = *part++;
  }
  void Append(long number) {
    char digits[24];
    size_t count = 0;
    const bool negative = number < 0;
    unsigned long magnitude =
        negative ? 0UL - static_cast<unsigned long>(number) : static_cast<unsigned long>(number);
    do {
      digits[count++] = static_cast<char>('0' + magnitude % 10);
      magnitude /= 10;
    } while (magnitude != 0);
    if (negative && length < sizeof(text) - 1) text[length++] = '-';
    while (count > 0 && length < sizeof(text) - 1) text[length++] = digits[--count];
  }
};

// The parent of process `pid`, from /proc/<pid>/stat; -1 where it cannot be read (gone, say).
// Async-signal-safe: open, read and close, and parsing by hand.
pid_t ParentOf(pid_t pid) {
  Line path;
  path.Append("/proc/");
  path.Append(static_cast<long>(pid));
  path.Append("/stat");
  const int fd = open(path.text, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char stat[512];
  const ssize_t got = read(fd, stat, sizeof(stat) - 1);
  close(fd);
  if (got <= 0) return -1;
  // "pid (comm) state ppid ...": comm may hold anything, ')' included, so from the last ')'.
  ssize_t at = got - 1;
  while (at >= 0 && stat[at] != ')') --at;
  if (at < 0) return -1;
  at += 4;  // past ") S "
  if (at >= got) return -1;
  long parent = 0;
  for (; at < got && stat[at] >= '0' && stat[at] <= '9'; ++at) {
    parent = parent * 10 + (stat[at] - '0');
  }
  return static_cast<pid_t>(parent);
}

// Whether `pid` is this process or one it started, however far down.
bool IsSelfOrDescendant(pid_t pid) {
  const pid_t self = getpid();
  for (int generation = 0; generation < 64 && pid > 1; ++generation) {
    if (pid == self) return true;
    pid = ParentOf(pid);
  }
  return false;
}

// A fault signal that was sent rather than raised by a fault (kill, tgkill, sigqueue: si_code
// 0 or below), by this process or one it started: model code aiming at a thread of the
// server's own (an I/O thread, say), whose death would name no model and end every one, or at
// the thread that loads or runs another model, whose death would be put on that model. Nothing
// faulted there, so it is ignored. Not SIGABRT, which abort() raises on its own thread in the
// server's code as well.
bool IsStrayFaultSignal(int signal_number, const siginfo_t* info) {
  return info != nullptr && signal_number != SIGABRT && info->si_code <= 0 &&
         IsSelfOrDescendant(info->si_pid);
}

void OnFatalSignal(int signal_number, siginfo_t* info, void* /*context*/) {
  if (const int saved_errno = errno; IsStrayFaultSignal(signal_number, info)) {
    errno = saved_errno;
    return;
  }
  Line line;
  line.Append("crash signal=");
  line.Append(static_cast<long>(signal_number));
  const Mark& mark = current_mark;
  if (mark.set) {
    line.Append(" model=");
    line.Append(mark.model);
    line.Append(" copy=");
    line.Append(static_cast<long>(mark.copy));
    line.Append(" activity=");
    line.Append(mark.activity);
  }
  line.Append("\n");
  if (crash_fd >= 0) {
    [[maybe_unused]] ssize_t written = write(crash_fd, line.text, line.length);
    // After the line, which is on record should the stack's walk fault too (the signal is
    // blocked here: the process then dies of that second fault).
    if (mark.set && mark.python_stack != nullptr) mark.python_stack(crash_fd);
  }
  // Die of the signal itself, so that the exit status says which.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  sigset_t this_signal;
  sigemptyset(&this_signal);
  sigaddset(&this_signal, signal_number);
  sigprocmask(SIG_UNBLOCK, &this_signal, nullptr);
  raise(signal_number);
}

void InstallHandler(int signal_number) {
  struct sigaction action {};
  action.sa_sigaction = OnFatalSignal;
  // Every recorded signal is blocked while the handler runs, so that a fault in the handler
  // itself ends the process (the kernel forces the default action of a fault it cannot deliver)
  // instead of looping. Not SA_RESETHAND, which resets the action for the whole process: a
  // second thread's signal meanwhile ended the process, even one that was to be ignored.
  sigemptyset(&action.sa_mask);
  for (int recorded : kRecordedSignals) sigaddset(&action.sa_mask, recorded);
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigaction(signal_number, &action, nullptr);
}

}  // namespace

ScopedCrashContext::ScopedCrashContext(std::string_view model, int copy, std::string_view activity,
                                       PythonStackWriter python_stack) {
  alternate_stack.Ensure();
  current_mark.copy = copy;
  current_mark.python_stack = python_stack;
  Copy(current_mark.model, sizeof(current_mark.model), model);
  Copy(current_mark.activity, sizeof(current_mark.activity), activity);
  current_mark.set = true;  // last: a handler reads the mark only once it is whole
}

ScopedCrashContext::~ScopedCrashContext() { current_mark.set = false; }

InheritedCrashContext::InheritedCrashContext() {
  static_assert(sizeof(model_) == kModelChars && sizeof(activity_) == kActivityChars);
  const Mark& mark = current_mark;
  if (!mark.set) return;
  set_ = true;
  copy_ = mark.copy;
  python_stack_ = mark.python_stack;
  std::memcpy(model_, mark.model, sizeof(model_));
  // A thread started by a thread of a model's predict is "thread:predict"; one started by such a
  // thread in turn keeps that activity rather than growing a prefix per generation.
  const std::string_view activity(mark.activity);
  if (activity.substr(0, sizeof(kThreadPrefix) - 1) == kThreadPrefix) {
    Copy(activity_, sizeof(activity_), activity);
  } else {
    char prefixed[kActivityChars * 2] = {};
    std::memcpy(prefixed, kThreadPrefix, sizeof(kThreadPrefix) - 1);
    std::memcpy(prefixed + sizeof(kThreadPrefix) - 1, activity.data(), activity.size());
    Copy(activity_, sizeof(activity_), prefixed);
  }
}

void InheritedCrashContext::MarkCallingThread() const {
  if (!set_) return;
  alternate_stack.Ensure();
  current_mark.copy = copy_;
  // The copy's stack writer writes only for the thread that runs its current call, so on this
  // thread it writes nothing: kept for the day it can say more, harmless until then.
  current_mark.python_stack = python_stack_;
  Copy(current_mark.model, sizeof(current_mark.model), model_);
  Copy(current_mark.activity, sizeof(current_mark.activity), activity_);
  current_mark.set = true;
}

void InstallCrashRecorder(int fd) {
  crash_fd = fd;
  for (int signal_number : kRecordedSignals) InstallHandler(signal_number);
  alternate_stack.Ensure();
}

bool IsRecordedSignal(int signal_number) {
  return std::find(std::begin(kRecordedSignals), std::end(kRecordedSignals), signal_number) !=
         std::end(kRecordedSignals);
}

}  // namespace orochi
