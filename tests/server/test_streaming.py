"""Streaming models against the real `orochi serve`: Triton's generate extension over HTTP
(`curl -N` and Server-Sent Events), gRPC ModelStreamInfer with several responses per request,
the step interface batching streams into one step() call, and the ways a stream ends early
(the client leaving, a deadline, an unload, a slow reader) or fails (hostile models), after
each of which the copy is free and the server still serves.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_streaming
"""

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from server_fixtures import BINARY, Server, metric, metric_series, resident_kib
from streaming_models import write_packages
import test_grpc  # the client generated from the server's proto

pb, pb_grpc = test_grpc.pb, test_grpc.pb_grpc


def read_marker(path: str, timeout: float = 15) -> str:
    """What a test model wrote to `path`, once it has (or "" past the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as file:
                text = file.read()
            if text:
                return text
        time.sleep(0.05)
    return ""


def events(raw: bytes) -> list:
    return [json.loads(line[len(b"data: "):]) for line in raw.split(b"\n\n")
            if line.startswith(b"data: ")]


class StreamingTest(unittest.TestCase):
    # One copy, so that concurrent streams of the step model share it (and one step() call).
    CONFIG = {"models": {"stream_stall_timeout_ms": 1500, "unload_grace_s": 1,
                         "max_queued_streams": 4, "stream_buffer_responses": 2}}

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-streaming-")
        cls.repository = os.path.join(cls.root, "repository")
        for name, directory in write_packages(cls.root).items():
            target = os.path.join(cls.repository, name, "1")
            os.makedirs(target)
            subprocess.run([BINARY, "pack", directory, "-o", os.path.join(target, "model.orochi")],
                           check=True, capture_output=True)
        cls.server = Server(cls.repository, cls.CONFIG, copies=1)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        shutil.rmtree(cls.root)
        assert code == 0, f"orochi serve exited with {code}"

    def marker(self) -> str:
        return os.path.join(self.root, f"marker-{time.monotonic_ns()}")

    def generate(self, model, body, stream=True, timeout=30):
        path = "generate_stream" if stream else "generate"
        result = subprocess.run(
            ["curl", "-sN", "--max-time", str(timeout), "-w", "\n%{http_code}", "-X", "POST",
             self.server.url(f"/v2/models/{model}/{path}"), "-d", json.dumps(body)],
            capture_output=True, timeout=timeout + 10)
        body, _, status = result.stdout.rpartition(b"\n")
        return int(status), body

    def assert_copy_free(self):
        """The one copy answers a short stream at once: nothing holds it."""
        started = time.monotonic()
        status, body = self.generate("tokens", {"text_input": "x", "max_tokens": 2})
        self.assertEqual(status, 200, body)
        self.assertEqual([event["text_output"] for event in events(body)], ["t0 ", "t1 "])
        self.assertLess(time.monotonic() - started, 5)

    def test_stream_series_exist_from_the_load(self):
        # At 0 before a model's first stream, so that a dashboard's rate() reads 0, not nothing.
        for model in ("tokens", "stepper"):
            ends = {re.search(r'end="(\w+)"', labels).group(1)
                    for labels in metric_series(self.server, "orochi_streams_total")
                    if f'model="{model}"' in labels}
            self.assertEqual(ends, {"finished", "cancelled", "deadline", "unloaded", "stalled",
                                    "error"}, model)
            for name in ("orochi_stream_responses_total", "orochi_live_streams",
                         "orochi_time_to_first_response_seconds_count",
                         "orochi_time_between_responses_seconds_count"):
                self.assertIn(f'model="{model}",version="1"', metric_series(self.server, name))

    def test_curl_sse_tokens_arrive_before_the_end(self):
        process = subprocess.Popen(
            ["curl", "-sN", "-X", "POST", self.server.url("/v2/models/tokens/generate_stream"),
             "-d", json.dumps({"text_input": "hi", "max_tokens": 4, "delay_s": 0.4})],
            stdout=subprocess.PIPE)
        arrivals = []
        buffer = b""
        while True:
            chunk = process.stdout.read1(4096)
            if not chunk:
                break
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                arrivals.append((time.monotonic(), json.loads(event[len(b"data: "):])))
        process.wait(timeout=10)
        self.assertEqual([event["text_output"] for _, event in arrivals],
                         ["t0 ", "t1 ", "t2 ", "t3 "])
        self.assertEqual(arrivals[0][1]["model_name"], "tokens")
        # The first token came well before the last: streamed, not buffered to the end.
        self.assertGreater(arrivals[-1][0] - arrivals[0][0], 1.0)

    def test_generate_combines_the_responses(self):
        status, body = self.generate("tokens", {"text_input": "hi", "max_tokens": 3}, stream=False)
        self.assertEqual(status, 200, body)
        self.assertEqual(json.loads(body), {"model_name": "tokens", "model_version": "1",
                                            "text_output": "t0 t1 t2 "})

    def test_infer_on_a_streaming_model_is_refused(self):
        result = subprocess.run(
            ["curl", "-s", "-w", "\n%{http_code}", "-X", "POST",
             self.server.url("/v2/models/tokens/infer"), "-d",
             json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                     "data": ["x"]}]})], capture_output=True)
        body, _, status = result.stdout.rpartition(b"\n")
        self.assertEqual(int(status), 400)
        self.assertIn(b"streaming model", body)

    def test_step_interface_batches_streams_into_one_step(self):
        results = {}

        def run(index):
            results[index] = self.generate("stepper", {"text_input": "x", "max_tokens": 6,
                                                       "delay_s": 0.15})

        threads = [threading.Thread(target=run, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        batches = []
        for status, body in results.values():
            self.assertEqual(status, 200, body)
            got = events(body)
            self.assertEqual([event["text_output"] for event in got],
                             [f"s{index} " for index in range(6)])
            batches += [event["batch"] for event in got]
        # The four streams were stepped together: one step() call saw all of them.
        self.assertEqual(max(batches), 4, batches)

    def test_grpc_stream_several_responses_then_final(self):
        import grpc
        with grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="stepper", id="r1")
            request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            request.raw_input_contents.append(test_grpc.bytes_raw([b"x"]))
            request.parameters["max_tokens"].int64_param = 3
            responses = list(stub.ModelStreamInfer(iter([request]), timeout=30))
        self.assertEqual(len(responses), 4)
        texts = []
        for response in responses[:3]:
            self.assertEqual(response.error_message, "")
            self.assertEqual(response.infer_response.id, "r1")
            self.assertFalse(
                response.infer_response.parameters["triton_final_response"].bool_param)
            raw = response.infer_response.raw_output_contents[0]
            texts.append(raw[4:].decode())
        self.assertEqual(texts, ["s0 ", "s1 ", "s2 "])
        final = responses[-1].infer_response
        self.assertTrue(final.parameters["triton_final_response"].bool_param)
        self.assertEqual(len(final.outputs), 0)

    def test_disconnect_mid_stream_stops_the_generator(self):
        marker = self.marker()
        cancelled = metric(self.server, "orochi_streams_total", model="tokens", end="cancelled")
        process = subprocess.Popen(
            ["curl", "-sN", "-X", "POST", self.server.url("/v2/models/tokens/generate_stream"),
             "-d", json.dumps({"text_input": "x", "mode": "forever", "delay_s": 0.05,
                               "marker": marker})], stdout=subprocess.PIPE)
        process.stdout.read1(100)  # the first token
        process.kill()
        process.wait()
        self.assertEqual(read_marker(marker), "GeneratorExit")  # closed at its yield
        self.assertEqual(metric(self.server, "orochi_streams_total", model="tokens",
                                end="cancelled"), cancelled + 1)
        self.assert_copy_free()

    def test_disconnect_between_slow_responses_interrupts_the_generator(self):
        # A client that leaves while the model works toward its next response: the transport
        # notices the hang-up at once (not at the next write), and the scheduler interrupts the
        # running call instead of letting it run a minute for nobody.
        marker = self.marker()
        cancelled = metric(self.server, "orochi_streams_total", model="tokens", end="cancelled")
        process = subprocess.Popen(
            ["curl", "-sN", "-X", "POST", self.server.url("/v2/models/tokens/generate_stream"),
             "-d", json.dumps({"text_input": "x", "max_tokens": 3, "delay_s": 60, "busy": True,
                               "marker": marker})], stdout=subprocess.PIPE)
        process.stdout.read1(100)  # the first token; the next is a minute away
        left = time.monotonic()
        process.kill()
        process.wait()
        self.assertEqual(read_marker(marker, timeout=20), "TimeoutError")  # interrupted
        self.assertLess(time.monotonic() - left, 15)
        self.assertEqual(metric(self.server, "orochi_streams_total", model="tokens",
                                end="cancelled"), cancelled + 1)
        self.assert_copy_free()

    def test_stream_whose_copy_is_replaced_is_counted(self):
        # Asleep in C between responses, the generator ignores the interrupt: its copy is
        # replaced after the grace period, and the stream still counts as ended by its client.
        cancelled = metric(self.server, "orochi_streams_total", model="tokens", end="cancelled")
        process = subprocess.Popen(
            ["curl", "-sN", "-X", "POST", self.server.url("/v2/models/tokens/generate_stream"),
             "-d", json.dumps({"text_input": "x", "max_tokens": 3, "delay_s": 60})],
            stdout=subprocess.PIPE)
        process.stdout.read1(100)
        process.kill()
        process.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
                metric(self.server, "orochi_copies_replaced_total") < 1 or metric(
                    self.server, "orochi_streams_total", model="tokens", end="cancelled")
                == cancelled):
            time.sleep(0.2)
        self.assertEqual(metric(self.server, "orochi_streams_total", model="tokens",
                                end="cancelled"), cancelled + 1)
        self.assertEqual(metric(self.server, "orochi_live_streams", model="tokens"), 0)
        self.assertGreaterEqual(metric(self.server, "orochi_copies_replaced_total"), 1)
        self.assert_copy_free()

    def test_disconnect_retires_a_step_sequence(self):
        marker = self.marker()
        process = subprocess.Popen(
            ["curl", "-sN", "-X", "POST", self.server.url("/v2/models/stepper/generate_stream"),
             "-d", json.dumps({"text_input": "x", "max_tokens": 100000, "delay_s": 0.02,
                               "marker": marker})], stdout=subprocess.PIPE)
        process.stdout.read1(100)
        process.kill()
        process.wait()
        self.assertRegex(read_marker(marker), r"^finished \d+\n$")  # finish() exactly once
        self.assertEqual(metric(self.server, "orochi_live_streams", model="stepper"), 0)

    def test_deadline_stops_the_stream(self):
        marker = self.marker()
        status, body = self.generate("tokens", {"text_input": "x", "mode": "forever",
                                                "delay_s": 0.05, "marker": marker,
                                                "parameters": {"timeout": 500000}})
        self.assertEqual(status, 200)
        got = events(body)
        self.assertIn("deadline", got[-1]["error"])
        self.assertTrue(all("text_output" in event for event in got[:-1]))
        # Closed at a yield, or interrupted in its sleep: stopped inside the copy either way.
        self.assertIn(read_marker(marker), ("GeneratorExit", "TimeoutError"))
        self.assert_copy_free()

    def test_generator_that_never_yields_is_stopped_by_its_deadline(self):
        started = time.monotonic()
        status, body = self.generate("tokens", {"text_input": "x", "mode": "spin",
                                                "parameters": {"timeout": 300000}})
        # Nothing was streamed yet: the answer is the error itself.
        self.assertEqual(status, 504, body)
        self.assertIn(b"deadline", body)
        self.assertLess(time.monotonic() - started, 10)
        self.assert_copy_free()

    def test_malformed_yield_and_raising_generator(self):
        status, body = self.generate("tokens", {"text_input": "x", "mode": "malformed"})
        got = events(body)
        self.assertEqual(got[0]["text_output"], "t0 ")
        self.assertIn("not_declared", got[-1]["error"])
        status, body = self.generate("tokens", {"text_input": "x", "mode": "raise"})
        got = events(body)
        self.assertEqual([event.get("text_output") for event in got[:2]], ["t0 ", "t1 "])
        self.assertIn("the model failed at token 2", got[-1]["error"])
        self.assert_copy_free()

    def test_step_that_raises_fails_its_sequences(self):
        marker = self.marker()
        status, body = self.generate("stepper", {"text_input": "x", "mode": "raise",
                                                 "marker": marker})
        got = events(body)
        self.assertEqual([event.get("text_output") for event in got[:2]], ["s0 ", "s1 "])
        self.assertIn("step failed at the third token", got[-1]["error"])
        with open(marker) as file:
            self.assertEqual(file.read(), "finished 2\n")

    def test_client_that_never_reads_is_ended(self):
        marker = self.marker()
        body = json.dumps({"text_input": "x", "mode": "forever", "marker": marker}).encode()
        sock = socket.create_connection(("127.0.0.1", self.server.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v2/models/tokens/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            # Paused while its buffer was full, then ended: never buffered without bound.
            self.assertEqual(read_marker(marker, timeout=20), "GeneratorExit")
            self.assertGreaterEqual(metric(self.server, "orochi_streams_total", model="tokens",
                                           end="stalled"), 1)
        finally:
            sock.close()
        self.assert_copy_free()

    def test_queued_streams_are_limited(self):
        bodies = {}

        def run(index):
            bodies[index] = self.generate("tokens", {"text_input": "x", "max_tokens": 3,
                                                     "delay_s": 0.3})

        threads = [threading.Thread(target=run, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        statuses = sorted(status for status, _ in bodies.values())
        self.assertIn(503, statuses)
        refused = [body for status, body in bodies.values() if status == 503]
        self.assertIn(b"max_queued_streams", refused[0])
        self.assertIn(200, statuses)

    def test_orochi_run_prints_responses_as_they_come(self):
        request = os.path.join(self.root, "request.json")
        with open(request, "w") as file:
            json.dump({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                                   "data": ["x"]}],
                       "parameters": {"max_tokens": 3, "delay_s": 0.5}}, file)
        process = subprocess.Popen(
            [BINARY, "run", os.path.join(self.repository, "tokens", "1", "model.orochi"),
             "--request", request], stdout=subprocess.PIPE)
        arrivals = [(time.monotonic(), json.loads(line)) for line in process.stdout]
        self.assertEqual(process.wait(timeout=30), 0)
        self.assertEqual([answer["outputs"][0]["data"] for _, answer in arrivals],
                         [["t0 "], ["t1 "], ["t2 "]])
        self.assertGreater(arrivals[-1][0] - arrivals[0][0], 0.8)  # printed as they came

    def test_many_aborted_streams_keep_memory_flat(self):
        def abort_some(count):
            for _ in range(count):
                sock = socket.create_connection(("127.0.0.1", self.server.port))
                body = json.dumps({"text_input": "x", "mode": "forever"}).encode()
                sock.sendall(b"POST /v2/models/stepper/generate_stream HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                sock.recv(200)
                sock.close()

        abort_some(100)  # warm-up: allocator pools, metric series
        time.sleep(0.5)
        before = resident_kib(self.server.serving_pid)
        started = time.monotonic()
        aborted = 100
        while aborted < 1000 and time.monotonic() - started < 25:
            abort_some(100)
            aborted += 100
        time.sleep(1)
        after = resident_kib(self.server.serving_pid)
        self.assertGreaterEqual(aborted, 300)
        self.assertLess(after - before, 16 * 1024, f"{aborted} aborted streams: {before} -> {after} kB")
        deadline = time.monotonic() + 10
        while metric(self.server, "orochi_live_streams", model="stepper") and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertEqual(metric(self.server, "orochi_live_streams", model="stepper"), 0)


class UnloadStopsStreamsTest(unittest.TestCase):
    def test_unload_stops_a_running_stream(self):
        root = tempfile.mkdtemp(prefix="orochi-streaming-unload-")
        try:
            repository = os.path.join(root, "repository")
            for name, directory in write_packages(root).items():
                target = os.path.join(repository, name, "1")
                os.makedirs(target)
                subprocess.run([BINARY, "pack", directory, "-o",
                                os.path.join(target, "model.orochi")], check=True,
                               capture_output=True)
            server = Server(repository, {"models": {"unload_grace_s": 1}}, copies=1)
            try:
                marker = os.path.join(root, "marker")
                process = subprocess.Popen(
                    ["curl", "-sN", "-X", "POST", server.url("/v2/models/tokens/generate_stream"),
                     "-d", json.dumps({"text_input": "x", "mode": "forever", "delay_s": 0.05,
                                       "marker": marker})], stdout=subprocess.PIPE)
                process.stdout.read1(100)
                unload = subprocess.run(
                    ["curl", "-s", "-X", "POST",
                     f"http://127.0.0.1:{server.management_port}/v2/repository/models/tokens/unload"],
                    capture_output=True, timeout=30)
                output, _ = process.communicate(timeout=30)
                self.assertEqual(unload.returncode, 0)
                self.assertIn("unloaded", events(output)[-1]["error"])
                self.assertIn(read_marker(marker), ("GeneratorExit", "TimeoutError"))
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
