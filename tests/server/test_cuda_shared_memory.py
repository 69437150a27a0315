"""Triton's CUDA shared-memory extension on the real `orochi serve`: this process, as a client,
allocates device memory with the CUDA runtime (through ctypes, as Triton's client utilities do),
exports it with cudaIpcGetMemHandle, registers the handle over HTTP and gRPC, and names the
region in inference inputs and outputs; then every refusal.

Which CUDA runtime the client uses: OROCHI_CLIENT_CUDA_RUNTIME names it, else the machine's
libcudart. ctest runs this file twice: on the machine's GPU (skipped, saying why, without one),
and on the emulated GPU, with OROCHI_CUDA_BACKEND naming the emulated backend for the server and
OROCHI_CLIENT_CUDA_RUNTIME the emulator's runtime for the client, whose IPC handles name memory
the server maps from this process.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_cuda_shared_memory
"""

import base64
import ctypes
import ctypes.util
import os
import unittest

import grpc
import numpy as np

from server_fixtures import echo_request
from shared_memory_fixtures import SharedMemoryServer, fp32_input_in_region, shm
import test_grpc  # the client generated from the server's proto

pb = test_grpc.pb

HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2  # cudaMemcpyKind


class CudaRuntime:
    """The few CUDA runtime calls a shared-memory client makes."""

    def __init__(self, path: str):
        self.lib = ctypes.CDLL(path)
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p
        count = ctypes.c_int(0)
        self.device_count = count.value if self.lib.cudaGetDeviceCount(ctypes.byref(count)) == 0 \
            else 0

    def check(self, error: int, what: str):
        if error != 0:
            raise RuntimeError(f"{what}: {self.lib.cudaGetErrorString(error).decode()}")

    def malloc(self, size: int, device: int = 0) -> int:
        self.check(self.lib.cudaSetDevice(device), "cudaSetDevice")
        pointer = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
        return pointer.value

    def free(self, pointer: int):
        self.check(self.lib.cudaFree(ctypes.c_void_p(pointer)), "cudaFree")

    def upload(self, pointer: int, data: bytes):
        self.check(self.lib.cudaMemcpy(ctypes.c_void_p(pointer), data, ctypes.c_size_t(len(data)),
                                       HOST_TO_DEVICE), "cudaMemcpy to the device")

    def download(self, pointer: int, size: int) -> bytes:
        buffer = ctypes.create_string_buffer(size)
        self.check(self.lib.cudaMemcpy(buffer, ctypes.c_void_p(pointer), ctypes.c_size_t(size),
                                       DEVICE_TO_HOST), "cudaMemcpy to the host")
        return buffer.raw

    def ipc_handle(self, pointer: int) -> bytes:
        handle = ctypes.create_string_buffer(64)  # cudaIpcMemHandle_t
        self.check(self.lib.cudaIpcGetMemHandle(handle, ctypes.c_void_p(pointer)),
                   "cudaIpcGetMemHandle")
        return handle.raw


def client_runtime() -> tuple[CudaRuntime | None, str]:
    """The client's CUDA runtime with at least one device, or None and why not."""
    path = os.environ.get("OROCHI_CLIENT_CUDA_RUNTIME") or ctypes.util.find_library("cudart")
    if not path:
        return None, "no CUDA runtime for the client (libcudart), so no GPU to share memory on"
    try:
        runtime = CudaRuntime(path)
    except OSError as error:
        return None, f"the CUDA runtime {path} does not load: {error}"
    if runtime.device_count == 0:
        return None, f"the CUDA runtime {path} finds no device"
    return runtime, ""


RUNTIME, WHY_NOT = client_runtime()


@unittest.skipIf(RUNTIME is None, WHY_NOT)
class CudaSharedMemoryTest(test_grpc.GrpcClient, SharedMemoryServer, unittest.TestCase):
    EXTENSION = "cudasharedmemory"

    def setUp(self):
        self.allocations = []

    def tearDown(self):
        super().tearDown()
        for pointer in self.allocations:
            RUNTIME.free(pointer)

    def allocation(self, size: int, fill: bytes = b"") -> tuple[int, str]:
        """Device memory of `size` bytes starting with `fill`, and its handle in base64."""
        pointer = RUNTIME.malloc(size)
        self.allocations.append(pointer)
        if fill:
            RUNTIME.upload(pointer, fill)
        return pointer, base64.b64encode(RUNTIME.ipc_handle(pointer)).decode()

    def register(self, name, handle, byte_size, device_id=0):
        return self.register_region(name, {"raw_handle": {"b64": handle}, "device_id": device_id,
                                           "byte_size": byte_size})

    def test_extension_is_listed(self):
        status, metadata = self.get("/v2")
        self.assertEqual(status, 200)
        self.assertIn("cuda_shared_memory", metadata["extensions"])
        self.assertIn("cuda_shared_memory",
                      self.stub.ServerMetadata(pb.ServerMetadataRequest()).extensions)

    def test_register_status_unregister(self):
        _, a = self.allocation(4096)
        _, b = self.allocation(1 << 20)
        self.assertEqual(self.register("a", a, 4096), (200, {}))
        self.assertEqual(self.register("b", b, 1000), (200, {}))
        self.assertEqual(self.get("/v2/cudasharedmemory/status"), (200, [
            {"name": "a", "device_id": 0, "byte_size": 4096},
            {"name": "b", "device_id": 0, "byte_size": 1000}]))
        self.assertEqual(self.get("/v2/cudasharedmemory/region/b/status"),
                         (200, [{"name": "b", "device_id": 0, "byte_size": 1000}]))
        # One namespace of names, two kinds: the system extension neither lists nor removes them.
        self.assertEqual(self.get("/v2/systemsharedmemory/status"), (200, []))
        self.assertEqual(self.post("/v2/systemsharedmemory/unregister"), (200, {}))
        self.assertEqual(self.post("/v2/cudasharedmemory/region/a/unregister"), (200, {}))
        status, error = self.get("/v2/cudasharedmemory/region/a/status")
        self.assertEqual(status, 404)
        self.assertIn("unable to find cuda shared memory region: 'a'", error["error"])
        self.assertEqual(self.post("/v2/cudasharedmemory/unregister"), (200, {}))
        self.assertEqual(self.get("/v2/cudasharedmemory/status"), (200, []))

    def test_inputs_and_outputs_in_device_memory(self):
        rows = 3
        fp32 = np.array([0.5, -2.25, 3e38], dtype=np.float32)
        int64 = np.array([2**62 + 1, -3, 7], dtype=np.int64)
        _, inputs = self.allocation(4096, fp32.tobytes() + bytes(52) + int64.tobytes())
        outputs, out_handle = self.allocation(4096, b"\xee" * 4096)
        self.assertEqual(self.register("in", inputs, 4096), (200, {}))
        self.assertEqual(self.register("out", out_handle, 4096), (200, {}))
        request = echo_request(rows)
        for item in request["inputs"]:
            if item["name"] == "in_fp32":
                del item["data"]
                item["parameters"] = shm("in", 12)
            elif item["name"] == "in_int64":
                del item["data"]
                item["parameters"] = shm("in", 24, offset=64)
        request["outputs"] = [{"name": "out_fp32", "parameters": shm("out", 64, offset=8)},
                              {"name": "out_int64"}]
        status, answer = self.infer(request)
        self.assertEqual(status, 200, answer)
        by_name = {output["name"]: output for output in answer["outputs"]}
        self.assertEqual(by_name["out_fp32"]["parameters"], {
            "shared_memory_region": "out", "shared_memory_offset": 8,
            "shared_memory_byte_size": 12})
        # Read from the device: the model saw the values; written to it: the client reads them.
        self.assertEqual(by_name["out_int64"]["data"], [int(v) for v in int64])
        written = RUNTIME.download(outputs, 4096)
        np.testing.assert_array_equal(np.frombuffer(written[8:20], dtype=np.float32), fp32)
        self.assertEqual(written[:8] + written[20:], b"\xee" * (4096 - 12))

    def test_large_tensor_through_device_memory(self):
        count = 1 << 20
        values = np.arange(count, dtype=np.float32)
        pointer, handle = self.allocation(8 * count, values.tobytes())
        self.assertEqual(self.register("big", handle, 8 * count), (200, {}))
        request = fp32_input_in_region(shm("big", 4 * count), shape=[1, count])
        request["outputs"] = [{"name": "out_fp32", "parameters": shm("big", 4 * count, 4 * count)}]
        status, answer = self.infer(request)
        self.assertEqual(status, 200, answer)
        np.testing.assert_array_equal(
            np.frombuffer(RUNTIME.download(pointer + 4 * count, 4 * count), dtype=np.float32),
            values)

    def test_registered_over_grpc_and_used_over_http(self):
        _, handle = self.allocation(4096, np.float32(1.5).tobytes())
        self.stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(
            name="g", raw_handle=base64.b64decode(handle), device_id=0, byte_size=4096))
        answer = self.stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest())
        self.assertEqual(list(answer.regions), ["g"])
        self.assertEqual((answer.regions["g"].device_id, answer.regions["g"].byte_size), (0, 4096))
        request = fp32_input_in_region(shm("g", 4))
        status, answer = self.infer(request)
        self.assertEqual(status, 200, answer)
        by_name = {output["name"]: output for output in answer["outputs"]}
        self.assertEqual(by_name["out_fp32"]["data"], [1.5])
        with self.assertRaises(grpc.RpcError) as refused:
            self.stub.CudaSharedMemoryRegister(pb.CudaSharedMemoryRegisterRequest(
                name="g2", raw_handle=b"short", device_id=0, byte_size=16))
        self.assertEqual(refused.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("'raw_handle' has 5 bytes", refused.exception.details())
        self.stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(name="g"))
        with self.assertRaises(grpc.RpcError) as gone:
            self.stub.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest(name="g"))
        self.assertEqual(gone.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_refusals(self):
        _, handle = self.allocation(4096)
        self.assertEqual(self.register("r", handle, 4096), (200, {}))
        status, error = self.register("r", handle, 16)
        self.assertEqual(status, 409)
        self.assertIn("shared memory region 'r' is already registered", error["error"])
        for body, message in [
            ({"device_id": 0, "byte_size": 16}, "'raw_handle' must be {\"b64\""),
            ({"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 16},
             "'raw_handle' must be {\"b64\""),
            ({"raw_handle": handle, "device_id": 0, "byte_size": 16}, "'raw_handle' must be"),
            ({"raw_handle": {"b64": handle}, "byte_size": 16}, "'device_id' must be an integer"),
            ({"raw_handle": {"b64": handle}, "device_id": 0}, "'byte_size' must be a non-negative"),
            ({"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 16, "key": "/x"},
             "unexpected field 'key'"),
            ({"raw_handle": {"b64": base64.b64encode(b"x" * 63).decode()}, "device_id": 0,
              "byte_size": 16}, "'raw_handle' has 63 bytes"),
            ({"raw_handle": {"b64": handle}, "device_id": 99, "byte_size": 16},
             "'device_id' 99 names no device"),
            ({"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 0}, "'byte_size' is 0"),
            # 64 bytes that name no allocation: the driver refuses them.
            ({"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()}, "device_id": 0,
              "byte_size": 16}, "opening the CUDA IPC handle failed on cuda:0"),
        ]:
            status, error = self.post("/v2/cudasharedmemory/region/x/register", body)
            self.assertEqual(status, 400, body)
            self.assertIn(message, error["error"])
        self.assertEqual([r["name"] for r in self.get("/v2/cudasharedmemory/status")[1]], ["r"])

        # Ranges past the registered size, and a registered size past the allocation's.
        request = fp32_input_in_region(shm("r", 4, offset=4094))
        status, answer = self.infer(request)
        self.assertEqual(status, 400, answer)
        self.assertIn("run past the end of shared memory region 'r' (4096 bytes)",
                      answer["error"])
        for item in request["inputs"]:
            if item["name"] == "in_fp32":
                item["shape"] = [1, 1024]
                item["parameters"] = shm("r", 4096)
        status, answer = self.infer(request)
        self.assertEqual(status, 200, answer)


    @unittest.skipUnless(os.environ.get("OROCHI_CLIENT_CUDA_RUNTIME"),
                         "on a real GPU whether a copy past the allocation fails depends on what "
                         "the driver mapped next to it; the emulated GPU's guard pages always do")
    def test_a_registered_size_past_the_allocation_is_refused_by_the_device(self):
        _, handle = self.allocation(4096)
        self.assertEqual(self.register("lying", handle, 1 << 20), (200, {}))
        request = fp32_input_in_region(shm("lying", 4096, offset=8192), shape=[1, 1024])
        status, answer = self.infer(request)
        self.assertEqual(status, 400, answer)
        self.assertIn("input 'in_fp32': CUDA shared memory region 'lying'",
                      answer["error"])
        request["outputs"] = [{"name": "out_fp32", "parameters": shm("lying", 4096, offset=8192)}]
        for item in request["inputs"]:
            if item["name"] == "in_fp32":
                item["parameters"] = shm("lying", 4096)
        status, answer = self.infer(request)
        self.assertEqual(status, 400, answer)
        self.assertIn("output 'out_fp32': CUDA shared memory region 'lying'",
                      answer["error"])


if __name__ == "__main__":
    unittest.main()
