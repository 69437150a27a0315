"""Requests that run past their deadline in a server with one copy: Python interrupted and the
copy going on, a copy stuck in C code replaced, full queues, clients that hang up or
half-close, and model exceptions answered with their tracebacks.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_deadlines
"""

import json
import re
import socket
import threading
import time
import unittest

from server_fixtures import SharedServerTest, curl, echo_request, post_json, slow_request


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
        self.server.wait_for_log("interpreter copy replaced")
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


if __name__ == "__main__":
    unittest.main()
