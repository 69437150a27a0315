"""Copies stuck in model code, each test on its own server: a model past
models.max_abandoned_copies made unavailable, a model that fails to load into the copy
replacing a stuck one retried while the slot serves the others, and unloading a stuck model
within models.unload_grace_s.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_stuck_copies
"""

import json
import os
import shutil
import signal
import tempfile
import threading
import time
import unittest

from server_fixtures import (Server, curl, echo_request, pack_model, pack_repository, pack_variant,
                             post_json, slow_request)


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


# Starts a thread that sleeps in C with its copy's GIL held (ctypes.PyDLL keeps it), a moment
# after each load: every copy it is loaded into is stuck for good.
HOLDS_THE_GIL_INIT = """
import ctypes
import threading
import time


def hold():
    time.sleep(0.5)
    ctypes.PyDLL("libc.so.6").sleep(3600)


class Hangs:
    def __init__(self, context):
        threading.Thread(target=hold, daemon=True).start()

    def predict(self, inputs):
        return {"done": [True]}
"""


class StopWithHeldCopiesTest(unittest.TestCase):

    def test_a_stop_ends_the_process_though_model_code_holds_a_copy(self):
        # P4 of docs/HARDENING.md: after the drain, the teardown waited for copies whose GIL a
        # model thread held asleep in C, and the stopped server kept every port, for good.
        root = tempfile.mkdtemp(prefix="orochi-held-copies-test-")
        repository = pack_repository(root)
        os.makedirs(os.path.join(repository, "zgil", "1"))
        shutil.copy(pack_variant(root, "zgil", HOLDS_THE_GIL_INIT),
                    os.path.join(repository, "zgil", "1", "model.orochi"))
        server = Server(repository, {"models": {"execution_grace_ms": 300},
                                     "http": {"shutdown_delay_s": 0, "shutdown_grace_s": 2}},
                        copies=1)
        try:
            time.sleep(1)
            for _ in range(2):  # each copy replaced is held again by the reload
                request = echo_request()
                request["parameters"] = {"timeout": 300000}
                status, _, body = post_json(server, "/v2/models/echo/infer", request)
                self.assertEqual(status, 504, body)
                time.sleep(1.5)
            stopping = time.time()
            server.process.send_signal(signal.SIGTERM)
            self.assertEqual(server.process.wait(timeout=40), 0)
            self.assertLess(time.time() - stopping, 30)
            self.assertIn("the server's teardown did not end in time (a copy held by model "
                          "code); ending the process seconds=10", server.log_text())
        finally:
            server.stop()
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
