"""bench/http: Orochi against FastAPI + uvicorn on the same machine, in the same run.

Two workloads (workload.py): an identity model (the servers' own cost) and a Python-heavy text
model. Both servers get the same KServe v2 JSON requests from wrk, with as many Orochi copies
as uvicorn workers. Prints req/s, p50 and p99 per server and the ratios, and Orochi's
server-side time per request (p50 over the request log of an identity run).

Then the identity model over HTTP and over gRPC from the same server in the same run: a closed
loop with as many requests in flight as wrk has connections, from two Python asyncio clients
(HTTP/1.1 JSON, and grpc.aio ModelInfer with raw_input_contents), since no C gRPC load generator
ships in Debian and a Python client set against wrk would measure the clients. Prints req/s,
p50, p99, the server's CPU time per request, and the gRPC / HTTP ratios.

    /usr/bin/python3.11 bench/http/bench_http.py [--seconds 10] [--connections 16] [--workers 1]
                                                 [--grpc-seconds 10]

Needs wrk, python3-fastapi, python3-uvicorn, python3-grpcio, python3-protobuf and protoc
(Debian), and a built build/bin/orochi.
"""

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from load import free_port, stop, wrk  # noqa: E402
import grpc_messages  # noqa: E402  (bench/http, next to this file)
BINARY = os.environ.get("OROCHI_BINARY", os.path.join(ROOT, "build", "bin", "orochi"))

TEXT = ("Orochi serves Python models from many private interpreter copies; each copy has its own "
        "GIL, so model code runs on every core at once. ") * 12
BODIES = {
    "identity": {"inputs": [{"name": "x", "datatype": "FP32", "shape": [8],
                             "data": [1, 2, 3, 4, 5, 6, 7, 8]}]},
    "wordcount": {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [TEXT]}]},
}


def wait_ready(url: str, process: subprocess.Popen) -> None:
    deadline = time.time() + 60
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited early ({process.returncode})")
        try:
            body = json.dumps(BODIES["identity"]).encode()
            request = urllib.request.Request(url + "/v2/models/identity/infer", body,
                                             {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("the server did not come up")


def post_model(url: str, model: str, seconds: int, connections: int, scratch: str) -> dict:
    """wrk POSTing the model's request body (BODIES) to its infer endpoint."""
    body_path = os.path.join(scratch, f"{model}.json")
    with open(body_path, "w") as file:
        json.dump(BODIES[model], file)
    return wrk(f"{url}/v2/models/{model}/infer", body_path, seconds, connections, 1, scratch)


def orochi_server_time(repository: str, workers: int, scratch: str) -> float:
    """p50 of the time Orochi spends per identity request (its request log), in µs."""
    port, metrics_port = free_port(), free_port()
    log_path = os.path.join(scratch, "server-time.log")
    config_path = os.path.join(scratch, "log-every-request.json")
    with open(config_path, "w") as file:
        json.dump({"log": {"requests": "all"}}, file)  # the default logs errors only
    with open(log_path, "w") as log:
        process = subprocess.Popen([BINARY, "serve", "--config", config_path,
                                    "--model-repository", repository,
                                    "--copies", str(workers), "--http-port", str(port),
                                    "--grpc-port", "0", "--metrics-port", str(metrics_port), "--bind", "127.0.0.1"],
                                   stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, process)
        post_model(url, "identity", 3, 1, scratch)
        stop(process)
    with open(log_path) as log:
        durations = [int(match) for match in re.findall(
            r"target=/v2/models/identity/infer status=200 duration_us=(\d+)", log.read())]
    return statistics.median(durations)


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants (the supervisor and the
    serving process it starts), from /proc."""
    children, cpu = {}, {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state, ppid, ..., utime (14th field of the line) and stime (15th).
        children.setdefault(int(fields[1]), []).append(int(entry))
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        total += cpu.get(current, 0.0)
        pending.extend(children.get(current, []))
    return total


def client_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process, grpc's too
    return usage.ru_utime + usage.ru_stime


async def http_loop(port: int, body: bytes, seconds: float, in_flight: int) -> tuple:
    """A closed loop over HTTP/1.1 in Python asyncio: `in_flight` keep-alive connections, each
    sending the identity JSON body (built once) and reading the whole answer as bytes (not
    parsed), as wrk does. Returns (latencies in s, errors)."""
    path = "/v2/models/identity/infer"
    request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
               ).encode() + body
    latencies, errors = [], [0]

    async def connection(deadline):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                writer.write(request)
                status = await reader.readline()
                length = None
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b""):
                        break
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:
                    raise SystemExit(f"an answer without Content-Length: {status!r}")
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - started)
                if not status.startswith(b"HTTP/1.1 200"):
                    errors[0] += 1
        finally:
            writer.close()

    deadline = time.perf_counter() + seconds
    await asyncio.gather(*(connection(deadline) for _ in range(in_flight)))
    return latencies, errors[0]


async def grpc_loop(port: int, request: bytes, seconds: float, in_flight: int) -> tuple:
    """A closed loop over gRPC in Python (grpc.aio, the same asyncio as http_loop): `in_flight`
    calls at once on one channel (one HTTP/2 connection, as gRPC clients multiplex), each a
    ModelInfer with the request serialized once and the answer read as bytes (not parsed)."""
    latencies, errors = [], [0]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        infer = channel.unary_unary(grpc_messages.MODEL_INFER)  # bytes in, bytes out
        await channel.channel_ready()  # connected before the clock, as http_loop's connections

        async def caller(deadline):
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    await infer(request, timeout=60)
                except grpc.RpcError:
                    errors[0] += 1
                latencies.append(time.perf_counter() - started)

        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(caller(deadline) for _ in range(in_flight)))
    return latencies, errors[0]


def percentile_ms(latencies: list, percent: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(len(ordered) * percent / 100))] * 1e3


def python_clients(http_port: int, grpc_port: int, server_pid: int, seconds: float,
                   in_flight: int) -> dict:
    """Identity over HTTP JSON and over gRPC (raw_input_contents) from the two Python asyncio
    clients, alternated in slices of about a second (HTTP, gRPC, gRPC, HTTP, HTTP, ...: `seconds`
    each in all) so that the load of whatever else runs on the machine falls on both alike. Per
    protocol: req/s, p50, p99, errors, and the server's and the client's CPU time per request;
    and the range of the gRPC / HTTP req/s ratio over the slice pairs."""
    pb = grpc_messages.load()
    http_body = json.dumps(BODIES["identity"]).encode()
    values = BODIES["identity"]["inputs"][0]["data"]
    message = pb.ModelInferRequest(model_name="identity")
    message.inputs.add(name="x", datatype="FP32", shape=[len(values)])
    message.raw_input_contents.append(struct.pack(f"<{len(values)}f", *values))
    grpc_body = message.SerializeToString()

    # Check that each answers what it should before timing it.
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        answer = pb.ModelInferResponse.FromString(
            channel.unary_unary(grpc_messages.MODEL_INFER)(grpc_body, timeout=10))
    if struct.unpack(f"<{len(values)}f", answer.raw_output_contents[0]) != tuple(values):
        raise SystemExit(f"gRPC identity answered {answer}")

    loops = {"HTTP": lambda s: http_loop(http_port, http_body, s, in_flight),
             "gRPC": lambda s: grpc_loop(grpc_port, grpc_body, s, in_flight)}
    totals = {name: {"latencies": [], "errors": 0, "elapsed": 0.0, "server_cpu": 0.0,
                     "client_cpu": 0.0} for name in loops}
    for name in loops:  # warm-up: connections, the channel, the server's caches
        asyncio.run(loops[name](0.5))
    pairs = max(1, round(seconds))
    pair_ratios = []
    for pair in range(pairs):
        rates = {}
        for name in (("HTTP", "gRPC") if pair % 2 == 0 else ("gRPC", "HTTP")):
            server_before, client_before = tree_cpu_seconds(server_pid), client_cpu_seconds()
            started = time.perf_counter()
            latencies, errors = asyncio.run(loops[name](seconds / pairs))
            elapsed = time.perf_counter() - started
            rates[name] = len(latencies) / elapsed
            total = totals[name]
            total["elapsed"] += elapsed
            total["server_cpu"] += tree_cpu_seconds(server_pid) - server_before
            total["client_cpu"] += client_cpu_seconds() - client_before
            total["latencies"] += latencies
            total["errors"] += errors
        pair_ratios.append(rates["gRPC"] / rates["HTTP"])
    results = {}
    for name, total in totals.items():
        count = len(total["latencies"])
        results[name] = {"rps": count / total["elapsed"],
                         "p50_ms": percentile_ms(total["latencies"], 50),
                         "p99_ms": percentile_ms(total["latencies"], 99),
                         "errors": total["errors"],
                         "server_us": total["server_cpu"] / count * 1e6,
                         "client_us": total["client_cpu"] / count * 1e6}
    results["pair_ratios"] = pair_ratios
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--grpc-seconds", type=float, default=10,
                        help="seconds per protocol of the Python HTTP/gRPC comparison (0: skip)")
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="orochi-bench-http-")
    try:
        repository = os.path.join(scratch, "repository")
        for model in BODIES:
            staged = os.path.join(scratch, "staged", model)
            shutil.copytree(os.path.join(HERE, "models", model), staged)
            shutil.copy(os.path.join(HERE, "workload.py"), os.path.join(staged, "code"))
            os.makedirs(os.path.join(repository, model, "1"))
            subprocess.run([BINARY, "pack", staged, "-o",
                            os.path.join(repository, model, "1", "model.orochi")],
                           check=True, capture_output=True)

        results = {}
        port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        orochi = subprocess.Popen([BINARY, "serve", "--model-repository", repository,
                                   "--copies", str(args.workers), "--http-port", str(port),
                                   "--grpc-port", str(grpc_port),
                                   "--metrics-port", str(metrics_port), "--bind", "127.0.0.1",
                                   "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, orochi)
        for model in BODIES:
            server_before = tree_cpu_seconds(orochi.pid)
            result = post_model(url, model, args.seconds, args.connections, scratch)
            result["server_us"] = ((tree_cpu_seconds(orochi.pid) - server_before)
                                   / result["requests"] * 1e6)
            results[("orochi", model)] = result
        protocols = {}
        if args.grpc_seconds > 0:
            protocols = python_clients(port, grpc_port, orochi.pid, args.grpc_seconds,
                                       args.connections)
        stop(orochi)

        port = free_port()
        fastapi = subprocess.Popen([sys.executable, "-m", "uvicorn", "fastapi_app:app",
                                    "--workers", str(args.workers), "--port", str(port),
                                    "--log-level", "warning", "--no-access-log"],
                                   cwd=HERE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, fastapi)
        for model in BODIES:
            results[("fastapi", model)] = post_model(url, model, args.seconds, args.connections, scratch)
        stop(fastapi)
        server_time = orochi_server_time(repository, args.workers, scratch)

        cores = os.cpu_count()
        print(f"bench/http: {args.workers} Orochi copies vs {args.workers} uvicorn workers, "
              f"wrk 1 thread x {args.connections} connections x {args.seconds} s, "
              f"{cores} cores, same run")
        print(f"{'model':<10} {'server':<8} {'req/s':>9} {'req/s/worker':>13} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'errors':>7}")
        for model in BODIES:
            for server in ("orochi", "fastapi"):
                r = results[(server, model)]
                print(f"{model:<10} {server:<8} {r['rps']:>9.0f} {r['rps'] / args.workers:>13.0f} "
                      f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['errors']:>7}")
            ratio = results[("orochi", model)]["rps"] / results[("fastapi", model)]["rps"]
            print(f"{model:<10} Orochi / FastAPI req/s: {ratio:.2f}x")
        identity_ratio = results[("orochi", "identity")]["rps"] / results[("fastapi", "identity")]["rps"]
        print(f"goal >= 3x req/s per core on identity: {'met' if identity_ratio >= 3 else 'MISSED'} "
              f"({identity_ratio:.2f}x)")
        print(f"Orochi server-side time per identity request, p50: {server_time:.0f} us "
              f"(goal <= 50 us: {'met' if server_time <= 50 else 'MISSED'})")
        if protocols:
            print()
            print(f"identity, Orochi over HTTP and gRPC: {args.workers} copies, closed loop, "
                  f"{args.connections} requests in flight, {args.grpc_seconds:g} s per protocol "
                  f"(alternated in 1 s slices), same server, same run")
            print("  wrk: C, HTTP/1.1 JSON (the row above). Python HTTP: asyncio, "
                  f"{args.connections} keep-alive connections, the same JSON body. Python gRPC: "
                  f"grpc.aio {grpc.__version__}, one channel, ModelInfer with raw_input_contents.")
            print("  Both Python clients send a body built once and read answers as bytes, "
                  "unparsed. CPU us/req: the server's (process tree) and the client's CPU time "
                  "per request.")
            wrk_identity = results[("orochi", "identity")]
            rows = [("wrk", "HTTP JSON", wrk_identity),
                    ("Python asyncio", "HTTP JSON", protocols["HTTP"]),
                    ("Python grpc.aio", "gRPC raw", protocols["gRPC"])]
            print(f"  {'client':<16} {'protocol':<10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
                  f"{'errors':>7} {'server CPU us/req':>18} {'client CPU us/req':>18}")
            for client, protocol, r in rows:
                client_us = f"{r['client_us']:.0f}" if "client_us" in r else "-"
                print(f"  {client:<16} {protocol:<10} {r['rps']:>9.0f} {r['p50_ms']:>8.2f} "
                      f"{r['p99_ms']:>8.2f} {r['errors']:>7} {r['server_us']:>18.0f} "
                      f"{client_us:>18}")
            h, g = protocols["HTTP"], protocols["gRPC"]
            print(f"  gRPC / HTTP, both from Python asyncio clients (like with like): "
                  f"req/s {g['rps'] / h['rps']:.2f}x, p50 {g['p50_ms'] / h['p50_ms']:.2f}x, "
                  f"p99 {g['p99_ms'] / h['p99_ms']:.2f}x, server CPU per request "
                  f"{g['server_us'] / h['server_us']:.2f}x")
            ratios = sorted(protocols["pair_ratios"])
            print(f"  gRPC / HTTP req/s over the {len(ratios)} slice pairs: median "
                  f"{statistics.median(ratios):.2f}x, range {ratios[0]:.2f}x-{ratios[-1]:.2f}x")
            print(f"  Python HTTP / wrk req/s: {h['rps'] / wrk_identity['rps']:.2f}x "
                  f"(the Python client's own cost; not a protocol difference)")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
