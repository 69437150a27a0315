"""Graceful shutdown: SIGTERM answers the requests in flight, serves through
http.shutdown_delay_s while reporting not ready, leaves a copy that never returns behind
after http.shutdown_grace_s, and a second signal skips the delay.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_shutdown
"""

import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import unittest

from server_fixtures import (Server, curl, echo_request, pack_model, pack_repository, pack_variant,
                             post_json, slow_request)

SLOW_START = """
import time


class Hangs:
    def __init__(self, context):
        time.sleep(2)

    def predict(self, inputs, parameters):
        return {}
"""


class ShutdownTest(unittest.TestCase):
    def test_sigterm_while_the_serving_process_restarts_stops_cleanly(self):
        # The restarted serving process loads a model for 2 s: SIGTERM comes while it starts,
        # before it handles signals, and must still be a stop, not a failure.
        root = tempfile.mkdtemp(prefix="orochi-shutdown-restart-test-")
        try:
            repository = pack_repository(root)
            pack_model(repository, "hostile")
            os.makedirs(os.path.join(repository, "slow_start", "1"))
            os.rename(pack_variant(root, "slow_start", SLOW_START),
                      os.path.join(repository, "slow_start", "1", "model.orochi"))
            server = Server(repository, {}, copies=1)
            self.addCleanup(lambda: server.process.poll() is None and server.process.kill())
            status, _, _ = post_json(server, "/v2/models/hostile/infer", {"inputs": [
                {"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["segfault"]}]})
            self.assertEqual(status, 0, "the serving process died without an answer")
            deadline = time.time() + 10
            while "restarting it" not in server.log_text() and time.time() < deadline:
                time.sleep(0.02)
            time.sleep(0.5)  # the new serving process is loading slow_start
            self.assertEqual(server.log_text().count(" info serving "), 1, server.log_text())
            server.process.send_signal(signal.SIGTERM)
            self.assertEqual(server.process.wait(timeout=30), 0, server.log_text())
            self.assertNotIn("died as the server stopped", server.log_text())
        finally:
            shutil.rmtree(root)

    def test_sigterm_exits_within_the_grace_even_with_a_copy_that_never_returns(self):
        # No deadline (default_timeout_ms 0): nothing interrupts the spinning model, so only the
        # grace period can end the shutdown.
        root = tempfile.mkdtemp(prefix="orochi-shutdown-stuck-test-")
        try:
            server = Server(pack_repository(root), {"http": {"shutdown_grace_s": 2}})
            self.addCleanup(lambda: server.process.poll() is None and server.process.kill())
            results = []
            spinner = threading.Thread(target=lambda: results.append(
                post_json(server, "/v2/models/slow/infer", slow_request("spin"))))
            spinner.start()
            time.sleep(0.5)  # running in a copy
            start = time.time()
            server.process.send_signal(signal.SIGTERM)
            code = server.process.wait(timeout=30)
            elapsed = time.time() - start
            spinner.join()
            log = server.log_text()
            self.assertLess(elapsed, 2 + 3, log)
            self.assertGreaterEqual(elapsed, 2, "the grace period was not given")
            self.assertEqual(code, 1, log)
            self.assertRegex(log, r"interpreter copy stuck at shutdown; leaving it behind "
                                  r"model=slow:1 copy=\d running_ms=\d+")
            self.assertIn("stopped unanswered_requests=1 stuck_copies=1", log)
            self.assertIn("exiting without unloading", log)
            # The stuck request was answered before the exit.
            status, _, body = results[0]
            self.assertEqual(status, 503, body)
            self.assertIn("did not return within the shutdown grace period",
                          json.loads(body)["error"])
            server.stop()
        finally:
            shutil.rmtree(root)

    def test_sigterm_answers_requests_in_flight_then_exits_zero(self):
        root = tempfile.mkdtemp(prefix="orochi-shutdown-test-")
        try:
            server = Server(pack_repository(root), {})
            sleeper = {"inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1],
                                   "data": ["sleep"]},
                                  {"name": "seconds", "datatype": "FP64", "shape": [1],
                                   "data": [1.0]}]}
            results = []
            threads = [threading.Thread(target=lambda: results.append(
                post_json(server, "/v2/models/slow/infer", sleeper)[0])) for _ in range(2)]
            for thread in threads:
                thread.start()
            time.sleep(0.3)
            server.process.send_signal(signal.SIGTERM)
            for thread in threads:
                thread.join()
            self.assertEqual(results, [200, 200])
            self.assertEqual(server.process.wait(timeout=30), 0)
            self.assertIn("stopped unanswered_requests=0 stuck_copies=0", server.log_text())
            server.stop()
        finally:
            shutil.rmtree(root)

    def test_sigterm_reports_not_ready_but_serves_through_the_shutdown_delay(self):
        root = tempfile.mkdtemp(prefix="orochi-shutdown-delay-test-")
        try:
            delay, grace = 3, 5
            server = Server(pack_repository(root),
                            {"http": {"shutdown_delay_s": delay, "shutdown_grace_s": grace}})
            self.addCleanup(lambda: server.process.poll() is None and server.process.kill())
            self.assertEqual(curl(server.url("/v2/health/ready"))[0], 200)
            # A keep-alive connection opened before the signal.
            kept = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            self.addCleanup(kept.close)
            live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
            kept.sendall(live)
            answer = kept.recv(65536)
            self.assertIn(b" 200 ", answer.split(b"\r\n")[0])
            self.assertNotIn(b"Connection: close", answer)
            start = time.time()
            server.process.send_signal(signal.SIGTERM)  # the supervisor, which passes it on
            while curl(server.url("/v2/health/ready"))[0] != 503:
                self.assertLess(time.time() - start, 1.5, "still ready after SIGTERM")
                time.sleep(0.02)
            # Its next request is answered, and the connection closed after it: the client
            # reconnects, through a balancer that by then routes elsewhere.
            kept.sendall(live)
            answer = b""
            while chunk := kept.recv(65536):  # to the end: the server closes it
                answer += chunk
            self.assertIn(b" 200 ", answer.split(b"\r\n")[0])
            self.assertIn(b"Connection: close", answer)
            self.assertLess(time.time() - start, delay, "closed only at the exit")
            # Until the delay ends, every listener takes new connections (each curl is one)
            # and answers them: a load balancer that has not yet noticed loses nothing.
            answered = 0
            while time.time() - start < delay - 1:
                status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
                self.assertEqual(status, 200, body)
                self.assertEqual(curl(server.url("/v2/health/live"))[0], 200)
                self.assertEqual(curl(server.url("/v2/health/ready"))[0], 503)
                self.assertEqual(curl(f"http://127.0.0.1:{server.metrics_port}/metrics")[0], 200)
                self.assertEqual(curl("-X", "POST", f"http://127.0.0.1:{server.management_port}"
                                      "/v2/repository/index")[0], 200)
                answered += 1
            self.assertGreater(answered, 0)
            code = server.process.wait(timeout=delay + grace + 10)
            elapsed = time.time() - start
            log = server.log_text()
            self.assertEqual(code, 0, log)
            self.assertGreaterEqual(elapsed, delay, "the shutdown delay was not given")
            self.assertLess(elapsed, delay + grace, log)
            self.assertIn("not ready; still serving until the shutdown delay ends "
                          f"shutdown_delay_s={delay}", log)
            self.assertIn("stopped unanswered_requests=0 stuck_copies=0", log)
            server.stop()
        finally:
            shutil.rmtree(root)

    def test_a_second_sigterm_or_a_sigint_skips_the_shutdown_delay(self):
        root = tempfile.mkdtemp(prefix="orochi-shutdown-skip-test-")
        try:
            repository = pack_repository(root)
            for signals in ([signal.SIGTERM, signal.SIGTERM], [signal.SIGINT]):
                server = Server(repository, {"http": {"shutdown_delay_s": 60}})
                self.addCleanup(lambda server=server: server.process.poll() is None
                                and server.process.kill())
                start = time.time()
                for number in signals:
                    server.process.send_signal(number)
                    time.sleep(0.3)
                code = server.process.wait(timeout=30)
                self.assertEqual(code, 0, server.log_text())
                self.assertLess(time.time() - start, 10, f"{signals}: {server.log_text()}")
                server.stop()
        finally:
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
