"""Stateful models (Triton's sequence batcher) against the real `orochi serve`: requests carrying
sequence_id, sequence_start and sequence_end over HTTP and gRPC keep their sequence's state in
order in one copy; concurrent sequences do not mix; unknown, ended and expired ids are 400; the
limit on live sequences is refused clearly; an unload drops them; a copy replaced while stuck,
or the serving process crashed by model code, fails its sequences clearly and the server goes on
serving.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_sequences
"""

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

import grpc

from server_fixtures import BINARY, Server, curl, metric, metric_series, post_json
import test_grpc  # the client generated from the server's proto

pb, pb_grpc = test_grpc.pb, test_grpc.pb_grpc
HERE = os.path.dirname(os.path.abspath(__file__))
ACCUMULATOR = os.path.join(HERE, "..", "..", "models", "accumulator")

# A stateful test model with a short idle timeout and a small limit, and requests that get its
# copy replaced (C code that ignores the interrupt) or crash the serving process.
COUNTER_MANIFEST = {
    "format_version": 1, "name": "counter", "version": 1, "entry": "model:Counter",
    "inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1]}],
    "outputs": [{"name": "count", "datatype": "INT64", "shape": [1]},
                {"name": "pid", "datatype": "INT64", "shape": [1]}],
    "sequence": {"idle_timeout_ms": 3000, "max_sequences_per_copy": 3},
}

COUNTER_CODE = '''
import ctypes
import os


class Counter:
    def __init__(self, context):
        pass

    def predict(self, inputs, state):
        mode = inputs["mode"][0].decode()
        if mode == "csleep":  # C code that ignores the interrupt: the copy is replaced
            ctypes.CDLL("libc.so.6").sleep(3)
        elif mode == "segfault":  # a native crash: the serving process restarts
            ctypes.string_at(0)
        state["count"] = state.get("count", 0) + 1
        return {"count": [state["count"]], "pid": [os.getpid()]}
'''


def sequence_parameters(sequence_id, start=False, end=False, timeout_us=None) -> dict:
    parameters = {"sequence_id": sequence_id}
    if start:
        parameters["sequence_start"] = True
    if end:
        parameters["sequence_end"] = True
    if timeout_us is not None:
        parameters["timeout"] = timeout_us
    return parameters


class SequencesTest(unittest.TestCase):
    # Two copies, so that sequences are spread over copies and one copy can be lost alone.
    CONFIG = {"models": {"execution_grace_ms": 300}}

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-sequences-")
        cls.repository = os.path.join(cls.root, "repository")
        counter = os.path.join(cls.root, "counter")
        os.makedirs(os.path.join(counter, "code"))
        with open(os.path.join(counter, "manifest.json"), "w") as file:
            json.dump(COUNTER_MANIFEST, file)
        with open(os.path.join(counter, "code", "model.py"), "w") as file:
            file.write(COUNTER_CODE)
        for name, directory in (("accumulator", ACCUMULATOR), ("counter", counter)):
            target = os.path.join(cls.repository, name, "1")
            os.makedirs(target)
            subprocess.run([BINARY, "pack", directory, "-o", os.path.join(target, "model.orochi")],
                           check=True, capture_output=True)
        cls.server = Server(cls.repository, cls.CONFIG, copies=2)
        cls.server.wait_for_serving(1)
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        code = cls.server.stop()
        shutil.rmtree(cls.root)
        assert code == 0, f"orochi serve exited with {code}"

    def add(self, sequence_id, value, **flags):
        """(status, body) of one accumulator request over HTTP."""
        status, _, body = post_json(self.server, "/v2/models/accumulator/infer", {
            "parameters": sequence_parameters(sequence_id, **flags),
            "inputs": [{"name": "value", "datatype": "FP64", "shape": [1], "data": [value]}]})
        return status, json.loads(body)

    def total(self, sequence_id, value, **flags):
        status, body = self.add(sequence_id, value, **flags)
        self.assertEqual(status, 200, body)
        outputs = {output["name"]: output["data"][0] for output in body["outputs"]}
        return outputs["total"], outputs["count"]

    def count(self, sequence_id, mode="", **flags):
        """(status, body) of one counter request over HTTP."""
        status, _, body = post_json(self.server, "/v2/models/counter/infer", {
            "parameters": sequence_parameters(sequence_id, **flags),
            "inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1], "data": [mode]}]})
        return status, (json.loads(body) if body else {})

    def test_sequence_series_exist_from_the_load_for_stateful_models_only(self):
        for model in ("accumulator", "counter"):
            ended = {labels for labels in metric_series(self.server, "orochi_sequences_ended_total")
                     if f'model="{model}"' in labels}
            self.assertEqual({re.search(r'reason="(\w+)"', labels).group(1) for labels in ended},
                             {"end", "restarted", "expired", "lost", "unloaded",
                              "never_started"}, model)
            self.assertIn(f'model="{model}",version="1"',
                          metric_series(self.server, "orochi_live_sequences"))
        self.assertFalse([labels for labels in metric_series(self.server, "orochi_streams_total")
                          if 'model="accumulator"' in labels])

    def test_state_is_kept_in_order_over_http_and_freed_by_the_end(self):
        ended = metric(self.server, "orochi_sequences_ended_total", model="accumulator",
                       reason="end")
        self.assertEqual(self.total(11, 1.0, start=True), (1.0, 1))
        self.assertEqual(self.total(11, 2.0), (3.0, 2))
        self.assertEqual(self.total(11, 3.5), (6.5, 3))
        self.assertEqual(self.total(11, 4.0, end=True), (10.5, 4))
        self.assertEqual(metric(self.server, "orochi_sequences_ended_total", model="accumulator",
                                reason="end"), ended + 1)
        # Ended: its id is no longer live, and starting it again begins from nothing.
        status, body = self.add(11, 1.0)
        self.assertEqual(status, 400, body)
        self.assertIn("sequence 11 of model accumulator:1 is not live", body["error"])
        self.assertEqual(self.total(11, 5.0, start=True), (5.0, 1))
        # A start on a live id restarts it, as Triton does.
        self.assertEqual(self.total(11, 7.0, start=True), (7.0, 1))
        self.assertEqual(self.total(11, 0.0, end=True), (7.0, 2))

    def test_state_is_kept_over_grpc_with_string_and_uint64_ids(self):
        def call(sequence_id, value, start=False, end=False):
            request = pb.ModelInferRequest(model_name="accumulator")
            if isinstance(sequence_id, str):
                request.parameters["sequence_id"].string_param = sequence_id
            else:
                request.parameters["sequence_id"].uint64_param = sequence_id
            if start:
                request.parameters["sequence_start"].bool_param = True
            if end:
                request.parameters["sequence_end"].bool_param = True
            tensor = request.inputs.add(name="value", datatype="FP64", shape=[1])
            tensor.contents.fp64_contents.append(value)
            response = self.stub.ModelInfer(request, timeout=30)
            totals = {}
            for output, raw in zip(response.outputs, response.raw_output_contents):
                totals[output.name] = raw
            import struct
            return struct.unpack("<d", totals["total"])[0], struct.unpack("<q", totals["count"])[0]

        big = 2**64 - 1
        self.assertEqual(call("user-7", 2.0, start=True), (2.0, 1))
        self.assertEqual(call(big, 10.0, start=True), (10.0, 1))
        self.assertEqual(call("user-7", 3.0), (5.0, 2))
        self.assertEqual(call(big, 1.0), (11.0, 2))
        # The string "7" and the number 7 are two sequences.
        self.assertEqual(call("7", 1.0, start=True), (1.0, 1))
        with self.assertRaises(grpc.RpcError) as raised:
            call(7, 1.0)
        self.assertEqual(raised.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("sequence 7 of model accumulator:1 is not live", raised.exception.details())
        self.assertEqual(call("user-7", 0.0, end=True), (5.0, 3))
        self.assertEqual(call(big, 0.0, end=True), (11.0, 3))
        self.assertEqual(call("7", 0.0, end=True), (1.0, 2))

    def test_concurrent_sequences_do_not_mix(self):
        ids = [f"mix-{i}" for i in range(8)]

        def run(index):
            sequence_id = ids[index]
            totals = [self.total(sequence_id, float(index), start=True)[0]]
            for _ in range(4):
                totals.append(self.total(sequence_id, float(index))[0])
            totals.append(self.total(sequence_id, float(index), end=True)[0])
            return totals

        with concurrent.futures.ThreadPoolExecutor(len(ids)) as pool:
            results = list(pool.map(run, range(len(ids))))
        for index, totals in enumerate(results):
            self.assertEqual(totals, [index * n for n in range(1, 7)], index)

    def test_requests_of_one_sequence_sent_at_once_run_one_at_a_time_in_arrival_order(self):
        self.total("burst", 1.0, start=True)
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda _: self.total("burst", 1.0), range(12)))
        # Each ran alone with the state its predecessor left: every running count once.
        self.assertEqual(sorted(count for _, count in results), list(range(2, 14)))
        self.assertEqual(sorted(total for total, _ in results), [float(n) for n in range(2, 14)])
        self.assertEqual(self.total("burst", 0.0, end=True), (13.0, 14))

    def test_requests_without_a_live_sequence_are_refused_naming_it(self):
        status, body = self.add(424242, 1.0)
        self.assertEqual(status, 400, body)
        self.assertIn("sequence 424242 of model accumulator:1 is not live: a sequence begins with "
                      "a request that sets sequence_start", body["error"])
        status, body = self.add("nobody", 1.0, end=True)
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "nobody" of model accumulator:1 is not live', body["error"])
        status, _, raw = post_json(self.server, "/v2/models/accumulator/infer", {
            "inputs": [{"name": "value", "datatype": "FP64", "shape": [1], "data": [1.0]}]})
        self.assertEqual(status, 400)
        self.assertIn("model accumulator is stateful: each request names its sequence",
                      json.loads(raw)["error"])
        status, body = self.add(-3, 1.0, start=True)
        self.assertEqual(status, 400, body)
        self.assertIn("'sequence_id' must be an unsigned integer or a non-empty string",
                      body["error"])

    def test_an_idle_sequence_expires_after_the_timeout(self):
        expired = metric(self.server, "orochi_sequences_ended_total", model="counter",
                         reason="expired")
        status, body = self.count("idle", start=True)
        self.assertEqual(status, 200, body)
        status, body = self.count("idle")
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [2]), body)
        time.sleep(3.5)  # past the counter's idle timeout of 3 s
        status, body = self.count("idle")
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "idle" of model counter:1 expired: it had no request for 3000 ms',
                      body["error"])
        self.assertEqual(metric(self.server, "orochi_sequences_ended_total", model="counter",
                                reason="expired"), expired + 1)
        status, body = self.count("idle", start=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [1]), body)
        self.assertEqual(self.count("idle", end=True)[0], 200)

    def test_a_start_answered_without_running_leaves_no_sequence(self):
        never = metric(self.server, "orochi_sequences_ended_total", model="counter",
                       reason="never_started")
        live = metric(self.server, "orochi_live_sequences", model="counter")
        # A deadline of 1 us has passed by the time a copy takes the request: it never runs.
        status, body = self.count("unstarted", start=True, timeout_us=1)
        self.assertNotEqual(status, 200, body)
        self.assertIn("deadline", body["error"])
        self.assertEqual(metric(self.server, "orochi_live_sequences", model="counter"), live)
        self.assertEqual(metric(self.server, "orochi_sequences_ended_total", model="counter",
                                reason="never_started"), never + 1)
        status, body = self.count("unstarted")
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "unstarted" of model counter:1 never started: its sequence_start '
                      "request did not run (its deadline expired in the queue)", body["error"])
        status, body = self.count("unstarted", start=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [1]), body)
        self.assertEqual(self.count("unstarted", end=True)[0], 200)

    def test_live_sequences_past_the_limit_are_refused(self):
        # 3 per copy, 2 copies.
        ids = [f"limit-{i}" for i in range(6)]
        try:
            for sequence_id in ids:
                status, body = self.count(sequence_id, start=True)
                self.assertEqual(status, 200, body)
            self.assertEqual(metric(self.server, "orochi_live_sequences", model="counter"), 6)
            status, body = self.count("limit-7", start=True)
            self.assertEqual(status, 503, body)
            self.assertIn("model counter:1 holds 6 live sequences, its limit of 3 on each of its "
                          "copies (sequence.max_sequences_per_copy)", body["error"])
            # An end frees a place.
            self.assertEqual(self.count(ids.pop(), end=True)[0], 200)
            status, body = self.count("limit-7", start=True)
            self.assertEqual(status, 200, body)
            ids.append("limit-7")
        finally:
            for sequence_id in ids:
                self.count(sequence_id, end=True)
        self.assertEqual(metric(self.server, "orochi_live_sequences", model="counter"), 0)

    def test_a_replaced_copy_fails_its_sequences_and_never_hands_them_on(self):
        lost = metric(self.server, "orochi_sequences_ended_total", model="counter", reason="lost")
        # Two sequences, one on each copy (a new sequence goes to the copy with fewest).
        pids = {}
        for sequence_id in ("left", "right"):
            status, body = self.count(sequence_id, start=True)
            self.assertEqual(status, 200, body)
            pids[sequence_id] = body["outputs"][1]["data"][0]
        # The copy holding "left" gets stuck in C past its deadline and the grace: replaced.
        status, body = self.count("left", "csleep", timeout_us=200_000)
        self.assertEqual(status, 504, body)
        self.assertIn("its interpreter copy was replaced", body["error"])
        status, body = self.count("left")
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "left" of model counter:1 was lost: the interpreter copy that held '
                      "its state was replaced (the request ran past its deadline", body["error"])
        self.assertEqual(metric(self.server, "orochi_sequences_ended_total", model="counter",
                                reason="lost"), lost + 1)
        # The other copy's sequence goes on; a new one starts from nothing.
        status, body = self.count("right", end=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [2]), body)
        status, body = self.count("left", start=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [1]), body)
        self.assertEqual(self.count("left", end=True)[0], 200)

    def test_zy_unloading_the_model_drops_its_sequences(self):
        def manage(action):
            status, _, body = curl(
                "-X", "POST",
                f"http://127.0.0.1:{self.server.management_port}/v2/repository/models/counter/"
                + action)
            self.assertEqual(status, 200, body)

        status, body = self.count("kept", start=True)
        self.assertEqual(status, 200, body)
        manage("unload")
        manage("load")
        status, body = self.count("kept")
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "kept" of model counter:1 is not live', body["error"])
        self.assertEqual(metric(self.server, "orochi_live_sequences", model="counter"), 0)
        status, body = self.count("kept", start=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [1]), body)
        self.assertEqual(self.count("kept", end=True)[0], 200)

    def test_zz_a_crash_of_the_serving_process_fails_its_sequences_clearly(self):
        # Last (by name): the serving process restarts, which the other tests need not see.
        status, body = self.count("doomed", start=True)
        self.assertEqual(status, 200, body)
        status, _ = self.count("doomed", "segfault")
        self.assertEqual(status, 0, "the connection closed without an answer")
        self.server.wait_for_serving(2)
        status, body = self.count("doomed")
        self.assertEqual(status, 400, body)
        self.assertIn('sequence "doomed" of model counter:1 is not live', body["error"])
        self.assertIn("the serving process was restarted after model code crashed it",
                      body["error"])
        status, body = self.count("doomed", start=True)
        self.assertEqual((status, body["outputs"][0]["data"]), (200, [1]), body)
        self.assertEqual(self.count("doomed", end=True)[0], 200)
        self.assertEqual(self.total("after", 2.0, start=True, end=True), (2.0, 1))


if __name__ == "__main__":
    unittest.main()
