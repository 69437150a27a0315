"""Loads under the watchdog: a model whose __init__ is stuck in C code (which no interrupt
reaches) past models.load_timeout_s. The load fails with the reason, the stuck interpreter copy
is abandoned and replaced as a copy stuck in predict is, the other models are served throughout,
the management API goes on answering, and a start with such a package in the repository serves
everything else. Once, the stuck copy kept its slot: out of service for good, and every later
load or unload that needed the slot, a start included, waited for it forever.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_load_watchdog
"""

import json
import os
import re
import shutil
import tempfile
import time
import unittest

from server_fixtures import (Server, curl, echo_request, pack_repository, pack_variant, post_json,
                             run_at_once, slow_request, start_upload)

# ctypes lets the GIL go around the call: the interrupt is queued, but nothing runs it until
# sleep() returns.
STUCK_IN_C_INIT = '''
import ctypes


class Hangs:
    def __init__(self, context):
        ctypes.CDLL("libc.so.6").sleep({seconds})

    def predict(self, inputs):
        return {{"done": [True]}}
'''

CONFIG = {"models": {"load_timeout_s": 1, "execution_grace_ms": 500}}
STUCK_REASON = ("loading model cstuck:1 did not finish within the load timeout of 1000 ms, and 1 "
                "interpreter copies did not stop when interrupted (stuck in C code); they were "
                "abandoned and replaced by fresh copies")


def copies(server) -> dict:
    _, _, body = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return {state: float(value) for state, value in re.findall(
        r'orochi_interpreter_copies\{state="(\w+)"\} ([\d.]+)', body.decode())}


def management(server, method: str, path: str) -> tuple[int, bytes, float]:
    began = time.time()
    status, _, body = curl("-X", method, f"http://127.0.0.1:{server.management_port}{path}")
    return status, body, time.time() - began


class LoadStuckInCTest(unittest.TestCase):

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-load-watchdog-test-")
        self.repository = pack_repository(self.root)

    def tearDown(self):
        shutil.rmtree(self.root)

    def assert_both_copies_serve(self, server):
        """Two 1 s requests at once end within 2 s only if two copies run them."""
        began = time.time()
        answers = run_at_once([lambda: post_json(server, "/v2/models/slow/infer",
                                                 slow_request("sleep", 1.0))] * 2)
        for status, _, body in answers:
            self.assertEqual(status, 200, body)
        self.assertLess(time.time() - began, 1.8, "one copy ran both requests")

    def test_an_upload_stuck_in_c_is_refused_and_its_copy_replaced(self):
        # Stuck for 6 s, then back: the load is refused at 1 s plus the 0.5 s grace.
        package = pack_variant(self.root, "cstuck", STUCK_IN_C_INIT.format(seconds=6))
        server = Server(self.repository, CONFIG, copies=2)
        try:
            deploying, upload = start_upload(server, package, "cstuck")
            slowest = 0.0
            while deploying.is_alive():  # the other models are served throughout
                began = time.time()
                status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
                self.assertEqual(status, 200, body)
                slowest = max(slowest, time.time() - began)
            deploying.join()
            status, _, body = upload["answer"]
            self.assertEqual(status, 504, body)
            self.assertIn(STUCK_REASON, json.loads(body)["error"])
            self.assertLess(upload["seconds"], 4)
            self.assertLess(slowest, 0.75)
            self.assertFalse(os.path.exists(os.path.join(self.repository, "cstuck", "1")))
            # The replacement is made, and logged, after the answer.
            server.wait_for_log("interpreter copy replaced")
            # The stuck copy is still loaded (its thread sleeps on in it), out of every count
            # but the abandoned ones.
            wanted = {"abandoned": 1, "abandoned_loaded": 1, "loading": 0, "idle": 2}
            deadline = time.time() + 5
            while {key: copies(server).get(key) for key in wanted} != wanted:
                self.assertLess(time.time(), deadline, copies(server))
                time.sleep(0.05)
            # Unloading a model from the replaced slot, and loading it back, need that slot:
            # both answer at once, while the stuck call still sleeps.
            status, body, seconds = management(server, "POST",
                                               "/v2/repository/models/echo/unload")
            self.assertEqual(status, 200, body)
            self.assertLess(seconds, 2)
            status, body, seconds = management(server, "POST", "/v2/repository/models/echo/load")
            self.assertEqual(status, 200, body)
            self.assertLess(seconds, 2)
            self.assert_both_copies_serve(server)
            # The stuck call returns at last: its copy is unloaded and no longer counted.
            deadline = time.time() + 10
            while (copies(server)["abandoned"], copies(server)["abandoned_loaded"]) != (0, 0):
                self.assertLess(time.time(), deadline, copies(server))
                time.sleep(0.1)
            status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
            self.assertEqual(status, 200, body)
        finally:
            self.assertEqual(server.stop(), 0)

    def test_a_start_with_a_package_stuck_in_c_serves_everything_else(self):
        # Stuck for good. "cstuck" sorts before the other models: each of them loads into the
        # slot it got stuck in.
        package = pack_variant(self.root, "cstuck", STUCK_IN_C_INIT.format(seconds=100000))
        target = os.path.join(self.repository, "cstuck", "1")
        os.makedirs(target)
        shutil.copy(package, os.path.join(target, "model.orochi"))
        began = time.time()
        server = Server(self.repository, CONFIG, copies=2)  # waits for `serving`
        try:
            self.assertLess(time.time() - began, 30)
            status, body, _ = management(server, "POST", "/v2/repository/index")
            self.assertEqual(status, 200, body)
            stuck = [entry for entry in json.loads(body) if entry["name"] == "cstuck"]
            self.assertEqual(stuck[0]["state"], "UNAVAILABLE", stuck)
            self.assertIn(STUCK_REASON, stuck[0]["reason"])
            status, _, body = post_json(server, "/v2/models/echo/infer", echo_request())
            self.assertEqual(status, 200, body)
            self.assert_both_copies_serve(server)
            state = copies(server)
            self.assertEqual((state["abandoned"], state["loading"]), (1, 0), state)
            status, body, seconds = management(server, "POST",
                                               "/v2/repository/models/slow/unload")
            self.assertEqual(status, 200, body)
            self.assertLess(seconds, 2)
        finally:
            self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main()
