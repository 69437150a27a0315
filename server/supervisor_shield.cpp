#include "supervisor_shield.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace orochi::server {
namespace {

#if defined(__x86_64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_X86_64;
// x32 calls come with the native arch and this bit in their number: refused, like the i386
// calls (a different arch), since nothing in a 64-bit server makes them and the rules below
// look at native numbers only.
constexpr uint32_t kForeignCallBit = 0x40000000;
#elif defined(__aarch64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
constexpr uint32_t kForeignCallBit = 0;
#else
constexpr uint32_t kNativeArch = 0;
constexpr uint32_t kForeignCallBit = 0;
#endif

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);

// The low 32 bits of a call's argument: where the kernel reads a pid_t from.
constexpr uint32_t ArgumentLowWord(size_t index) {
  return static_cast<uint32_t>(offsetof(seccomp_data, args) + sizeof(uint64_t) * index) +
         (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? 0 : 4);
}

// One call the filter looks at: refused when its argument `argument` is one of `refused`, or
// always when `refused` is empty.
struct Rule {
  long call;
  size_t argument;
  std::vector<pid_t> refused;
};

sock_filter Load(uint32_t offset) {
  return BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset);  // NOLINT(hicpp-signed-bitwise)
}
sock_filter Return(uint32_t action) {
  return BPF_STMT(BPF_RET | BPF_K, action);  // NOLINT(hicpp-signed-bitwise)
}
sock_filter JumpIfEqual(uint32_t value, uint8_t when_equal, uint8_t otherwise) {
  // NOLINTNEXTLINE(hicpp-signed-bitwise)
  return BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, value, when_equal, otherwise);
}

// The program: check the arch, then one block per rule, in which a call that is not the rule's
// jumps over the block, and one that is returns kRefuse or kAllow by its argument.
std::vector<sock_filter> Compile(const std::vector<Rule>& rules) {
  std::vector<sock_filter> program;
  program.push_back(Load(offsetof(seccomp_data, arch)));
  program.push_back(JumpIfEqual(kNativeArch, 1, 0));
  program.push_back(Return(kRefuse));
  program.push_back(Load(offsetof(seccomp_data, nr)));
  if (kForeignCallBit != 0) {
    // NOLINTNEXTLINE(hicpp-signed-bitwise)
    program.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kForeignCallBit, 0, 1));
    program.push_back(Return(kRefuse));
  }
  // clone with CLONE_PARENT makes a child of the supervisor, which it would never reap: a loop
  // of them fills the pid table with zombies. clone3 passes its flags in memory, which a filter
  // cannot read: ENOSYS makes the C library fall back to clone (as container runtimes do).
  program.push_back(JumpIfEqual(static_cast<uint32_t>(SYS_clone), 0, 3));
  program.push_back(Load(ArgumentLowWord(0)));
  // NOLINTNEXTLINE(hicpp-signed-bitwise)
  program.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_PARENT, 0, 1));
  program.push_back(Return(kRefuse));
  program.push_back(Load(offsetof(seccomp_data, nr)));
  program.push_back(JumpIfEqual(static_cast<uint32_t>(SYS_clone3), 0, 1));
  program.push_back(Return(SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)));
  for (const Rule& rule : rules) {
    // The block after the call's test: [load the argument, one test per refused value, allow],
    // then refuse; or only refuse.
    const size_t tests = rule.refused.size();
    const size_t block = tests == 0 ? 1 : tests + 3;
    program.push_back(
        JumpIfEqual(static_cast<uint32_t>(rule.call), 0, static_cast<uint8_t>(block)));
    if (tests != 0) {
      program.push_back(Load(ArgumentLowWord(rule.argument)));
      for (size_t i = 0; i < tests; ++i) {
        program.push_back(JumpIfEqual(static_cast<uint32_t>(rule.refused[i]),
                                      static_cast<uint8_t>(tests - i), 0));
      }
      program.push_back(Return(kAllow));
    }
    program.push_back(Return(kRefuse));
    // The next block tests the call number again, which the argument's load replaced.
    program.push_back(Load(offsetof(seccomp_data, nr)));
  }
  program.push_back(Return(kAllow));
  return program;
}

}  // namespace

void HideSupervisorMemory() { ::prctl(PR_SET_DUMPABLE, 0); }

Status ShieldSupervisorFrom(pid_t supervisor, pid_t supervisor_group) {
  if (kNativeArch == 0) {
    return Unimplemented("the serving process's seccomp filter is not written for this processor");
  }
  ::prctl(PR_SET_DUMPABLE, 1);
  // Every pid that names the supervisor as a signal's target: itself, its group (negated), and
  // -1, which reaches every process the caller may signal.
  const std::vector<pid_t> signal_targets{supervisor, -supervisor_group, -1};
  const std::vector<Rule> rules{
      {SYS_kill, 0, signal_targets},
      {SYS_rt_sigqueueinfo, 0, signal_targets},
      {SYS_tkill, 0, {supervisor}},  // the supervisor is single-threaded: its one tid is its pid
      {SYS_tgkill, 0, {supervisor}},
      {SYS_rt_tgsigqueueinfo, 0, {supervisor}},
      {SYS_pidfd_open, 0, {supervisor}},
      {SYS_pidfd_send_signal, 0, {}},
      {SYS_prlimit64, 0, {supervisor}},
      {SYS_ptrace, 1, {supervisor}},
      {SYS_process_vm_readv, 0, {supervisor}},
      {SYS_process_vm_writev, 0, {supervisor}},
  };
  std::vector<sock_filter> program = Compile(rules);
  const sock_fprog filter{static_cast<unsigned short>(program.size()), program.data()};
  // Required to install a filter without CAP_SYS_ADMIN; it also keeps what models execute from
  // gaining privileges (set-user-ID programs), which they have no business doing.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
      ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) != 0) {
    return Internal(std::string("the kernel refused the serving process's seccomp filter: ") +
                    std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace orochi::server
