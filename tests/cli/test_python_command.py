"""`orochi python` and `orochi-python` behave like the python command, in a private copy.

Run with Debian's python3.11: OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v
"""

import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest
from pathlib import Path

OROCHI = Path(os.environ.get("OROCHI_BINARY", Path(__file__).parents[2] / "build/bin/orochi"))
OROCHI_PYTHON = OROCHI.parent / "orochi-python"


def run(*args, stdin=None, env=None, cwd=None, timeout=120):
    return subprocess.run([str(OROCHI), "python", *args], input=stdin, capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


class ProgramsRunLikePython(unittest.TestCase):
    def test_code_gets_argv_and_its_output_is_flushed(self):
        result = run("-c", "import sys; sys.stdout.write(repr(sys.argv))", "one", "two")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "['-c', 'one', 'two']")  # no newline, still flushed

    def test_exit_status_comes_from_system_exit(self):
        self.assertEqual(run("-c", "raise SystemExit(7)").returncode, 7)
        self.assertEqual(run("-c", "import sys; sys.exit()").returncode, 0)
        result = run("-c", "import sys; sys.exit('bad configuration')")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr, "bad configuration\n")

    def test_uncaught_exception_prints_the_traceback_and_exits_1(self):
        result = run("-c", "def f():\n    raise KeyError('missing')\nf()")
        self.assertEqual(result.returncode, 1)
        self.assertEqual(result.stderr, textwrap.dedent("""\
            Traceback (most recent call last):
              File "<string>", line 3, in <module>
              File "<string>", line 2, in f
            KeyError: 'missing'
            """))

    def test_file_runs_with_its_directory_first_on_sys_path(self):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "helper.py").write_text("VALUE = 'from helper'\n")
            script = Path(directory, "main.py")
            script.write_text("import sys, helper\nprint(helper.VALUE, sys.argv[1:], __name__)\n")
            result = run(str(script), "--flag", cwd="/")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "from helper ['--flag'] __main__\n")

    def test_module_runs_as_main_from_the_current_directory(self):
        with tempfile.TemporaryDirectory() as directory:
            package = Path(directory, "tool")
            package.mkdir()
            (package / "__init__.py").write_text("")
            (package / "__main__.py").write_text("import sys\nprint('tool', sys.argv)\n")
            result = run("-m", "tool", "x", cwd=directory)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, f"tool ['{directory}/tool/__main__.py', 'x']\n")

    def test_stdlib_modules_run_with_dash_m(self):
        result = run("-m", "json.tool", stdin='{"b": 1, "a": [true]}')
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, '{\n    "b": 1,\n    "a": [\n        true\n    ]\n}\n')

    def test_stdin_is_the_program_when_it_is_not_a_terminal(self):
        result = run("-", "arg", stdin="import sys\nprint('from stdin', sys.argv)\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "from stdin ['', 'arg']\n")

    def test_c_extension_modules_load_with_orochis_loader(self):
        result = run("-c", "import _decimal, decimal, json, sys; print(decimal.Decimal(1) / 8, "
                           "json.dumps([1]), '_pydecimal' in sys.modules, _decimal.__file__)")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "0.125 [1] False /usr/lib/python3.11/lib-dynload/"
                                        "_decimal.cpython-311-x86_64-linux-gnu.so\n")

    def test_python_environment_variables_are_ignored(self):
        env = dict(os.environ, PYTHONPATH="/garbage", PYTHONHOME="/garbage",
                   PYTHONWARNINGS="error", PYTHONSTARTUP="/garbage/startup.py",
                   PYTHONINSPECT="1", PYTHONDONTWRITEBYTECODE="")
        result = run("-c", "import sys, json; print(sys.path[1:], sys.warnoptions)", env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("garbage", result.stdout)
        self.assertTrue(result.stdout.startswith("['/proc/self/fd/"), result.stdout)

    def test_the_system_python_is_touched_only_for_c_extension_modules(self):
        if shutil.which("strace") is None:
            self.fail("strace is required (scripts/install-deps.sh installs it)")
        with tempfile.NamedTemporaryFile("r") as trace:
            result = subprocess.run(
                ["strace", "-f", "-e", "trace=%file", "-o", trace.name, str(OROCHI), "python",
                 "-c", "import json, decimal, asyncio, email.message; print('ok')"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout, "ok\n")
            touched = [line for line in trace.read().splitlines() if "/usr/lib/python3" in line]
        # The stdlib's Python code comes from the embedded archive; lib-dynload is searched for
        # the C accelerators (_json, _decimal, _asyncio, ...) and nothing else is opened.
        elsewhere = [line for line in touched if "/usr/lib/python3.11/lib-dynload" not in line]
        self.assertEqual(elsewhere, [])
        opened = {re.search(r"lib-dynload/(\w+)\.", line).group(1) for line in touched
                  if "openat(" in line and ".so" in line and "ENOENT" not in line}
        self.assertTrue({"_json", "_decimal", "_asyncio"} <= opened, opened)

    def test_interactive_prompt_in_a_terminal(self):
        pid, terminal = pty.fork()
        if pid == 0:
            os.execv(str(OROCHI), [str(OROCHI), "python"])
        output = b""

        def read_until(marker, timeout=30):
            nonlocal output
            deadline = time.monotonic() + timeout
            while marker not in output and time.monotonic() < deadline:
                ready, _, _ = select.select([terminal], [], [], 0.5)
                if ready:
                    try:
                        output += os.read(terminal, 4096)
                    except OSError:
                        break
            return marker in output

        self.assertTrue(read_until(b">>> "), output)
        os.write(terminal, b"answer = 6 * 7\n")
        os.write(terminal, b"print('the answer is', answer)\n")
        self.assertTrue(read_until(b"the answer is 42"), output)
        os.write(terminal, b"exit(3)\n")
        _, status = os.waitpid(pid, 0)
        os.close(terminal)
        self.assertIn(b"Orochi interpreter copy", output)
        self.assertEqual(os.waitstatus_to_exitcode(status), 3)

    def test_ctrl_c_raises_keyboard_interrupt(self):
        process = subprocess.Popen([str(OROCHI), "python", "-c",
                                    "import time\nprint('ready', flush=True)\ntime.sleep(60)"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(process.stdout.readline(), "ready\n")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
        self.assertEqual(process.returncode, 130)
        self.assertIn("KeyboardInterrupt", stderr)


class SourcesAreShipped(unittest.TestCase):
    """The embedded archives carry their .py sources beside the .pyc files imports load."""

    def test_an_uncaught_exception_shows_stdlib_source_lines(self):
        result = run("-c", "import json\njson.loads('{')")
        self.assertEqual(result.returncode, 1)
        self.assertIn('File "<stdlib>/json/decoder.py", line', result.stderr)
        self.assertIn("obj, end = self.scan_once(s, idx)", result.stderr)

    def test_inspect_reads_stdlib_and_orochi_sources(self):
        result = run("-c", "import inspect, json, orochi.nn\n"
                           "print(inspect.getsource(json.dumps).splitlines()[0])\n"
                           "print(inspect.getsource(orochi.nn.Linear).splitlines()[0])")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines()[0], "def dumps(obj, *, skipkeys=False, "
                         "ensure_ascii=True, check_circular=True,")
        self.assertTrue(result.stdout.splitlines()[1].startswith("class Linear("), result.stdout)

    def test_every_top_level_stdlib_source_parses_and_compiles(self):
        # What CPython's test_ast.test_stdlib_validates checks, read from the archive: that test
        # lists the stdlib's directory, which in a copy is a zip archive (see skips.txt).
        code = textwrap.dedent("""\
            import ast, zipfile
            with zipfile.ZipFile(ast.__loader__.archive) as archive:
                names = [n for n in archive.namelist() if n.endswith(".py") and "/" not in n]
                for name in names:
                    compile(ast.parse(archive.read(name), name), name, "exec")
            print(len(names))
            """)
        result = run("-c", code)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertGreater(int(result.stdout), 150)  # CPython 3.11 has about 190

    def test_a_file_that_is_not_utf8_fails_as_cpython_says(self):
        with tempfile.TemporaryDirectory() as directory:
            script = Path(directory, "bad.py")
            script.write_bytes(b"x = 1\n\x89\n")
            result = run(str(script))
        self.assertEqual(result.returncode, 1)
        self.assertIn(f"SyntaxError: Non-UTF-8 code starting with '\\x89' in file {script} on "
                      "line 2, but no encoding declared", result.stderr)


class CopiesAndCompatibility(unittest.TestCase):
    def test_many_copies_run_the_same_program_at_once(self):
        result = run("--copies", "3", "-c", "import _orochi; print('copy', _orochi.copy_id())")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(result.stdout.splitlines()), ["copy 0", "copy 1", "copy 2"])

    def test_many_copies_report_the_first_failure(self):
        result = run("--copies", "2", "-c",
                     "import _orochi, sys; sys.exit(5 if _orochi.copy_id() == 1 else 0)")
        self.assertEqual(result.returncode, 5)

    def test_sys_executable_starts_a_fresh_copy(self):
        code = ("import subprocess, sys\n"
                "child = subprocess.run([sys.executable, '-I', '-c', 'print(6 * 7)'],"
                " capture_output=True, text=True)\n"
                "print(sys.executable.endswith('/orochi-python'), child.stdout.strip())")
        result = run("-c", code)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "True 42\n")

    def test_cpython_flags(self):
        result = subprocess.run(
            [str(OROCHI_PYTHON), "-OO", "-Wignore::DeprecationWarning", "-X", "faulthandler",
             "-c", "import sys, faulthandler; print(sys.flags.optimize, sys.warnoptions,"
                   " faulthandler.is_enabled(), __doc__)"],
            capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "2 ['ignore::DeprecationWarning'] True None\n")
        version = subprocess.run([str(OROCHI_PYTHON), "-V"], capture_output=True, text=True)
        self.assertEqual(version.stdout, "Python 3.11.2\n")

    def test_isolated_flag_keeps_the_script_directory_off_sys_path(self):
        result = run("-I", "-c", "import sys; print(sys.path[0].startswith('/proc/self/fd/'))")
        self.assertEqual(result.stdout, "True\n", result.stderr)

    def test_extra_paths_from_the_flag_and_the_host_environment(self):
        with tempfile.TemporaryDirectory() as directory:
            Path(directory, "extra_module.py").write_text("WHERE = 'extra'\n")
            result = run("--path", directory, "-c", "import extra_module; print(extra_module.WHERE)")
            self.assertEqual(result.stdout, "extra\n", result.stderr)
            env = dict(os.environ, OROCHI_PYTHON_PATH=directory)
            result = run("-I", "-c", "import extra_module; print(extra_module.WHERE)", env=env)
            self.assertEqual(result.stdout, "extra\n", result.stderr)

    def test_bad_usage_is_reported_with_status_2(self):
        for args in (["-c"], ["--copies", "zero", "-c", "pass"], ["-Z"]):
            result = run(*args)
            self.assertEqual(result.returncode, 2, args)
            self.assertIn("orochi python:", result.stderr)
        result = run("--help")
        self.assertEqual(result.returncode, 0)
        self.assertIn("Usage: orochi python", result.stdout)


class OpenMpSpinning(unittest.TestCase):
    """oneDNN's OpenMP threads spin only briefly for more work (cli/main.cpp): libgomp reads its
    setting as it loads, so orochi sets GOMP_SPINCOUNT and starts again as itself, unless the
    environment already says how OpenMP threads wait."""

    SHOW = "import os; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"

    def environment(self, **settings):
        env = {key: value for key, value in os.environ.items()
               if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
        return {**env, **settings}

    def test_the_spin_is_set_for_both_names_of_the_command(self):
        for command in ([str(OROCHI), "python"], [str(OROCHI_PYTHON)]):
            result = subprocess.run([*command, "-c", self.SHOW, "argument"], capture_output=True,
                                    text=True, env=self.environment(), timeout=120)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertEqual(result.stdout, "1000 None\n", command)

    def test_the_process_keeps_its_name(self):
        # Started again through /proc/self/exe, the process was named "exe" (ps, pidof, pkill).
        show_name = "print(open('/proc/self/comm').read().strip())"
        result = run("-c", show_name, env=self.environment())
        self.assertEqual(result.stdout, "orochi\n", result.stderr)
        result = subprocess.run([str(OROCHI_PYTHON), "-c", show_name], capture_output=True,
                                text=True, env=self.environment(), timeout=120)
        self.assertEqual(result.stdout, "orochi-python\n", result.stderr)

    def test_settings_from_the_environment_are_kept(self):
        result = run("-c", self.SHOW, env=self.environment(GOMP_SPINCOUNT="5"))
        self.assertEqual(result.stdout, "5 None\n", result.stderr)
        result = run("-c", self.SHOW, env=self.environment(OMP_WAIT_POLICY="passive"))
        self.assertEqual(result.stdout, "None passive\n", result.stderr)


if __name__ == "__main__":
    unittest.main()
