#include "exit_guard.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "log.h"
#include "seccomp_filter.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace orochi::server {
namespace {

// The upper half of exit_group's argument on the server's own exits; 0 without the filter.
uint32_t own_exit_word = 0;
// The serving process the filter guards, whose C library exit() is model code's: 0 elsewhere
// (the supervisor, a fork of the serving process, any other command).
pid_t guarded_process = 0;

// The call the serving process's first thread tells the supervisor of a load through
// (SendReport): a number no kernel has (they are in the hundreds), so that it fails with ENOSYS
// where no filter asks about it.
constexpr int kReportCall = 4000;
// The most a report line may hold: a model's name and version, and a word or two.
constexpr size_t kMostReportBytes = 512;

const char* CallName(int number) {
  switch (number) {
    case kReportCall:
      return "report";
    case SYS_exit_group:
      return "exit_group";
    case SYS_execve:
      return "execve";
    case SYS_execveat:
      return "execveat";
    case SYS_shutdown:
      return "shutdown";
    case SYS_close:
      return "close";
    case SYS_close_range:
      return "close_range";
    case SYS_dup:
      return "dup";
#ifdef SYS_dup2
    case SYS_dup2:
      return "dup2";
#endif
    case SYS_dup3:
      return "dup3";
    case SYS_fcntl:
      return "fcntl";
    case SYS_pidfd_getfd:
      return "pidfd_getfd";
    default:
      return "?";
  }
}

// Whether call `number` is one that ends or replaces its process (the others the filter asks
// about reach a listener).
bool EndsProcess(int number) {
  return number == SYS_exit_group || number == SYS_execve || number == SYS_execveat;
}

// The filter of InstallExitFilter: the server's own exits (`word` in the upper half of
// exit_group's argument) and closes of a listener (in close's, or in the number dup3 replaces)
// allowed; other exits, execs, and the calls that would shut down, close (close_range too),
// duplicate or replace one of `listeners`, asked of the supervisor; anything else allowed. Another
// architecture's calls (i386's have other numbers) are refused outright by the supervisor shield's
// filter.
std::vector<sock_filter> Compile(uint32_t word, const std::vector<int>& kept) {
  seccomp::FilterBuilder filter;
  const auto allow = filter.NewLabel();
  const auto ask = filter.NewLabel();
  const auto exit_group = filter.NewLabel();
  const auto close = filter.NewLabel();
  const auto close_range = filter.NewLabel();
  const auto first_is_kept = filter.NewLabel();
  const auto second_is_kept = filter.NewLabel();
  const auto either_is_kept = filter.NewLabel();
  const auto fcntl = filter.NewLabel();
  const auto native = filter.NewLabel();
  filter.Load(seccomp::kArch);
  filter.JumpIfEqual(seccomp::kNativeArch, native);
  filter.Return(SECCOMP_RET_ALLOW);
  filter.Bind(native);
  filter.Load(seccomp::kCallNumber);
  filter.JumpIfEqual(SYS_exit_group, exit_group);
  filter.JumpIfEqual(SYS_close, close);
  filter.JumpIfEqual(SYS_close_range, close_range);
  filter.JumpIfOneOf(std::array{SYS_execve, SYS_execveat}, ask);
  filter.JumpIfOneOf(std::array{SYS_shutdown, SYS_dup}, first_is_kept);
  filter.JumpIfOneOf(
      std::array{
#ifdef SYS_dup2
          SYS_dup2,
#endif
          SYS_dup3},
      either_is_kept);
  filter.JumpIfEqual(SYS_fcntl, fcntl);
  filter.JumpIfEqual(SYS_pidfd_getfd, second_is_kept);
  filter.JumpIfEqual(kReportCall, ask);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(exit_group);
  filter.Load(seccomp::ArgumentHigh(0));
  filter.JumpIfEqual(word, allow);
  filter.Return(SECCOMP_RET_USER_NOTIF);

  filter.Bind(close);  // the server's own (CloseListener) carry the word too
  filter.Load(seccomp::ArgumentHigh(0));
  filter.JumpIfEqual(word, allow);
  filter.JumpIfArgumentIsOneOf(0, kept, ask);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(close_range);  // asked if `first` <= a listener <= `last`, whatever the flags
  for (const int descriptor : kept) {
    const auto next = filter.NewLabel();
    filter.Load(seccomp::Argument(0));
    filter.JumpIfGreater(static_cast<uint32_t>(descriptor), next);
    filter.Load(seccomp::Argument(1));
    filter.JumpIfAtLeast(static_cast<uint32_t>(descriptor), ask);
    filter.Bind(next);
  }
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(fcntl);
  filter.JumpIfArgumentIsOneOf(1, std::array{F_DUPFD, F_DUPFD_CLOEXEC}, first_is_kept);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(either_is_kept);  // dup2 and dup3: what is copied, and what it replaces
  filter.Load(seccomp::ArgumentHigh(1));
  filter.JumpIfEqual(word, allow);  // the server's own (CloseListener)
  filter.JumpIfArgumentIsOneOf(0, kept, ask);
  filter.JumpIfArgumentIsOneOf(1, kept, ask);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(first_is_kept);
  filter.JumpIfArgumentIsOneOf(0, kept, ask);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(second_is_kept);
  filter.JumpIfArgumentIsOneOf(1, kept, ask);
  filter.Return(SECCOMP_RET_ALLOW);

  filter.Bind(ask);
  filter.Return(SECCOMP_RET_USER_NOTIF);
  filter.Bind(allow);
  filter.Return(SECCOMP_RET_ALLOW);
  return filter.Finish();
}

// glibc's exit(), overwritten in the guarded serving process by a jump to the executable's own
// (below). Callers outside glibc bind to the executable's, but dlsym on libc's own handle
// (ctypes.CDLL("libc.so.6").exit) and glibc's internal calls reach glibc's definition, whose
// exit handlers and static destructors once ran in the live server: it died of SIGABRT at its
// next request, naming no model. A fork of the serving process puts glibc's code back before
// it exits (RemoveExitDetour).
#if defined(__x86_64__)
constexpr size_t kJumpBytes = 12;
void WriteJump(unsigned char* at, const void* to) {
  at[0] = 0x48;  // movabs $to, %rax
  at[1] = 0xB8;
  std::memcpy(at + 2, static_cast<const void*>(&to), sizeof(to));
  at[10] = 0xFF;  // jmp *%rax
  at[11] = 0xE0;
}
// Kept ahead of the jump: an indirect call's landing pad (endbr64).
bool IsLandingPad(const unsigned char* at) {
  constexpr unsigned char kEndbr64[] = {0xF3, 0x0F, 0x1E, 0xFA};
  return std::memcmp(at, kEndbr64, sizeof(kEndbr64)) == 0;
}
#elif defined(__aarch64__)
constexpr size_t kJumpBytes = 16;
void WriteJump(unsigned char* at, const void* to) {
  constexpr uint32_t kLoadX16 = 0x58000050;    // ldr x16, .+8
  constexpr uint32_t kBranchX16 = 0xD61F0200;  // br x16
  std::memcpy(at, &kLoadX16, 4);
  std::memcpy(at + 4, &kBranchX16, 4);
  std::memcpy(at + 8, static_cast<const void*>(&to), sizeof(to));
}
// Kept ahead of the jump: a landing pad (bti, paciasp).
bool IsLandingPad(const unsigned char* at) {
  uint32_t word = 0;
  std::memcpy(&word, at, sizeof(word));
  return (word & 0xFFFFFF3FU) == 0xD503241FU || word == 0xD503233FU;
}
#else
constexpr size_t kJumpBytes = 0;
void WriteJump(unsigned char* /*at*/, const void* /*to*/) {}
bool IsLandingPad(const unsigned char* /*at*/) { return false; }
#endif

struct ExitDetour {
  void* glibc_exit = nullptr;                // glibc's exit()
  unsigned char* jump = nullptr;             // where the jump is written; null: not there
  std::array<unsigned char, 16> saved = {};  // what it overwrote
};
ExitDetour exit_detour;

// Makes the pages of [at, at + size) writable too, or (`writable` false) not any more.
bool SetWritable(unsigned char* at, size_t size, bool writable) {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t offset = reinterpret_cast<uintptr_t>(at) & (page - 1);
  const int protection = PROT_READ | PROT_EXEC | (writable ? PROT_WRITE : 0);
  return ::mprotect(at - offset, offset + size, protection) == 0;
}

void Overwrite(unsigned char* at, const unsigned char* bytes) {
  std::memcpy(at, bytes, kJumpBytes);
  __builtin___clear_cache(reinterpret_cast<char*>(at), reinterpret_cast<char*>(at + kJumpBytes));
}

Status DetourGlibcExit(void (*replacement)(int)) {
  if (kJumpBytes == 0) return Unimplemented("not written for this processor");
  exit_detour.glibc_exit = ::dlsym(RTLD_NEXT, "exit");
  if (exit_detour.glibc_exit == nullptr) return Internal("glibc's exit() is not found");
  auto* at = static_cast<unsigned char*>(exit_detour.glibc_exit);
  if (IsLandingPad(at)) at += 4;
  if (!SetWritable(at, kJumpBytes, true)) {
    return Internal(std::string("its code cannot be made writable: ") + std::strerror(errno));
  }
  std::memcpy(exit_detour.saved.data(), at, kJumpBytes);
  std::array<unsigned char, 16> jump{};
  WriteJump(jump.data(), reinterpret_cast<const void*>(replacement));
  Overwrite(at, jump.data());
  SetWritable(at, kJumpBytes, false);
  exit_detour.jump = at;
  return Status::Ok();
}

void RemoveExitDetour() {
  unsigned char* at = exit_detour.jump;
  if (at == nullptr || !SetWritable(at, kJumpBytes, true)) return;
  Overwrite(at, exit_detour.saved.data());
  SetWritable(at, kJumpBytes, false);
  exit_detour.jump = nullptr;
}

// What HandListener sends and ExitWarden::Receive takes: one byte, and room for a descriptor.
struct DescriptorMessage {
  DescriptorMessage() {
    header.msg_iov = &data;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof(control);
  }
  DescriptorMessage(const DescriptorMessage&) = delete;
  DescriptorMessage& operator=(const DescriptorMessage&) = delete;

  char byte = 0;
  iovec data{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr header{};
};

std::string ThreadName(pid_t process, pid_t thread) {
  const std::string path =
      "/proc/" + std::to_string(process) + "/task/" + std::to_string(thread) + "/comm";
  char name[32] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t length = ::read(fd, name, sizeof(name) - 1);
  ::close(fd);
  std::string result(name, length > 0 ? static_cast<size_t>(length) : 0);
  while (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

}  // namespace

Result<int> InstallExitFilter(const std::vector<int>& kept) {
  if (seccomp::kNativeArch == 0) {
    return Unimplemented("the exit filter is not written for this processor");
  }
  uint32_t word = 0;
  while (word == 0) {
    if (::getrandom(&word, sizeof(word), 0) != sizeof(word)) {
      return Internal(std::string("no random word for the exit filter: ") + std::strerror(errno));
    }
  }
  std::vector<sock_filter> program = Compile(word, kept);
  const sock_fprog filter{static_cast<unsigned short>(program.size()), program.data()};
  // No new privileges: the condition for a filter without CAP_SYS_ADMIN (the shield sets it too).
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    return Internal(std::string("cannot set no_new_privs: ") + std::strerror(errno));
  }
  const long fd =
      ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &filter);
  if (fd < 0) {
    return Internal(std::string("the kernel refused the exit filter: ") + std::strerror(errno));
  }
  own_exit_word = word;
  guarded_process = ::getpid();
  if (Status detoured = DetourGlibcExit(&::exit); !detoured.ok()) {
    Log(LogLevel::kWarning,
        "glibc's own exit() stays reachable through libc's handle: model code can run the "
        "server's exit handlers",
        {{"reason", detoured.message()}});
  }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer's report ends the process from whichever thread found the fault.
  __sanitizer_set_death_callback([] { ExitServingProcess(1); });
#endif
  return static_cast<int>(fd);
}

void HandListener(int channel, int listener) {
  DescriptorMessage message;
  if (listener >= 0) {
    cmsghdr* header = CMSG_FIRSTHDR(&message.header);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(header), &listener, sizeof(int));
  } else {
    message.header.msg_control = nullptr;
    message.header.msg_controllen = 0;
  }
  [[maybe_unused]] ssize_t sent = ::sendmsg(channel, &message.header, MSG_NOSIGNAL);
  // Model code must not answer the notifications itself: it would let its own exits through.
  if (listener >= 0) ::close(listener);
}

void CloseListener(int fd) {
  if (own_exit_word == 0) {  // no filter here (one process, a test): a close, and no placeholder
    ::close(fd);
    return;
  }
  // dup3 and close take unsigned ints: the kernel reads the low half alone.
  const uint64_t marked = (static_cast<uint64_t>(own_exit_word) << 32U) | static_cast<uint32_t>(fd);
  // The number stays taken, by /dev/null: the filter goes on asking about it, and a socket of
  // the server's own given that number later (a connection gRPC closes) would be refused.
  const int placeholder = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (placeholder >= 0 && ::syscall(SYS_dup3, placeholder, marked, O_CLOEXEC) >= 0) {
    ::close(placeholder);
    return;
  }
  if (placeholder >= 0) ::close(placeholder);
  ::syscall(SYS_close, marked);
}

void ExitServingProcess(int code, bool flush_streams) {
  if (flush_streams) std::fflush(nullptr);
  ::syscall(SYS_exit_group,
            (static_cast<uint64_t>(own_exit_word) << 32U) | static_cast<uint32_t>(code));
  std::_Exit(code);  // not reached: the filter lets the call above through
}

}  // namespace orochi::server

// The C library's exit(), bound in place of glibc's for every caller outside glibc itself (the
// executable exports it: --export-dynamic-symbol, so the copies' CPython and the C extensions
// their loader maps bind here too). glibc's runs the process's exit handlers and C++ static
// destructors before its exit_group, which the filter then refuses: the server went on with its
// globals destroyed, answering 500 to every request while its health said ready. In the
// guarded serving process the calling thread is parked instead, for good (a request running
// there meets its deadline and its copy is replaced, as a copy stuck in C is); anywhere else
// it is glibc's exit.
// NOLINTNEXTLINE(bugprone-reserved-identifier,cert-dcl37-c,cert-dcl51-cpp,readability-inconsistent-declaration-parameter-name)
extern "C" void exit(int status) noexcept {
  using orochi::server::guarded_process;
  if (guarded_process != 0 && ::getpid() == guarded_process) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      orochi::server::Log(
          orochi::server::LogLevel::kWarning,
          "model code called the C library's exit(), which would run the server's exit "
          "handlers; its thread is parked for good instead",
          {{"status", std::to_string(status), false},
           {"thread", std::to_string(::gettid()), false}});
    }
    while (true) ::pause();
  }
  using orochi::server::exit_detour;
  orochi::server::RemoveExitDetour();  // a fork of the serving process: glibc's code back
  using Exit = void (*)(int);
  auto* glibc_exit = reinterpret_cast<Exit>(
      exit_detour.glibc_exit != nullptr ? exit_detour.glibc_exit : ::dlsym(RTLD_NEXT, "exit"));
  if (glibc_exit != nullptr) glibc_exit(status);
  std::_Exit(status);
}

namespace orochi::server {

void ExitWarden::Receive(int channel, pid_t serving) {
  Close();
  serving_ = serving;
  refused_ = 0;
  reports_.clear();
  reports_unreadable_ = false;
  // Sent right after the fork, before anything that could take long; a serving process that
  // dies first closes its end, which ends the wait too.
  pollfd ready{channel, POLLIN, 0};
  if (::poll(&ready, 1, 10000) <= 0) return;
  DescriptorMessage message;
  if (::recvmsg(channel, &message.header, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) <= 0) return;
  const cmsghdr* header = CMSG_FIRSTHDR(&message.header);
  if (header == nullptr || header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) {
    return;
  }
  std::memcpy(&listener_, CMSG_DATA(header), sizeof(int));
  // Sized once per listener: every exec and exit of what models start comes through here. The
  // kernel's structures may be larger than these headers' (a newer kernel).
  seccomp_notif_sizes sizes{};
  if (::syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) {
    sizes = {sizeof(seccomp_notif), sizeof(seccomp_notif_resp), sizeof(seccomp_data)};
  }
  request_.resize(std::max<size_t>(sizes.seccomp_notif, sizeof(seccomp_notif)));
  response_.resize(std::max<size_t>(sizes.seccomp_notif_resp, sizeof(seccomp_notif_resp)));
}

void SendReport(int pipe, std::string_view line) {
  if (line.size() <= kMostReportBytes && ::syscall(kReportCall, line.data(), line.size()) == 0) {
    return;
  }
  if (pipe < 0) return;
  // One write, under PIPE_BUF: whole or not at all, as the supervisor reads lines.
  [[maybe_unused]] const ssize_t written = ::write(pipe, line.data(), line.size());
}

std::string ExitWarden::TakeReports() {
  std::string reports;
  reports.swap(reports_);
  return reports;
}

// A report from the serving process's first thread, which runs no model code: its line, read
// from the process's memory while the thread waits, is the supervisor's to believe. From any
// other thread of it (model code's), refused like the calls above.
bool ExitWarden::TakeReport(const seccomp_notif& request) {
  const auto caller = static_cast<pid_t>(request.pid);
  const auto size = static_cast<size_t>(request.data.args[1]);
  if (caller != serving_ || size > kMostReportBytes) return false;
  std::string line(size, '\0');
  const iovec local{line.data(), size};
  // An address in the serving process, not here: never dereferenced as a pointer.
  const iovec remote{
      reinterpret_cast<void*>(request.data.args[0]),  // NOLINT(performance-no-int-to-ptr)
      size};
  if (::process_vm_readv(serving_, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(size)) {
    // Not allowed here (a ptrace policy stricter than a parent's reach): the serving process
    // tells its loads on the pipe instead, as where there is no filter.
    if (!reports_unreadable_) {
      Log(LogLevel::kWarning,
          "the serving process's reports cannot be read from its memory; taking them from its "
          "pipe, where model code can write too",
          {{"error", std::strerror(errno)}});
    }
    reports_unreadable_ = true;
    return false;
  }
  // Still the call read for: not a thread id used again since the notification came.
  __u64 id = request.id;
  if (::ioctl(listener_, SECCOMP_IOCTL_NOTIF_ID_VALID, &id) != 0) return false;
  if (reports_.size() < (64 << 10)) reports_ += line;
  return true;
}

void ExitWarden::AnswerOne() {
  if (listener_ < 0) return;
  std::fill(request_.begin(), request_.end(), std::byte{0});  // the kernel wants it zeroed
  std::fill(response_.begin(), response_.end(), std::byte{0});
  auto* request = reinterpret_cast<seccomp_notif*>(request_.data());
  // Polled readable, so this does not wait; ENOENT: its caller was killed meanwhile.
  if (::ioctl(listener_, SECCOMP_IOCTL_NOTIF_RECV, request) != 0) return;
  auto* response = reinterpret_cast<seccomp_notif_resp*>(response_.data());
  response->id = request->id;
  const auto caller = static_cast<pid_t>(request->pid);  // a thread id; 0 from another namespace
  const std::string task = "/proc/" + std::to_string(serving_) + "/task/" + std::to_string(caller);
  if (request->data.nr == kReportCall && TakeReport(*request)) {
    response->val = 0;  // answered here: the call itself would fail with ENOSYS
  } else if (request->data.nr == kReportCall && caller == serving_) {
    response->error = -EPERM;  // unreadable: SendReport writes the pipe instead
  } else if (caller > 0 && ::access(task.c_str(), F_OK) == 0) {
    response->error = -EPERM;
    ++refused_;
    // Logged at the 1st, 2nd, 4th, 8th... refusal: a loop of them cannot flood the log.
    if ((refused_ & (refused_ - 1)) == 0) {
      Log(LogLevel::kWarning,
          request->data.nr == kReportCall
              ? "model code tried to report to the supervisor as the server; refused"
          : EndsProcess(request->data.nr)
              ? "model code tried to end or replace the serving process; refused"
              : "model code tried to shut down, close, copy or replace a descriptor the server "
                "keeps "
                "(a listener, a copy's archive); refused",
          {{"call", CallName(request->data.nr)},
           {"thread", std::to_string(caller), false},
           {"thread_name", ThreadName(serving_, caller)},
           {"refused_so_far", std::to_string(refused_), false}});
    }
  } else {
    response->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
  }
  // ENOENT: the caller was killed while it waited, which ends its call anyway.
  ::ioctl(listener_, SECCOMP_IOCTL_NOTIF_SEND, response);
}

void ExitWarden::Close() {
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
}

}  // namespace orochi::server
