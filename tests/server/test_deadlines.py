"""Requests that run past their deadline and copies stuck in model code: interrupts, the
execution grace, full queues, clients that hang up, replaced and abandoned copies
(models.max_abandoned_copies), a replacement a model fails to load into, and unloading a
stuck model within models.unload_grace_s.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_deadlines
"""

import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
import unittest

from server_fixtures import (Server, SharedServerTest, curl, echo_request, pack_model,
                             pack_repository, post_json, slow_request)


class DeadlineTest(SharedServerTest):
    """Requests still running at their deadline, in a server with one copy."""

    CONFIG = {"models": {"execution_grace_ms": 500, "max_queue_size": 1}}
    COPIES = 1

    def test_python_that_never_returns_is_interrupted_and_the_copy_goes_on(self):
        replaced_before = self.server.log_text().count("interpreter copy replaced")
        start = time.time()
        status, _, body = post_json(self.server, "/v2/models/slow/infer",
                                    slow_request("spin", timeout_us=300000))
        elapsed = time.time() - start
        self.assertEqual(status, 504, body)
        self.assertIn("ran past its deadline and was interrupted", json.loads(body)["error"])
        self.assertLess(elapsed, 0.3 + 0.5 + 0.5)  # deadline + grace + slack
        status, _, body = post_json(self.server, "/v2/models/slow/infer", slow_request("sleep", 0.01))
        self.assertEqual(status, 200, body)
        self.assertEqual(self.server.log_text().count("interpreter copy replaced"), replaced_before,
                         "an interrupt that works needs no new copy")

    def test_a_full_queue_answers_503(self):
        running = threading.Thread(target=post_json, args=(
            self.server, "/v2/models/slow/infer", slow_request("sleep", 0.6)))
        running.start()
        time.sleep(0.15)  # the one copy is busy
        waiting = threading.Thread(target=post_json, args=(
            self.server, "/v2/models/slow/infer", slow_request("sleep", 0.01)))
        waiting.start()
        time.sleep(0.15)  # the queue (size 1) is full
        status, _, body = post_json(self.server, "/v2/models/slow/infer", slow_request("sleep"))
        running.join()
        waiting.join()
        self.assertEqual(status, 503, body)
        self.assertIn("the queue of model slow:1 is full (1 waiting requests); retry later",
                      json.loads(body)["error"])

    def test_a_request_whose_client_hung_up_is_not_run(self):
        running = threading.Thread(target=post_json, args=(
            self.server, "/v2/models/slow/infer", slow_request("sleep", 0.8)))
        running.start()
        time.sleep(0.15)  # the one copy is busy; the next request waits in the queue
        gone = curl("--max-time", "0.3", "-X", "POST", self.server.url("/v2/models/slow/infer"),
                    data=json.dumps(slow_request("sleep", 1.0)).encode())
        self.assertEqual(gone[0], 0, "curl gave up before an answer")
        running.join()
        start = time.time()
        status, _, _ = post_json(self.server, "/v2/models/slow/infer", slow_request("sleep", 0.01))
        self.assertEqual(status, 200)
        self.assertLess(time.time() - start, 0.5, "the abandoned 1 s request ran")
        _, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        self.assertRegex(metrics.decode(), r'orochi_inference_requests_total\{model="slow",'
                                           r'reason="client_gone",version="1"\} 1')
        # Not counted as a client error: nginx's 499.
        self.assertRegex(metrics.decode(), r'orochi_http_requests_total\{method="POST",'
                                           r'route="/v2/models/\{model\}/infer",status="499"\} 1')

    def test_a_client_that_half_closes_after_its_request_gets_the_answer(self):
        body = json.dumps(slow_request("sleep", 0.5)).encode()
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
            sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            sock.shutdown(socket.SHUT_WR)  # done sending; still reading
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        final = received[received.rindex(b"HTTP/1.1 "):]
        self.assertTrue(final.startswith(b"HTTP/1.1 200"), received)
        self.assertIn(b'"model_name":"slow"', final)

    def test_an_exception_in_the_model_is_a_500_with_the_traceback(self):
        status, _, body = post_json(self.server, "/v2/models/slow/infer", slow_request("fail", 2))
        self.assertEqual(status, 500, body)
        error = json.loads(body)["error"]
        self.assertIn("ValueError: asked to fail after 2.0 s", error)
        self.assertIn("<package slow:1>/code/model.py", error)
        self.assertIn("raise ValueError", error)

    def test_a_traceback_shows_the_source_lines_of_stdlib_frames(self):
        status, _, body = post_json(self.server, "/v2/models/slow/infer",
                                    slow_request("fail_in_stdlib", 0))
        self.assertEqual(status, 500, body)
        error = json.loads(body)["error"]
        self.assertIn('File "<stdlib>/json/decoder.py", line', error)
        # The line itself, read from the sources shipped in the embedded stdlib archive.
        self.assertIn("obj, end = self.scan_once(s, idx)", error)

    def test_a_copy_stuck_in_c_code_is_replaced(self):
        def metrics():
            return curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")[2].decode()

        def sample(text, pattern):
            found = re.search("^" + pattern + r" (\S+)$", text, re.MULTILINE)
            return float(found.group(1)) if found else 0.0

        before = metrics()
        start = time.time()
        status, _, body = post_json(self.server, "/v2/models/slow/infer",
                                    slow_request("block", timeout_us=300000))
        elapsed = time.time() - start
        self.assertEqual(status, 504, body)
        self.assertIn("did not stop within the grace period of 500 ms; its interpreter copy was "
                      "replaced", json.loads(body)["error"])
        self.assertLess(elapsed, 0.3 + 0.5 + 1.0)
        # The fresh copy has the models loaded and serves.
        for model, request in (("slow", slow_request("sleep", 0.01)), ("echo", echo_request())):
            status, _, body = post_json(self.server, f"/v2/models/{model}/infer", request)
            self.assertEqual(status, 200, body)
        self.assertIn("interpreter copy replaced", self.server.log_text())
        _, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        self.assertEqual(sample(metrics.decode(), "orochi_copies_replaced_total"),
                         sample(before, "orochi_copies_replaced_total") + 1)
        # The batch the watchdog answered counts as a batch, and its time as the copy's busy
        # time (its stuck thread never reports it): about the 0.3 s deadline plus the 0.5 s grace.
        batches = r'orochi_batch_size_count\{model="slow",version="1"\}'
        self.assertEqual(sample(metrics.decode(), batches), sample(before, batches) + 2)
        def busy_seconds(text):
            return sum(float(value) for value in
                       re.findall(r'orochi_copy_busy_seconds_total\{copy="\d+"\} (\S+)', text))

        self.assertGreaterEqual(busy_seconds(metrics.decode()) - busy_seconds(before), 0.3 + 0.5)
        # The abandoned copy is still stuck, but its batch was answered: no copy is busy.
        self.assertIn('orochi_interpreter_copies{state="busy"} 0', metrics.decode())
        self.assertIn('orochi_interpreter_copies{state="idle"} 1', metrics.decode())
        self.assertIn('orochi_interpreter_copies{state="missing_models"} 0', metrics.decode())


class AbandonedCopiesTest(unittest.TestCase):
    """models.max_abandoned_copies: a model that got copies stuck too often is made unavailable."""

    def test_a_model_past_the_cap_is_unavailable_and_the_others_still_serve(self):
        root = tempfile.mkdtemp(prefix="orochi-abandoned-test-")
        server = Server(pack_repository(root),
                        {"models": {"execution_grace_ms": 300, "max_abandoned_copies": 1}})
        try:
            status, _, body = post_json(server, "/v2/models/slow/infer",
                                        slow_request("block", timeout_us=200000))
            self.assertEqual(status, 504, body)
            reason = ("model slow:1 is unavailable: 1 interpreter copies are abandoned while stuck "
                      "(the limit is models.max_abandoned_copies = 1), the last in this model's "
                      "code; unload and load it, or deploy another version")
            status, _, body = post_json(server, "/v2/models/slow/infer", slow_request("sleep"))
            self.assertEqual((status, json.loads(body)["error"]), (503, reason))
            status, _, body = curl(server.url("/v2/models/slow/ready"))
            self.assertEqual((status, json.loads(body)["error"]), (503, reason))
            status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
            self.assertEqual(status, 200, body)
            _, _, index = curl("-X", "POST",
                               f"http://127.0.0.1:{server.management_port}/v2/repository/index")
            slow = [entry for entry in json.loads(index) if entry["name"] == "slow"]
            self.assertEqual(slow, [{"name": "slow", "version": "1", "state": "UNAVAILABLE",
                                     "reason": reason}])
            _, _, metrics = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertIn('orochi_interpreter_copies{state="abandoned"} 1', metrics.decode())
            self.assertIn("model made unavailable: its code got too many copies stuck model=slow:1",
                          server.log_text())
        finally:
            server.stop()
            shutil.rmtree(root)


class FailedReplacementTest(unittest.TestCase):
    """A model that fails to load into the copy replacing a stuck one: the slot serves the other
    models, the model is refused with the reason while no copy holds it, and the load is retried
    until it works."""

    def test_the_slot_serves_what_loaded_and_retries_the_rest(self):
        root = tempfile.mkdtemp(prefix="orochi-failed-replacement-test-")
        repository = pack_repository(root)
        pack_model(repository, "gated")
        gate = os.path.join(root, "gate")
        server = Server(repository, {"models": {"execution_grace_ms": 300}}, copies=1,
                        env={"OROCHI_TEST_GATE_FILE": gate})
        gated_request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                     "data": [2.5]}]}
        try:
            open(gate, "w").close()  # loaded at startup; from now on its loads fail
            status, _, body = post_json(server, "/v2/models/slow/infer",
                                        slow_request("block", timeout_us=200000))
            self.assertEqual(status, 504, body)
            # The fresh copy serves the models that loaded into it...
            status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
            self.assertEqual(status, 200, body)
            # ...and refuses the one that did not, saying why, rather than queue it for good.
            status, _, body = post_json(server, "/v2/models/gated/infer", gated_request)
            self.assertEqual(status, 503, body)
            error = json.loads(body)["error"]
            self.assertIn("model gated:1 has no interpreter copy to run in: loading it into the "
                          "replacement of a stuck copy failed", error)
            self.assertIn("refused by the test while", error)
            self.assertEqual(curl(server.url("/v2/models/gated/ready"))[0], 503)
            _, _, metrics = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertIn('orochi_interpreter_copies{state="missing_models"} 1', metrics.decode())
            self.assertIn('orochi_interpreter_copies{state="failed"} 0', metrics.decode())
            self.assertIn('orochi_interpreter_copies{state="busy"} 0', metrics.decode())
            self.assertRegex(server.log_text(),
                             r"error loading a model into the replacement of a stuck interpreter "
                             r"copy failed; the copy serves its other models until a retry works "
                             r"copy=0 model=gated:1 attempt=1 retry_in_ms=1000 error=\"reloading "
                             r"model gated:1 in interpreter copy 1: .*refused by the test")
            # Retried after 1 s, 2 s...: served again once its load works.
            os.remove(gate)
            deadline = time.time() + 15
            while time.time() < deadline:
                status, _, body = post_json(server, "/v2/models/gated/infer", gated_request)
                if status == 200:
                    break
                time.sleep(0.2)
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["outputs"][0]["data"], [2.5])
            self.assertEqual(curl(server.url("/v2/models/gated/ready"))[0], 200)
            _, _, metrics = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertIn('orochi_interpreter_copies{state="missing_models"} 0', metrics.decode())
            self.assertRegex(server.log_text(), r"info the replacement of a stuck interpreter copy "
                                                r"recovered copy=0 failed_attempts=\d")
        finally:
            server.stop()
            shutil.rmtree(root)


class UnloadGraceTest(unittest.TestCase):
    """models.unload_grace_s: unloading a model stuck with no deadline answers within the grace."""

    def test_unloading_a_stuck_model_interrupts_or_abandons_its_copies_and_answers(self):
        root = tempfile.mkdtemp(prefix="orochi-unload-grace-test-")
        server = Server(pack_repository(root),
                        {"models": {"unload_grace_s": 1, "execution_grace_ms": 300}})
        try:
            answers = {}

            def infer(mode):
                status, _, body = post_json(server, "/v2/models/slow/infer", slow_request(mode))
                answers[mode] = (status, json.loads(body)["error"] if body else "")

            # No deadline: C code that ignores interrupts on one copy, Python that only an
            # interrupt stops on the other.
            threads = [threading.Thread(target=infer, args=(mode,)) for mode in ("block", "spin")]
            for thread in threads:
                thread.start()
                time.sleep(0.3)
            start = time.time()
            status, _, body = curl("-X", "POST", f"http://127.0.0.1:{server.management_port}"
                                                 "/v2/repository/models/slow/unload")
            elapsed = time.time() - start
            self.assertEqual(status, 200, body)
            self.assertLess(elapsed, 1 + 0.3 + 3, "the unload waited past its grace")
            message = json.loads(body)["message"]
            self.assertIn("model 'slow' version 1 was unloaded, but 1 interpreter copy(ies) still "
                          "running its code after models.unload_grace_s (1 s) ignored the "
                          "interrupt and were abandoned", message)
            for thread in threads:
                thread.join(timeout=10)
            self.assertEqual(answers["block"][0], 503, answers)
            self.assertIn("did not finish within the unload grace period nor stop when "
                          "interrupted, and its interpreter copy was replaced", answers["block"][1])
            self.assertEqual(answers["spin"][0], 503, answers)
            self.assertIn("did not finish within the unload grace period and was interrupted",
                          answers["spin"][1])
            # Healthy: the other models are served on both copies, the slow one is gone.
            self.assertEqual(curl(server.url("/v2/health/ready"))[0], 200)
            for _ in range(4):
                status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
                self.assertEqual(status, 200, body)
            self.assertEqual(post_json(server, "/v2/models/slow/infer", slow_request("sleep"))[0],
                             404)
            self.assertIn("model unloaded model=slow version=1 abandoned_copies=1",
                          server.log_text())
            # Loaded again, it is served again, from the fresh copy too.
            status, _, body = curl("-X", "POST", f"http://127.0.0.1:{server.management_port}"
                                                 "/v2/repository/models/slow/load")
            self.assertEqual(status, 200, body)
            for _ in range(4):
                status, _, body = post_json(server, "/v2/models/slow/infer",
                                            slow_request("sleep", 0.01))
                self.assertEqual(status, 200, body)
        finally:
            server.stop()
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
