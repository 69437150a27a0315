#include "exit_guard.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "log.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#include <sanitizer/common_interface_defs.h>
#endif

namespace orochi::server {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
#else
constexpr uint32_t kNativeArch = 0;
#endif

// The notification listener: the warden's to read, -1 without the filter. Not inherited by an
// exec (the kernel makes it close-on-exec) nor kept by a fork (CloseListenerInChild), so that
// once the serving process is gone a leftover's exit_group finds no listener and goes through.
int listener = -1;
// The upper half of exit_group's argument on the server's own exits; 0 without the filter.
uint32_t own_exit_word = 0;

// The high 32 bits of a call's first argument, for the filter.
constexpr uint32_t kFirstArgumentHigh = static_cast<uint32_t>(offsetof(seccomp_data, args)) +
                                        (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 4 : 0);

void CloseListenerInChild() {
  if (listener >= 0) ::close(listener);
  listener = -1;
}

bool IsThreadOfThisProcess(pid_t thread) {
  if (thread <= 0) return false;  // a caller in another pid namespace
  const std::string task = "/proc/self/task/" + std::to_string(thread);
  return ::access(task.c_str(), F_OK) == 0;
}

std::string ThreadName(pid_t thread) {
  const std::string path = "/proc/self/task/" + std::to_string(thread) + "/comm";
  char name[32] = {};
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  const ssize_t length = ::read(fd, name, sizeof(name) - 1);
  ::close(fd);
  std::string result(name, length > 0 ? static_cast<size_t>(length) : 0);
  while (!result.empty() && result.back() == '\n') result.pop_back();
  return result;
}

void Warden(int fd) {
  seccomp_notif_sizes sizes{};
  if (::syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) {
    sizes = {sizeof(seccomp_notif), sizeof(seccomp_notif_resp), sizeof(seccomp_data)};
  }
  // The kernel's structures may be larger than these headers' (a newer kernel).
  std::vector<std::byte> request_buffer(
      std::max<size_t>(sizes.seccomp_notif, sizeof(seccomp_notif)));
  std::vector<std::byte> response_buffer(
      std::max<size_t>(sizes.seccomp_notif_resp, sizeof(seccomp_notif_resp)));
  uint64_t refused = 0;
  while (true) {
    std::fill(request_buffer.begin(), request_buffer.end(), std::byte{0});
    auto* request = reinterpret_cast<seccomp_notif*>(request_buffer.data());
    if (::ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, request) != 0) {
      if (errno == EINTR || errno == ENOENT) continue;  // ENOENT: its caller was killed
      Log(LogLevel::kError, "the exit warden stopped; exits of model code go unchecked",
          {{"error", std::strerror(errno)}});
      return;
    }
    std::fill(response_buffer.begin(), response_buffer.end(), std::byte{0});
    auto* response = reinterpret_cast<seccomp_notif_resp*>(response_buffer.data());
    response->id = request->id;
    const auto caller = static_cast<pid_t>(request->pid);
    if (IsThreadOfThisProcess(caller)) {
      response->error = -EPERM;
      // Logged at the 1st, 2nd, 4th, 8th... refusal: a loop of them cannot flood the log.
      ++refused;
      if ((refused & (refused - 1)) == 0) {
        Log(LogLevel::kWarning, "model code tried to end the serving process (exit_group); refused",
            {{"thread", std::to_string(caller), false},
             {"thread_name", ThreadName(caller)},
             {"refused_so_far", std::to_string(refused), false}});
      }
    } else {
      response->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    }
    // ENOENT: the caller was killed while it waited, which ends its call anyway.
    ::ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, response);
  }
}

}  // namespace

Status InstallExitFilter() {
  if (kNativeArch == 0) {
    return Unimplemented("the exit filter is not written for this processor");
  }
  uint32_t word = 0;
  while (word == 0) {
    if (::getrandom(&word, sizeof(word), 0) != sizeof(word)) {
      return Internal(std::string("no random word for the exit filter: ") + std::strerror(errno));
    }
  }
  // Another architecture's calls (i386's exit_group has another number) are refused outright by
  // the supervisor shield's filter.
  // NOLINTBEGIN(hicpp-signed-bitwise): the kernel's BPF macros
  std::vector<sock_filter> program = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kNativeArch, 0, 5),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_exit_group, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kFirstArgumentHigh),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  // NOLINTEND(hicpp-signed-bitwise)
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
  listener = static_cast<int>(fd);
  own_exit_word = word;
  ::pthread_atfork(nullptr, nullptr, CloseListenerInChild);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer's report ends the process from whichever thread found the fault.
  __sanitizer_set_death_callback([] { ExitServingProcess(1); });
#endif
  return Status::Ok();
}

void StartExitWarden() {
  if (listener < 0) return;
  // No signal for it: an interrupted wait would only be retried.
  sigset_t all;
  sigfillset(&all);
  sigset_t previous;
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  std::thread(Warden, listener).detach();
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void ExitServingProcess(int code) {
  std::fflush(nullptr);
  ::syscall(SYS_exit_group,
            (static_cast<uint64_t>(own_exit_word) << 32U) | static_cast<uint32_t>(code));
  std::_Exit(code);  // not reached: the filter lets the call above through
}

}  // namespace orochi::server
