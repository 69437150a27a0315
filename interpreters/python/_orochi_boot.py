"""Start-up and entry points of an Orochi interpreter copy.

Imported once when a copy starts. The host calls the functions below through the copy's
C table; they run programs the way the `python` command does, and describe exceptions so the
host gets the type, message and full traceback.

A copy's CPython is private (every C symbol hidden), so a C extension module built as a
separate .so cannot be loaded by the system's dynamic linker: it would look for Py* symbols
process-wide and find none. Extension files found on sys.path are loaded instead by Orochi's
own ELF loader (in the host), which binds them to this copy's CPython.
"""

import sys
import traceback
from importlib import machinery

import _orochi

try:
    from _orochi_native_modules import NATIVE_MODULES
except ImportError:  # a copy built without the generated list
    NATIVE_MODULES = frozenset()

RUN_CODE, RUN_FILE, RUN_MODULE, RUN_INTERACTIVE = range(4)


# Extension modules a copy does not load, and why: their libraries keep state per process,
# which every copy would share (and fight over).
_PROCESS_WIDE = {
    "readline": "GNU readline keeps one terminal state per process, shared by every copy",
}


class _CopyExtensionLoader(machinery.ExtensionFileLoader):
    """ExtensionFileLoader, with the module mapped and linked by Orochi's loader for this copy
    instead of by dlopen (which would bind it to no Python at all)."""

    def create_module(self, spec):
        reason = _PROCESS_WIDE.get(spec.name)
        if reason is not None:
            raise ImportError(f"interpreter copies do not load {spec.name!r}: {reason}",
                              name=spec.name, path=spec.origin)
        return _orochi.create_extension(spec)

    def exec_module(self, module):
        _orochi.exec_extension(module)


class _NativeModuleFinder:
    """Last on sys.meta_path: a module the system Python ships as a C extension, not found."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname in NATIVE_MODULES:
            raise ImportError(f"cannot import {fullname!r}: a C extension module of the system "
                              "Python, not found in its lib-dynload directory on sys.path",
                              name=fullname)
        return None


def _install_import_guards():
    loaders = [
        (_CopyExtensionLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    ]
    for index, hook in enumerate(sys.path_hooks):
        if getattr(hook, "__name__", "") == "path_hook_for_FileFinder":
            sys.path_hooks[index] = machinery.FileFinder.path_hook(*loaders)
    sys.path_importer_cache.clear()
    sys.meta_path.append(_NativeModuleFinder)


_install_import_guards()


# --- errors -----------------------------------------------------------------------------------

def _qualified_name(exc_type):
    module = exc_type.__module__
    if module in (None, "builtins", "__main__"):
        return exc_type.__qualname__
    return f"{module}.{exc_type.__qualname__}"


# The most characters of an exception's message and of its formatted traceback that go to the
# host. The host puts both into an HTTP answer and the log: a message of hundreds of megabytes
# (`raise ValueError(huge_text)`) took the server half a minute per request to escape and send,
# and no reader needs more than the first and last lines of a traceback.
DESCRIPTION_LIMIT = 16384


def _bounded(text, limit=DESCRIPTION_LIMIT):
    """`text` if it fits in `limit` characters, else its head and tail around a note of how
    much was cut (a traceback's last lines name the exception, so both ends matter)."""
    if len(text) <= limit:
        return text
    keep = limit // 2
    return f"{text[:keep]}\n... {len(text) - 2 * keep} characters cut ...\n{text[-keep:]}"


def describe_exception(exc):
    """(type name, message, formatted traceback) of an exception, for the host; the message
    and the traceback at most DESCRIPTION_LIMIT characters each."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return _qualified_name(type(exc)), _bounded(str(exc)), _bounded(text)


def _without_own_frames(tb):
    own_file = _without_own_frames.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == own_file:
        tb = tb.tb_next
    return tb


def _exit_status(exit_exception):
    code = exit_exception.code
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)  # sys.exit(True) means 1, and the host takes ints only
    # Like CPython: a non-integer code is printed to stderr and the status is 1.
    print(code, file=sys.stderr)
    return 1


def _flush_std_streams():
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # a closed or broken stream must not hide the program's status
            pass


# --- output of a served copy -------------------------------------------------------------------

class _HostOutput:
    """sys.stdout or sys.stderr of a copy whose host takes its output line by line (a server,
    which logs each line as a record of its own instead of letting raw text interleave with
    its log). Whole lines go to the host as they complete, a partial line when flushed (print's
    flush=True, and after every call from the host). A line longer than OUTPUT_LINE_LIMIT
    characters is cut there, so output without a newline never grows without bound."""

    encoding = "utf-8"
    errors = "backslashreplace"
    newlines = None
    line_buffering = True
    closed = False

    def __init__(self, stream, name):
        import _thread
        self._stream = stream
        self.name = name
        self._pending = []
        self._size = 0
        self._cut = False
        self._lock = _thread.RLock()
        self.buffer = _HostOutputBuffer(self)

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            start = 0
            while True:
                newline = text.find("\n", start)
                self._keep(text, start, len(text) if newline < 0 else newline)
                if newline < 0:
                    break
                self._hand_over()
                start = newline + 1
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        with self._lock:
            if self._pending or self._cut:
                self._hand_over()

    def _keep(self, text, start, end):
        room = _orochi.OUTPUT_LINE_LIMIT - self._size
        if end - start > room:
            self._cut = True
            end = start + room
        if end > start:
            self._pending.append(text[start:end])
            self._size += end - start

    def _hand_over(self):
        line = "".join(self._pending)
        cut = self._cut
        self._pending.clear()
        self._size = 0
        self._cut = False
        _orochi.write_output(self._stream, line, cut)

    def isatty(self):
        return False

    def readable(self):
        return False

    def writable(self):
        return True

    def seekable(self):
        return False

    def fileno(self):
        import io
        raise io.UnsupportedOperation(f"{self.name} goes to the server's log, not to a file")

    def close(self):
        self.flush()  # the host's stream stays: closing it would silence the copy for good


class _HostOutputBuffer:
    """The bytes side of a _HostOutput (sys.stdout.buffer): UTF-8 decoded as it comes, a
    character split between two writes included."""

    def __init__(self, text):
        import codecs
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def write(self, data):
        self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self):
        self._text.flush()

    def writable(self):
        return True


def redirect_output():
    """Called by the copy at start-up when its host takes the output (see _HostOutput): a
    server, whose process the copy shares with every other model."""
    sys.stdout = _HostOutput(1, "<stdout>")
    sys.stderr = _HostOutput(2, "<stderr>")
    _guard_the_servers_process()


# The standard descriptors of a server's process: the log's stderr, and the numbers that must
# stay taken. A model's os.close(2) (a daemon's habit) frees the number, the kernel hands the
# lowest free number to the next connection the server accepts, and whatever is later written
# to descriptor 2 (a C library's messages, sys.__stderr__) goes to that client.
_STANDARD_DESCRIPTORS = range(3)


def _guard_the_servers_process():
    """Makes the few calls by which a model's code would end or damage the whole server raise
    instead, with a message saying why: os._exit() and os.abort() in the server's own process
    (a child the model forked may still use them, as it should), os.close()/os.closerange()
    of descriptors 0, 1 and 2, and sys.addaudithook(). This is no sandbox (ARCHITECTURE.md):
    it stops the ordinary mistakes, not code that means harm."""
    import os
    server_pid = os.getpid()
    real_exit, real_abort = os._exit, os.abort
    real_close, real_closerange = os.close, os.closerange

    def _exit(status):
        if os.getpid() == server_pid:
            raise RuntimeError(f"os._exit({status!r}) would end the whole server, every other "
                               "model with it: raise an exception instead (a forked child may "
                               "call os._exit)")
        real_exit(status)

    def abort():
        if os.getpid() == server_pid:
            raise RuntimeError("os.abort() would end the whole server, every other model with "
                               "it: raise an exception instead")
        real_abort()

    def refuse_standard(call):
        raise PermissionError(f"{call}: descriptors 0, 1 and 2 belong to the server, and once "
                              "closed the next client connection would take their number")

    def close(fd):
        if os.getpid() == server_pid and fd in _STANDARD_DESCRIPTORS:
            refuse_standard(f"os.close({fd!r})")
        real_close(fd)

    def closerange(fd_low, fd_high):
        if os.getpid() == server_pid and fd_low < len(_STANDARD_DESCRIPTORS) and fd_high > fd_low:
            refuse_standard(f"os.closerange({fd_low!r}, {fd_high!r})")
        real_closerange(fd_low, fd_high)

    def addaudithook(hook):
        # The copy's own hook refuses new ones too (entry.cpp), but CPython swallows what a
        # hook raises there: this says why.
        raise PermissionError("sys.addaudithook: an audit hook would run inside every other "
                              "model's code in this interpreter (its loads and its requests); "
                              "the server refuses new ones")

    for module, replacement, real in ((os, _exit, real_exit), (os, abort, real_abort),
                                      (os, close, real_close), (os, closerange, real_closerange),
                                      (sys, addaudithook, sys.addaudithook)):
        replacement.__name__ = replacement.__qualname__ = real.__name__
        replacement.__doc__ = real.__doc__
        setattr(module, real.__name__, replacement)


# --- programs (orochi python) -----------------------------------------------------------------

def _fresh_main():
    import types
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    return main


def _run_file(path, main, prepend_path):
    import os
    import runpy
    if os.path.isdir(path) or _is_zip(path):
        # A directory or zip with __main__.py, as `python DIR` runs it.
        sys.path.insert(0, path)
        runpy._run_module_as_main("__main__", alter_argv=False)
        return
    prepend_path(os.path.dirname(os.path.realpath(path)))
    main.__dict__.update(__file__=path, __cached__=None)
    _orochi.run_file(path, main.__dict__)


def _is_zip(path):
    import zipfile
    try:
        return zipfile.is_zipfile(path)
    except OSError:
        return False


def _install_interactive_builtins():
    import builtins
    import _sitebuiltins
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    builtins.help = _sitebuiltins._Helper()


def _run_interactive(main):
    if sys.stdin is None or not sys.stdin.isatty():
        # `python < script.py` runs the whole of stdin as one program.
        source = sys.stdin.read() if sys.stdin is not None else ""
        exec(compile(source, "<stdin>", "exec", dont_inherit=True), main.__dict__)
        return
    import code
    _install_interactive_builtins()
    sys.ps1, sys.ps2 = ">>> ", "... "
    banner = (f"Python {sys.version} in Orochi interpreter copy {_orochi.copy_id()}\n"
              'Type "help", "exit()" or Ctrl-D to leave.')
    code.interact(banner=banner, local=main.__dict__, exitmsg="")


def run_program(kind, target, argv, safe_path=False):
    """Runs a program like the `python` command and returns its exit status.

    Unless safe_path (python -P, -I), sys.path[0] becomes the script's directory, the current
    directory for -m, or '' for -c, stdin and the prompt, as python does.
    """
    import os

    def prepend_path(entry):
        if not safe_path:
            sys.path.insert(0, entry)

    main = _fresh_main()
    try:
        try:
            if kind == RUN_CODE:
                sys.argv = ["-c", *argv]
                prepend_path("")
                exec(compile(target, "<string>", "exec", dont_inherit=True), main.__dict__)
            elif kind == RUN_FILE:
                sys.argv = [target, *argv]
                _run_file(target, main, prepend_path)
            elif kind == RUN_MODULE:
                import runpy
                sys.argv = [target, *argv]
                prepend_path(os.getcwd())
                runpy._run_module_as_main(target, alter_argv=True)
            elif kind == RUN_INTERACTIVE:
                sys.argv = ["", *argv]
                prepend_path("")
                _run_interactive(main)
            else:
                raise ValueError(f"unknown program kind {kind}")
        except SystemExit as exit_exception:
            return _exit_status(exit_exception)
        except BaseException as exc:  # noqa: B036 - an uncaught exception ends the program
            exc = exc.with_traceback(_without_own_frames(exc.__traceback__))
            if sys.excepthook is sys.__excepthook__ and not isinstance(exc, MemoryError):
                # CPython's own printer reads source lines from files on disk only; the
                # traceback module reads them through each module's loader too, which finds
                # the stdlib's sources in the embedded archive. Out of memory, only CPython's
                # printer, which needs no new Python frames, can still report it.
                traceback.print_exception(type(exc), exc, exc.__traceback__)
            else:
                sys.excepthook(type(exc), exc, exc.__traceback__)
            return 130 if isinstance(exc, KeyboardInterrupt) else 1
        return 0
    finally:
        _flush_std_streams()


def prepare_finalize():
    """Lets threading's shutdown finish when the copy is unloaded from another OS thread.

    The thread that first imported threading is its "main thread". CPython 3.11's
    threading._shutdown() stops that thread only when called on it, yet then waits for it like
    any non-daemon thread, which would be forever: the host drives a copy from whichever thread
    holds it, and unloads it from yet another. At unload no Python code runs on that thread any
    more (the host serialises calls), so it is stopped here as _shutdown() would have done.
    """
    threading = sys.modules.get("threading")
    if threading is None:
        return
    main_thread = threading._main_thread
    if main_thread.ident == threading.get_ident() or main_thread._is_stopped:
        return
    lock = main_thread._tstate_lock
    if lock is not None and lock.locked():
        lock.release()
    main_thread._stop()


# --- calls from the host library API ----------------------------------------------------------

def exec_main(source, filename):
    main = sys.modules["__main__"]
    try:
        exec(compile(source, filename, "exec", dont_inherit=True), main.__dict__)
    finally:
        _flush_std_streams()


def eval_main(expression):
    main = sys.modules["__main__"]
    try:
        return eval(compile(expression, "<eval>", "eval", dont_inherit=True), main.__dict__)
    finally:
        _flush_std_streams()


# orochi's modules as the host first reached them. orochi.serving holds every model loaded in
# the copy: were it looked up in sys.modules on each call, a model's `del
# sys.modules["orochi.serving"]` would hand the next call a fresh module that knows of no
# model, and every other model in the copy would answer "not loaded".
_host_modules = {}


def call_target(target, args):
    """Calls "package.module:qualified.name" with positional args."""
    import importlib
    module_name, separator, qualified_name = target.partition(":")
    if not separator or not module_name or not qualified_name:
        raise ValueError(f"call target {target!r} is not of the form 'module:name'")
    obj = _host_modules.get(module_name)
    if obj is None:
        obj = importlib.import_module(module_name)
        if module_name.partition(".")[0] == "orochi":
            _host_modules[module_name] = obj
    for attribute in qualified_name.split("."):
        obj = getattr(obj, attribute)
    try:
        return obj(*args)
    finally:
        _flush_std_streams()
