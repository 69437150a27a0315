"""What model code does past its predict(): its prints become bounded log records, a child it
forks holds none of the server's sockets, and code that reaches at the process, its
descriptors, its working directory or shared modules gets an error while the other models
go on.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_model_isolation
"""

import json
import os
import shutil
import signal
import socket
import tempfile
import time
import unittest

from server_fixtures import (Server, child_pids, curl, pack_model, pack_repository, post_json,
                             slow_request, socket_inodes, tcp_inodes_on_port)


class ModelOutputTest(unittest.TestCase):
    """What served models print becomes log records with the model's name, bounded in rate
    and in line length."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-model-output-test-")
        repository = os.path.join(cls.root, "repository")
        pack_model(repository, "printer")
        cls.server = Server(repository, {"log": {"format": "json"}}, copies=1)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        shutil.rmtree(cls.root)
        assert code == 0, f"orochi serve exited with {code}"

    def predict(self, mode, count=0):
        status, _, body = post_json(self.server, "/v2/models/printer/infer", {"inputs": [
            {"name": "mode", "datatype": "BYTES", "shape": [1], "data": [mode]},
            {"name": "count", "datatype": "INT64", "shape": [1], "data": [count]}]})
        self.assertEqual(status, 200, body)

    def records(self, message):
        records = []
        for line in self.server.log_text().splitlines():
            self.assertTrue(line.startswith("{"), f"a raw line in the log: {line!r}")
            record = json.loads(line)
            if record["message"] == message:
                records.append(record)
        return records

    def test_each_line_is_a_record_with_the_copy_and_the_model(self):
        self.predict("lines", 7)
        output = [(r["level"], r["stream"], r["copy"], r["model"], r["version"], r["line"])
                  for r in self.records("model output")]
        for expected in [("info", "stdout", 0, "printer", 1, "loading the printer"),
                         ("info", "stdout", 0, "printer", 1, "hello from predict 7"),
                         ("warning", "stderr", 0, "printer", 1, "a warning"),
                         ("info", "stdout", 0, "printer", 1, "no newlinebytes é"),
                         ("info", "stdout", 0, "printer", 1, "from a thread")]:
            self.assertIn(expected, output)
        self.assertNotIn("cut", self.records("model output")[0])

    def test_a_flood_is_bounded_and_the_dropped_lines_are_reported(self):
        start = time.time()
        self.predict("flood", 20000)
        elapsed = time.time() - start
        time.sleep(1.1)  # the next report may come; a line's worth of the rate is back
        self.predict("lines", 1)
        logged = len([r for r in self.records("model output") if r["line"].startswith("flood")])
        dropped = self.records("model output dropped: the copy printed faster than its limit")
        self.assertGreaterEqual(len(dropped), 1)
        self.assertLessEqual(len(dropped), elapsed + 2, "one report a second at most")
        self.assertEqual({(r["copy"], r["model"], r["level"]) for r in dropped},
                         {(0, "printer", "warning")})
        self.assertGreaterEqual(logged, 200)  # the burst
        self.assertLessEqual(logged, 200 + 200 * elapsed + 1)
        self.assertEqual(logged + sum(r["dropped_lines"] for r in dropped), 20000)

    def test_a_long_line_is_cut(self):
        time.sleep(1)  # the rate limit of the other tests is spent
        self.predict("long", 10000)
        long_lines = [r for r in self.records("model output") if r["line"].startswith("xxx")]
        self.assertEqual(len(long_lines), 1)
        self.assertEqual((len(long_lines[0]["line"]), long_lines[0]["cut"]), (4096, True))


class ForkTest(unittest.TestCase):
    def test_a_child_forked_by_a_model_holds_none_of_the_servers_sockets(self):
        root = tempfile.mkdtemp(prefix="orochi-fork-test-")
        child = None
        server = None
        try:
            server = Server(pack_repository(root), {})
            status, _, body = post_json(server, "/v2/models/slow/infer", slow_request("fork", 30))
            self.assertEqual(status, 200, body)
            children = child_pids(server.serving_pid)
            self.assertEqual(len(children), 1, children)
            child = children[0]
            held = socket_inodes(child)
            # gRPC's listener too: once, a daemon kept it, and a new server found the port taken.
            for port in (server.port, server.metrics_port, server.management_port,
                         server.grpc_port):
                self.assertFalse(held & tcp_inodes_on_port(port),
                                 f"the forked child holds a socket of port {port}")
            # The reviewer's case: the server dies, the child lives on, and a new server must
            # be able to listen on the same port.
            port = server.port
            server.process.kill()  # the supervisor, then the serving process
            server.process.wait(timeout=30)
            os.kill(server.serving_pid, signal.SIGKILL)
            deadline = time.time() + 10
            while os.path.exists(f"/proc/{server.serving_pid}") and time.time() < deadline:
                time.sleep(0.01)
            with socket.socket() as again:
                again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                again.bind(("127.0.0.1", port))
                again.listen()
            server.stop()
        finally:
            if server is not None and server.process.poll() is None:
                server.process.kill()
                server.stop()
            if child is not None:
                try:
                    os.kill(child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(root)


class HostileModelTest(unittest.TestCase):
    """Model code that reaches past its model, at the process, its descriptors, its working
    directory or the modules that every model in a copy shares: the server answers it with an
    error that says what happened, and the other model in the same copy (one copy, so both
    share it) goes on answering."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-hostile-test-")
        for name in ("hostile", "slow"):
            pack_model(os.path.join(self.root, "repository"), name)
        # Relative, as `orochi serve --model-repository repo` is typed: a model's os.chdir()
        # must not move it.
        self.server = Server("repository", {}, copies=1, cwd=self.root)

    def tearDown(self):
        code = self.server.stop() if self.server.process.poll() is None else None
        shutil.rmtree(self.root)
        self.assertEqual(code, 0, "the server was still running and exited cleanly")

    def hostile(self, mode):
        status, _, body = post_json(self.server, "/v2/models/hostile/infer", {"inputs": [
            {"name": "mode", "datatype": "BYTES", "shape": [1], "data": [mode]}]})
        return status, json.loads(body)

    def assert_both_models_answer(self):
        status, answer = self.hostile("fine")
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer["outputs"][0]["data"], [1.0])
        status, _, body = post_json(self.server, "/v2/models/slow/infer", slow_request("sleep"))
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body)["outputs"][0]["data"], [True])

    def test_ending_the_process_is_refused_with_a_model_error(self):
        for mode, call in (("exit", "os._exit(7)"), ("abort", "os.abort()")):
            with self.subTest(mode):
                status, answer = self.hostile(mode)
                self.assertEqual(status, 500, answer)
                self.assertIn(f"RuntimeError: {call} would end the whole server", answer["error"])
                self.assertIn("hostile:1>/code/model.py", answer["error"])
                self.assertIsNone(self.server.process.poll(), "the server is still running")
                self.assert_both_models_answer()

    def test_closing_the_standard_descriptors_is_refused(self):
        for mode, call in (("close_stderr", "os.close(2)"),
                           ("close_std_range", "os.closerange(0, 1024)")):
            with self.subTest(mode):
                status, answer = self.hostile(mode)
                self.assertEqual(status, 500, answer)
                self.assertIn(f"PermissionError: {call}: descriptors 0, 1 and 2 belong to the "
                              "server", answer["error"])
                self.assert_both_models_answer()

    def test_a_freed_stderr_number_never_carries_log_records_to_a_client(self):
        # os.fdopen(2).close() frees descriptor 2 past the guard on os.close: the next
        # connection takes the number. The log keeps its own descriptor, so no record goes
        # into that connection's answer (curl saw "HTTP/0.9" garbage before).
        status, answer = self.hostile("close_stderr_file")
        self.assertEqual(status, 200, answer)
        for _ in range(3):
            self.assert_both_models_answer()
        deadline = time.time() + 10
        while "target=/v2/models/slow/infer status=200" not in self.server.log_text():
            self.assertLess(time.time(), deadline, "the requests after the close are logged")
            time.sleep(0.05)

    def test_forgetting_the_serving_module_does_not_unload_the_other_models(self):
        status, answer = self.hostile("forget_serving")
        self.assertEqual(status, 200, answer)
        self.assert_both_models_answer()

    def test_a_change_of_directory_does_not_move_the_repository(self):
        status, answer = self.hostile("chdir")
        self.assertEqual(status, 200, answer)
        management = f"http://127.0.0.1:{self.server.management_port}/v2/repository"
        status, _, body = curl("-X", "POST", f"{management}/models/slow/unload")
        self.assertEqual(status, 200, body)
        status, _, body = curl("-X", "POST", f"{management}/models/slow/load")
        self.assertEqual(status, 200, body)
        status, _, body = curl("-T", os.path.join(self.root, "repository", "hostile", "1",
                                                  "model.orochi"),
                               f"{management}/models/hostile/versions/2")
        self.assertEqual(status, 400, body)  # read from the repository: its manifest says 1
        self.assertIn("uploaded as hostile version 2", json.loads(body)["error"])
        status, _, body = curl("-X", "POST", f"{management}/index")
        self.assertEqual(status, 200, body)
        self.assertEqual(sorted(entry["name"] for entry in json.loads(body)),
                         ["hostile", "slow"])
        self.assert_both_models_answer()

    def test_a_huge_error_message_is_cut_and_answered_at_once(self):
        started = time.monotonic()
        status, answer = self.hostile("huge_error")
        self.assertLess(time.monotonic() - started, 10)
        self.assertEqual(status, 500)
        self.assertLess(len(answer["error"]), 64 << 10)
        self.assertRegex(answer["error"], r"^ValueError: x+\n\.\.\. \d+ characters cut \.\.\.\n")
        self.assertIn('raise ValueError("x" * (16 << 20))', answer["error"])
        self.assert_both_models_answer()

    def test_outputs_under_keys_that_are_not_names_are_named(self):
        status, answer = self.hostile("odd_keys")
        self.assertEqual(status, 500)
        self.assertIn("predict() returned outputs [1, None] that the manifest does not declare",
                      answer["error"])


if __name__ == "__main__":
    unittest.main()
