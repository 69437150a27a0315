"""Faults in model code that the interpreter cannot catch, and loads that take long or never end:
a C stack overflowed by recursion, a segfault in a model's __init__ (uploaded, or in the
repository at start), readiness while an __init__ runs, and a reload into the replacement of a
stuck copy whose __init__ never returns. Each costs at most a restart of the serving process or
the one model, never the service.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_native_faults
"""

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import unittest

from server_fixtures import (BINARY, Server, child_pids, curl, echo_request, metrics_text,
                             pack_model, pack_repository, pack_variant, post_json, slow_request,
                             start_upload)

CRASHING_INIT = '''
import ctypes


class Hangs:
    def __init__(self, context):
        ctypes.string_at(0)  # a native crash, as a C extension's bug would make one

    def predict(self, inputs):
        return {"done": [True]}
'''

# Crashes its load while the file MARK exists: a package quarantined, then mended.
CRASHES_WHILE_MARKED = '''
import ctypes
import os

MARK = {mark!r}


class Hangs:
    def __init__(self, context):
        if os.path.exists(MARK):
            ctypes.string_at(0)

    def predict(self, inputs):
        return {{"done": [True]}}
'''


def starting_a_thread(preamble: str, target: str) -> str:
    """The code of a package whose __init__ starts `target` (defined in `preamble`) in a
    thread of its own, which runs on after the load."""
    return preamble + f"""


class Hangs:
    def __init__(self, context):
        threading.Thread(target={target}, daemon=True).start()

    def predict(self, inputs):
        return {{"done": [True]}}
"""


# Starts a thread that crashes a moment after the load, outside any call of the model's.
CRASHING_THREAD_INIT = starting_a_thread('''
import ctypes
import threading
import time


def crash_later():
    time.sleep(0.5)
    ctypes.string_at(0)''', "crash_later")

# Crashes a moment after the load in a thread started with the C library's own pthread_create,
# which the server never marks: the crash record names no model (P2b of docs/HARDENING.md).
UNMARKED_THREAD_CRASH_INIT = starting_a_thread('''
import ctypes
import threading
import time


def crash_unmarked_later():
    time.sleep(0.5)
    thread = ctypes.c_ulong()
    # No start routine: the new thread jumps to address 0.
    ctypes.CDLL("libc.so.6").pthread_create(ctypes.byref(thread), None, None, None)
    time.sleep(5)''', "crash_unmarked_later")

# Replaces inspect.signature, which the server calls at each model's load, in the interpreter the
# models of its copy share, by one that kills the process with no record for any model but
# itself: every later load dies, put on an innocent model (Q3 of docs/HARDENING.md).
DAMAGES_LATER_LOADS_INIT = '''
import ctypes
import inspect

_original_signature = inspect.signature


def _signature(function, *args, **kwargs):
    if type(getattr(function, "__self__", None)) is not Hangs:
        libc = ctypes.CDLL(None)
        libc.signal(11, None)  # SIGSEGV, SIG_DFL: no crash record
        getattr(libc, "raise")(11)
    return _original_signature(function, *args, **kwargs)


class Hangs:
    def __init__(self, context):
        inspect.signature = _signature

    def predict(self, inputs):
        return {"done": [True]}
'''

# Ends its process through the kernel's exit_group, past os._exit's guard, from a thread it
# starts, a moment after each load (R4 of docs/HARDENING.md).
EXITING_THREAD_INIT = starting_a_thread('''
import ctypes
import platform
import threading
import time

EXIT_GROUP = {"x86_64": 231, "aarch64": 94}[platform.machine()]


def exit_later():
    time.sleep(0.3)
    ctypes.CDLL(None).syscall(EXIT_GROUP, 0)''', "exit_later")

# Writes to descriptors 1 and 2 as it loads, past sys.stdout and sys.stderr.
WRITING_INIT = '''
import os


class Hangs:
    def __init__(self, context):
        os.write(1, b"init wrote to 1\\n")
        os.write(2, b"init wrote to 2\\n")

    def predict(self, inputs):
        return {"done": [True]}
'''

# Replaces its process with another program as it loads.
EXEC_INIT = '''
import os


class Hangs:
    def __init__(self, context):
        os.execv("/bin/true", ["true"])

    def predict(self, inputs):
        return {"done": [True]}
'''

# Ends its own process with no crash record, as the kernel's OOM killer would: the crash
# recorder's handler put back to the default, then a SIGSEGV. (A POSIX timer set to SIGKILL did
# this once; the filter refuses such timers since.)
KILLED_INIT = '''
import ctypes
import time


class Hangs:
    def __init__(self, context):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal(11, None)  # SIGSEGV, SIG_DFL
        libc.raise_ = getattr(libc, "raise")
        libc.raise_(11)
        time.sleep(5)

    def predict(self, inputs):
        return {"done": [True]}
'''

SLOW_INIT = '''
import time


class Hangs:
    def __init__(self, context):
        time.sleep(1.0)

    def predict(self, inputs):
        return {"done": [True]}
'''

# Its predict gets stuck in C past its deadline, after leaving a mark: the copy is replaced, and
# reloading the model into the fresh copy runs an __init__ that, seeing the mark, never returns
# (`hang`: Python that an interrupt ends, or C code that it does not reach).
PYTHON_HANG = """while True:
                pass"""
C_HANG = "ctypes.CDLL('libc.so.6').sleep(30)"
HANGS_ON_RELOAD = '''
import ctypes
import os

MARK = {mark!r}


class Hangs:
    def __init__(self, context):
        if os.path.exists(MARK):
            {hang}

    def predict(self, inputs):
        open(MARK, "w").close()
        ctypes.CDLL("libc.so.6").sleep(3)
        return {{"done": [True]}}
'''


STUCK_IN_C_INIT = '''
import ctypes


class Hangs:
    def __init__(self, context):
        ctypes.CDLL("libc.so.6").sleep(30)  # C code, which no interrupt reaches

    def predict(self, inputs):
        return {"done": [True]}
'''


# Writes "ready" to every pipe it can write to (the report pipe among them), then is killed as
# KILLED_INIT is.
FORGES_READY_THEN_KILLED = KILLED_INIT.replace("""        libc = ctypes.CDLL(None, use_errno=True)
""", """        import os
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                    os.write(int(name), b"ready\\n")
            except OSError:
                pass  # a read end
        libc = ctypes.CDLL(None, use_errno=True)
""")


# Names another model as the one loading, on every pipe and through the call the server's own
# reports take, then dies with no record, as FORGES_READY_THEN_KILLED does.
FORGES_LOADING_THEN_KILLED = KILLED_INIT.replace("""        libc = ctypes.CDLL(None, use_errno=True)
""", """        import os
        forged = b"loading model=echo:1\\n"
        for name in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{name}").startswith("pipe:"):
                    os.write(int(name), forged)
            except OSError:
                pass  # a read end
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(4000, forged, len(forged))
""")


# Marks its first load with its process's pid in the file MARK, and sleeps there; any later
# load is quick.
MARKS_A_SLOW_FIRST_LOAD = '''
import os
import time

MARK = {mark!r}


class Hangs:
    def __init__(self, context):
        if not os.path.exists(MARK):
            with open(MARK + ".tmp", "w") as file:
                file.write(str(os.getpid()))
            os.rename(MARK + ".tmp", MARK)
            time.sleep(3)

    def predict(self, inputs):
        return {{"done": [True]}}
'''


def freeze(test: unittest.TestCase, pid: int) -> list:
    """Stops every thread of process `pid` as a tracer would (nothing but its death frees it),
    skipping `test` where the kernel lets no process trace its descendants; the threads'
    ids."""
    libc = ctypes.CDLL(None, use_errno=True)
    threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    for tid in threads:
        if libc.ptrace(0x4206, tid, 0, 0) != 0:  # PTRACE_SEIZE
            test.skipTest("this kernel does not let a process trace its descendants "
                          f"(kernel.yama.ptrace_scope): {os.strerror(ctypes.get_errno())}")
        libc.ptrace(0x4207, tid, 0, 0)  # PTRACE_INTERRUPT: a tracing stop
    return threads


def let_frozen_die(threads: list, timeout: float) -> None:
    """Waits for the threads `freeze` stopped to be killed. As their tracer, the freezing thread
    hears of their death first, and must let it go on to their parent."""
    deadline = time.time() + timeout
    while threads and time.time() < deadline:
        for tid in list(threads):
            try:
                done, status = os.waitpid(tid, os.WNOHANG | 0x40000000)  # __WALL
                if done and (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
                    threads.remove(tid)
            except ChildProcessError:
                threads.remove(tid)
        time.sleep(0.05)


def index(server) -> dict:
    _, _, body = curl("-X", "POST",
                      f"http://127.0.0.1:{server.management_port}/v2/repository/index")
    return {entry["name"]: entry for entry in json.loads(body)}


def serving_count(server) -> int:
    """How many times a serving process has said it serves."""
    return len(re.findall(r" serving .* pid=", server.log_text()))


def status_of(url: str) -> int:
    return curl(url)[0]


def listen_backlog(port: int) -> int:
    """The backlog of the socket listening on `port` (ss's Send-Q for a listener)."""
    listing = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                             text=True, check=True).stdout.split()
    return int(listing[2])


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


class FaultsTest(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-native-faults-test-")
        self.repository = pack_repository(self.root)

    def tearDown(self):
        shutil.rmtree(self.root)

    @contextlib.contextmanager
    def hostile_server(self, stop_message=None, config=None):
        """A server with one copy and the test models, hostile among them; it must stop with
        status 0."""
        pack_model(self.repository, "hostile")
        server = Server(self.repository, config or {}, copies=1)
        try:
            yield server
        finally:
            self.assertEqual(server.stop(), 0, stop_message)

    def place_package(self, name: str, code: str) -> None:
        """Puts a package of `code` (entry Hangs) in the repository as version 1 of `name`,
        as a deploy would have left it: there at the next start."""
        target = os.path.join(self.repository, name, "1")
        os.makedirs(target)
        shutil.copy(pack_variant(self.root, name, code), os.path.join(target, "model.orochi"))

    def hostile(self, server, mode):
        return post_json(server, "/v2/models/hostile/infer", {"inputs": [
            {"name": "mode", "datatype": "BYTES", "shape": [1], "data": [mode]}]})

    def assert_answered_in_place(self, server, mode: str, status: int, says: bytes = b"") -> None:
        """The hostile model's `mode` answers `status` with a body that says `says`, and a
        moment later the serving process is still the one that answered."""
        first = server.serving_pid
        answered, _, body = self.hostile(server, mode)
        self.assertEqual(answered, status, body)
        self.assertIn(says, body)
        time.sleep(0.3)
        self.assertEqual(server.serving_pid, first)

    def serve_to_the_end(self, config: dict) -> subprocess.CompletedProcess:
        """`orochi serve` of the test repository with `config`, for a start expected to fail:
        its status and output once it has ended."""
        path = os.path.join(self.root, "config.json")
        with open(path, "w") as file:
            json.dump(config, file)
        return subprocess.run(
            [BINARY, "serve", "--config", path, "--model-repository", self.repository,
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
             "--management-port", "0", "--copies", "1", "--bind", "127.0.0.1"],
            capture_output=True, text=True, timeout=120, check=False)

    def assert_echo_serves(self, server, within_s: int = 60):
        status, _, body = curl("-X", "POST", "--max-time", str(within_s), server.url(
            "/v2/models/echo/infer"), data=json.dumps(echo_request()).encode())
        self.assertEqual(status, 200, body)


class StackOverflowTest(FaultsTest):

    def test_a_c_stack_overflow_in_predict_restarts_the_serving_process(self):
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, _ = post_json(server, "/v2/models/hostile/infer", {"inputs": [
                {"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["stack_overflow"]}]})
            self.assertEqual(status, 0, "the connection closed without an answer")
            server.wait_for_serving(2)
            self.assertNotEqual(server.serving_pid, first)
            # Recorded from the alternate signal stack: the model, its copy and the signal.
            self.assertRegex(server.log_text(), r"the serving process died; restarting it "
                                                r"signal=SIGSEGV model=hostile:1 copy=0 "
                                                r"activity=predict .*restarts=1")
            self.assertIn('orochi_model_crashes_total{model="hostile"} 1', metrics_text(server))
            self.assert_echo_serves(server)
            status, _, body = post_json(server, "/v2/models/slow/infer", slow_request("sleep"))
            self.assertEqual(status, 200, body)


class TrapTest(FaultsTest):

    def test_a_sigtrap_in_predict_is_recorded_against_its_model(self):
        # SIGTRAP, which the crash recorder once did not handle, named no model: a crash loop
        # of it was never quarantined.
        with self.hostile_server() as server:
            status, _, _ = self.hostile(server, "trap")
            self.assertEqual(status, 0, "the connection closed without an answer")
            server.wait_for_serving(2)
            self.assertRegex(server.log_text(), r"the serving process died; restarting it "
                                                r"signal=SIGTRAP model=hostile:1 copy=0 "
                                                r"activity=predict ")
            self.assert_echo_serves(server)


class CrashLoopAfterServingTest(FaultsTest):

    def test_a_process_that_served_is_restarted_at_once_however_often_it_dies(self):
        # Deaths soon after the start once backed off to 5 s between restarts, even for a
        # process that had served: a client repeating a crashing request (or a model thread
        # crashing a second after each load) kept the server down most of the time. (Ten
        # deaths naming no model would begin the search for a model behind them, which holds
        # models back: CulpritSearchTest.)
        with self.hostile_server(config={"supervisor": {"max_model_crashes": 100}}) as server:
            for death in range(1, 11):  # the backoff reached 5 s by the ninth
                killed = time.time()
                os.kill(server.serving_pid, signal.SIGKILL)
                server.wait_for_serving(death + 1)
                back = time.time() - killed
                self.assertLess(back, 4, f"death {death}: serving again after {back:.2f} s")
            self.assert_echo_serves(server)


class CrashDuringLoadTest(FaultsTest):

    def assert_served_by_a_new_server(self, name: str, config: dict):
        """A new supervisor on the repository loads `name`, and quarantines nothing."""
        server = Server(self.repository, config, copies=1)
        try:
            self.assertEqual(index(server)[name]["state"], "READY")
            self.assertNotIn("quarantined", server.log_text())
        finally:
            self.assertEqual(server.stop(), 0)

    def test_an_upload_whose_init_crashes_is_recorded_and_not_kept(self):
        package = pack_variant(self.root, "crashinit", CRASHING_INIT)
        server = Server(self.repository, {}, copies=1)
        try:
            status, _, _ = curl("-T", package, f"http://127.0.0.1:{server.management_port}"
                                "/v2/repository/models/crashinit/versions/1")
            # Only curl's 100 Continue came before the connection closed.
            self.assertIn(status, (0, 100), "the connection closed without an answer")
            server.wait_for_serving(2)
            self.assertRegex(server.log_text(), r"the serving process died; restarting it "
                                                r"signal=SIGSEGV model=crashinit:1 copy=0 "
                                                r"activity=load ")
            self.assertIn('orochi_model_crashes_total{model="crashinit"} 1', metrics_text(server))
            # Loaded before it is published: the package never reached the repository, so the
            # next serving process does not load it again.
            self.assertFalse(os.path.exists(os.path.join(self.repository, "crashinit")))
            self.assertNotIn("crashinit", index(server))
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_package_that_crashes_at_start_is_quarantined_and_not_loaded_again(self):
        self.place_package("crashinit", CRASHING_INIT)
        # Waits for `serving`: from the third serving process, which does not load it.
        server = Server(self.repository, {"supervisor": {"max_model_crashes": 2}}, copies=1)
        try:
            log = server.log_text()
            self.assertEqual(len(re.findall(r"the serving process died; restarting it "
                                            r"signal=SIGSEGV model=crashinit:1 copy=0 "
                                            r"activity=load ", log)), 2, log)
            self.assertIn("model quarantined", log)
            states = index(server)
            self.assertEqual(states["crashinit"]["state"], "UNAVAILABLE")
            self.assertIn("quarantined: model crashinit:1 crashed the server 2 times",
                          states["crashinit"]["reason"])
            self.assertEqual(states["echo"]["state"], "READY")
            # Its clients are told why, not only that it is not loaded.
            status, _, body = post_json(server, "/v2/models/crashinit/infer",
                                        slow_request("sleep"))
            self.assertEqual(status, 404, body)
            self.assertIn("model 'crashinit' is not loaded: quarantined: model crashinit:1 "
                          "crashed the server 2 times", json.loads(body)["error"])
            self.assert_echo_serves(server)
            self.assertEqual(status_of(server.url("/v2/health/ready")), 200)
            # Another crash (of anything) restarts the serving process once: the quarantined
            # package stays out, so it does not crash the next one.
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2)
            self.assert_echo_serves(server)
            self.assertEqual(server.log_text().count("the serving process died"), 3)
            self.assertEqual(index(server)["crashinit"]["state"], "UNAVAILABLE")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_quarantine_outlives_its_supervisor_until_the_package_changes(self):
        # A quarantine lived in the supervisor's memory: each new supervisor (a container
        # restarted) met the crashing package max_model_crashes times again.
        self.place_package("crashinit", CRASHING_INIT)
        config = {"supervisor": {"max_model_crashes": 2}}
        server = Server(self.repository, config, copies=1)
        try:
            self.assertEqual(index(server)["crashinit"]["state"], "UNAVAILABLE")
        finally:
            self.assertEqual(server.stop(), 0)
        server = Server(self.repository, config, copies=1)
        try:
            log = server.log_text()
            self.assertNotIn("the serving process died", log)
            self.assertRegex(log, r"model quarantined at an earlier start; not loading it "
                                  r"model=crashinit:1 reason=\"quarantined: model crashinit:1 "
                                  r"crashed the server 2 times")
            states = index(server)
            self.assertEqual(states["crashinit"]["state"], "UNAVAILABLE")
            self.assertIn("crashed the server 2 times", states["crashinit"]["reason"])
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)
        # Another package in its place is another model: it is loaded.
        shutil.rmtree(os.path.join(self.repository, "crashinit"))
        self.place_package("crashinit", SLOW_INIT)
        self.assert_served_by_a_new_server("crashinit", config)

    def test_an_explicit_load_lifts_a_quarantine_for_later_starts_too(self):
        mark = os.path.join(self.root, "crash")
        open(mark, "w").close()
        self.place_package("mended", CRASHES_WHILE_MARKED.format(mark=mark))
        config = {"supervisor": {"max_model_crashes": 2}}
        server = Server(self.repository, config, copies=1)
        try:
            self.assertEqual(index(server)["mended"]["state"], "UNAVAILABLE")
            os.remove(mark)
            status, _, body = curl("-X", "POST", f"http://127.0.0.1:{server.management_port}"
                                   "/v2/repository/models/mended/load")
            self.assertEqual(status, 200, body)
            self.assertEqual(index(server)["mended"]["state"], "READY")
            self.assertIn("quarantine lifted: loaded explicitly model=mended:1", server.log_text())
            # A crash now restarts the serving process with the version loaded again.
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2)  # the first serving process to serve was the third
            self.assertEqual(index(server)["mended"]["state"], "READY")
        finally:
            self.assertEqual(server.stop(), 0)
        # So does the next supervisor.
        self.assert_served_by_a_new_server("mended", config)

    def assert_quarantined_for_deaths_at_start(self, name: str, code: str) -> Server:
        """Starts a server with a package `name` of `code` in the repository, whose load kills
        the serving process with no record, and checks that the deaths were put on its load,
        that it was tried both ways (CulpritSearchTest) and quarantined, and that echo serves.
        The caller stops the server."""
        self.place_package(name, code)
        server = Server(self.repository, {"supervisor": {"max_model_crashes": 2}}, copies=1)
        try:
            server.wait_for_log(f"model quarantined model={name}:1", timeout=90)
            server.wait_for_serving(serving_count(server) + 1)
            log = server.log_text()
            # Two deaths, then one more with it loaded again after a start without it.
            self.assertEqual(len(re.findall(rf"the serving process died; restarting it "
                                            rf"signal=SIGSEGV model={name}:1 activity=load "
                                            r"record=\"none: the load in flight at the start\"",
                                            log)), 3, log)
            self.assertIn(f"holding back {name}:1 alone", log)
            states = index(server)
            self.assertEqual(states[name]["state"], "UNAVAILABLE")
            self.assertIn(f"quarantined: model {name}:1 was tried both ways",
                          states[name]["reason"])
            self.assert_echo_serves(server)
        except BaseException:
            server.stop()
            raise
        return server

    def test_a_package_killed_at_start_without_a_record_is_quarantined(self):
        # A SIGKILL (the OOM killer's) leaves no crash record, nor does a SIGSEGV whose handler
        # model code put back to the default: such a package once killed every start, forever,
        # with restarts backing off to seconds, and no model to quarantine.
        server = self.assert_quarantined_for_deaths_at_start("killedinit", KILLED_INIT)
        try:
            # Once serving, a death without a record blames nobody: no load is in flight.
            before = serving_count(server)
            os.kill(server.serving_pid, signal.SIGKILL)
            server.wait_for_serving(before + 1)
            self.assertIn("the serving process died; restarting it signal=SIGKILL restarts=4",
                          server.log_text())
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_forged_ready_line_does_not_make_a_death_at_start_one_after_serving(self):
        # Model code can write to the report pipe. A "ready" line written there in an
        # __init__, then a death with no record, once made every start's death one after
        # serving: put on no load, restarted at once, for good, and nothing ever served. A
        # process serves once its ports answer the supervisor's probe.
        server = self.assert_quarantined_for_deaths_at_start("forgesready",
                                                             FORGES_READY_THEN_KILLED)
        self.assertEqual(server.stop(), 0)


    def test_a_forged_loading_line_does_not_put_a_death_on_another_model(self):
        # A "loading" line naming an innocent model, written to the report pipe before a death
        # with no record at each start, once had every death put on the innocent one, which was
        # quarantined, and then nothing served, for good. Loads are told through the filter's
        # listener now, from the serving process's first thread alone.
        server = self.assert_quarantined_for_deaths_at_start("forgesloading",
                                                             FORGES_LOADING_THEN_KILLED)
        try:
            log = server.log_text()
            self.assertNotIn("model=echo:1 activity=load", log)
            self.assertIn("model code tried to report to the supervisor as the server; refused",
                          log)
            self.assertEqual(index(server)["echo"]["state"], "READY")
        finally:
            self.assertEqual(server.stop(), 0)


class ModelThreadCrashTest(FaultsTest):

    def test_a_crash_in_a_thread_a_model_started_is_recorded_against_it(self):
        # A thread started by model code ran no call of the model's, so its crash once named no
        # model: a package crashing the server a moment after each start was never quarantined.
        self.place_package("threadcrash", CRASHING_THREAD_INIT)
        pack_model(self.repository, "hostile")
        server = Server(self.repository, {"supervisor": {"max_model_crashes": 2}}, copies=1)
        try:
            server.wait_for_serving(3)
            log = server.log_text()
            self.assertEqual(len(re.findall(r"the serving process died; restarting it "
                                            r"signal=SIGSEGV model=threadcrash:1 copy=0 "
                                            r"activity=thread:load ", log)), 2, log)
            self.assertEqual(index(server)["threadcrash"]["state"], "UNAVAILABLE")
            self.assert_echo_serves(server)
            # A thread a predict starts is its model's too.
            self.assertEqual(self.hostile(server, "thread_segfault")[0], 200)
            server.wait_for_serving(4)
            self.assertRegex(server.log_text(), r"the serving process died; restarting it "
                                                r"signal=SIGSEGV model=hostile:1 copy=0 "
                                                r"activity=thread:predict ")
        finally:
            self.assertEqual(server.stop(), 0)


class CulpritSearchTest(FaultsTest):

    def test_a_model_whose_deaths_name_none_is_found_by_holding_models_back(self):
        # A package whose deaths named no model (here a crash in a thread the server never
        # marked) was restarted at once, for good, and nothing was quarantined: every model
        # went down with it each time.
        self.place_package("stranger", UNMARKED_THREAD_CRASH_INIT)
        server = Server(self.repository, {}, copies=1)
        try:
            server.wait_for_log("the search for the model behind deaths naming none found "
                                "stranger:1", timeout=240)
            server.wait_for_serving(serving_count(server) + 1)
            log = server.log_text()
            # Its crashes said no model, and were recorded.
            self.assertRegex(log, r"the serving process died; restarting it signal=SIGSEGV "
                                  r"restarts=1")
            self.assertIn("times with no crash record naming a model; looking for the model "
                          "behind it", log)
            self.assertIn("holding back stranger:1 alone", log)
            self.assertIn("loading it again to see the deaths come back", log)
            self.assertNotIn("nothing found", log)
            states = index(server)
            self.assertEqual(states["stranger"]["state"], "UNAVAILABLE")
            self.assertIn("quarantined: model stranger:1 was tried both ways",
                          states["stranger"]["reason"])
            for innocent in ("echo", "slow", "extra_rows"):
                self.assertEqual(states[innocent]["state"], "READY", states[innocent])
            # The search holds nothing back any more, and the server stays up.
            serving = server.serving_pid
            time.sleep(3)
            self.assertEqual(server.serving_pid, serving)
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_two_models_whose_deaths_name_none_are_found_one_after_the_other(self):
        # Each search once ended with nothing found (the deaths went on with either held back),
        # and the next began three deaths later: a restart loop for good (F3 of the tenth run).
        self.place_package("stranger", UNMARKED_THREAD_CRASH_INIT)
        self.place_package("astranger", UNMARKED_THREAD_CRASH_INIT)
        server = Server(self.repository, {}, copies=1)
        try:
            for name in ("stranger", "astranger"):
                server.wait_for_log(f"model quarantined model={name}:1", timeout=240)
            server.wait_for_serving(serving_count(server) + 1)
            log = server.log_text()
            self.assertIn("which is set aside", log)
            self.assertNotIn("nothing found", log)
            states = index(server)
            for name in ("stranger", "astranger"):
                self.assertIn(f"quarantined: model {name}:1 was tried both ways",
                              states[name]["reason"])
            for innocent in ("echo", "slow", "extra_rows"):
                self.assertEqual(states[innocent]["state"], "READY", states[innocent])
            serving = server.serving_pid
            time.sleep(3)
            self.assertEqual(server.serving_pid, serving)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_deaths_at_an_innocents_load_find_the_model_loaded_before_that_caused_them(self):
        # A package loaded first damaged what every later load uses, and each start died with no
        # record at the next model's load: the innocent model was quarantined, then the next,
        # while the guilty one served alone.
        self.place_package("aardvark", DAMAGES_LATER_LOADS_INIT)
        server = Server(self.repository, {"supervisor": {"max_model_crashes": 2}}, copies=1)
        try:
            server.wait_for_log("model quarantined model=aardvark:1", timeout=120)
            server.wait_for_serving(serving_count(server) + 1)
            log = server.log_text()
            self.assertRegex(log, r"restarting it signal=SIGSEGV model=echo:1 activity=load "
                                  r"record=\"none: the load in flight at the start\"")
            self.assertIn("holding back echo:1 alone", log)
            self.assertIn("holding back aardvark:1 alone", log)
            self.assertEqual(log.count("model quarantined"), 1, log)
            states = index(server)
            self.assertIn("quarantined: model aardvark:1 was tried both ways",
                          states["aardvark"]["reason"])
            for innocent in ("echo", "slow", "extra_rows"):
                self.assertEqual(states[innocent]["state"], "READY", states[innocent])
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_deaths_that_stop_on_their_own_quarantine_nobody(self):
        # An operator's kill -9 three times names no model either: the search holds models back
        # in turn, finds that the deaths stopped, and ends with nothing quarantined.
        server = Server(self.repository, {}, copies=1)
        try:
            for death in range(1, 4):
                os.kill(server.serving_pid, signal.SIGKILL)
                server.wait_for_serving(death + 1)
            server.wait_for_log("the deaths stopped on their own", timeout=240)
            log = server.log_text()
            self.assertIn("ends with nothing found", log)
            self.assertNotIn("model quarantined", log)
            server.wait_for_serving(serving_count(server))
            states = index(server)
            for name in ("echo", "slow", "extra_rows"):
                self.assertEqual(states[name]["state"], "READY", states[name])
        finally:
            self.assertEqual(server.stop(), 0)


class ExitGroupTest(FaultsTest):
    """Model code cannot exit the serving process past os._exit's guard (exit_guard.h)."""

    def test_exit_group_from_model_code_is_refused(self):
        # A clean exit once restarted the serving process, named no model and quarantined
        # nothing: a thread that exited each start a moment after its load looped for ever.
        self.place_package("exiter", EXITING_THREAD_INIT)
        with self.hostile_server() as server:
            first = server.serving_pid
            time.sleep(1)  # well past the exiting thread's call
            self.assertEqual(server.serving_pid, first)
            self.assertEqual(index(server)["exiter"]["state"], "READY")
            for mode in ("exit_group", "thread_exit_group"):
                status, _, body = self.hostile(server, mode)
                self.assertEqual(status, 200, body)
                self.assertEqual(json.loads(body)["outputs"][0]["data"], [errno.EPERM], mode)
            self.assertEqual(server.serving_pid, first)
            log = server.log_text()
            self.assertNotIn("restarting it", log)
            # Three refused, the first two logged: then the 4th, the 8th... (no flood).
            self.assertEqual(re.findall(r"model code tried to end or replace the serving "
                                        r"process; refused call=exit_group thread=\d+ .*"
                                        r"refused_so_far=(\d+)", log), ["1", "2"], log)
            self.assert_echo_serves(server)

    def test_the_serving_process_holds_no_listener_of_its_filter(self):
        # It once held the listener its warden thread read: model code answered its own
        # exit_group with "go on", and the process exited cleanly, naming no model.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "count_exit_listeners")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [0])
            # ...while the filter is there: exit_group is still refused.
            status, _, body = self.hostile(server, "exit_group")
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [errno.EPERM])

    def test_an_exec_at_a_first_start_fails_that_start_and_says_why(self):
        # An exec in __init__ made a clean exit of the serving process, which ended the
        # supervisor with status 0 and not a word; one of a program that waits hung the start.
        self.place_package("execinit", EXEC_INIT)
        finished = self.serve_to_the_end({})
        self.assertEqual(finished.returncode, 1, finished.stderr)
        self.assertIn("orochi serve: loading model execinit:1 in interpreter copy 0: "
                      "PermissionError", finished.stderr)
        self.assertIn("refused call=execve", finished.stderr)

    def test_an_exec_from_model_code_is_refused(self):
        # An exec replaced the serving process: /bin/true made a clean exit, and a program of
        # the model's own, given the listeners, answered every port as the server.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "exec", 500, b"PermissionError")
            self.assertRegex(server.log_text(), r"model code tried to end or replace the serving "
                                                r"process; refused call=execve thread=\d+")
            self.assertNotIn("restarting it", server.log_text())
            self.assert_echo_serves(server)

    def test_a_worker_thread_ended_by_model_code_costs_its_request_and_its_copy(self):
        # The kernel's exit of one thread (what glibc's _exit falls back to once exit_group is
        # refused) takes a copy's worker from under it: that request gets its deadline, the copy
        # is replaced, and nothing else is lost.
        # The lost thread never leaves its copy: the stop waits out a short grace for it.
        config = {"models": {"default_timeout_ms": 2000, "execution_grace_ms": 300},
                  "http": {"shutdown_grace_s": 1}}
        with self.hostile_server(config=config) as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "exit_thread")
            self.assertEqual(status, 504, body)
            self.assert_echo_serves(server, within_s=10)
            self.assertEqual(server.serving_pid, first)
            server.wait_for_log("interpreter copy replaced")

    def test_the_c_librarys_exit_parks_its_thread_and_runs_no_exit_handler(self):
        # glibc's exit() ran the process's exit handlers and static destructors before its
        # exit_group was refused: every request then answered 500, while health said ready.
        # Reached through libc's own handle, glibc's definition did the same: its entry jumps
        # to the executable's exit in the serving process.
        with self.hostile_server() as server:
            for mode in ("c_exit", "glibc_exit"):
                self.assert_answered_in_place(server, mode, 200)
                for _ in range(3):
                    self.assert_echo_serves(server, within_s=10)
                self.assert_answered_in_place(server, "nothing", 200)
            self.assertIn("model code called the C library's exit(), which would run the "
                          "server's exit handlers; its thread is parked for good instead status=0",
                          server.log_text())
            self.assertNotIn("glibc's own exit() stays reachable", server.log_text())

    def test_what_model_code_starts_exits_as_it_would_anywhere(self):
        # A fork, a program, and a program that exits with a thread still running: each
        # exit_group goes to the warden, which lets through those of other processes.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "child_exits")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [3, 4, 5])
            self.assertNotIn("refused", server.log_text())


class StartOutputTest(FaultsTest):
    """What the serving process writes to descriptors 1 and 2 goes through the supervisor's
    pipes from before the first load (R9 of docs/HARDENING.md)."""

    def test_writes_of_an_init_at_start_are_logged_as_process_output(self):
        # They once went straight to the supervisor's own output, unbounded and unlabelled.
        self.place_package("writer", WRITING_INIT)
        server = Server(self.repository, {}, copies=1)
        try:
            server.wait_for_serving(1)
            log = server.log_text()
            self.assertIn('process output stream=stdout line="init wrote to 1"', log)
            self.assertIn('process output stream=stderr line="init wrote to 2"', log)
            self.assertNotRegex(log, r"(?m)^init wrote to")
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_descriptor_the_launcher_left_open_stays_with_the_supervisor(self):
        # Model code once wrote to what the program starting the server had left open (a
        # shell's `251>file`): the serving process inherited it.
        leaked = os.open(os.path.join(self.root, "launcher.txt"), os.O_WRONLY | os.O_CREAT)
        os.dup2(leaked, 251)
        try:
            server = Server(self.repository, {}, copies=1, pass_fds=(251,))
        finally:
            os.close(leaked)
            os.close(251)
        try:
            self.assertTrue(os.path.exists(f"/proc/{server.process.pid}/fd/251"))
            self.assertFalse(os.path.exists(f"/proc/{server.serving_pid}/fd/251"))
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_start_that_fails_still_says_why_on_stderr(self):
        finished = self.serve_to_the_end(
            {"management": {"token_file": os.path.join(self.root, "absent")}})
        self.assertEqual(finished.returncode, 1, finished.stderr)
        self.assertIn("\norochi serve: cannot read the management token file "
                      f"{self.root}/absent\n", "\n" + finished.stderr)


class SlowLoadReadinessTest(FaultsTest):

    def test_readiness_tells_the_truth_while_an_init_runs(self):
        package = pack_variant(self.root, "slowinit", SLOW_INIT)
        server = Server(self.repository, {}, copies=2)
        try:
            began = time.time()
            deploying, upload = start_upload(server, package, "slowinit")
            seen = {"server": set(), "echo": set()}
            loading = []  # (seconds since the upload began, the loading model's ready status)
            while deploying.is_alive():
                seen["server"].add(status_of(server.url("/v2/health/ready")))
                seen["echo"].add(status_of(server.url("/v2/models/echo/ready")))
                loading.append((time.time() - began,
                                status_of(server.url("/v2/models/slowinit/ready"))))
                self.assert_echo_serves(server)
            deploying.join()
            self.assertEqual(upload["answer"][0], 200, upload["answer"][2])
            # The server and its other models are ready throughout; the loading one is not
            # until its __init__ returned in both copies (1 s each, one at a time), and ready
            # from then on.
            self.assertEqual(seen["server"], {200}, seen)
            self.assertEqual(seen["echo"], {200}, seen)
            statuses = [status for _, status in loading]
            self.assertEqual(statuses[0], 404, loading)
            first_ready = statuses.index(200) if 200 in statuses else len(statuses)
            self.assertEqual(set(statuses[:first_ready]), {404}, loading)
            self.assertEqual(set(statuses[first_ready:]), {200} if first_ready < len(statuses)
                             else set(), loading)
            if first_ready < len(statuses):
                self.assertGreater(loading[first_ready][0], 1.9, loading)
            self.assertEqual(status_of(server.url("/v2/models/slowinit/ready")), 200)
        finally:
            self.assertEqual(server.stop(), 0)


class StoppedProcessTest(FaultsTest):

    def test_a_stopped_serving_process_is_continued(self):
        # Once, SIGSTOP from model code froze the server for good: ports open, nothing answered.
        # Model code can no longer send it (refused like any signal to its own process); from
        # outside, the supervisor continues the process.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "stop_process")
            self.assertEqual(status, 500, body)
            self.assertIn(b"PermissionError", body)
            os.kill(server.serving_pid, signal.SIGSTOP)
            # The supervisor's line may reach the log file after the answer reached us.
            deadline = time.time() + 5
            while "continuing it" not in server.log_text() and time.time() < deadline:
                time.sleep(0.05)
            self.assertIn("the serving process was stopped; continuing it signal=SIGSTOP",
                          server.log_text())
            self.assert_echo_serves(server, within_s=5)


class StopSignalFromModelCodeTest(FaultsTest):
    """A model cannot decide when the server stops: SIGTERM to its own process costs a restart,
    and no signal of its code reaches the supervisor (supervisor_shield.h)."""

    def test_a_sigterm_to_its_own_process_is_refused(self):
        # Once it drained the serving process, which the supervisor restarted (a clean exit
        # nobody asked for): a restart that names no model, so a loop of them was never
        # quarantined, and its quick restarts backed off to seconds.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "terminate_self", 500,
                                          b"PermissionError: [Errno 1] Operation not permitted")
            self.assertNotIn("shutting down", server.log_text())
            self.assert_echo_serves(server)

    def test_an_audit_hook_is_refused(self):
        # A model's audit hook runs inside the other models' code: one that killed the process
        # at another model's load once had every innocent model quarantined in turn.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "audit_hook", 500,
                                          b"PermissionError: sys.addaudithook: an audit hook "
                                          b"would run inside every other model's code")
            self.assert_echo_serves(server)

    def test_glibcs_own_signals_to_its_own_threads_are_refused(self):
        # glibc installs the handlers of 32 and 33 on first use: before it, either one ended
        # the process with no crash record, a restart loop that named no model.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "glibc_signals", 500,
                                          b"PermissionError: [Errno 1] Operation not permitted")
            self.assert_echo_serves(server)

    def test_timers_set_by_model_code_end_nothing(self):
        # Their signals (SIGALRM, SIGPROF, SIGVTALRM) once ended the process, naming no model.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "set_timers", 200)
            self.assertNotIn("restarting it", server.log_text())
            self.assert_echo_serves(server)

    def test_fault_signals_sent_to_the_servers_own_threads_are_ignored(self):
        # A SIGSEGV that model code sent (tgkill) to one of the server's threads, which runs no
        # model, once ended the process with a record that named no model: a restart loop (and
        # one sent to the thread that loads another model was put on that model). A fault
        # signal sent, not raised by a fault, from the process or one it started, faulted
        # nothing where it went: it is ignored, even on the sender's own thread.
        with self.hostile_server() as server:
            self.assert_answered_in_place(server, "raise_fault", 200)
            for mode in ("signal_server_threads", "signal_server_threads_from_a_child"):
                first = server.serving_pid
                status, _, body = self.hostile(server, mode)
                self.assertEqual(status, 200, body)
                self.assertGreater(json.loads(body)["outputs"][0]["data"][0], 30)
                time.sleep(0.5)
                self.assertEqual(server.serving_pid, first, mode)
                self.assertNotIn("restarting it", server.log_text())
                self.assert_echo_serves(server)
            # From outside the server, the signal still ends the process, recorded.
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2)
            self.assertIn("the serving process died; restarting it signal=SIGSEGV",
                          server.log_text())

    def test_signal_timers_are_refused(self):
        # A POSIX timer asked for SIGKILL, set after each load, once made a restart loop that
        # named no model: no kill-like call shows the filter that signal. So are refused a
        # timer and a message queue's notification that name their signal; a timer with the
        # default one (SIGALRM, ignored) is still allowed.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "signal_timers")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [1, 1, 0])
            self.assertNotIn("restarting it", server.log_text())
            self.assert_echo_serves(server)

    def test_a_sigterm_to_the_supervisor_is_refused(self):
        # Once it reached the supervisor, which stopped the server; then the supervisor ignored
        # it by its sender. Now the call itself fails, and the model's error says so.
        with self.hostile_server(stop_message="SIGTERM from outside still stops it") as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "terminate_supervisor")
            self.assertEqual(status, 500, body)
            self.assertIn(b"PermissionError: [Errno 1] Operation not permitted", body)
            time.sleep(0.5)
            self.assertIsNone(server.process.poll(), "the server stopped")
            self.assertEqual(server.serving_pid, first)
            self.assert_echo_serves(server)

    def test_no_call_of_model_code_reaches_the_supervisor(self):
        # Once, os.kill(os.getppid(), signal.SIGKILL) ended the server past any restart.
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "signal_supervisor")
            self.assertEqual(status, 200, body)
            refused = dict(zip(["kill(supervisor, 0)", "kill(-1, 0)", "killpg(its group, 0)",
                                "pidfd_open(supervisor)", "prlimit(supervisor)",
                                "sh -c 'kill -0 supervisor'", "clone(CLONE_PARENT)",
                                "F_SETOWN(supervisor)", "setpriority(supervisor)",
                                "sched_setaffinity(supervisor)",
                                "kill(supervisor, SIGKILL)", "kill(itself, 0)", "kill(0, 0)",
                                "pthread_kill(its thread, SIGTERM)",
                                "setrlimit(RLIMIT_CPU)", "kill(0, SIGKILL)",
                                "kill(itself, SIGKILL)"],
                               json.loads(body)["outputs"][0]["data"]))
            self.assertEqual(refused, {
                "kill(supervisor, 0)": 1, "kill(-1, 0)": 1, "killpg(its group, 0)": 1,
                "pidfd_open(supervisor)": 1, "prlimit(supervisor)": 1,
                "sh -c 'kill -0 supervisor'": 1, "clone(CLONE_PARENT)": 1,
                "F_SETOWN(supervisor)": 1, "setpriority(supervisor)": 1,
                "sched_setaffinity(supervisor)": 1,
                "kill(supervisor, SIGKILL)": 1,
                "kill(itself, 0)": 0, "kill(0, 0)": 0, "pthread_kill(its thread, SIGTERM)": 1,
                "setrlimit(RLIMIT_CPU)": 1, "kill(0, SIGKILL)": 1, "kill(itself, SIGKILL)": 1})
            self.assertIsNone(server.process.poll(), "the supervisor died")
            self.assertEqual(server.serving_pid, first)
            self.assertEqual(child_pids(server.process.pid), [first], "a stray child")
            self.assert_echo_serves(server)

    def test_a_forged_crash_record_blames_nobody(self):
        # The record is trusted only when it names the signal its process died of, and a
        # SIGKILL leaves none: the forged line naming echo was once counted against echo.
        # (Model code can no longer SIGKILL its own process; the test does it from outside.)
        # A forged stuck_load line once got echo quarantined at the restart: one counts only
        # while the process starts, after models.load_timeout_s.
        with self.hostile_server() as server:
            first = server.serving_pid
            self.hostile(server, "forge_crash_record")
            os.kill(first, signal.SIGKILL)  # as the OOM killer would: no handler sees it
            server.wait_for_serving(2)
            self.assertNotEqual(server.serving_pid, first)
            self.assertIn("the serving process died; restarting it signal=SIGKILL restarts=1",
                          server.log_text())
            self.assertIn('orochi_model_crashes_total{model="echo"} 0\n', metrics_text(server))
            self.assertNotIn("model quarantined", server.log_text())
            self.assert_echo_serves(server)

    def test_a_daemon_that_left_the_group_ends_with_its_serving_process(self):
        # Out of the serving process's group, such a daemon outlived it (and could hunt each
        # new serving process, or take every process slot); now it is the supervisor's to end.
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "escape_group")
            self.assertEqual(status, 200, body)
            daemon = daemon_pid("61.234")
            self.assertIsNotNone(daemon, "the daemon did not start")
            os.kill(first, signal.SIGKILL)
            server.wait_for_serving(2)
            deadline = time.time() + 5
            while os.path.exists(f"/proc/{daemon}") and time.time() < deadline:
                time.sleep(0.05)
            self.assertFalse(os.path.exists(f"/proc/{daemon}"), "the daemon outlived it")
            self.assert_echo_serves(server)


def daemon_pid(argument: str):
    """The pid of the `sleep argument` process, if one runs."""
    deadline = time.time() + 5
    while time.time() < deadline:
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    if file.read().split(b"\0")[:2] == [b"sleep", argument.encode()]:
                        return int(entry)
            except (OSError, ValueError):
                continue
        time.sleep(0.05)
    return None


class ListenerShutdownTest(FaultsTest):

    def test_a_listener_cannot_be_shut_down_closed_copied_or_replaced_by_its_number(self):
        # A listener shut down (or closed) at each load made the serving process exit to have
        # it bound again, a restart loop that named no model. By their numbers, the calls that
        # would shut one down, close it, copy it or put another file in its place are refused.
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "touch_listeners")
            self.assertEqual(status, 200, body)
            # Four listeners, eight ways each.
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [32.0])
            log = server.log_text()
            # Logged at the 1st, 2nd, 4th... refusal (os.dup is fcntl's F_DUPFD_CLOEXEC).
            for call in ("shutdown", "close", "fcntl"):
                self.assertRegex(log, r"model code tried to shut down, close, copy or replace a "
                                      r"descriptor the server keeps \(a listener, a copy's "
                                      rf"archive\); refused call={call} ")
            self.assertIn("refused_so_far=16", log)
            time.sleep(1.5)  # a round of the listeners' upkeep
            self.assertEqual(server.serving_pid, first)
            self.assertNotIn("bound again", server.log_text())
            self.assert_echo_serves(server, within_s=5)

    def test_the_archives_copies_start_from_cannot_be_replaced(self):
        # /dev/null put in their place once left no copy able to start: every inference hung
        # while health said ready.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "replace_archives")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [2.0])  # stdlib, package
            self.assert_echo_serves(server)

    def test_listeners_shut_down_by_model_code_are_bound_again(self):
        # The listening sockets are the supervisor's too: shut down from model code, they once
        # stopped listening for good (through every restart), and gRPC's accept loop spun. By
        # their numbers they no longer can be; through copies the process passed itself over a
        # socket, they still can.
        import grpc
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "shutdown_listeners")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [4.0])
            server.wait_for_serving(2)
            self.assertNotEqual(server.serving_pid, first)
            log = server.log_text()
            self.assertIn("a listening socket was shut down or shared (SO_REUSEPORT) by model "
                          "code", log)
            self.assertIn("the serving process died; restarting it exit_code=75", log)
            for port in (server.port, server.metrics_port, server.management_port,
                         server.grpc_port):
                self.assertIn(f"a listening socket was shut down or shared; bound again "
                              f"port={port}", log)
            self.assert_echo_serves(server, within_s=5)
            self.assertIn("orochi_server_restarts_total 1", metrics_text(server))
            self.assertEqual(len(index(server)), 4)
            with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
                grpc.channel_ready_future(channel).result(timeout=5)

    def test_a_backlog_shrunk_by_model_code_is_given_back(self):
        # listen(fd, 0) on an inherited listener once stayed through every restart: a burst of
        # connections took one at a time, and the rest waited for SYN retries (a second each).
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "shrink_backlogs")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [4])
            with open("/proc/sys/net/core/somaxconn") as file:
                full = int(file.read())
            ports = [server.port, server.metrics_port, server.management_port, server.grpc_port]
            deadline = time.time() + 5
            while True:
                backlogs = {port: listen_backlog(port) for port in ports}
                if set(backlogs.values()) == {full} or time.time() > deadline:
                    break
                time.sleep(0.2)
            self.assertEqual(backlogs, {port: full for port in ports})
            self.assert_echo_serves(server)

    def test_listeners_made_blocking_by_model_code_are_made_non_blocking_again(self):
        # O_NONBLOCK lives on the file description the listeners share with model code: cleared,
        # accepts blocked the I/O threads, and every port stalled between two connections.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "clear_nonblocking")
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [4], body)
            time.sleep(1.5)  # a round of the listeners' upkeep
            status, _, body = self.hostile(server, "count_blocking")
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [0], body)
            for _ in range(3):
                self.assertEqual(status_of(server.url("/v2/health/ready")), 200)
            self.assert_echo_serves(server)

    def test_an_accept_never_waits_on_a_listener_made_blocking(self):
        # Asio tried an accept before waiting for a connection: on listeners made blocking, one
        # connection to each of two ports left both I/O threads waiting in accept, and every
        # port stalled (the listeners' upkeep too) until someone connected to those two again.
        pack_model(self.repository, "hostile")
        server = Server(self.repository, {"supervisor": {"liveness_timeout_s": 0},
                                          "http": {"io_threads": 2}}, copies=1)
        try:
            status, _, body = self.hostile(server, "clear_nonblocking")
            self.assertEqual(status, 200, body)
            for port in (server.port, server.management_port):
                socket.create_connection(("127.0.0.1", port)).close()
            status, _, _ = curl("--max-time", "5", f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertEqual(status, 200, "the metrics port stalled")
            self.assertEqual(status_of(server.url("/v2/health/ready")), 200)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_listener_options_changed_by_model_code_are_put_back(self):
        # The connections a listener accepts inherit its options: with SO_RCVLOWAT at 1 MiB no
        # request was ever read, with TCP_MAXSEG 88 and a pacing rate of 1 answers stalled, on
        # every port, through every restart, while the liveness probe still got its answers.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "deafen_listeners")
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [4], body)
            deadline = time.time() + 5
            while time.time() < deadline and "options were changed" not in server.log_text():
                time.sleep(0.1)
            self.assertRegex(server.log_text(), r"a listener's socket options were changed; put "
                                                r"back port=\d+ options=SO_RCVLOWAT,"
                                                r"SO_MAX_PACING_RATE,IP_TTL,TCP_MAXSEG")
            time.sleep(0.5)  # every listener's turn
            self.assert_echo_serves(server, within_s=5)
            status, _, metrics = curl("--max-time", "5",
                                      f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertEqual(status, 200)
            self.assertIn(b"orochi_server_restarts_total 0", metrics)

    def test_listener_options_that_cannot_be_put_back_get_fresh_listeners(self):
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "lock_listener_buffers")
            self.assertEqual(status, 200, body)
            server.wait_for_serving(2)
            self.assertIn("a listener's socket options were changed and cannot all be put back",
                          server.log_text())
            self.assertIn("a listener's socket options cannot be put back; killing the serving "
                          "process, to restart it on fresh listeners", server.log_text())
            self.assert_echo_serves(server, within_s=5)
            status, _, body = self.hostile(server, "count_blocking")  # the new listeners serve
            self.assertEqual(status, 200, body)

    def test_a_listener_shared_through_so_reuseport_is_replaced(self):
        # With SO_REUSEPORT on the inference listener, a daemon's socket on the port took part
        # of its connections, through every restart. Now the next accept notices.
        with self.hostile_server() as server:
            first = server.serving_pid
            status, _, body = self.hostile(server, "share_listener")
            self.assertEqual(status, 200, body)
            self.assert_echo_serves(server, within_s=5)  # a new connection: an accept
            server.wait_for_serving(2)
            self.assertNotEqual(server.serving_pid, first)
            self.assertIn(f"a listening socket was shut down or shared; bound again "
                          f"port={server.port}", server.log_text())
            self.assert_echo_serves(server, within_s=5)


class DamagedRepositoryTest(FaultsTest):

    def test_a_restart_serves_what_loads_and_reports_the_rest(self):
        # Model code can write to the repository. Once, a package damaged there failed every
        # restart (as a first start fails, exit 1), and the supervisor restarted it for good.
        with self.hostile_server() as server:
            first = server.serving_pid
            with open(os.path.join(self.repository, "echo", "1", "model.orochi"), "r+b") as file:
                file.truncate(100)
            os.kill(first, signal.SIGKILL)
            server.wait_for_serving(2)
            self.assertIn("model not loaded model=echo", server.log_text())
            entry = index(server)["echo"]
            self.assertEqual(entry["state"], "UNAVAILABLE", entry)
            status, _, body = self.hostile(server, "nothing")
            self.assertEqual(status, 200, body)

    def test_a_load_stuck_at_start_is_not_waited_for_again_after_a_crash(self):
        # Once each restart waited models.load_timeout_s again for the same stuck __init__.
        self.place_package("stuckinit", STUCK_IN_C_INIT)
        pack_model(self.repository, "hostile")
        config = {"models": {"load_timeout_s": 2, "execution_grace_ms": 300}}
        server = Server(self.repository, config, copies=1)
        try:
            self.assertIn("model not loaded model=stuckinit", server.log_text())
            first = server.serving_pid
            crashed = time.time()
            os.kill(first, signal.SIGKILL)
            server.wait_for_serving(2)
            self.assertLess(time.time() - crashed, 2, "the restart waited for the load again")
            self.assertIn("model quarantined model=stuckinit:1 reason=\"quarantined: loading "
                          "model stuckinit:1 did not finish within 2 s", server.log_text())
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)


class LogFloodTest(FaultsTest):

    def test_model_code_writing_to_the_log_descriptor_is_bounded(self):
        # Once the serving process logged straight to the supervisor's stderr, and model code
        # writing to that descriptor put 1.5 GB of forged records in the log in a second.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "flood_log")
            self.assertEqual(status, 200, body)
            self.assertGreaterEqual(json.loads(body)["outputs"][0]["data"][0], 1)
            time.sleep(1.2)  # the budget refills; the next record reports what was dropped
            self.assert_echo_serves(server)
            text = server.log_text()
            self.assertLess(len(text), 40 << 20, "64 MB of forged lines reached the log")
            self.assertRegex(text, r"log records of the serving process dropped: .* "
                                   r"dropped_lines=\d+ bytes_per_second=16777216")
            # The server's own records still come through, whole.
            self.assertRegex(text, r"info request listener=inference method=POST "
                                   r"target=/v2/models/echo/infer status=200")

    def test_the_serving_process_holds_no_descriptor_of_the_supervisors_output(self):
        # The log's duplicate of stderr stayed open in the serving process (descriptor 3): model
        # code wrote 504 MB of forged lines to the supervisor's log file in a second.
        with self.hostile_server() as server:
            held = []
            for fd in os.listdir(f"/proc/{server.serving_pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.path.samefile(f"/proc/{server.serving_pid}/fd/{fd}", server.log_path):
                        held.append(fd)
            self.assertEqual(held, [], "descriptors of the supervisor's log")
            self.assert_echo_serves(server)


class ManagementFromModelCodeTest(FaultsTest):
    """Model code runs as the server's user and can read its token, so who may manage models is
    told by the process a connection comes from (peer_process.h)."""

    def test_model_code_cannot_manage_models_and_an_operator_still_can(self):
        # Once a model's predict unloaded (or deleted) every other model through the loopback
        # management API, which trusts loopback without a token.
        with self.hostile_server() as server:
            for how, port, refused in (("http", server.management_port, 403),
                                       ("curl", server.management_port, 403),
                                       ("grpc", server.grpc_port, 7)):  # PERMISSION_DENIED
                status, _, body = self.hostile(server, f"manage:{port}:{how}")
                self.assertEqual(status, 200, body)
                self.assertEqual(json.loads(body)["outputs"][0]["data"], [refused], how)
            self.assertEqual(len(re.findall(r"management request refused port=\d+ reason=\"the "
                                            r"connection comes from process \d+, which the "
                                            r"server started", server.log_text())), 3)
            # What would hide a socket from /proc/<pid>/fd, or act past the filter.
            status, _, body = self.hostile(server, "hidden_routes")
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [1] * 12)
            self.assert_echo_serves(server)
            status, _, body = curl("-X", "POST", "-d", "{}", f"http://127.0.0.1:"
                                   f"{server.management_port}/v2/repository/models/echo/unload")
            self.assertEqual(status, 200, body)


class LockedRepositoryTest(FaultsTest):

    def test_a_repository_locked_by_model_code_is_opened_again_at_the_restart(self):
        # chmod(repository, 0) from model code made every later start fail ("cannot create
        # .../.orochi/uploads: Permission denied"): a restart loop with nothing served.
        with self.hostile_server() as server:
            before = stat.S_IMODE(os.stat(self.repository).st_mode)
            status, _, body = self.hostile(server, f"chmod:0000:{self.repository}")
            self.assertEqual(status, 200, body)
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2)
            self.assertEqual(stat.S_IMODE(os.stat(self.repository).st_mode), before)
            self.assertIn("the permissions of the model repository changed while the server "
                          f"ran; put back path={self.repository} found=0000", server.log_text())
            self.assert_echo_serves(server)

    def test_a_model_directory_locked_by_model_code_is_opened_again(self):
        # P11: a chmod of another model's directories by model code was put back by nothing, and
        # the next cold start failed listing the repository.
        model = os.path.join(self.repository, "echo")
        with self.hostile_server() as server:
            before = {path: stat.S_IMODE(os.stat(path).st_mode) for path in (model, model + "/1")}
            for path in before:
                status, _, body = self.hostile(server, f"chmod:0000:{path}")
                self.assertEqual(status, 200, body)
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2)
            for path, mode in before.items():
                self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), mode, path)
                self.assertIn("the permissions of the model repository changed while the server "
                              f"ran; put back path={path} found=0000", server.log_text())
            self.assert_echo_serves(server)
        # Closed while no server ran: a cold start opens it to its owner again.
        os.chmod(model, 0o000)
        server = Server(self.repository, {}, copies=1)
        try:
            self.assertEqual(stat.S_IMODE(os.stat(model).st_mode), 0o500)
            self.assertIn("a directory of the model repository was closed to the server; opened "
                          f"again path={model} found=0000 restored=0500", server.log_text())
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_an_upload_after_model_code_set_the_umask_is_readable(self):
        # umask(0o777) in model code, then an operator's upload: the model's directories were
        # made with mode 000, and the next start could not list the repository.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "umask:777")
            self.assertEqual(status, 200, body)
            package = pack_variant(self.root, "later", SLOW_INIT.replace("time.sleep(1.0)",
                                                                         "pass"))
            status, _, body = curl("-T", package, f"http://127.0.0.1:{server.management_port}"
                                   "/v2/repository/models/later/versions/1")
            self.assertEqual(status, 200, body)
            for directory in ("later", "later/1"):
                mode = stat.S_IMODE(os.stat(os.path.join(self.repository, directory)).st_mode)
                self.assertEqual(mode, 0o755, directory)
            self.assertEqual(index(server)["later"]["state"], "READY")
            self.hostile(server, "umask:022")
        # The next start lists and loads it.
        server = Server(self.repository, {}, copies=1)
        try:
            self.assertEqual(index(server)["later"]["state"], "READY")
        finally:
            self.assertEqual(server.stop(), 0)


class DescriptorExhaustionTest(FaultsTest):

    def test_a_repository_that_cannot_be_listed_is_not_taken_for_empty(self):
        # Once, in poll mode, a model that used up the process's descriptors made a listing
        # of the repository come back empty, and the poll unloaded every model.
        pack_model(self.repository, "hostile")
        server = Server(self.repository, {}, copies=1,
                        args=("--model-control-mode", "poll", "--repository-poll-secs", "0.1"))
        try:
            status, _, body = post_json(server, "/v2/models/hostile/infer", {"inputs": [
                {"name": "mode", "datatype": "BYTES", "shape": [1],
                 "data": ["exhaust_descriptors"]}]})
            self.assertEqual(status, 200, body)
            time.sleep(0.5)  # what the polls during it decided has been done
            log = server.log_text()
            self.assertNotIn("model unloaded", log)
            self.assertIn("repository poll failed", log)
            self.assertIn("Too many open files", log)
            self.assert_echo_serves(server)
            self.assertEqual(index(server)["echo"]["state"], "READY")
        finally:
            self.assertEqual(server.stop(), 0)


class LivenessTest(FaultsTest):

    def test_a_serving_process_that_answers_nothing_is_restarted(self):
        # A process that lives but answers nothing once stayed so for good: no death for the
        # supervisor to see. Here every thread is stopped by a tracer, as a child of the
        # serving process once did (model code may no longer trace: the seccomp filter).
        server = Server(self.repository, {"supervisor": {"liveness_timeout_s": 2}}, copies=1)
        try:
            # The probe starts once the serving process reports it serves, just after it logs
            # so: frozen in between (a loaded machine), it would never be asked.
            time.sleep(1)
            frozen = server.serving_pid
            let_frozen_die(freeze(self, frozen), timeout=30)
            server.wait_for_serving(2, timeout=30)
            self.assertNotEqual(server.serving_pid, frozen)
            log = server.log_text()
            self.assertRegex(log, r"error the serving process left a port unanswered; killing it, "
                                  r"to restart it on fresh listeners port=\d+ seconds=2 "
                                  r"open_descriptors=\d+ descriptor_limit=(\d+|unlimited)")
            self.assertIn("the serving process stopped answering; restarting it signal=SIGKILL",
                          log)
            self.assert_echo_serves(server)
            # The probes themselves leave no trace in the request log.
            self.assertNotIn("method=OPTIONS", log)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_start_frozen_during_a_load_is_killed_and_charged_to_that_load(self):
        # Before it serves, the serving process answers no port, so the probe cannot tell a
        # frozen start from a slow one: a start frozen during a load (or between the "serving"
        # line and its report of it) once went on for good. Its steps are bounded instead:
        # 2 x models.load_timeout_s + execution_grace_ms + 5 s = 13 s here without a load begun.
        mark = os.path.join(self.root, "first-load")
        self.place_package("freezes", MARKS_A_SLOW_FIRST_LOAD.format(mark=mark))
        config = {"models": {"load_timeout_s": 4, "execution_grace_ms": 0}}
        started = {}

        def start():
            try:
                started["server"] = Server(self.repository, config, copies=1)
            except AssertionError as error:
                started["error"] = error

        starting = threading.Thread(target=start)
        starting.start()
        deadline = time.time() + 60
        while not os.path.exists(mark) and time.time() < deadline:
            time.sleep(0.02)
        with open(mark) as file:
            frozen = int(file.read())
        threads = freeze(self, frozen)
        began = time.time()
        let_frozen_die(threads, timeout=60)
        stalled_for = time.time() - began
        starting.join(timeout=90)
        self.assertNotIn("error", started, started.get("error"))
        server = started["server"]
        try:
            self.assertNotEqual(server.serving_pid, frozen)
            self.assertGreater(stalled_for, 8)
            log = server.log_text()
            self.assertRegex(log, r"error the serving process's start made no progress; killing "
                                  r"it seconds=13 loading=freezes:1 open_descriptors=\d+ ")
            self.assertIn("the serving process stopped answering; restarting it signal=SIGKILL "
                          "model=freezes:1 activity=load "
                          "record=\"none: the load in flight at the start\"", log)
            self.assertEqual(index(server)["freezes"]["state"], "READY")
            self.assert_echo_serves(server)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_process_started_by_model_code_holding_a_listener_is_killed(self):
        # Passed across an exec (subprocess's pass_fds), where the fork handler that closes the
        # listeners in a child does not run, a listener let a program answer the server's
        # clients as it liked, until the next restart.
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, "spawn_listener_holder")
            self.assertEqual(status, 200, body)
            holder = int(json.loads(body)["outputs"][0]["data"][0])
            deadline = time.time() + 10
            while time.time() < deadline and process_alive(holder):
                time.sleep(0.1)
            self.assertFalse(process_alive(holder), "the holder still runs")
            self.assertIn(f"a process the serving process started held a listening socket; "
                          f"killed it pid={holder}", server.log_text())
            self.assert_echo_serves(server)


class ModelProcessesTest(FaultsTest):

    def test_model_code_keeps_at_most_max_model_processes(self):
        # 284 sleeping children (the user's process limit) once left the serving process no
        # room for threads: gRPC calls failed while they lived.
        with self.hostile_server(config={"supervisor": {"max_model_processes": 5}}) as server:
            serving = server.serving_pid
            status, _, body = self.hostile(server, "spawn_sleepers:12")
            self.assertEqual(status, 200, body)
            sleepers = [int(pid) for pid in json.loads(body)["outputs"][0]["data"]]
            deadline = time.time() + 10
            while time.time() < deadline and sum(map(process_alive, sleepers)) > 5:
                time.sleep(0.1)
            # The youngest went; the five oldest still run.
            self.assertEqual([process_alive(pid) for pid in sleepers], [True] * 5 + [False] * 7)
            self.assertIn("model code started more processes than it may have; killed the "
                          "youngest processes=12 bound=5 killed=7", server.log_text())
            self.assertEqual(server.serving_pid, serving)
            self.assertTrue(process_alive(serving))
            self.assert_echo_serves(server)
            for pid in sleepers[:5]:
                os.kill(pid, signal.SIGKILL)


class RunawayDescendantsTest(FaultsTest):

    def test_a_chain_of_processes_faster_than_its_kills_ends_with_its_serving_process(self):
        # A fork loop in a session of its own kept the supervisor killing and waiting for good
        # after a crash: it never restarted the serving process.
        marks = os.path.join(self.root, "hopper")
        with self.hostile_server() as server:
            status, _, body = self.hostile(server, f"hopper:{marks}")
            self.assertEqual(status, 200, body)
            deadline = time.time() + 10
            while time.time() < deadline and not os.path.exists(marks):
                time.sleep(0.05)
            os.kill(server.serving_pid, signal.SIGSEGV)
            server.wait_for_serving(2, timeout=10)
            with open(marks) as file:
                last = file.read()
            time.sleep(1)
            with open(marks) as file:
                self.assertEqual(file.read(), last, "the chain goes on")
            self.assertFalse(process_alive(int(last)))
            self.assert_echo_serves(server)


class ReloadTimeoutTest(FaultsTest):

    @contextlib.contextmanager
    def copy_replaced_under_reloadhang(self, hang: str):
        """A server whose one copy reloadhang's predict just got stuck and had replaced: its
        models are being loaded into the fresh copy, where reloadhang's __init__ runs `hang`."""
        mark = os.path.join(self.root, "stuck-once")
        self.place_package("reloadhang", HANGS_ON_RELOAD.format(mark=mark, hang=hang))
        config = {"models": {"load_timeout_s": 1, "execution_grace_ms": 300}}
        server = Server(self.repository, config, copies=1)
        try:
            status, _, body = post_json(server, "/v2/models/reloadhang/infer",
                                        slow_request("sleep", 0, timeout_us=200_000))
            self.assertEqual(status, 504, body)
            yield server
        finally:
            self.assertEqual(server.stop(), 0)

    def assert_unloads_at_once(self, server, model: str):
        began = time.time()
        status, _, body = curl("-X", "POST", f"http://127.0.0.1:{server.management_port}"
                               f"/v2/repository/models/{model}/unload")
        self.assertEqual(status, 200, body)
        self.assertLess(time.time() - began, 5)
        self.assert_echo_serves(server)

    def test_a_reload_into_a_replaced_copy_is_under_the_load_timeout(self):
        with self.copy_replaced_under_reloadhang(PYTHON_HANG) as server:
            # The one copy was replaced; its models are loaded into the fresh one, where
            # reloadhang's __init__ never returns: interrupted at the load timeout, so the slot
            # serves its other models again (once, it served nothing ever again).
            self.assert_echo_serves(server, within_s=5)
            deadline = time.time() + 5
            while "loading a model into the replacement" not in server.log_text():
                self.assertLess(time.time(), deadline, server.log_text())
                time.sleep(0.05)
            self.assertRegex(server.log_text(), r"loading a model into the replacement of a "
                                                r"stuck interpreter copy failed.*"
                                                r"model=reloadhang:1 .*did not finish within "
                                                r"the load timeout of 1000 ms")
            self.assert_unloads_at_once(server, "reloadhang")  # waits for nothing stuck

    def test_a_reload_stuck_in_c_code_costs_one_copy_and_not_the_slot(self):
        with self.copy_replaced_under_reloadhang(C_HANG) as server:
            # The reload into the fresh copy is stuck in C, where the interrupt does not reach:
            # past the load timeout and the grace, that copy is replaced too, without the model
            # (once, the slot served nothing for as long as the C call lasted, maybe for good).
            self.assert_echo_serves(server, within_s=5)
            self.assertIn("reloading a model got stuck past the load timeout; its copy was "
                          "replaced without it copy=0 model=reloadhang:1 load_timeout_ms=1000",
                          server.log_text())
            status, _, body = post_json(server, "/v2/models/reloadhang/infer",
                                        slow_request("sleep", 0))
            self.assertEqual(status, 503, body)
            self.assertIn(b"is not loaded into it again", body)
            self.assertNotIn(b"the load is retried", body)
            self.assert_unloads_at_once(server, "reloadhang")


if __name__ == "__main__":
    unittest.main()
