"""Model code that misbehaves on request, for the tests that the server survives it: each mode
is something a model's code may do that reaches past the model (the process, its descriptors,
its working directory, the modules every model shares)."""

import os
import sys


def refused(attempt) -> float:
    """1.0 if the attempt failed with EPERM, 0.0 if it went through."""
    try:
        attempt()
    except PermissionError:
        return 1.0
    return 0.0


def supervisor_reach() -> list:
    """Probes (signal 0 and reads, which change nothing where they go through), then SIGKILL."""
    import resource
    import signal
    import threading
    supervisor = os.getppid()
    group = os.getpgid(supervisor)
    probes = [
        lambda: os.kill(supervisor, 0),
        lambda: os.kill(-1, 0),  # every process of the user
        lambda: os.killpg(group, 0),
        lambda: os.close(os.pidfd_open(supervisor)),
        lambda: resource.prlimit(supervisor, resource.RLIMIT_NOFILE),
        # What a model starts has the filter too: a shell's own kill.
        lambda: shell_kill(supervisor),
        clone_parent,
        # Reaching it without a signal call: as the owner of a descriptor's SIGIO, through its
        # scheduling (which its next serving process inherits).
        lambda: set_owner(supervisor),
        lambda: os.setpriority(os.PRIO_PROCESS, supervisor,
                               os.getpriority(os.PRIO_PROCESS, supervisor)),
        lambda: os.sched_setaffinity(supervisor, os.sched_getaffinity(supervisor)),
    ]
    results = [refused(probe) for probe in probes]
    results.append(refused(lambda: os.kill(supervisor, signal.SIGKILL)))
    # Its own process and group: probes go through; what would end the process with no record
    # of this model does not.
    results.append(refused(lambda: os.kill(os.getpid(), 0)))
    results.append(refused(lambda: os.kill(0, 0)))
    results.append(refused(lambda: signal.pthread_kill(threading.get_ident(), signal.SIGTERM)))
    results.append(refused(lambda: set_cpu_limit(resource)))
    results.append(refused(lambda: os.kill(0, signal.SIGKILL)))
    results.append(refused(lambda: os.kill(os.getpid(), signal.SIGKILL)))
    return results


def hidden_routes() -> list:
    """Ways around the filter's and the management API's sight: a descriptor table of its own
    (unshare), SIGKILL picked for a descriptor's owner (F_SETSIG), io_uring (whose operations no
    seccomp filter sees), memory closed to the supervisor. 1.0 for each refused."""
    import ctypes
    import errno
    import fcntl
    import socket
    libc = ctypes.CDLL(None, use_errno=True)

    def unshare_files():
        if libc.unshare(0x400) != 0:  # CLONE_FILES
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    def kill_signal_for_owner():
        with socket.socket() as sock:
            fcntl.fcntl(sock.fileno(), 10, 9)  # F_SETSIG, SIGKILL

    def trace_its_process():
        """PTRACE_SEIZE of the serving process from a child: it could stop every thread."""
        parent = os.getpid()
        child = os.fork()
        if child == 0:
            os._exit(0 if libc.ptrace(0x4206, parent, 0, 0) == 0 else ctypes.get_errno())
        _, status = os.waitpid(child, 0)
        if os.WEXITSTATUS(status) != 0:
            raise OSError(os.WEXITSTATUS(status), os.strerror(os.WEXITSTATUS(status)))

    def lower_descriptor_limit():
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        except ValueError as error:  # how CPython words EPERM here
            raise PermissionError(str(error)) from error

    def socket_option(level, option, value):
        with socket.socket() as sock:
            sock.setsockopt(level, option, value)

    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    ring = libc.syscall(425, 8, params)  # io_uring_setup, the same number on x86-64 and arm64
    no_ring = 1.0 if ring < 0 and ctypes.get_errno() == errno.ENOSYS else 0.0
    if ring >= 0:
        os.close(ring)
    def libc_call(call):
        """A C library call, EPERM raised as PermissionError."""
        if call() != 0 and ctypes.get_errno() == errno.EPERM:
            raise PermissionError(errno.EPERM, "refused")

    def own_filter(call):
        """A seccomp filter of its own (a null program: EFAULT where the call is allowed)."""
        libc_call(call)

    import platform
    seccomp = {"x86_64": 317, "aarch64": 277}[platform.machine()]
    return [refused(lambda: own_filter(lambda: libc.syscall(seccomp, 1, 0, None))),
            refused(lambda: own_filter(lambda: libc.prctl(22, 2, None, 0, 0))),  # PR_SET_SECCOMP
            refused(lambda: clone_parent(9)),  # a child whose exit sends its parent SIGKILL
            refused(unshare_files), refused(kill_signal_for_owner), no_ring,
            refused(trace_its_process), refused(lower_descriptor_limit),
            refused(lambda: socket_option(socket.SOL_SOCKET, 25, b"lo")),  # SO_BINDTODEVICE
            refused(lambda: socket_option(socket.IPPROTO_IP, 21, 255)),  # IP_MINTTL
            refused(lambda: socket_option(socket.IPPROTO_TCP, 14, bytes(216))),  # TCP_MD5SIG
            # Its memory closed to the supervisor, which reads the loads it is told of there.
            refused(lambda: libc_call(lambda: libc.prctl(4, 0, 0, 0, 0)))]  # PR_SET_DUMPABLE


def signal_server_threads(from_a_child: bool) -> int:
    """SIGSEGV, SIGBUS and SIGFPE sent (tgkill) to every other thread of the process: the
    server's own (I/O, gRPC, the scheduler's) and idle copies' workers. Returns how many were
    sent; from a forked child that exits when done where `from_a_child`."""
    import ctypes
    import platform
    import signal
    import threading
    libc = ctypes.CDLL(None, use_errno=True)
    tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    process = os.getpid()
    own = threading.get_native_id()
    threads = [int(name) for name in os.listdir("/proc/self/task") if int(name) != own]
    if from_a_child:
        child = os.fork()
        if child == 0:
            for thread in threads:
                for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE):
                    libc.syscall(tgkill, process, thread, number)
            os._exit(0)
        os.waitpid(child, 0)
        return 3 * len(threads)
    sent = 0
    for thread in threads:
        for number in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE):
            sent += libc.syscall(tgkill, process, thread, number) == 0
    return sent


def signal_timers() -> list:
    """The kernel's own senders of a chosen signal, which no kill-like call shows the filter: a
    POSIX timer (timer_create) and a message queue's notification (mq_notify), each asked for
    SIGKILL. 1.0 for each refused; then a timer with the default notification (SIGALRM, which
    the serving process ignores), 0.0 where it is allowed, as it should be."""
    import ctypes
    import platform
    libc = ctypes.CDLL(None, use_errno=True)
    timer_create, timer_delete, mq_notify = {"x86_64": (222, 226, 244),
                                             "aarch64": (107, 111, 184)}[platform.machine()]
    # struct sigevent: value, signo, notify (SIGEV_SIGNAL is 0), then the union's padding.
    kill_event = (ctypes.c_int * 16)(0, 0, 9, 0)

    def call(number, *arguments):
        if libc.syscall(number, *arguments) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    timer = ctypes.c_int()
    results = [refused(lambda: call(timer_create, 1, kill_event, ctypes.byref(timer))),
               refused(lambda: call(mq_notify, -1, kill_event))]
    call(timer_create, 1, None, ctypes.byref(timer))  # CLOCK_MONOTONIC, SIGALRM: no harm
    call(timer_delete, timer.value)
    results.append(0.0)
    return results


def flood_pipes(megabytes: int) -> int:
    """Writes `megabytes` of forged lines to each pipe the process writes to past 1 and 2 (the
    server's own log among them); returns how many pipes took them."""
    import fcntl
    import stat
    block = (b"forged log line " + b"x" * 83 + b"\n") * 10486  # about 1 MB
    flooded = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            if (fd <= 2 or not stat.S_ISFIFO(os.fstat(fd).st_mode) or
                    fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_WRONLY):
                continue
            for _ in range(megabytes):
                os.write(fd, block)
            flooded += 1
        except OSError:  # gone, or the report pipe (non-blocking), full
            pass
    return flooded


def clone_parent(flags: int = 0x8000 | 17):
    """A child made by a raw clone with `flags`, which exits at once: by default a child of the
    supervisor's (CLONE_PARENT | SIGCHLD, fork-like)."""
    import ctypes
    import platform
    clone = {"x86_64": 56, "aarch64": 220}[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    pid = libc.syscall(clone, flags, 0, 0, 0, 0)
    if pid == 0:
        os._exit(0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    os.waitpid(pid, 0)


def listening_sockets():
    """Each listening socket of the process, by the server's own descriptor (a copy made by
    its number is refused: exit_guard.h), detached after its turn so that it stays open."""
    import socket
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=int(name))
        except OSError:
            continue
        try:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                yield sock
        finally:
            sock.detach()


# A process that forks its successor and exits, again and again, in a session of its own: one
# process at a time, each with a new pid, each reparented to the supervisor, faster than a kill
# and a wait of each. It writes each pid to the file it is given, and stops after 20 s.
HOPPER = """
import os, sys, time
until = time.time() + 20
while time.time() < until:
    if os.fork():
        os._exit(0)
    with open(sys.argv[1] + ".tmp", "w") as file:
        file.write(str(os.getpid()))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
"""


def set_listener_options(options) -> int:
    """Sets each (level, name, value) on every listening socket of the process; returns how
    many sockets."""
    count = 0
    for sock in listening_sockets():
        for level, name, value in options:
            sock.setsockopt(level, name, value)
        count += 1
    return count


def shutdown_listeners() -> int:
    """Shuts down every listening socket of the process through copies it passed itself over a
    socket pair, whose numbers the filter does not know; returns how many."""
    import socket
    numbers = [sock.fileno() for sock in listening_sockets()]
    first, second = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with first, second:
        socket.send_fds(first, [b"x"], numbers)
        _, copies, _, _ = socket.recv_fds(second, 1, len(numbers))
    for number in copies:  # after the first, the server starts to drain
        with socket.socket(fileno=number) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    return len(copies)


def touch_listeners_by_number() -> int:
    """Tries to shut down, close, copy and replace every listening socket of the process by its
    number, eight ways each; returns how many tries were refused with EPERM."""
    import ctypes
    import fcntl
    import socket
    libc = ctypes.CDLL(None, use_errno=True)

    def shut_down(number):
        sock = socket.socket(fileno=number)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the server's descriptor stays open

    def copy_through_pidfd(number):
        own = os.pidfd_open(os.getpid())
        try:
            copy = libc.syscall(438, own, number, 0)  # pidfd_getfd, on x86_64 and aarch64
            if copy < 0:
                raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
            os.close(copy)
        finally:
            os.close(own)

    def close_range(number):
        if libc.syscall(436, 0, number + 1, 0) != 0:  # close_range, on x86_64 and aarch64
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    def replace(number):
        spare = os.open(os.devnull, os.O_RDONLY)
        try:
            os.dup2(spare, number)
        finally:
            os.close(spare)

    tries = [shut_down, os.close, lambda number: os.close(os.dup(number)),
             lambda number: os.close(fcntl.fcntl(number, fcntl.F_DUPFD_CLOEXEC, 100)),
             lambda number: os.dup2(number, 200), replace, copy_through_pidfd, close_range]
    refused = 0
    for number in [sock.fileno() for sock in listening_sockets()]:
        for attempt in tries:
            try:
                attempt(number)
            except PermissionError:
                refused += 1
    return refused


def set_owner(pid):
    import fcntl
    import socket
    first, second = socket.socketpair()
    with first, second:
        fcntl.fcntl(first.fileno(), fcntl.F_SETOWN, pid)


def set_cpu_limit(resource):
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (1, 1))
    except ValueError as error:  # how CPython words EPERM here
        raise PermissionError(str(error)) from error


def share_listener() -> int:
    """Sets SO_REUSEPORT on the listener of the port this request came in on; returns its fd."""
    import socket
    for sock in listening_sockets():
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        return sock.fileno()
    return -1


def manage(port: int, how: str) -> int:
    """Asks the management API on `port` to unload echo, as any loopback client may: from this
    process (`http`), from curl (a process it starts), or over gRPC from a Python it starts (the
    gRPC port is `port`). Returns the HTTP status, or the gRPC status code."""
    import subprocess
    unload = f"http://127.0.0.1:{port}/v2/repository/models/echo/unload"
    if how == "http":
        import urllib.error
        import urllib.request
        request = urllib.request.Request(unload, data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=20) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
    if how == "curl":
        done = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST",
                               "-d", "{}", unload], capture_output=True, check=True, timeout=20)
        return int(done.stdout)
    # RepositoryModelUnloadRequest {model_name (2): "echo"}, sent as raw bytes.
    script = ("import grpc, sys\n"
              f"channel = grpc.insecure_channel('127.0.0.1:{port}')\n"
              "unload = channel.unary_unary('/inference.GRPCInferenceService/"
              "RepositoryModelUnload', request_serializer=None, response_deserializer=None)\n"
              "try:\n"
              "    unload(b'\\x12\\x04echo', timeout=20)\n"
              "    print(0)\n"
              "except grpc.RpcError as error:\n"
              "    print(error.code().value[0])\n")
    done = subprocess.run(["/usr/bin/python3.11", "-c", script], capture_output=True,
                          check=True, timeout=30)
    return int(done.stdout)


def shrink_backlogs() -> int:
    """listen(fd, 0) on every listening socket of the process; returns how many."""
    shrunk = 0
    for sock in listening_sockets():
        sock.listen(0)
        shrunk += 1
    return shrunk


def listeners_blocking(clear: bool) -> int:
    """Clears O_NONBLOCK on every listening socket of the process (`clear`), or counts those
    that lack it."""
    import fcntl
    count = 0
    for sock in listening_sockets():
        flags = fcntl.fcntl(sock.fileno(), fcntl.F_GETFL)
        if clear:
            fcntl.fcntl(sock.fileno(), fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        if clear or not flags & os.O_NONBLOCK:
            count += 1
    return count


def spawn_listener_holder() -> int:
    """Starts `sleep` with a duplicate of a listening socket passed across its exec; returns its
    pid."""
    import subprocess
    for sock in listening_sockets():
        return subprocess.Popen(["sleep", "60"], pass_fds=[sock.fileno()]).pid
    return -1


def shell_kill(pid):
    import subprocess
    if subprocess.run(["sh", "-c", f"kill -0 {pid} 2>/dev/null"], check=False).returncode != 0:
        raise PermissionError("the shell's kill was refused")


def raw_exit_group(status: int) -> int:
    """The kernel's exit_group, past the guard on os._exit; the errno it failed with (0 if it
    returned without one)."""
    import ctypes
    import platform
    number = {"x86_64": 231, "aarch64": 94}[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    return ctypes.get_errno() if libc.syscall(number, status) == -1 else 0


# Ends with status 5 while a thread of its own still runs: the whole process must go.
THREADED_EXIT = """
import os, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
time.sleep(0.1)
os._exit(5)
"""


def child_exit_statuses() -> list:
    """The exit statuses of what a model starts: a fork, a program, a threaded program."""
    import subprocess
    pid = os.fork()
    if pid == 0:
        os._exit(3)
    statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]
    statuses.append(subprocess.run(["sh", "-c", "exit 4"], check=False).returncode)
    statuses.append(subprocess.run(["/usr/bin/python3.11", "-c", THREADED_EXIT], check=False,
                                   timeout=30).returncode)
    return [float(status) for status in statuses]


class Hostile:
    def __init__(self, context):
        pass

    def predict(self, inputs):
        mode = inputs["mode"][0].decode()
        if mode == "exit":
            os._exit(7)
        elif mode == "abort":
            os.abort()
        elif mode == "close_stderr":
            os.close(2)
        elif mode == "close_std_range":
            os.closerange(0, 1024)
        elif mode == "close_stderr_file":  # frees descriptor 2 past the guard on os.close
            os.fdopen(2, "wb").close()
        elif mode == "forget_serving":  # the module that holds every model of the copy
            del sys.modules["orochi.serving"]
        elif mode == "chdir":
            os.chdir("/")
        elif mode == "huge_error":
            raise ValueError("x" * (16 << 20))
        elif mode == "trap":  # a breakpoint instruction, as code patched or left in hits one
            import ctypes
            import mmap
            import platform
            # int3; ret (x86-64), brk #0; ret (arm64): a SIGTRAP the processor raises.
            code = {"x86_64": b"\xcc\xc3",
                    "aarch64": bytes.fromhex("000020d4c0035fd6")}[platform.machine()]
            memory = mmap.mmap(-1, mmap.PAGESIZE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            memory.write(code)
            ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(memory)))()
        elif mode == "segfault":  # a native crash, as a C extension's bug would make one
            import ctypes
            ctypes.string_at(0)
        elif mode == "exit_group":
            return {"out": [float(raw_exit_group(7))]}
        elif mode == "thread_exit_group":  # from a thread of its own, as R4 of HARDENING.md
            import threading
            errors = []
            thread = threading.Thread(target=lambda: errors.append(raw_exit_group(7)))
            thread.start()
            thread.join()
            return {"out": [float(errors[0])]}
        elif mode == "exit_thread":  # the kernel's exit of the calling thread alone
            import ctypes
            import platform
            number = {"x86_64": 60, "aarch64": 93}[platform.machine()]
            ctypes.CDLL(None).syscall(number, 0)
        elif mode == "count_exit_listeners":  # the exit filter's, by their /proc name
            count = 0
            for name in os.listdir("/proc/self/fd"):
                try:
                    count += "seccomp" in os.readlink(f"/proc/self/fd/{name}")
                except OSError:
                    pass
            return {"out": [float(count)]}
        elif mode in ("c_exit", "glibc_exit"):  # the C library's exit(), from a thread
            import ctypes
            import threading
            # CDLL(None) finds the executable's exit; libc's own handle, glibc's definition.
            library = ctypes.CDLL(None if mode == "c_exit" else "libc.so.6")
            threading.Thread(target=library.exit, args=(0,), daemon=True).start()
        elif mode == "exec":  # replaces the serving process, past any exit of its own
            os.execv("/bin/true", ["true"])
        elif mode == "child_exits":
            return {"out": child_exit_statuses()}
        elif mode == "thread_segfault":  # the same, a moment later in a thread of its own
            import ctypes
            import threading
            threading.Timer(0.2, ctypes.string_at, (0,)).start()
        elif mode == "stack_overflow":  # C recursion that the raised recursion limit lets run
            sys.setrecursionlimit(1 << 30)
            nested = []
            for _ in range(1 << 20):
                nested = [nested]
            repr(nested)
        elif mode.startswith("umask:"):  # umask:<octal mask>, the process's, for every thread
            os.umask(int(mode.split(":", 1)[1], 8))
        elif mode.startswith("chmod:"):  # chmod:<octal mode>:<path>
            _, bits, path = mode.split(":", 2)
            os.chmod(path, int(bits, 8))
        elif mode.startswith("hopper:"):  # hopper:<path>, see HOPPER
            import subprocess
            subprocess.Popen(["/usr/bin/python3.11", "-c", HOPPER, mode.split(":", 1)[1]],
                             start_new_session=True)
        elif mode.startswith("spawn_sleepers:"):  # spawn_sleepers:<count>, oldest first
            import subprocess
            count = int(mode.split(":")[1])
            return {"out": [float(subprocess.Popen(["sleep", "60"]).pid) for _ in range(count)]}
        elif mode == "spawn_listener_holder":
            return {"out": [float(spawn_listener_holder())]}
        elif mode == "exhaust_descriptors":  # leaks files until the process has none left
            kept = []
            try:
                while True:
                    kept.append(open("/dev/null"))
            except OSError:
                pass
            import time
            time.sleep(1)  # held across several repository polls
            for file in kept:
                file.close()
        elif mode == "terminate_self":  # as `kill` of the server would: a graceful stop
            import signal
            os.kill(os.getpid(), signal.SIGTERM)
        elif mode == "terminate_supervisor":
            import signal
            os.kill(os.getppid(), signal.SIGTERM)
        elif mode == "signal_supervisor":  # every way to reach the supervisor by its pid
            return {"out": supervisor_reach()}
        elif mode == "forge_crash_record":  # blames echo; the test then kills the process
            import stat
            for name in os.listdir("/proc/self/fd"):
                fd = int(name)
                try:
                    if fd > 2 and stat.S_ISFIFO(os.fstat(fd).st_mode):
                        os.write(fd, b"stuck_load model=echo:1\n"
                                     b"crash signal=9 model=echo:1 copy=0 activity=predict\n")
                except OSError:
                    pass
        elif mode == "share_listener":  # SO_REUSEPORT on the inference listener
            return {"out": [float(share_listener())]}
        elif mode in ("clear_nonblocking", "count_blocking"):
            return {"out": [float(listeners_blocking(mode == "clear_nonblocking"))]}
        elif mode == "deafen_listeners":  # options the connections accepted inherit
            import socket
            pacing_rate = 47  # SO_MAX_PACING_RATE
            return {"out": [float(set_listener_options([
                (socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1 << 20),
                (socket.IPPROTO_TCP, socket.TCP_MAXSEG, 88),
                (socket.SOL_SOCKET, pacing_rate, 1),
                (socket.IPPROTO_IP, socket.IP_TTL, 1)]))]}
        elif mode == "lock_listener_buffers":  # which nothing can unlock
            import socket
            return {"out": [float(set_listener_options([
                (socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]))]}
        elif mode == "shrink_backlogs":
            return {"out": [float(shrink_backlogs())]}
        elif mode == "replace_archives":  # /dev/null where every new copy reads its stdlib
            refused = 0
            for name in os.listdir("/proc/self/fd"):
                try:
                    if not os.readlink(f"/proc/self/fd/{name}").startswith("/memfd:orochi-"):
                        continue
                except OSError:
                    continue
                spare = os.open(os.devnull, os.O_RDONLY)
                try:
                    os.dup2(spare, int(name))
                except PermissionError:
                    refused += 1
                finally:
                    os.close(spare)
            return {"out": [float(refused)]}
        elif mode == "touch_listeners":  # shut down or copied by their numbers: refused
            return {"out": [float(touch_listeners_by_number())]}
        elif mode == "shutdown_listeners":  # the sockets the supervisor holds too
            return {"out": [float(shutdown_listeners())]}
        elif mode == "set_timers":  # their signals' default action would end the process
            import signal
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            signal.setitimer(signal.ITIMER_PROF, 0.001)
            signal.setitimer(signal.ITIMER_VIRTUAL, 0.001)
            end = __import__("time").process_time() + 0.05
            while __import__("time").process_time() < end:  # CPU time, for the two others
                pass
        elif mode == "raise_fault":  # a SIGSEGV sent to its own thread, which faulted nothing
            import signal
            signal.raise_signal(signal.SIGSEGV)
        elif mode in ("signal_server_threads", "signal_server_threads_from_a_child"):
            return {"out": [float(signal_server_threads(mode.endswith("child")))]}
        elif mode.startswith("answer:"):  # an answer of that many float32 values
            return {"out": [0.0] * int(mode.split(":")[1])}
        elif mode == "signal_timers":
            return {"out": signal_timers()}
        elif mode == "escape_group":  # a daemon in a session of its own, orphaned at once
            import subprocess
            subprocess.run(["setsid", "-f", "sleep", "61.234"], check=True)
        elif mode == "audit_hook":  # a hook would run in every other model's code
            sys.addaudithook(lambda event, args: None)
        elif mode == "glibc_signals":  # 32 and 33 to its own main thread: handled by nothing
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            for number in (32, 33):
                if libc.syscall(234 if os.uname().machine == "x86_64" else 131, os.getpid(),
                                os.getpid(), number) != 0:  # tgkill
                    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        elif mode == "stop_process":  # freezes the whole process; nothing in it can continue it
            import signal
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "write_fds":  # past sys.stdout, straight to the process's descriptors
            os.write(2, b"to descriptor 2\n")
            os.write(1, b"y" * 10000 + b"\n")
        elif mode == "flood_fds":
            for _ in range(5000):
                os.write(1, b"flood\n")
        elif mode == "flood_log":
            return {"out": [float(flood_pipes(64))]}
        elif mode == "hidden_routes":
            return {"out": hidden_routes()}
        elif mode.startswith("manage:"):  # manage:<port>:<http|curl|grpc>
            _, port, how = mode.split(":")
            return {"out": [float(manage(int(port), how))]}
        elif mode == "odd_keys":
            return {"out": [1.0], 1: [2.0], None: [3.0]}
        return {"out": [1.0]}
