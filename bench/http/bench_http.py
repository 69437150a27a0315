"""bench/http: Orochi against FastAPI + uvicorn on the same machine, in the same run.

Two workloads (workload.py): an identity model (the servers' own cost) and a Python-heavy text
model. Both servers get the same KServe v2 JSON requests from wrk, with as many Orochi copies
as uvicorn workers. Prints req/s, p50 and p99 per server and the ratios, and Orochi's
server-side time per request (p50 over the request log of an identity run).

    /usr/bin/python3.11 bench/http/bench_http.py [--seconds 10] [--connections 16] [--workers 1]

Needs wrk, python3-fastapi and python3-uvicorn (Debian), and a built build/bin/orochi.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.dirname(HERE))
from load import free_port, stop, wrk  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=1)
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
        port, metrics_port = free_port(), free_port()
        orochi = subprocess.Popen([BINARY, "serve", "--model-repository", repository,
                                   "--copies", str(args.workers), "--http-port", str(port),
                                   "--grpc-port", "0", "--metrics-port", str(metrics_port), "--bind", "127.0.0.1",
                                   "--log-level", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, orochi)
        for model in BODIES:
            results[("orochi", model)] = post_model(url, model, args.seconds, args.connections, scratch)
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
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
