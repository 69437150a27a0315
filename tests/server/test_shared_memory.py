"""Triton's system shared-memory extension on the real `orochi serve`: regions made with Python's
multiprocessing.shared_memory (POSIX shm_open objects in /dev/shm), registered over HTTP, named
by inference inputs and outputs; every refusal; a region unregistered while a request uses it;
and the CUDA extension's endpoints on a machine without a CUDA device (test_cuda_shared_memory
has the extension itself).

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_shared_memory
"""

import json
import os
import re
import shutil
import struct
import tempfile
import threading
import time
import unittest
from multiprocessing import shared_memory

import numpy as np

from server_fixtures import Server, curl, echo_request, pack_repository, post_json
from shared_memory_fixtures import SharedMemoryServer, fp32_input_in_region, shm


class Region:
    """A POSIX shared-memory object of `size` bytes, unlinked by close()."""

    def __init__(self, size: int):
        self.memory = shared_memory.SharedMemory(create=True, size=size)
        self.key = "/" + self.memory.name  # as shm_open takes it

    def array(self, dtype, count: int, offset: int = 0) -> np.ndarray:
        return np.ndarray((count,), dtype=dtype, buffer=self.memory.buf, offset=offset)

    def close(self):
        self.memory.close()
        self.memory.unlink()


def bytes_elements(items: list[bytes]) -> bytes:
    """BYTES elements as the binary extension and shared memory carry them."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


class SharedMemoryTest(SharedMemoryServer, unittest.TestCase):
    EXTENSION = "systemsharedmemory"

    def setUp(self):
        self.regions = []

    def tearDown(self):
        super().tearDown()
        for region in self.regions:
            region.close()

    def region(self, size: int) -> Region:
        region = Region(size)
        self.regions.append(region)
        return region

    def register(self, name, key, byte_size, offset=0):
        return self.register_region(name, {"key": key, "offset": offset, "byte_size": byte_size})

    def test_extension_is_listed(self):
        status, metadata = self.get("/v2")
        self.assertEqual(status, 200)
        self.assertIn("system_shared_memory", metadata["extensions"])

    def test_register_status_unregister(self):
        a, b = self.region(4096), self.region(8192)
        self.assertEqual(self.register("a", a.key, 1000, offset=96), (200, {}))
        self.assertEqual(self.register("b", b.key, 8192), (200, {}))
        status, regions = self.get("/v2/systemsharedmemory/status")
        self.assertEqual(status, 200)
        self.assertEqual(regions, [
            {"name": "a", "key": a.key, "offset": 96, "byte_size": 1000},
            {"name": "b", "key": b.key, "offset": 0, "byte_size": 8192}])
        self.assertEqual(self.get("/v2/systemsharedmemory/region/b/status"),
                         (200, [{"name": "b", "key": b.key, "offset": 0, "byte_size": 8192}]))
        status, error = self.get("/v2/systemsharedmemory/region/nope/status")
        self.assertEqual(status, 404)
        self.assertIn("unable to find system shared memory region: 'nope'", error["error"])

        self.assertEqual(self.post("/v2/systemsharedmemory/region/a/unregister"), (200, {}))
        self.assertEqual(self.get("/v2/systemsharedmemory/status")[1],
                         [{"name": "b", "key": b.key, "offset": 0, "byte_size": 8192}])
        # Unregistering what is not registered leaves it unregistered, as in Triton.
        self.assertEqual(self.post("/v2/systemsharedmemory/region/a/unregister"), (200, {}))
        self.assertEqual(self.post("/v2/systemsharedmemory/unregister"), (200, {}))
        self.assertEqual(self.get("/v2/systemsharedmemory/status"), (200, []))
        # The name is free again, and an empty JSON object is an empty body too.
        self.assertEqual(self.register("a", a.key, 4096), (200, {}))
        self.assertEqual(self.post("/v2/systemsharedmemory/region/a/unregister", {}), (200, {}))

    def test_registration_errors(self):
        region = self.region(4096)
        self.assertEqual(self.register("r", region.key, 4096), (200, {}))
        status, error = self.register("r", region.key, 16)
        self.assertEqual(status, 409)
        self.assertIn("shared memory region 'r' is already registered", error["error"])

        status, error = self.register("missing", "/orochi-no-such-object", 16)
        self.assertEqual(status, 400)
        self.assertIn("cannot open shared memory object '/orochi-no-such-object'", error["error"])
        self.assertIn("No such file or directory", error["error"])

        status, error = self.register("big", region.key, 4096, offset=1)
        self.assertEqual(status, 400)
        self.assertIn("offset 1 and byte_size 4096 run past the end of shared memory object",
                      error["error"])
        self.assertIn("(4096 bytes)", error["error"])
        status, error = self.register("big", region.key, 8192)
        self.assertEqual(status, 400)
        status, error = self.register("zero", region.key, 0)
        self.assertEqual(status, 400)
        self.assertIn("'byte_size' is 0", error["error"])

        for body, message in [
            ({"offset": 0, "byte_size": 16}, "'key' must be a string"),
            ({"key": region.key, "offset": 0}, "'byte_size' must be a non-negative integer"),
            ({"key": region.key, "offset": -1, "byte_size": 16}, "'offset' must be a non-negative"),
            ({"key": region.key, "byte_size": 16, "device_id": 0}, "unexpected field 'device_id'"),
        ]:
            status, error = self.post("/v2/systemsharedmemory/region/x/register", body)
            self.assertEqual(status, 400, body)
            self.assertIn(message, error["error"])
        status, error = self.post("/v2/systemsharedmemory/region/x/register")
        self.assertEqual(status, 400)
        self.assertIn("not a JSON object", error["error"])
        status, error = self.post("/v2/systemsharedmemory/unregister", {"name": "r"})
        self.assertEqual(status, 400)
        self.assertIn("has no body", error["error"])
        # None of that registered anything.
        self.assertEqual([r["name"] for r in self.get("/v2/systemsharedmemory/status")[1]], ["r"])

    def test_inputs_and_outputs_in_shared_memory(self):
        rows = 3
        inputs = self.region(4096)
        fp32 = np.array([0.5, -2.25, 3e38], dtype=np.float32)
        int64 = np.array([2**62 + 1, -3, 7], dtype=np.int64)
        texts = [b"h\xc3\xa9llo", b"", b"\x00\xff"]
        inputs.array(np.float32, rows, offset=0)[:] = fp32
        inputs.array(np.int64, rows, offset=64)[:] = int64
        serialized = bytes_elements(texts)
        inputs.memory.buf[128:128 + len(serialized)] = serialized
        outputs = self.region(4096)
        outputs.memory.buf[:] = b"\xee" * 4096
        self.assertEqual(self.register("in", inputs.key, 4096), (200, {}))
        # Registered at an offset within the object: request offsets count from there.
        self.assertEqual(self.register("out", outputs.key, 2048, offset=1024), (200, {}))

        request = echo_request(rows)
        for item in request["inputs"]:
            if item["name"] == "in_fp32":
                del item["data"]
                item["parameters"] = shm("in", 12)
            elif item["name"] == "in_int64":
                del item["data"]
                item["parameters"] = shm("in", 24, offset=64)
            elif item["name"] == "in_bytes":
                del item["data"]
                item["parameters"] = shm("in", len(serialized), offset=128)
        request["outputs"] = [
            {"name": "out_fp32", "parameters": shm("out", 64, offset=8)},
            {"name": "out_bytes", "parameters": shm("out", 100, offset=200)},
            {"name": "out_int64"},
            {"name": "out_int32", "parameters": {"binary_data": False}},
        ]
        status, response = self.infer(request)
        self.assertEqual(status, 200, response)
        by_name = {output["name"]: output for output in response["outputs"]}
        self.assertEqual(by_name["out_fp32"], {
            "name": "out_fp32", "datatype": "FP32", "shape": [rows, 1],
            "parameters": {"shared_memory_region": "out", "shared_memory_offset": 8,
                           "shared_memory_byte_size": 12}})
        self.assertEqual(by_name["out_bytes"]["parameters"]["shared_memory_byte_size"],
                         len(serialized))
        self.assertNotIn("data", by_name["out_bytes"])
        # An input read from shared memory reaches the model, and back in JSON.
        self.assertEqual(by_name["out_int64"]["data"], [int(v) for v in int64])
        self.assertEqual(by_name["out_int32"]["data"], [2**31 - 1, -7, 2**31 - 1])
        region = outputs.memory.buf
        np.testing.assert_array_equal(
            np.frombuffer(bytes(region[1024 + 8:1024 + 20]), dtype=np.float32), fp32)
        self.assertEqual(bytes(region[1024 + 200:1024 + 200 + len(serialized)]), serialized)
        # Nothing outside what was written changed.
        self.assertEqual(bytes(region[:1024 + 8]), b"\xee" * (1024 + 8))
        self.assertEqual(bytes(region[1024 + 20:1024 + 200]), b"\xee" * 180)

    def test_large_input_and_output(self):
        count = 1 << 20
        region = self.region(8 * count)
        values = np.arange(count, dtype=np.float32)
        region.array(np.float32, count)[:] = values
        self.assertEqual(self.register("big", region.key, 8 * count), (200, {}))
        request = fp32_input_in_region(shm("big", 4 * count), shape=[1, count])
        request["outputs"] = [{"name": "out_fp32", "parameters": shm("big", 4 * count, 4 * count)}]
        status, response = self.infer(request)
        self.assertEqual(status, 200, response)
        np.testing.assert_array_equal(region.array(np.float32, count, offset=4 * count), values)

    def assert_refused(self, request, *messages, status=400):
        answer_status, answer = self.infer(request)
        self.assertEqual(answer_status, status, answer)
        for message in messages:
            self.assertIn(message, answer["error"])

    def test_inference_errors(self):
        region = self.region(4096)
        region.memory.buf[:] = b"\x00" * 4096
        self.assertEqual(self.register("r", region.key, 64, offset=4000 - 64), (200, {}))
        self.assert_refused(fp32_input_in_region(shm("nope", 4)),
                            "input 'in_fp32': unable to find shared memory region: 'nope'")
        self.assert_refused(fp32_input_in_region(shm("r", 4, offset=61)),
                            "input 'in_fp32': shared_memory_offset 61 and "
                            "shared_memory_byte_size 4 run past the end of shared memory region "
                            "'r' (64 bytes)")
        self.assert_refused(fp32_input_in_region(shm("r", 2**64 - 1, offset=8)),
                            "shared_memory_offset 8 and shared_memory_byte_size "
                            "18446744073709551615 run past the end of shared memory region 'r'")
        self.assert_refused(fp32_input_in_region(shm("r", 8)),
                            "input 'in_fp32': shared_memory_byte_size is 8 bytes, but shape [1, 1] "
                            "of FP32 needs 4")
        self.assert_refused(fp32_input_in_region(shm("r", 4), data=[1.0]),
                            "input 'in_fp32' has both shared_memory_region and 'data'")
        self.assert_refused(fp32_input_in_region({"shared_memory_region": "r"}),
                            "shared_memory_region needs shared_memory_byte_size")
        self.assert_refused(fp32_input_in_region({"shared_memory_byte_size": 4}),
                            "need shared_memory_region")
        self.assert_refused(fp32_input_in_region(shm("r", -4)),
                            "shared_memory_byte_size must be a non-negative integer")
        self.assert_refused(fp32_input_in_region({"shared_memory_region": 3,
                                                       "shared_memory_byte_size": 4}),
                            "shared_memory_region must be the name of a registered region")

        def with_output(parameters):
            request = echo_request(1)
            request["outputs"] = [{"name": "out_fp32", "parameters": parameters}]
            return request

        self.assert_refused(with_output(shm("nope", 4)),
                            "output 'out_fp32': unable to find shared memory region: 'nope'")
        self.assert_refused(with_output(shm("r", 64, offset=1)),
                            "output 'out_fp32': shared_memory_offset 1 and shared_memory_byte_size "
                            "64 run past the end of shared memory region 'r'")
        self.assert_refused(with_output({**shm("r", 4), "binary_data": True}),
                            "asks for both binary_data and shared_memory_region")
        self.assert_refused(with_output({**shm("r", 4), "classification": 1}),
                            "classification cannot be written to shared memory")
        self.assert_refused(with_output({"shared_memory_offset": 0}), "need shared_memory_region")
        # An output larger than its byte size: refused after the model ran, nothing written.
        region.memory.buf[4000 - 64:4000] = b"\xab" * 64
        request = echo_request(4)
        request["outputs"] = [{"name": "out_fp32", "parameters": shm("r", 8)},
                              {"name": "out_int8", "parameters": shm("r", 8, offset=16)}]
        self.assert_refused(request, "output 'out_fp32' of model 'echo' has 16 bytes (shape "
                                     "[4, 1]), more than its shared_memory_byte_size 8 in shared "
                                     "memory region 'r' at offset 0")
        self.assertEqual(bytes(region.memory.buf[4000 - 64:4000]), b"\xab" * 64)

    def test_region_unregistered_while_in_use(self):
        """The request that uses a region keeps it mapped: unregistering it answers at once and
        the request still reads its input and writes its output there."""
        region = self.region(64)
        region.array(np.float64, 1)[0] = 1.5  # seconds to sleep
        region.memory.buf[16] = 0
        self.assertEqual(self.register("busy", region.key, 64), (200, {}))
        request = {"inputs": [
            {"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["sleep"]},
            {"name": "seconds", "datatype": "FP64", "shape": [1], "parameters": shm("busy", 8)}],
            "outputs": [{"name": "done", "parameters": shm("busy", 1, offset=16)}]}
        answers = []
        thread = threading.Thread(target=lambda: answers.append(self.infer(request, "slow")))
        thread.start()
        time.sleep(0.5)
        started = time.monotonic()
        self.assertEqual(self.post("/v2/systemsharedmemory/region/busy/unregister"), (200, {}))
        self.assertLess(time.monotonic() - started, 0.5)
        self.assertEqual(self.get("/v2/systemsharedmemory/status"), (200, []))
        thread.join(timeout=30)
        status, response = answers[0]
        self.assertEqual(status, 200, response)
        self.assertEqual(response["outputs"][0]["parameters"]["shared_memory_region"], "busy")
        self.assertEqual(region.memory.buf[16], 1)  # True, written after the unregister
        # Later requests no longer find it.
        status, error = self.infer(request, "slow")
        self.assertEqual(status, 400)
        self.assertIn("unable to find shared memory region: 'busy'", error["error"])

    def test_region_truncated_after_registration(self):
        """A client may shrink its object (ftruncate) after registering it: the server never
        touches bytes past the object's end (a mapping's would kill the serving process with
        SIGBUS), refuses what no longer fits with the sizes, and goes on serving."""
        size = 1 << 20
        region = self.region(size)
        self.assertEqual(self.register("cut", region.key, size - 4096, offset=4096), (200, {}))
        serving_pid = self.server.serving_pid
        # Through a descriptor of its own: the test's mapping must not touch the cut pages either.
        fd = os.open("/dev/shm" + region.key, os.O_RDWR)
        try:
            os.ftruncate(fd, 0)
            output = {"name": "out_fp32", "parameters": shm("cut", 64, offset=8)}
            self.assert_refused(fp32_input_in_region(shm("cut", 4)),
                                "input 'in_fp32': shared memory region 'cut' holds 0 bytes now "
                                "(its object was truncated to 0 bytes); the input needs 4 bytes "
                                "at offset 0")
            self.assert_refused({**echo_request(1), "outputs": [output]},
                                "output 'out_fp32': shared memory region 'cut' holds 0 bytes now "
                                "(its object was truncated to 0 bytes); the output needs 64 bytes "
                                "at offset 8")
            # Cut within the region: what still lies in it is read, what does not is refused.
            os.ftruncate(fd, 4096 + 6)
            os.pwrite(fd, np.float32(2.5).tobytes(), 4096)
            request = fp32_input_in_region(shm("cut", 4))
            request["outputs"] = [{"name": "out_fp32", "parameters": {"binary_data": False}}]
            status, response = self.infer(request)
            self.assertEqual(status, 200, response)
            self.assertEqual(response["outputs"][0]["data"], [2.5])
            self.assert_refused(fp32_input_in_region(shm("cut", 4, offset=4)),
                                "shared memory region 'cut' holds 6 bytes now (its object was "
                                "truncated to 4102 bytes); the input needs 4 bytes at offset 4")
            # Grown back, the region serves again.
            os.ftruncate(fd, size)
            os.pwrite(fd, np.float32(-7.0).tobytes(), 4096 + 4)
            status, response = self.infer({**fp32_input_in_region(shm("cut", 4, offset=4)),
                                           "outputs": [output]})
            self.assertEqual(status, 200, response)
            self.assertEqual(os.pread(fd, 4, 4096 + 8), np.float32(-7.0).tobytes())
        finally:
            os.close(fd)
        # The same serving process answers: no crash and no restart.
        self.assertEqual(curl(self.server.url("/v2/health/ready"))[0], 200)
        self.assertEqual(re.findall(r" serving .* pid=(\d+)", self.server.log_text())[-1],
                         str(serving_pid))
        os.kill(serving_pid, 0)

    def test_cuda_shared_memory_without_a_cuda_device_is_refused_clearly(self):
        # Served (test_cuda_shared_memory shares device memory on a GPU), but this machine has
        # none: nothing is registered, and a registration says why.
        if "cuda_shared_memory" in self.get("/v2")[1]["extensions"]:
            self.skipTest("the server has a CUDA device: test_cuda_shared_memory covers it")
        self.assertEqual(self.get("/v2/cudasharedmemory/status"), (200, []))
        status, error = self.post("/v2/cudasharedmemory/region/g/register", {
            "raw_handle": {"b64": "AA" * 42 + "AA=="}, "device_id": 0, "byte_size": 16})
        self.assertEqual(status, 400)
        self.assertIn("cannot register CUDA shared memory region 'g': 'device_id' 0 names no "
                      "device: this server has no CUDA device (", error["error"])
        self.assertEqual(self.post("/v2/cudasharedmemory/unregister"), (200, {}))


class SharedMemoryInputBoundTest(SharedMemoryServer, unittest.TestCase):
    """Inputs read from shared memory count as the request's own bytes."""

    EXTENSION = "systemsharedmemory"
    CONFIG = {"http": {"allow_shared_memory": True, "max_body_bytes": 64 << 10}}

    def test_inputs_in_shared_memory_count_against_the_request_bound(self):
        # A request of 2 KB once had 1 GiB read into the server's memory from a region, past
        # every bound on a request's bytes: three at once took 2.5 GB.
        region = Region(256 << 10)
        try:
            self.assertEqual(self.register_region("big", {"key": region.key,
                                                          "byte_size": 256 << 10}), (200, {}))
            status, answer = self.infer(fp32_input_in_region(shm("big", 128 << 10),
                                                             shape=[1, 32 << 10]))
            self.assertEqual(status, 413, answer)
            self.assertRegex(answer["error"], r"the request has \d+ bytes with 131072 of inputs "
                             r"in shared memory, which count as its own; the server takes at "
                             r"most 65536 in a request")
            # Within the bound, it is read as before.
            region.array(np.float32, 1024)[:] = 1.5
            request = fp32_input_in_region(shm("big", 4096), shape=[1, 1024])
            request["outputs"] = [{"name": "out_fp32", "parameters": {"binary_data": False}}]
            status, answer = self.infer(request)
            self.assertEqual(status, 200, answer)
            self.assertEqual(answer["outputs"][0]["data"], [1.5] * 1024)
        finally:
            self.post(f"/v2/{self.EXTENSION}/unregister")
            region.close()


class SharedMemoryDisabledTest(unittest.TestCase):
    """Off by default: registering says how the operator turns it on."""

    def test_register_is_refused(self):
        root = tempfile.mkdtemp(prefix="orochi-shm-off-")
        region = Region(64)
        try:
            server = Server(pack_repository(root), {}, copies=1)
            try:
                status, _, body = curl(
                    "-X", "POST", server.url("/v2/systemsharedmemory/region/r/register"),
                    data=json.dumps({"key": region.key, "offset": 0, "byte_size": 64}).encode())
                self.assertEqual(status, 400)
                self.assertIn("system shared memory is disabled on this server",
                              json.loads(body)["error"])
                self.assertIn("http.allow_shared_memory", json.loads(body)["error"])
                status, _, body = curl(server.url("/v2/systemsharedmemory/status"))
                self.assertEqual((status, json.loads(body)), (200, []))
                request = echo_request(1)
                request["inputs"][0]["parameters"] = shm("r", 1)
                del request["inputs"][0]["data"]
                status, _, body = post_json(server, "/v2/models/echo/infer", request)
                self.assertEqual(status, 400)
                self.assertIn("(shared memory is disabled on this server)",
                              json.loads(body)["error"])
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            region.close()
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
