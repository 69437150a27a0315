#include "supervisor_shield.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "seccomp_filter.h"

namespace orochi::server {
namespace {

using seccomp::Argument;
using seccomp::ArgumentHigh;
using seccomp::FilterBuilder;
using seccomp::kArch;
using seccomp::kCallNumber;
using seccomp::kForeignCallBit;
using seccomp::kNativeArch;

constexpr uint32_t kAllow = SECCOMP_RET_ALLOW;
constexpr uint32_t kRefuse = SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA);
constexpr uint32_t kNoSuchCall = SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA);

// ioprio_set's `which` for a user (linux/ioprio.h, not in every distribution's headers).
constexpr uint32_t kIoPriorityOfUser = 3;

// clone's exit signal: the low byte of its flags.
constexpr uint32_t kCloneExitSignal = 0xff;

// TCP_AO_ADD_KEY (linux/tcp.h since 6.7, not in every distribution's headers).
constexpr uint32_t kTcpAoAddKey = 38;

// The signals a thread of the serving process may send itself (raise, abort): the crash
// recorder's, which it attributes to the thread's model. 0 is a probe. Not glibc's own two
// (32, thread cancellation; 33, the set*id broadcast), which nothing in the server uses: glibc
// installs their handlers on first use, so until then either one ended the process with no
// record, a restart loop that named no model. (A set*id of model code's then changes the
// calling thread's credentials alone; glibc skips the threads it cannot signal.)
constexpr int kSignalsToOwnThreads[] = {0,      SIGSEGV, SIGBUS,  SIGFPE,
                                        SIGILL, SIGABRT, SIGTRAP, SIGSYS};

// Jumps to `allow` if the call's argument `index` is 0 (a null pointer: both of its halves);
// refuses the call otherwise.
void AllowOnlyIfNull(FilterBuilder& filter, size_t index, FilterBuilder::Label allow) {
  const auto low_half_is_null = filter.NewLabel();
  filter.Load(Argument(index));
  filter.JumpIfEqual(0, low_half_is_null);
  filter.Return(kRefuse);
  filter.Bind(low_half_is_null);
  filter.Load(ArgumentHigh(index));
  filter.JumpIfEqual(0, allow);
  filter.Return(kRefuse);
}

std::vector<sock_filter> Compile(pid_t supervisor, pid_t supervisor_group, pid_t serving) {
  FilterBuilder filter;
  const auto refuse = filter.NewLabel();
  const auto allow = filter.NewLabel();
  const auto no_such_call = filter.NewLabel();
  const auto native = filter.NewLabel();
  const auto clone = filter.NewLabel();
  const auto unshare = filter.NewLabel();
  const auto prctl = filter.NewLabel();
  const auto process_signal = filter.NewLabel();
  const auto own_process_signal = filter.NewLabel();
  const auto thread_signal = filter.NewLabel();
  const auto own_thread_signal = filter.NewLabel();
  const auto tkill = filter.NewLabel();
  const auto first_is_supervisor = filter.NewLabel();
  const auto limit = filter.NewLabel();
  const auto fcntl = filter.NewLabel();
  const auto ioctl = filter.NewLabel();
  const auto setsockopt = filter.NewLabel();
  const auto priority = filter.NewLabel();
  const auto allow_unless_socket_option = filter.NewLabel();
  const auto chosen_signal = filter.NewLabel();

  filter.Load(kArch);
  filter.JumpIfEqual(kNativeArch, native);
  filter.Return(kRefuse);
  filter.Bind(native);
  filter.Load(kCallNumber);
  if (kForeignCallBit != 0) filter.JumpIfAnyBit(kForeignCallBit, refuse);
  filter.JumpIfEqual(SYS_clone, clone);
  filter.JumpIfOneOf(
      std::array{SYS_clone3, SYS_io_uring_setup, SYS_io_uring_enter, SYS_io_uring_register},
      no_such_call);
  filter.JumpIfEqual(SYS_unshare, unshare);
  filter.JumpIfEqual(SYS_pidfd_send_signal, refuse);
  filter.JumpIfOneOf(std::array{SYS_kill, SYS_rt_sigqueueinfo}, process_signal);
  filter.JumpIfOneOf(std::array{SYS_tgkill, SYS_rt_tgsigqueueinfo}, thread_signal);
  filter.JumpIfEqual(SYS_tkill, tkill);
  filter.JumpIfOneOf(
      std::array{SYS_pidfd_open, SYS_process_vm_readv, SYS_process_vm_writev, SYS_sched_setaffinity,
                 SYS_sched_setscheduler, SYS_sched_setparam, SYS_sched_setattr},
      first_is_supervisor);
  filter.JumpIfEqual(SYS_fcntl, fcntl);
  filter.JumpIfEqual(SYS_ioctl, ioctl);
  filter.JumpIfEqual(SYS_setsockopt, setsockopt);
  filter.JumpIfOneOf(std::array{SYS_setpriority, SYS_ioprio_set}, priority);
  // Tracing: a child of the serving process could stop every thread of it (PTRACE_SEIZE,
  // PTRACE_INTERRUPT), which no wait of the supervisor's sees. Nothing in the server traces.
  // Limits: the serving process's own descriptor, memory or file-size limit lowered for good
  // (its hard limit cannot be raised again) would starve every model. Reading them is prlimit64
  // with no new limit.
  // A filter of model code's own (seccomp, or prctl's PR_SET_SECCOMP), synchronized onto
  // every thread, could fail the futex wakes every request waits on, or kill every thread
  // that polls its sockets: the server's threads are not model code's to filter.
  filter.JumpIfOneOf(std::array{SYS_ptrace, SYS_setrlimit, SYS_seccomp}, refuse);
  filter.JumpIfEqual(SYS_prctl, prctl);
  filter.JumpIfEqual(SYS_prlimit64, limit);
  filter.JumpIfOneOf(std::array{SYS_timer_create, SYS_mq_notify}, chosen_signal);
  filter.Return(kAllow);

  // timer_create(clock, event, id), mq_notify(queue, event): the kernel itself sends the signal
  // an event names (SIGKILL, say, to the serving process or one of its threads), which no
  // kill-like call shows this filter: a timer set after each load was a restart loop that named
  // no model. The event lies in memory, out of a filter's sight, so any is refused; none (a
  // timer's default, SIGALRM, which the serving process ignores; a queue's notification
  // removed) goes through. Nothing in the server sets either.
  filter.Bind(chosen_signal);
  AllowOnlyIfNull(filter, 1, allow);

  // kill(pid, signal), rt_sigqueueinfo(pid, signal, info): the supervisor, its group and every
  // process are out of reach; the serving process itself and its group get probes only.
  filter.Bind(process_signal);
  filter.JumpIfArgumentIsOneOf(0, std::array{supervisor, -supervisor_group, -1}, refuse);
  filter.JumpIfOneOf(std::array{serving, 0, -serving}, own_process_signal);
  filter.Return(kAllow);
  filter.Bind(own_process_signal);
  filter.JumpIfArgumentIs(1, 0, allow);
  filter.Return(kRefuse);

  // tgkill(tgid, tid, signal), rt_tgsigqueueinfo(tgid, tid, signal, info).
  filter.Bind(thread_signal);
  filter.JumpIfArgumentIs(0, static_cast<uint32_t>(supervisor), refuse);
  filter.JumpIfEqual(static_cast<uint32_t>(serving), own_thread_signal);
  filter.Return(kAllow);
  filter.Bind(own_thread_signal);
  filter.JumpIfArgumentIsOneOf(2, kSignalsToOwnThreads, allow);
  filter.Return(kRefuse);

  // tkill(tid, signal) names no process, so its signal is held to the same list whatever the
  // thread (the supervisor's one thread is refused outright).
  filter.Bind(tkill);
  filter.JumpIfArgumentIs(0, static_cast<uint32_t>(supervisor), refuse);
  filter.JumpIfArgumentIsOneOf(1, kSignalsToOwnThreads, allow);
  filter.Return(kRefuse);

  filter.Bind(first_is_supervisor);
  filter.JumpIfArgumentIs(0, static_cast<uint32_t>(supervisor), refuse);
  filter.Return(kAllow);

  // prlimit64(pid, resource, new, old): the supervisor's not even read; anyone's only read (new
  // is null, both halves of the pointer).
  filter.Bind(limit);
  filter.JumpIfArgumentIs(0, static_cast<uint32_t>(supervisor), refuse);
  AllowOnlyIfNull(filter, 2, allow);

  // fcntl(fd, F_SETOWN, pid) makes the kernel signal pid (SIGIO, or F_SETSIG's choice, SIGKILL
  // included) when the descriptor has input: a signal no kill() sends. F_SETOWN_EX passes its
  // owner in memory: refused outright, as are the ioctls that set an owner, which do too.
  filter.Bind(fcntl);
  const auto set_owner = filter.NewLabel();
  const auto set_signal = filter.NewLabel();
  filter.JumpIfArgumentIs(1, F_SETOWN_EX, refuse);
  filter.JumpIfEqual(F_SETSIG, set_signal);
  filter.JumpIfEqual(F_SETOWN, set_owner);
  filter.Return(kAllow);
  filter.Bind(set_owner);
  filter.JumpIfArgumentIsOneOf(2, std::array{supervisor, -supervisor_group}, refuse);
  filter.Return(kAllow);
  // F_SETSIG picks the signal an owner gets: only the default (0, SIGIO, which the serving
  // process ignores), not SIGKILL to the serving process itself, which would name no model.
  filter.Bind(set_signal);
  filter.JumpIfArgumentIs(2, 0, allow);
  filter.Return(kRefuse);

  // Owners as above; the terminal's foreground group (which would leave the supervisor in the
  // background of its own terminal, stopped by its next write) and typing into it.
  filter.Bind(ioctl);
  filter.JumpIfArgumentIsOneOf(1, std::array<uint32_t, 4>{FIOSETOWN, SIOCSPGRP, TIOCSPGRP, TIOCSTI},
                               refuse);
  filter.Return(kAllow);

  // The listening sockets are the supervisor's too: a socket filter could drop every connection
  // through every restart. Nothing in the serving process sets one. (SO_REUSEPORT, which would
  // let a daemon's socket share a listener's connections, cannot be refused so: gRPC sets it on
  // a socket of its own to see whether it works. A listener with it is replaced instead, see
  // listening_socket.h.)
  //
  // Options that make a listener deaf to every client while it still listens, through every
  // restart: bound to another device, a minimum TTL or hop count no local packet has, a TCP
  // MD5 or TCP-AO key that unsigned connections fail. (The supervisor's liveness probe catches
  // what is not listed here.)
  filter.Bind(setsockopt);
  const auto ip_option = filter.NewLabel();
  const auto ipv6_option = filter.NewLabel();
  const auto tcp_option = filter.NewLabel();
  filter.Load(Argument(1));
  filter.JumpIfEqual(SOL_SOCKET, allow_unless_socket_option);
  filter.JumpIfEqual(IPPROTO_IP, ip_option);
  filter.JumpIfEqual(IPPROTO_IPV6, ipv6_option);
  filter.JumpIfEqual(IPPROTO_TCP, tcp_option);
  filter.Return(kAllow);
  filter.Bind(allow_unless_socket_option);
  filter.JumpIfArgumentIsOneOf(
      2,
      std::array{SO_ATTACH_FILTER, SO_ATTACH_BPF, SO_ATTACH_REUSEPORT_CBPF,
                 SO_ATTACH_REUSEPORT_EBPF, SO_LOCK_FILTER, SO_BINDTODEVICE, SO_BINDTOIFINDEX},
      refuse);
  filter.Return(kAllow);
  filter.Bind(ip_option);
  filter.JumpIfArgumentIs(2, IP_MINTTL, refuse);
  filter.Return(kAllow);
  filter.Bind(ipv6_option);
  filter.JumpIfArgumentIs(2, IPV6_MINHOPCOUNT, refuse);
  filter.Return(kAllow);
  filter.Bind(tcp_option);
  filter.JumpIfArgumentIsOneOf(2, std::array<uint32_t, 3>{TCP_MD5SIG, TCP_MD5SIG_EXT, kTcpAoAddKey},
                               refuse);
  filter.Return(kAllow);

  // setpriority(which, who, prio), ioprio_set(which, who, prio): the supervisor's priority is
  // what every serving process it forks starts with. A user-wide one reaches it too: PRIO_USER
  // (2) and IOPRIO_WHO_USER (3), refused for both calls (2 is ioprio_set's process group).
  filter.Bind(priority);
  filter.JumpIfArgumentIsOneOf(0, std::array<uint32_t, 2>{PRIO_USER, kIoPriorityOfUser}, refuse);
  filter.JumpIfArgumentIsOneOf(1, std::array{supervisor, supervisor_group}, refuse);
  filter.Return(kAllow);

  // The management API tells model code by the process that holds a connection's socket, read
  // from /proc/<pid>/fd (peer_process.h): a thread with a descriptor table of its own would
  // hold sockets that no /proc/<pid>/fd lists. So a thread shares its process's table
  // (CLONE_FILES with CLONE_THREAD), and nothing unshares it.
  //
  // Its low byte is the signal the parent gets when the child ends: SIGKILL there, and a child
  // that exits would end the serving process with no record of which model did it. A signal
  // with a bit SIGCHLD lacks is refused: what passes is none (threads), SIGCHLD (fork,
  // posix_spawn), and SIGHUP and SIGSTKFLT, whose bits SIGCHLD has and which the serving
  // process ignores (IgnoreUnusedSignals).
  filter.Bind(clone);
  const auto thread = filter.NewLabel();
  filter.Load(Argument(0));
  filter.JumpIfAnyBit(CLONE_PARENT, refuse);
  filter.JumpIfAnyBit(kCloneExitSignal & ~static_cast<uint32_t>(SIGCHLD), refuse);
  filter.JumpIfAnyBit(CLONE_THREAD, thread);
  filter.Return(kAllow);
  filter.Bind(thread);
  filter.JumpIfAnyBit(CLONE_FILES, allow);
  filter.Return(kRefuse);
  // Not dumpable, the serving process's memory is closed to its supervisor, which reads the
  // loads it is told of there (exit_guard.h's SendReport) and would fall back to the pipe that
  // model code writes to.
  filter.Bind(prctl);
  filter.JumpIfArgumentIsOneOf(0, std::array<uint32_t, 2>{PR_SET_SECCOMP, PR_SET_DUMPABLE}, refuse);
  filter.Return(kAllow);
  filter.Bind(unshare);
  filter.Load(Argument(0));
  filter.JumpIfAnyBit(CLONE_FILES, refuse);
  filter.Return(kAllow);

  filter.Bind(no_such_call);
  filter.Return(kNoSuchCall);
  filter.Bind(refuse);
  filter.Return(kRefuse);
  filter.Bind(allow);
  filter.Return(kAllow);
  return filter.Finish();
}

}  // namespace

void HideSupervisorMemory() { ::prctl(PR_SET_DUMPABLE, 0); }

void IgnoreUnusedSignals() {
  // A handler rather than SIG_IGN: handlers are reset by execve, so what models start gets the
  // default actions it expects.
  struct sigaction nothing {};
  nothing.sa_handler = [](int) {};
  sigemptyset(&nothing.sa_mask);
  nothing.sa_flags = SA_RESTART;
  for (int signal_number :
       {SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR, SIGSTKFLT, SIGXCPU}) {
    ::sigaction(signal_number, &nothing, nullptr);
  }
  for (int signal_number = SIGRTMIN; signal_number <= SIGRTMAX; ++signal_number) {
    ::sigaction(signal_number, &nothing, nullptr);
  }
}

Status ShieldSupervisorFrom(pid_t supervisor, pid_t supervisor_group) {
  if (kNativeArch == 0) {
    return Unimplemented("the serving process's seccomp filter is not written for this processor");
  }
  ::prctl(PR_SET_DUMPABLE, 1);
  std::vector<sock_filter> program = Compile(supervisor, supervisor_group, ::getpid());
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
