"""bench/server: what the supervisor costs and what it buys.

1. Crash to serving again: `orochi serve` with the four examples (and the test suite's
   `hostile` model, whose `segfault` mode crashes the process as a C extension's bug would) is
   crashed ROUNDS times (2 by default: from the third quick crash in a row the supervisor
   backs off, by design); each round measures the seconds from the crashing request to the first
   moment the server is ready again and the digits example answers 200 on the same port. The
   first start is measured the same way, for comparison: a restart costs about a start.
2. Overhead: the test suite's echo model (an identity: inputs back as outputs) driven by wrk
   with the supervisor on and off (`supervisor.enabled`), alternated so that the machine's noise
   falls on both; the ratio on/off should be 1 within noise (the supervisor only waits on
   signals, and a request costs one thread-local mark more).

    /usr/bin/python3.11 bench/server/bench_supervisor.py [--rounds 2] [--seconds 5] [--pairs 3]

Needs a built build/bin/orochi with build/model-repository, and wrk.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from load import free_port, stop, wrk  # noqa: E402
from server_fixtures import echo_request  # noqa: E402

BINARY = os.environ.get("OROCHI_BINARY", os.path.join(BUILD, "bin", "orochi"))
EXAMPLES = os.path.join(BUILD, "model-repository")
TEST_MODELS = os.path.join(ROOT, "tests", "server", "models")


def post(url: str, body: dict, timeout: float = 10) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0  # no answer: the connection closed


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready",
                                    timeout=1) as response:
            return response.status == 200
    except (urllib.error.HTTPError, OSError):
        return False


def start(repository: str, config: dict, scratch: str) -> tuple[subprocess.Popen, int, int]:
    config_path = os.path.join(scratch, "config.json")
    with open(config_path, "w") as file:
        json.dump(config, file)
    port, metrics_port = free_port(), free_port()
    log = open(os.path.join(scratch, "serve.log"), "a")
    process = subprocess.Popen(
        [BINARY, "serve", "--config", config_path, "--model-repository", repository,
         "--http-port", str(port), "--grpc-port", "0", "--metrics-port", str(metrics_port), "--management-port",
         str(free_port()), "--bind", "127.0.0.1"], stdout=log, stderr=subprocess.STDOUT)
    return process, port, metrics_port


def wait_serving(port: int, digits_body: dict, deadline: float) -> None:
    while time.time() < deadline:
        if ready(port) and post(f"http://127.0.0.1:{port}/v2/models/digits/infer",
                                digits_body) == 200:
            return
        time.sleep(0.01)
    raise SystemExit("the server did not serve again in time")


def pack(name: str, repository: str) -> None:
    target = os.path.join(repository, name, "1")
    os.makedirs(target)
    subprocess.run([BINARY, "pack", os.path.join(TEST_MODELS, name), "-o",
                    os.path.join(target, "model.orochi")], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Past two crashes in a row the supervisor backs off (100 ms, doubling), which is not what
    # a restart costs: the default stays below that.
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--copies", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--pairs", type=int, default=3, help="wrk runs on and off, alternated")
    args = parser.parse_args()
    with open(os.path.join(BUILD, "models", "digits", "request.json")) as file:
        digits_body = json.load(file)
    scratch = tempfile.mkdtemp(prefix="orochi-bench-supervisor-")
    try:
        repository = os.path.join(scratch, "repository")
        shutil.copytree(EXAMPLES, repository)
        for name in ("hostile", "echo"):
            pack(name, repository)

        print(f"crash to serving again: the four examples, hostile and echo, "
              f"{args.copies} copies")
        began = time.time()
        # More crashes than rounds before the quarantine, which would end the rounds early.
        process, port, _ = start(repository, {"copies": args.copies, "supervisor": {
            "max_model_crashes": args.rounds + 1}}, scratch)
        try:
            wait_serving(port, digits_body, time.time() + 120)
            first_start = time.time() - began
            restarts = []
            for _ in range(args.rounds):
                crashed = time.time()
                status = post(f"http://127.0.0.1:{port}/v2/models/hostile/infer", {
                    "inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1],
                                "data": ["segfault"]}]})
                if status != 0:
                    with open(os.path.join(scratch, "serve.log")) as log:
                        raise SystemExit(f"the crashing request was answered ({status}):\n"
                                         + log.read()[-3000:])
                wait_serving(port, digits_body, time.time() + 120)
                restarts.append(time.time() - crashed)
        finally:
            stop(process)
        print(f"  first start to serving: {first_start:.3f} s")
        print(f"  crash to serving again: median {statistics.median(restarts):.3f} s, "
              f"min {min(restarts):.3f} s, max {max(restarts):.3f} s "
              f"({len(restarts)} crashes); restart / start = "
              f"{statistics.median(restarts) / first_start:.2f}x")

        echo_body = os.path.join(scratch, "echo.json")
        with open(echo_body, "w") as file:
            json.dump(echo_request(), file)
        print(f"overhead on the echo model: wrk, {args.seconds:g} s a run, 8 connections, "
              f"{args.copies} copies")
        rates = {True: [], False: []}
        for supervised in (True, False) * args.pairs:
            process, port, _ = start(repository, {"copies": args.copies, "supervisor": {
                "enabled": supervised}, "models": {"load": ["echo"]}}, scratch)
            try:
                deadline = time.time() + 60
                while not ready(port):
                    if time.time() > deadline:
                        raise SystemExit("the server did not start")
                    time.sleep(0.05)
                result = wrk(f"http://127.0.0.1:{port}/v2/models/echo/infer", echo_body,
                             int(args.seconds), 8, 2, scratch)
            finally:
                stop(process)
            assert result["errors"] == 0, result
            rates[supervised].append(result["rps"])
            print(f"  supervisor {'on ' if supervised else 'off'}: {result['rps']:.0f} req/s, "
                  f"p50 {result['p50_ms']:.2f} ms, p99 {result['p99_ms']:.2f} ms")
        on, off = statistics.mean(rates[True]), statistics.mean(rates[False])
        print(f"  req/s with / without the supervisor: {on / off:.3f}x")
    finally:
        shutil.rmtree(scratch)


if __name__ == "__main__":
    main()
