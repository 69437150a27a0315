"""The real `orochi serve`, driven with the real curl: every KServe v2 endpoint, every datatype
in JSON and with the binary extension, errors and limits, batching, deadlines, metrics (checked
by promtool), graceful shutdown and many concurrent keep-alive clients.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_server
"""

import http.client
import json
import math
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import unittest

from server_fixtures import (BINARY, HERE, HeldConnectionsTest, Server, SharedServerTest,
                             child_pids, cpu_seconds, curl, echo_request, pack_repository,
                             post_json, slow_request, socket_inodes, tcp_inodes_on_port)


class CompressionLimitsTest(SharedServerTest):
    CONFIG = {"http": {"max_body_bytes": 1 << 20}}

    def test_the_body_limit_holds_for_the_decompressed_size_and_bombs_stop_there(self):
        import gzip
        import zlib
        # 64 MB of zeros is 64 KB of gzip: refused once 1 MB has come out, never inflated whole.
        bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
        self.assertLess(len(bomb), 1 << 20)
        started = time.monotonic()
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: gzip",
                               self.server.url("/v2/models/echo/infer"), data=bomb)
        self.assertEqual(status, 413, body)
        self.assertEqual(json.loads(body)["error"],
                         "the request body decompresses (gzip) to more than the limit of "
                         "1048576 bytes (http.max_body_bytes)")
        self.assertLess(time.monotonic() - started, 5)
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: deflate",
                               self.server.url("/v2/models/echo/infer"),
                               data=zlib.compress(b" " * (2 << 20)))
        self.assertEqual(status, 413, body)
        request = json.dumps(echo_request()).encode()
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: gzip",
                               self.server.url("/v2/models/echo/infer"),
                               data=gzip.compress(request))
        self.assertEqual(status, 200, body)
        self.assertEqual(self.server.process.poll(), None)


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
        request = echo_request(rows=2)
        binary = b""
        for entry in request["inputs"]:
            if entry["datatype"] == "FP32":
                raw = struct.pack("<2f", 1.25, -8.0)
            elif entry["datatype"] == "BYTES":
                raw = b"".join(struct.pack("<I", len(item)) + item for item in (b"\x00\xff", b"ab"))
            else:
                continue
            entry.pop("data")
            entry["parameters"] = {"binary_data_size": len(raw)}
            binary += raw
        request["outputs"] = [{"name": "out_fp32", "parameters": {"binary_data": True}},
                              {"name": "out_bytes", "parameters": {"binary_data": True}},
                              {"name": "out_int8"}]
        header = json.dumps(request).encode()
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
             "output 'out_fp32': unable to find system shared memory region: 'r'"),
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
                     "process_open_fds"):
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
        target = os.path.join(repository, "gated", "1")
        os.makedirs(target)
        subprocess.run([BINARY, "pack", os.path.join(HERE, "models", "gated"), "-o",
                        os.path.join(target, "model.orochi")], check=True, capture_output=True)
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


class ModelOutputTest(unittest.TestCase):
    """What served models print becomes log records with the model's name, bounded in rate
    and in line length."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-model-output-test-")
        repository = os.path.join(cls.root, "repository")
        target = os.path.join(repository, "printer", "1")
        os.makedirs(target)
        subprocess.run([BINARY, "pack", os.path.join(HERE, "models", "printer"), "-o",
                        os.path.join(target, "model.orochi")], check=True, capture_output=True)
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


class ConnectionFloodTest(HeldConnectionsTest):
    """Many idle connections: the server neither spins nor stops answering once they go."""

    def open_connections(self, port, count):
        for _ in range(count):
            self.sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))

    def assert_not_spinning(self, server):
        before = cpu_seconds(server.serving_pid)
        time.sleep(1.0)
        used = cpu_seconds(server.serving_pid) - before
        self.assertLess(used, 0.3, f"the server used {used:.2f} s of CPU in 1 s while idle")

    def close_connections_then_expect_health(self, server):
        for sock in self.sockets:
            sock.close()
        self.sockets = []
        deadline = time.time() + 10
        while time.time() < deadline:
            if curl("--max-time", "2", server.url("/v2/health/live"))[0] == 200:
                return
            time.sleep(0.1)
        self.fail("the server does not answer health after the clients went away")

    def test_out_of_file_descriptors_backs_off_and_recovers(self):
        import resource
        server = Server(self.repository, {}, copies=1, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (80, 80)))
        try:
            self.open_connections(server.port, 150)  # more than the server has descriptors
            time.sleep(0.3)
            self.assert_not_spinning(server)
            self.assertIn("cannot accept connections; retrying every 100 ms", server.log_text())
            self.close_connections_then_expect_health(server)
        finally:
            self.assertEqual(server.stop(), 0)


class IdleTimeoutTest(SharedServerTest):
    """http.idle_timeout_s = 1: for idle connections and stalled bodies, not slow ones."""

    CONFIG = {"http": {"idle_timeout_s": 1}}
    COPIES = 1

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.server.port), timeout=10)

    @staticmethod
    def read_all(sock):
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received

    def test_a_body_that_keeps_coming_may_take_longer_than_the_idle_timeout(self):
        body = json.dumps(echo_request()).encode()
        with self.connect() as sock:
            sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nConnection: close"
                         b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            start = time.time()
            step = len(body) // 10 + 1
            for at in range(0, len(body), step):  # 2.5 s in all, 0.25 s between pieces
                sock.sendall(body[at:at + step])
                time.sleep(0.25)
            received = self.read_all(sock)
        self.assertGreater(time.time() - start, 2.0)
        self.assertTrue(received.startswith(b"HTTP/1.1 200"), received[:300])

    def test_a_stalled_body_gets_408(self):
        with self.connect() as sock:
            sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 100\r\n\r\n{\"inputs\"")
            start = time.time()
            received = self.read_all(sock)
        self.assertTrue(received.startswith(b"HTTP/1.1 408"), received)
        self.assertIn(b"no data of the request body arrived for 1 s", received)
        self.assertLess(time.time() - start, 3)

    def test_an_idle_connection_is_closed_quietly(self):
        with self.connect() as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
            self.assertTrue(first.startswith(b"HTTP/1.1 200"), first)
            start = time.time()
            self.assertEqual(self.read_all(sock), b"", "closed without an answer")
            self.assertLess(time.time() - start, 3)


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
            for port in (server.port, server.metrics_port, server.management_port):
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
            target = os.path.join(self.root, "repository", name, "1")
            os.makedirs(target)
            subprocess.run([BINARY, "pack", os.path.join(HERE, "models", name), "-o",
                            os.path.join(target, "model.orochi")], check=True,
                           capture_output=True)
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


class ShutdownTest(unittest.TestCase):
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
