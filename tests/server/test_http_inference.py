"""The real `orochi serve`, driven with the real curl on its inference port: every KServe v2
endpoint, every datatype in JSON and with the binary extension, errors and limits, batching,
metrics (checked by promtool), request logging and many concurrent keep-alive clients.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_http_inference
"""

import http.client
import json
import math
import os
import re
import socket
import struct
import subprocess
import threading
import time
import unittest

from server_fixtures import (SharedServerTest, binary_echo_request, curl, echo_request, post_json,
                             slow_request)


class ServerTest(SharedServerTest):
    CONFIG = {"models": {"max_queue_delay_us": 200000}}

    def get(self, path):
        status, _, body = curl(self.server.url(path))
        return status, json.loads(body) if body else None

    def test_health_and_server_metadata(self):
        self.assertEqual(self.get("/v2/health/live"), (200, {"live": True}))
        self.assertEqual(self.get("/v2/health/ready"), (200, {"ready": True}))
        status, metadata = self.get("/v2")
        self.assertEqual(status, 200)
        self.assertEqual(metadata["name"], "orochi")
        self.assertIn("binary_tensor_data", metadata["extensions"])

    def test_every_route_of_the_inference_port_reaches_its_handler(self):
        # Literal segments beat captures: /v2/models/stats is the all-models statistics, not
        # the metadata of a model called "stats" (it was, by registration order).
        status, stats = self.get("/v2/models/stats")
        self.assertEqual(status, 200, stats)
        self.assertIn("echo", [entry["name"] for entry in stats["model_stats"]])
        gets = {
            "/v2/health/live": "live", "/v2/health/ready": "ready", "/v2": "extensions",
            "/v2/models/echo": "inputs", "/v2/models/echo/versions/1": "inputs",
            "/v2/models/echo/ready": "ready", "/v2/models/echo/versions/1/ready": "ready",
            "/v2/models/echo/config": "max_batch_size",
            "/v2/models/echo/versions/1/config": "max_batch_size",
            "/v2/models/echo/stats": "model_stats",
            "/v2/models/echo/versions/1/stats": "model_stats",
            "/v2/logging": "log_verbose_level", "/v2/trace/setting": "trace_level",
        }
        for path, key in gets.items():
            status, body = self.get(path)
            self.assertEqual(status, 200, (path, body))
            self.assertIn(key, body, path)
        for path in ("/v2/models/echo/infer", "/v2/models/echo/versions/1/infer"):
            status, _, body = post_json(self.server, path, echo_request())
            self.assertEqual(status, 200, (path, body))
        # A model really called "stats" still has its own routes below the literal one.
        status, body = self.get("/v2/models/stats/ready")
        self.assertEqual(status, 404, body)
        self.assertIn("Request for unknown model: 'stats'", body["error"])

    def test_statistics_measure_compute_input_infer_and_output(self):
        def echo_stats():
            status, stats = self.get("/v2/models/echo/stats")
            self.assertEqual(status, 200, stats)
            return stats["model_stats"][0]

        before = echo_stats()
        for _ in range(3):  # one at a time: each runs as a batch of its own
            status, _, body = post_json(self.server, "/v2/models/echo/infer", echo_request(rows=2))
            self.assertEqual(status, 200, body)
        after = echo_stats()
        self.assertEqual(after["execution_count"], before["execution_count"] + 3)
        stats, earlier = after["inference_stats"], before["inference_stats"]

        def grew(name):
            return stats[name]["ns"] - earlier[name]["ns"]

        computes = ("compute_input", "compute_infer", "compute_output")
        for name in computes:
            # One of each per batch, in all and by batch size, and each took time.
            self.assertEqual(stats[name]["count"], after["execution_count"], name)
            self.assertEqual(sum(batch[name]["count"] for batch in after["batch_stats"]),
                             after["execution_count"], name)
            self.assertGreater(grew(name), 0, name)
        pairs = [batch for batch in after["batch_stats"] if batch["batch_size"] == 2]
        self.assertEqual(len(pairs), 1, after["batch_stats"])
        for name in computes:
            self.assertGreater(pairs[0][name]["ns"], 0, name)
        # A request that ran alone spent its time queued or in its batch, which the three
        # share out without a gap or an overlap.
        self.assertEqual(grew("success") - grew("queue"), sum(grew(name) for name in computes))

    def test_logging_settings_are_read_and_changed_at_run_time(self):
        status, settings = self.get("/v2/logging")
        self.assertEqual((status, settings), (200, {
            "log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "text"}))
        try:
            status, _, body = post_json(self.server, "/v2/logging",
                                        {"log_verbose_level": 1, "log_format": "json"})
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["log_verbose_level"], 1)
            self.assertEqual(self.get("/v2/logging")[1]["log_format"], "json")
            self.assertIn('"message":"log settings changed"', self.server.log_text())
            refusals = [
                ({"log_file": "/tmp/triton.log"}, "log_file \"/tmp/triton.log\" is not supported"),
                ({"log_error": False}, "log_error false is not supported"),
                ({"log_info": True, "log_warning": False}, "this combination is not supported"),
                ({"log_format": "ISO8601"}, 'log_format "ISO8601" is not supported'),
                ({"log_rotation": 3}, 'the log setting "log_rotation" is not supported'),
            ]
            for update, message in refusals:
                status, _, body = post_json(self.server, "/v2/logging", update)
                self.assertEqual(status, 400, body)
                self.assertIn(message, json.loads(body)["error"])
            self.assertEqual(self.get("/v2/logging")[1]["log_verbose_level"], 1)  # unchanged
        finally:
            status, _, body = post_json(self.server, "/v2/logging",
                                        {"log_verbose_level": 0, "log_format": "text"})
            self.assertEqual(status, 200, body)
        status, _, body = post_json(self.server, "/v2/logging",
                                    {"log_info": False, "log_warning": True})
        self.assertEqual((status, json.loads(body)["log_info"]), (200, False))
        post_json(self.server, "/v2/logging", {"log_info": True})
        status, metadata = self.get("/v2")
        self.assertIn("logging", metadata["extensions"])
        self.assertIn("trace", metadata["extensions"])

    def test_trace_settings_say_tracing_is_off_and_stay_off(self):
        status, settings = self.get("/v2/trace/setting")
        self.assertEqual((status, settings["trace_level"]), (200, ["OFF"]))
        status, _, body = post_json(self.server, "/v2/trace/setting", {"trace_level": ["OFF"]})
        self.assertEqual((status, json.loads(body)["trace_level"]), (200, ["OFF"]))
        for update in ({"trace_level": ["TIMESTAMPS"]}, {"trace_rate": "1"},
                       {"trace_file": "/tmp/trace.json"}):
            status, _, body = post_json(self.server, "/v2/trace/setting", update)
            self.assertEqual(status, 400, body)
            self.assertIn("Orochi does not trace requests", json.loads(body)["error"])

    def test_compressed_requests_and_responses(self):
        import gzip
        import zlib
        request = json.dumps(echo_request()).encode()
        for encoding, compressed in (("gzip", gzip.compress(request)),
                                     ("deflate", zlib.compress(request)),
                                     ("deflate", zlib.compress(request)[2:-4])):  # raw deflate
            status, _, body = curl("-X", "POST", "-H", f"Content-Encoding: {encoding}",
                                   self.server.url("/v2/models/echo/infer"), data=compressed)
            self.assertEqual(status, 200, body)
            self.assertEqual(json.loads(body)["id"], "echo-1")
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: br",
                               self.server.url("/v2/models/echo/infer"), data=request)
        self.assertEqual(status, 415, body)
        self.assertIn("Content-Encoding 'br' is not supported", json.loads(body)["error"])
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: gzip",
                               self.server.url("/v2/models/echo/infer"), data=request)
        self.assertEqual(status, 400, body)
        self.assertIn("not valid gzip data", json.loads(body)["error"])
        # Responses: compressed when the client takes it and the body is not tiny.
        rows = echo_request(rows=8)
        status, headers, body = curl("-X", "POST", "-H", "Accept-Encoding: gzip",
                                     self.server.url("/v2/models/echo/infer"),
                                     data=json.dumps(rows).encode())
        self.assertEqual(status, 200)
        self.assertRegex(headers, r"(?i)content-encoding: gzip")
        self.assertRegex(headers, r"(?i)vary: Accept-Encoding")
        self.assertEqual(json.loads(gzip.decompress(body))["id"], "echo-1")
        status, headers, body = curl("-X", "POST", "-H", "Accept-Encoding: gzip;q=0, deflate",
                                     self.server.url("/v2/models/echo/infer"),
                                     data=json.dumps(rows).encode())
        self.assertEqual(status, 200)
        self.assertRegex(headers, r"(?i)content-encoding: deflate")
        self.assertEqual(json.loads(zlib.decompress(body))["id"], "echo-1")
        status, headers, body = curl(self.server.url("/v2/models/echo/infer"), "-X", "POST",
                                     data=json.dumps(rows).encode())
        self.assertNotRegex(headers, r"(?i)content-encoding")
        status, headers, _ = curl("-H", "Accept-Encoding: gzip", self.server.url("/v2/health/live"))
        self.assertNotRegex(headers, r"(?i)content-encoding")  # too small to be worth it


    def test_keep_alive_and_pipelining(self):
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=30) as connection:
            # Two requests in one write: answered in order on the same connection.
            connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                               b"GET /v2/models/echo/ready HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"}"):
                chunk = connection.recv(65536)
                if not chunk:
                    break
                received += chunk
        first = received.index(b'{"live":true}')
        second = received.index(b'"ready":true')
        self.assertLess(first, second)
        self.assertEqual(received.count(b"HTTP/1.1 200 OK"), 2)

    def test_model_metadata_ready_config(self):
        for path in ("/v2/models/echo", "/v2/models/echo/versions/1"):
            status, metadata = self.get(path)
            self.assertEqual(status, 200)
            self.assertEqual(metadata["name"], "echo")
            self.assertEqual(metadata["versions"], ["1"])
            self.assertIn({"name": "in_bf16", "datatype": "BF16", "shape": [-1, -1]},
                          metadata["inputs"])
        self.assertEqual(self.get("/v2/models/echo/ready")[1]["ready"], True)
        self.assertEqual(self.get("/v2/models/echo/versions/1/ready")[0], 200)
        status, config = self.get("/v2/models/echo/config")
        self.assertEqual(status, 200)
        self.assertEqual(config["max_batch_size"], 64)
        self.assertEqual(config["input"][0], {"name": "in_bool", "data_type": "TYPE_BOOL",
                                              "dims": [-1]})
        self.assertEqual(config["dynamic_batching"]["max_queue_delay_microseconds"], 200000)
        self.assertEqual(config["instance_group"][0]["count"], 2)

    def test_every_datatype_round_trips_in_json(self):
        status, _, body = post_json(self.server, "/v2/models/echo/infer", echo_request(rows=2))
        self.assertEqual(status, 200, body)
        response = json.loads(body)
        self.assertEqual(response["id"], "echo-1")
        self.assertEqual(response["model_name"], "echo")
        self.assertEqual(response["model_version"], "1")
        outputs = {output["name"]: output for output in response["outputs"]}
        request = echo_request(rows=2)
        for entry in request["inputs"]:
            name = entry["name"].replace("in_", "out_")
            self.assertEqual(outputs[name]["shape"], [2, 1], name)
            self.assertEqual(outputs[name]["datatype"], entry["datatype"])
            expected = entry["data"]
            if entry["datatype"] == "FP32":
                expected = [0.25, 3.5]
            self.assertEqual(outputs[name]["data"], expected, name)

    def test_nested_data_and_selected_outputs(self):
        request = echo_request(rows=2)
        for entry in request["inputs"]:
            entry["data"] = [[value] for value in entry["data"]]  # nested like the shape
        request["outputs"] = [{"name": "out_int64"}, {"name": "out_bytes"}]
        status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
        self.assertEqual(status, 200, body)
        names = [output["name"] for output in json.loads(body)["outputs"]]
        self.assertEqual(names, ["out_int64", "out_bytes"])

    def test_binary_extension_both_ways(self):
        header, binary = binary_echo_request()
        status, headers, body = curl(
            "-X", "POST", "-H", "Content-Type: application/octet-stream",
            "-H", f"Inference-Header-Content-Length: {len(header)}",
            self.server.url("/v2/models/echo/infer"), data=header + binary)
        self.assertEqual(status, 200, body)
        length = int(re.search(r"Inference-Header-Content-Length: (\d+)", headers, re.I).group(1))
        response = json.loads(body[:length])
        rest = body[length:]
        outputs = {output["name"]: output for output in response["outputs"]}
        self.assertEqual(outputs["out_fp32"]["parameters"]["binary_data_size"], 8)
        self.assertEqual(struct.unpack("<2f", rest[:8]), (1.25, -8.0))
        self.assertEqual(rest[8:], struct.pack("<I", 2) + b"\x00\xff" + struct.pack("<I", 2) + b"ab")
        self.assertEqual(outputs["out_int8"]["data"], [-128, 127])

        request = echo_request(rows=1)
        request["parameters"] = {"binary_data_output": True}
        status, headers, body = post_json(self.server, "/v2/models/echo/infer", request)
        self.assertEqual(status, 200)
        self.assertRegex(headers, r"(?i)content-type: application/octet-stream")

    def test_floats_come_back_shortest_and_non_finite_as_triton_writes_them(self):
        # NaN and the infinities come back as Python's json module and Triton write them, and go
        # in that way too; FP32 0.1 comes back as 0.1, not 0.10000000149011612.
        request = echo_request(rows=4)
        raw = struct.pack("<4f", float("nan"), float("inf"), float("-inf"), 0.1)
        for entry in request["inputs"]:
            if entry["datatype"] == "FP32":
                entry.pop("data")
                entry["parameters"] = {"binary_data_size": len(raw)}
        request["outputs"] = [{"name": "out_fp32"}]
        header = json.dumps(request).encode()
        status, _, body = curl(
            "-X", "POST", "-H", f"Inference-Header-Content-Length: {len(header)}",
            self.server.url("/v2/models/echo/infer"), data=header + raw)
        self.assertEqual(status, 200, body)
        self.assertIn(b'"data":[NaN,Infinity,-Infinity,0.1]', body)
        values = json.loads(body)["outputs"][0]["data"]
        self.assertTrue(math.isnan(values[0]))
        self.assertEqual(values[1:], [math.inf, -math.inf, 0.1])
        # Sent back as JSON (Python's json writes NaN, Infinity and -Infinity), they read as
        # they were.
        request = echo_request(rows=4, values={"FP32": values})
        request["outputs"] = [{"name": "out_fp32"}]
        status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
        self.assertEqual(status, 200, body)
        self.assertIn(b'"data":[NaN,Infinity,-Infinity,0.1]', body)
        # numpy's spellings are refused with the ones to use.
        text = json.dumps(request).replace("NaN", "nan").encode()
        status, _, body = curl("-X", "POST", self.server.url("/v2/models/echo/infer"), data=text)
        self.assertEqual(status, 400, body)
        self.assertIn("found 'nan'; write NaN, Infinity and -Infinity", json.loads(body)["error"])

    def test_request_fields_orochi_does_not_implement_are_refused_naming_them(self):
        # Accepted and ignored, a priority or a sequence would silently be wrong (sequences are
        # for stateful models: test_sequences); shared memory is served, and
        # a region this server does not have is named (test_shared_memory has the rest).
        cases = [
            ({"parameters": {"priority": 2}}, 'parameter "priority" is not supported'),
            ({"parameters": {"sequence_id": 5, "sequence_start": True}},
             "model echo is not stateful"),
            ({"outputs": [{"name": "out_fp32",
                           "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]},
             "output 'out_fp32': unable to find shared memory region: 'r'"),
            ({"model_version": "1"}, 'the request has the key "model_version"'),
        ]
        for extra, message in cases:
            request = {**echo_request(), **extra}
            status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
            self.assertEqual(status, 400, body)
            self.assertIn(message, json.loads(body)["error"])
        request = echo_request()
        request["inputs"][0]["parameters"] = {"shared_memory_region": "r"}
        status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
        self.assertEqual(status, 400, body)
        self.assertIn("input 'in_bool': shared_memory_region needs shared_memory_byte_size",
                      json.loads(body)["error"])

    def test_errors_have_triton_statuses_and_messages(self):
        cases = [
            # Triton's words, which its clients and scripts match on, then Orochi's detail.
            ("/v2/models/nope/infer", echo_request(), 404,
             "Request for unknown model: 'nope' is not found (model 'nope' is not loaded)"),
            ("/v2/models/echo/versions/7/infer", echo_request(), 404,
             "Request for unknown model: 'echo' version 7 is not found (version 7 is not loaded; "
             "loaded: 1)"),
            ("/v2/models/echo/versions/x/infer", echo_request(), 400, "positive integer"),
        ]
        for path, body, status, message in cases:
            got, _, text = post_json(self.server, path, body)
            self.assertEqual(got, status, text)
            self.assertIn(message, json.loads(text)["error"])
        wrong_type = echo_request()
        wrong_type["inputs"][5]["datatype"] = "FP32"
        got, _, text = post_json(self.server, "/v2/models/echo/infer", wrong_type)
        self.assertEqual((got, json.loads(text)["error"]),
                         (400, "input 'in_int64' has datatype FP32, but the model expects INT64"))
        wrong_count = echo_request()
        wrong_count["inputs"][0]["data"] = [True, True]
        got, _, text = post_json(self.server, "/v2/models/echo/infer", wrong_count)
        self.assertIn("has 2 values, but shape [1, 1] needs 1", json.loads(text)["error"])
        missing = echo_request()
        missing["inputs"].pop()
        got, _, text = post_json(self.server, "/v2/models/echo/infer", missing)
        self.assertEqual((got, json.loads(text)["error"]), (400, "input 'in_bytes' is missing"))
        got, _, text = curl("-X", "POST", self.server.url("/v2/models/echo/infer"), data=b"{nope")
        self.assertEqual((got, json.loads(text)["error"]),
                         (400, "the request body is not valid JSON at byte 2: expected a key "
                               "(a string in quotes), found 'n' (near '{n')"))
        got, _, text = curl("-X", "POST", self.server.url("/v2/models/echo/infer"),
                            data=b"[" * 1000 + b"]" * 1000)
        self.assertEqual(got, 400)
        self.assertIn("nested deeper than the limit of 64", json.loads(text)["error"])
        got, _, text = curl("-X", "POST", self.server.url("/v2/models/echo/infer"),
                            data=b"0" * (65 * 1024 * 1024))
        self.assertEqual(got, 413)
        self.assertIn("larger than the limit", json.loads(text)["error"])
        got, _, text = curl(self.server.url("/v2/models/echo/infer"))
        self.assertEqual(got, 405)
        got, _, text = curl(self.server.url("/v3"))
        self.assertEqual((got, json.loads(text)["error"]), (404, "no such endpoint: GET /v3"))
        big_header = "X-Big: " + "a" * 20000
        got, _, text = curl("-H", big_header, self.server.url("/v2/health/live"))
        self.assertEqual(got, 431)

    def test_nested_data_must_follow_the_shape(self):
        for data in ([[1.0], [2.0]], [[1.0, 2.0]], [[[1.0]], [2.0]]):
            with self.subTest(data=data):
                request = echo_request(rows=2, values={"FP32": data})
                got, _, text = post_json(self.server, "/v2/models/echo/infer", request)
                if data == [[1.0], [2.0]]:
                    self.assertEqual(got, 200, text)  # nested exactly as the shape [2, 1]
                    continue
                self.assertEqual(got, 400, text)
                self.assertEqual(json.loads(text)["error"],
                                 "input 'in_fp32' has nested data that does not follow its shape "
                                 "[2, 1] (send it flat, or nested exactly as the shape)")

    def test_outputs_must_have_the_requests_rows_alone_or_batched(self):
        # A model with a batch dimension answering 2 rows too many: refused for a request that
        # ran alone (which once went out with the extra rows) as for one run in a batch.
        def request(rows):
            return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 1],
                                "data": [0.5] * rows}]}

        status, _, body = post_json(self.server, "/v2/models/extra_rows/infer", request(1))
        self.assertEqual((status, json.loads(body)["error"]),
                         (500, "output 'y' has 3 rows for a batch of 1"))
        results = {}

        def client(rows):
            got, _, text = post_json(self.server, "/v2/models/extra_rows/infer", request(rows))
            results[rows] = (got, json.loads(text)["error"])

        threads = [threading.Thread(target=client, args=(rows,)) for rows in (2, 4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for rows, (got, error) in results.items():
            self.assertEqual(got, 500, error)
            # Alone or together (the batching window is 200 ms), the count is checked.
            match = re.fullmatch(r"output 'y' has (\d+) rows for a batch of (\d+)", error)
            self.assertIsNotNone(match, error)
            self.assertEqual(int(match[1]), int(match[2]) + 2)

    def test_integers_out_of_their_datatypes_range_are_refused(self):
        cases = [("UINT8", 300, "[0, 255]"), ("UINT8", -1, "[0, 255]"), ("INT8", 128, "[-128, 127]"),
                 ("INT16", -32769, "[-32768, 32767]"),
                 ("INT32", 2**31, "[-2147483648, 2147483647]"),
                 ("INT64", 2**64 - 1, "[-9223372036854775808, 9223372036854775807]")]
        for datatype, value, limits in cases:
            with self.subTest(datatype=datatype, value=value):
                request = echo_request(values={datatype: [value]})
                got, _, text = post_json(self.server, "/v2/models/echo/infer", request)
                self.assertEqual(got, 400, text)
                self.assertEqual(json.loads(text)["error"],
                                 f"input 'in_{datatype.lower()}' is {datatype}: {value} is out of "
                                 f"its range {limits}")
        edges = {"UINT8": [255], "INT8": [-128], "INT64": [-2**63]}
        got, _, text = post_json(self.server, "/v2/models/echo/infer", echo_request(values=edges))
        self.assertEqual(got, 200, text)
        outputs = {o["name"]: o["data"] for o in json.loads(text)["outputs"]}
        self.assertEqual((outputs["out_uint8"], outputs["out_int8"], outputs["out_int64"]),
                         ([255], [-128], [-2**63]))

    def test_a_timeout_too_long_for_the_clock_means_no_deadline(self):
        for timeout in (2**63 - 1, 2**62):
            request = dict(echo_request(), parameters={"timeout": timeout})
            got, _, text = post_json(self.server, "/v2/models/echo/infer", request)
            self.assertEqual(got, 200, text)

    def test_model_errors_carry_the_traceback(self):
        body = {"inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["bad"]},
                           {"name": "seconds", "datatype": "FP64", "shape": [1], "data": ["x"]}]}
        got, _, text = post_json(self.server, "/v2/models/slow/infer", body)
        self.assertEqual(got, 400)
        self.assertIn("input 'seconds' is FP64: expected numbers", json.loads(text)["error"])

    def test_deadline_in_the_queue(self):
        sleeper = {"inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["sleep"]},
                              {"name": "seconds", "datatype": "FP64", "shape": [1], "data": [1.0]}]}
        threads = [threading.Thread(target=post_json, args=(self.server, "/v2/models/slow/infer",
                                                            sleeper)) for _ in range(2)]
        for thread in threads:
            thread.start()
        time.sleep(0.2)  # both copies are now busy for a second
        hurried = dict(sleeper, parameters={"timeout": 100000})  # 100 ms
        got, _, text = post_json(self.server, "/v2/models/slow/infer", hurried)
        for thread in threads:
            thread.join()
        self.assertEqual(got, 504, text)
        self.assertIn("deadline expired after", json.loads(text)["error"])

    def echo_rows_at_once(self, clients, parameters=lambda index: None, stagger_s=0.0):
        """Each of `clients` sends one row, its index, to echo at the same time, with
        parameters(index) if any: {index: (status, out_int64 data, batch data)}."""
        results = {}

        def client(index):
            request = echo_request(rows=1, values={"INT64": [index]})
            if parameters(index) is not None:
                request["parameters"] = parameters(index)
            status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
            outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
            results[index] = (status, outputs["out_int64"]["data"], outputs["batch"]["data"])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
            time.sleep(stagger_s)
        for thread in threads:
            thread.join()
        return results

    def test_batching_is_observable_and_rows_go_back_to_their_clients(self):
        results = self.echo_rows_at_once(16)
        self.assertEqual(len(results), 16)
        for index, (status, echoed, _) in results.items():
            self.assertEqual((status, echoed), (200, [index]))
        self.assertGreater(max(batch[0] for _, _, batch in results.values()), 1)
        _, stats = self.get("/v2/models/echo/stats")
        sizes = [entry["batch_size"] for entry in stats["model_stats"][0]["batch_stats"]]
        self.assertGreater(max(sizes), 1)
        status, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        bucket = re.search(r'orochi_batch_size_bucket\{model="echo",version="1",le="1"\} (\d+)',
                           metrics.decode())
        count = re.search(r'orochi_batch_size_count\{model="echo",version="1"\} (\d+)',
                          metrics.decode())
        self.assertLess(int(bucket.group(1)), int(count.group(1)), "some batches had > 1 row")

    def test_request_parameters_reach_predict_and_batch_only_when_equal(self):
        # Two groups of clients, each with its own parameters: every row comes back shifted by
        # its own request's "add" (a batch that mixed them would shift some rows wrongly), and
        # requests with equal parameters still ran together.
        results = self.echo_rows_at_once(
            16, lambda index: {"add": 1000 if index >= 8 else 0, "note": "group",
                               "timeout": 30_000_000}, stagger_s=0.005)
        for index, (status, shifted, _) in results.items():
            self.assertEqual((status, shifted), (200, [index + (1000 if index >= 8 else 0)]))
        self.assertGreater(max(batch[0] for _, _, batch in results.values()), 1)
        # KServe v2 parameters are strings, numbers or booleans.
        request = echo_request()
        request["parameters"] = {"add": [1]}
        status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
        self.assertEqual((status, json.loads(body)["error"]),
                         (400, 'parameter "add" must be a string, a number or a boolean, not '
                               'array (KServe v2 parameters)'))
        # A model whose predict() takes no parameters is called without them.
        body = slow_request("sleep", 0.0)
        body["parameters"] = {"add": 1}
        status, _, text = post_json(self.server, "/v2/models/slow/infer", body)
        self.assertEqual(status, 200, text)

    def test_requests_batch_with_the_same_zero_or_nan_but_not_the_other_zero(self):
        # As numbers 0.0 == -0.0 and NaN != NaN; as parameters a model tells the zeros apart
        # (math.copysign), and one NaN is the same value as another. Three groups of clients:
        # every row comes back with its own zero's sign, and the NaN requests still batch.
        results = {}
        zeros = [0.0, -0.0, math.nan]

        def client(index):
            request = echo_request(rows=1)
            request["parameters"] = {"zero": zeros[index // 8], "timeout": 30_000_000}
            status, _, body = post_json(self.server, "/v2/models/echo/infer", request)
            outputs = {o["name"]: o for o in json.loads(body)["outputs"]}
            results[index] = (status, outputs["out_fp64"]["data"], outputs["batch"]["data"])

        threads = [threading.Thread(target=client, args=(i,)) for i in range(24)]
        for thread in threads:
            thread.start()
            time.sleep(0.005)
        for thread in threads:
            thread.join()
        for index, (status, sign, _) in results.items():
            self.assertEqual((status, sign), (200, [-1.0 if index // 8 == 1 else 1.0]), index)
        self.assertGreater(max(results[i][2][0] for i in range(16, 24)), 1,
                           "NaN requests ran one at a time")

    def test_metrics_pass_promtool(self):
        post_json(self.server, "/v2/models/echo/infer", echo_request())
        status, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        self.assertEqual(status, 200)
        text = metrics.decode()
        for name in ("orochi_inference_requests_total", "orochi_request_duration_seconds_bucket",
                     "orochi_queue_duration_seconds", "orochi_compute_duration_seconds",
                     "orochi_batch_size", "orochi_queue_depth", "orochi_interpreter_copies",
                     "orochi_copy_busy_seconds_total", "orochi_model_loads_total",
                     "orochi_model_load_duration_seconds", "orochi_http_requests_total",
                     "process_cpu_seconds_total", "process_resident_memory_bytes",
                     "process_open_fds", "orochi_buffered_bytes", "orochi_buffered_bytes_limit"):
            self.assertIn(name, text)
        self.assertIn('orochi_interpreter_copies{state="busy"} 0', text)
        self.assertIn('orochi_interpreter_copies{state="idle"} 2', text)
        checked = subprocess.run(["promtool", "check", "metrics"], input=metrics,
                                 capture_output=True)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)

    def test_one_log_line_per_request(self):
        curl(self.server.url("/v2/health/live?probe=log-line"))
        time.sleep(0.1)
        lines = [line for line in self.server.log_text().splitlines() if "probe=log-line" in line]
        self.assertEqual(len(lines), 1)
        self.assertRegex(lines[0], r"info request listener=inference method=GET "
                                   r"target=/v2/health/live\?probe=log-line status=200 "
                                   r"duration_us=\d+")

    def test_expect_100_continue_is_answered_at_once(self):
        body = json.dumps(echo_request(rows=40)).encode()
        self.assertGreater(len(body), 1024)
        start = time.time()
        status, headers, text = curl("-X", "POST", "-H", "Expect: 100-continue",
                                     self.server.url("/v2/models/echo/infer"), data=body)
        self.assertEqual(status, 200, text)
        self.assertIn("HTTP/1.1 100 Continue", headers)
        self.assertLess(time.time() - start, 0.9, "curl waited 1 s for the 100")
        # Over the limit: the final answer instead of the 100, before the body is sent.
        status, headers, text = curl("-X", "POST", "-H", "Expect: 100-continue",
                                     "-H", f"Content-Length: {65 * 1024 * 1024}",
                                     self.server.url("/v2/models/echo/infer"), data=b"{}")
        self.assertEqual(status, 413, text)
        self.assertNotIn("100 Continue", headers)

    def test_transport_answers_are_logged_and_counted_and_methods_are_bounded(self):
        def raw(request):
            with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
                sock.sendall(request)
                received = b""
                while chunk := sock.recv(65536):
                    received += chunk
                return received

        for i in range(3):
            answer = raw(b"M%05dX /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                         b"Connection: close\r\n\r\n" % i)
            self.assertTrue(answer.startswith(b"HTTP/1.1 4"), answer)
        answer = raw(b"GET /v2/health/live?probe=431 HTTP/1.1\r\nX-Big: " + b"a" * 20000 +
                     b"\r\n\r\n")
        self.assertTrue(answer.startswith(b"HTTP/1.1 431"), answer)
        time.sleep(0.1)
        self.assertRegex(self.server.log_text(),
                         r"request listener=inference method=GET target=/v2/health/live\?"
                         r"probe=431 status=431")
        _, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        text = metrics.decode()
        self.assertNotIn("M00001X", text)
        self.assertRegex(text, r'orochi_http_requests_total\{method="other",'
                               r'route="unmatched",status="405"\} [3-9]')
        self.assertRegex(text, r'orochi_http_requests_total\{method="GET",'
                               r'route="/v2/health/live",status="431"\} [1-9]')

    def test_head_runs_get_routes_and_405_says_allow(self):
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
            sock.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        head, _, body = received.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), received)
        self.assertRegex(head.decode(), r"(?i)content-length: 13")  # that of {"live":true}
        self.assertEqual(body, b"")
        status, headers, _ = curl("-X", "DELETE", self.server.url("/v2/health/live"))
        self.assertEqual(status, 405)
        self.assertRegex(headers, r"(?i)\r\nallow: GET, HEAD\r\n")
        status, headers, _ = curl(self.server.url("/v2/models/echo/infer"))
        self.assertEqual(status, 405)
        self.assertRegex(headers, r"(?i)\r\nallow: POST\r\n")

    def test_a_transfer_encoding_not_ending_in_chunked_is_refused_and_closes(self):
        smuggled = (b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                    b"Transfer-Encoding: gzip\r\n\r\n"
                    b"GET /v2/health/live?probe=smuggled HTTP/1.1\r\nHost: x\r\n\r\n")
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=10) as sock:
            sock.sendall(smuggled)
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
        self.assertTrue(received.startswith(b"HTTP/1.1 400"), received)
        self.assertIn(b"Transfer-Encoding 'gzip' is not supported", received)
        self.assertEqual(received.count(b"HTTP/1.1"), 1, "the rest was not read as a request")
        self.assertNotIn("probe=smuggled", self.server.log_text())

    def test_many_keep_alive_clients(self):
        duration = float(os.environ.get("OROCHI_LOAD_SECONDS", "30"))
        errors, answered = [], [0]
        lock = threading.Lock()
        body = json.dumps(echo_request(rows=1, values={"INT64": [0]}))

        def client(index):
            connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=60)
            request = body.replace('"data": [0]', f'"data": [{index}]')
            end = time.time() + duration
            while time.time() < end:
                connection.request("POST", "/v2/models/echo/infer", request,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
                outputs = {o["name"]: o for o in json.loads(payload)["outputs"]} \
                    if response.status == 200 else {}
                if response.status != 200 or outputs["out_int64"]["data"] != [index]:
                    with lock:
                        errors.append((response.status, payload[:200]))
                with lock:
                    answered[0] += 1
            connection.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.assertEqual(errors, [])
        self.assertGreater(answered[0], 100)
        print(f"\n100 keep-alive clients, {duration:.0f} s: {answered[0]} answers, no errors")


if __name__ == "__main__":
    unittest.main()
