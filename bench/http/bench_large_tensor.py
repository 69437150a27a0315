"""bench/http: one large FP32 tensor (64 MB by default) through the identity model, in and out,
by HTTP JSON, HTTP with the binary tensor extension, gRPC with raw_input_contents (ModelInfer,
the answer in raw_output_contents), and system shared memory (Triton's extension), in the same
run. For each: the time of a request from the first
byte sent to the last byte of the answer received, and the serving process's peak resident
memory above the idle server's (VmHWM, reset through /proc/PID/clear_refs; a fresh server for
each transport, so that none inherits another's freed blocks). Prints the ratios to shared
memory.

Client-side encoding is left out of every time: the JSON and binary bodies and the gRPC message
(serialized) are built before the clock starts, the shared-memory input is written into the
region before it, and the answers are read as bytes (the JSON and gRPC ones are parsed once
afterwards, untimed, to check them). So the times are
the server's and the transport's cost, which is what shared memory removes.

    /usr/bin/python3.11 bench/http/bench_large_tensor.py [--megabytes 64] [--repeats 5]

Needs numpy, grpcio and protobuf (Debian's python3-numpy, python3-grpcio, python3-protobuf),
protoc, and a built build/bin/orochi; Linux (/proc, /dev/shm).
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from multiprocessing import shared_memory

import grpc
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from load import free_port, stop  # noqa: E402
import grpc_messages  # noqa: E402  (bench/http, next to this file)
BINARY = os.environ.get("OROCHI_BINARY", os.path.join(ROOT, "build", "bin", "orochi"))


def peak_reset(pid: int) -> None:
    # "5" resets the peak resident set size (VmHWM) to the current one (Linux 4.0+).
    with open(f"/proc/{pid}/clear_refs", "w") as file:
        file.write("5")


def memory_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as file:
        for line in file:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def wait_ready(port: int, server: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
                                        timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None or time.time() > deadline:
            raise SystemExit("the server did not come up")
        time.sleep(0.1)


class Client:
    """One keep-alive connection; post() returns (status, headers, body bytes)."""

    def __init__(self, port: int):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)

    def post(self, path: str, body: bytes, headers: dict | None = None):
        self.connection.request("POST", path, body,
                                {"Content-Type": "application/json", **(headers or {})})
        response = self.connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()


class Server:
    """A fresh `orochi serve` (one copy, no supervisor: the process started is the one serving,
    whose memory is read) for one transport, so that no transport's peak includes what an
    earlier one left allocated (the engine keeps freed blocks for reuse)."""

    def __init__(self, repository: str, config_path: str):
        self.port, self.grpc_port = free_port(), free_port()
        self.process = subprocess.Popen(
            [BINARY, "serve", "--config", config_path, "--model-repository", repository,
             "--copies", "1", "--http-port", str(self.port), "--grpc-port", str(self.grpc_port),
             "--metrics-port", str(free_port()),
             "--management-port", str(free_port()), "--bind", "127.0.0.1", "--log-level",
             "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.port, self.process)
        self.client = Client(self.port)

    def measure(self, repeats: int, run) -> dict:
        """Times `repeats` runs after one to warm up; the peak resident memory above the idle
        server's covers them all, the warm-up included."""
        pid = self.process.pid
        baseline = memory_kb(pid, "VmRSS")
        baseline_shared = memory_kb(pid, "RssShmem")
        peak_reset(pid)
        run(self.client)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run(self.client)
            times.append(time.perf_counter() - started)
        # Pages of shared memory the server touched count in its resident set: for shared
        # memory, the client's region (mapped, not allocated). Told apart from the rest.
        return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
                "peak_mb": (memory_kb(pid, "VmHWM") - baseline) / 1024,
                "shared_mb": (memory_kb(pid, "RssShmem") - baseline_shared) / 1024}

    def stop(self):
        self.client.connection.close()
        stop(self.process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json-repeats", type=int, default=2,
                        help="JSON takes seconds a request: fewer repeats")
    args = parser.parse_args()
    count = args.megabytes * (1 << 20) // 4
    size = count * 4
    values = np.random.default_rng(0).standard_normal(count, dtype=np.float32)

    scratch = tempfile.mkdtemp(prefix="orochi-bench-large-")
    region = shared_memory.SharedMemory(create=True, size=2 * size)
    try:
        staged = os.path.join(scratch, "staged")
        shutil.copytree(os.path.join(HERE, "models", "identity"), staged)
        shutil.copy(os.path.join(HERE, "workload.py"), os.path.join(staged, "code"))
        repository = os.path.join(scratch, "repository")
        os.makedirs(os.path.join(repository, "identity", "1"))
        subprocess.run([BINARY, "pack", staged, "-o",
                        os.path.join(repository, "identity", "1", "model.orochi")],
                       check=True, capture_output=True)
        config_path = os.path.join(scratch, "config.json")
        with open(config_path, "w") as file:
            # No supervisor: the process started is the one serving, whose memory is measured.
            # gRPC's limits (64 MiB a request by default) raised like HTTP's body limit.
            json.dump({"http": {"allow_shared_memory": True, "max_body_bytes": 1 << 30},
                       "grpc": {"max_message_bytes": 1 << 30, "max_response_bytes": 1 << 30},
                       "supervisor": {"enabled": False}}, file)
        path = "/v2/models/identity/infer"
        results = {}

        # HTTP JSON: shortest round-trip float text, as clients' JSON writers produce.
        json_body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [count],
                                            "data": values.tolist()}]}).encode()
        json_answer = []

        def run_json(client):
            status, _, body = client.post(path, json_body)
            assert status == 200, body[:300]
            json_answer[:] = [body]

        server = Server(repository, config_path)
        results["HTTP JSON"] = server.measure(args.json_repeats, run_json)
        server.stop()
        answer = json.loads(json_answer[0])["outputs"][0]
        np.testing.assert_array_equal(np.array(answer["data"], dtype=np.float32), values)
        del json_answer[:], json_body, answer

        # HTTP with the binary tensor data extension, in and out.
        header = json.dumps({
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [count],
                        "parameters": {"binary_data_size": size}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}).encode()
        binary_body = header + values.tobytes()
        binary_answer = []

        def run_binary(client):
            status, headers, body = client.post(
                path, binary_body, {"Content-Type": "application/octet-stream",
                                    "Inference-Header-Content-Length": str(len(header))})
            assert status == 200, body[:300]
            binary_answer[:] = [(int(headers["Inference-Header-Content-Length"]), body)]

        server = Server(repository, config_path)
        results["HTTP binary"] = server.measure(args.repeats, run_binary)
        server.stop()
        json_length, body = binary_answer[0]
        np.testing.assert_array_equal(np.frombuffer(body[json_length:], dtype=np.float32), values)
        del binary_answer[:], binary_body, body

        # gRPC: ModelInfer with the tensor in raw_input_contents, serialized once; the answer is
        # taken as bytes (grpc's serializers left out) and parsed after the clock.
        pb = grpc_messages.load()
        message = pb.ModelInferRequest(model_name="identity")
        message.inputs.add(name="x", datatype="FP32", shape=[count])
        message.raw_input_contents.append(values.tobytes())
        grpc_body = message.SerializeToString()
        del message
        grpc_answer = []
        server = Server(repository, config_path)
        channel = grpc.insecure_channel(
            f"127.0.0.1:{server.grpc_port}",
            options=[("grpc.max_send_message_length", -1),
                     ("grpc.max_receive_message_length", -1)])
        infer = channel.unary_unary(grpc_messages.MODEL_INFER)  # bytes in, bytes out

        def run_grpc(_client):
            grpc_answer[:] = [infer(grpc_body, timeout=600)]

        results["gRPC raw"] = server.measure(args.repeats, run_grpc)
        channel.close()
        server.stop()
        answer = pb.ModelInferResponse.FromString(grpc_answer[0])
        np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0],
                                                    dtype=np.float32), values)
        del grpc_answer[:], grpc_body, answer

        # System shared memory: the input at offset 0 of the region, the output after it.
        np.ndarray((count,), np.float32, region.buf)[:] = values
        server = Server(repository, config_path)
        status, _, body = server.client.post(
            "/v2/systemsharedmemory/region/bench/register",
            json.dumps({"key": "/" + region.name, "offset": 0, "byte_size": 2 * size}).encode())
        assert status == 200, body
        shm_body = json.dumps({
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [count],
                        "parameters": {"shared_memory_region": "bench",
                                       "shared_memory_byte_size": size}}],
            "outputs": [{"name": "y", "parameters": {"shared_memory_region": "bench",
                                                     "shared_memory_offset": size,
                                                     "shared_memory_byte_size": size}}]}).encode()

        def run_shm(client):
            status, _, body = client.post(path, shm_body)
            assert status == 200, body[:300]

        results["shared memory"] = server.measure(args.repeats * 4, run_shm)
        np.testing.assert_array_equal(np.ndarray((count,), np.float32, region.buf, offset=size),
                                      values)
        server.client.post("/v2/systemsharedmemory/unregister", b"")
        server.stop()

        print(f"bench/http large tensor: {args.megabytes} MB FP32 [{count}] through identity, "
              f"in and out; 1 copy, {os.cpu_count()} cores, same run (a fresh server each)")
        print("peak MB: the server's peak resident memory above its idle size; 'of it shm': "
              "pages of the client's region mapped into it (shared, not allocated)")
        print(f"{'transport':<14} {'median ms':>10} {'min ms':>9} {'peak MB':>9} "
              f"{'of it shm':>10} {'time / shm':>11} {'private peak / shm':>19}")
        shm = results["shared memory"]
        shm_private = max(shm["peak_mb"] - shm["shared_mb"], 1)
        for name, r in results.items():
            print(f"{name:<14} {r['median_ms']:>10.1f} {r['min_ms']:>9.1f} {r['peak_mb']:>9.0f} "
                  f"{r['shared_mb']:>10.0f} {r['median_ms'] / shm['median_ms']:>10.1f}x "
                  f"{(r['peak_mb'] - r['shared_mb']) / shm_private:>18.1f}x")
        grpc_ratio = results["gRPC raw"]["median_ms"] / results["HTTP binary"]["median_ms"]
        print(f"gRPC raw / HTTP binary time: {grpc_ratio:.2f}x; peak: "
              f"{results['gRPC raw']['peak_mb'] / max(results['HTTP binary']['peak_mb'], 1):.2f}x")
        ratio = results["HTTP binary"]["median_ms"] / shm["median_ms"]
        print(f"goal: shared memory >= 10x faster than HTTP binary: "
              f"{'met' if ratio >= 10 else 'MISSED'} ({ratio:.1f}x)")
    finally:
        region.close()
        region.unlink()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
