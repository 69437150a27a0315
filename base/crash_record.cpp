#include "orochi/base/crash_record.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
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

void OnFatalSignal(int signal_number) {
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
    // After the line, which is on record should the stack's walk fault too (SA_RESETHAND: the
    // process then dies of that second fault).
    if (mark.set && mark.python_stack != nullptr) mark.python_stack(crash_fd);
  }
  // Die of the signal itself, so that the exit status says which.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal_number, &default_action, nullptr);
  raise(signal_number);
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
  struct sigaction action {};
  action.sa_handler = OnFatalSignal;
  sigemptyset(&action.sa_mask);
  // On the alternate stack where the thread has one; once (SA_RESETHAND), so that a fault in
  // the handler itself ends the process instead of looping.
  action.sa_flags = SA_ONSTACK | SA_RESETHAND;
  for (int signal_number : kRecordedSignals) sigaction(signal_number, &action, nullptr);
  alternate_stack.Ensure();
}

bool IsRecordedSignal(int signal_number) {
  return std::find(std::begin(kRecordedSignals), std::end(kRecordedSignals), signal_number) !=
         std::end(kRecordedSignals);
}

}  // namespace orochi
