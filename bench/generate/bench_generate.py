"""bench/generate: the text generator's streams on one copy, with and without step batching.

For N concurrent streams (1, 2, 4, 8, 16 by default), each generating --max-tokens bytes of
text at temperature 0.8 with its own seed, it reports total tokens/s and the time to first
token (p50, p99), with step-level batching (every live sequence advanced by one batched step()
per token) and without it (one sequence at a time), in the same run, and the ratio of each N's
tokens/s to one stream's.

Two levels, both by default:

- `model`: inside one interpreter copy (`orochi python bench/generate/model_level.py`), calling
  the model's start/step/finish directly: sequences stepped together, or run one after another.
  No HTTP; what the model itself gains from batching its steps.
- `server`: `orochi serve` with one copy serving models/textgen twice: as built (its manifest's
  max_live_sequences lets the scheduler step up to that many sequences together), and repacked
  as `textgen-one-at-a-time` with `"max_live_sequences": 1`; N clients each POST
  /v2/models/NAME/generate_stream (Triton's generate extension, Server-Sent Events) at once,
  and every event's arrival is timed.

    /usr/bin/python3.11 bench/generate/bench_generate.py [--level model|server|both]
        [--streams 1,2,4,8,16] [--max-tokens 128] [--repeat 3] [--threads N]
        [--json results.json]

--threads caps the engine's intra-op threads (0, the default: every core, the engine's and the
server's default): the copy's calls at model level, `engine.intra_op_threads` at server level.
Each table says what it ran with.

Needs a built build/bin/orochi and build/models/textgen (the build makes both).
"""

import argparse
import concurrent.futures
import http.client
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
from load import free_port, stop  # noqa: E402
BINARY = os.environ.get("OROCHI_BINARY", os.path.join(BUILD, "bin", "orochi"))
PACKAGE = os.path.join(os.environ.get("OROCHI_EXAMPLES", os.path.join(BUILD, "models")),
                       "textgen", "package")
sys.path.insert(0, HERE)
from workload import PROMPTS, percentile  # noqa: E402

BATCHED, ONE_AT_A_TIME = "stepped together", "one at a time"


def model_level(args) -> list:
    command = [BINARY, "python", os.path.join(HERE, "model_level.py"), "--package", PACKAGE,
               "--streams", args.streams, "--max-tokens", str(args.max_tokens),
               "--repeat", str(args.repeat), "--threads", str(args.threads)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"model_level.py failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return [dict(json.loads(line), level="model") for line in result.stdout.splitlines() if line]


class Server:
    """`orochi serve` with one copy, serving textgen as built and with max_live_sequences 1."""

    def __init__(self, scratch: str, threads: int):
        repository = os.path.join(scratch, "repository")
        for name, live in (("textgen", None), ("textgen-one-at-a-time", 1)):
            source = os.path.join(scratch, name)
            shutil.copytree(PACKAGE, source)
            manifest_path = os.path.join(source, "manifest.json")
            with open(manifest_path) as file:
                manifest = json.load(file)
            manifest["name"] = name
            if live is not None:
                manifest["max_live_sequences"] = live
            with open(manifest_path, "w") as file:
                json.dump(manifest, file)
            os.makedirs(os.path.join(repository, name, "1"))
            packed = subprocess.run([BINARY, "pack", source, "-o",
                                     os.path.join(repository, name, "1", "model.orochi")],
                                    capture_output=True, text=True)
            if packed.returncode != 0:
                raise SystemExit(f"orochi pack refused {name} (a server without streaming "
                                 f"models?): {packed.stderr.strip()}")
        self.port = free_port()
        self.log_path = os.path.join(scratch, "server.log")
        config_path = os.path.join(scratch, "orochi.json")
        with open(config_path, "w") as file:
            json.dump({"engine": {"intra_op_threads": threads}}, file)
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [BINARY, "serve", "--config", config_path, "--model-repository", repository,
                 "--copies", "1",
                 "--http-port", str(self.port), "--grpc-port", "0",
                 "--metrics-port", str(free_port()), "--management-port", str(free_port()),
                 "--bind", "127.0.0.1", "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit("orochi serve exited:\n" + open(self.log_path).read()[-3000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready",
                                            timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit("orochi serve did not become ready:\n" + open(self.log_path).read()[-3000:])

    def stream(self, model: str, index: int, max_tokens: int, started: float) -> tuple:
        """One generate_stream request: (tokens, seconds to its first event from `started`)."""
        body = json.dumps({"text_input": PROMPTS[index % len(PROMPTS)], "parameters": {
            "max_tokens": max_tokens, "temperature": 0.8, "seed": index}})
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        connection.request("POST", f"/v2/models/{model}/generate_stream", body,
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"generate_stream answered {response.status}: "
                               f"{response.read()[:300]!r}")
        first, tokens = None, 0
        for line in response:
            if not line.startswith(b"data:"):
                continue
            event = json.loads(line[5:])
            if "error" in event:
                raise RuntimeError(f"stream {index} failed: {event['error']}")
            if first is None:
                first = time.perf_counter() - started
            tokens += len(event.get("text_output", "").encode())
        connection.close()
        return tokens, first

    def measure(self, model: str, streams: int, max_tokens: int) -> tuple:
        with concurrent.futures.ThreadPoolExecutor(streams) as pool:
            started = time.perf_counter()
            results = list(pool.map(lambda i: self.stream(model, i, max_tokens, started),
                                    range(streams)))
            seconds = time.perf_counter() - started
        return (sum(tokens for tokens, _ in results) / seconds,
                [first for _, first in results if first is not None])


def server_level(args) -> list:
    rows = []
    with tempfile.TemporaryDirectory(prefix="orochi-bench-generate-") as scratch:
        server = Server(scratch, args.threads)
        try:
            probe = urllib.request.Request(
                f"http://127.0.0.1:{server.port}/v2/models/textgen/generate_stream",
                data=json.dumps({"text_input": "x", "parameters": {"max_tokens": 1}}).encode(),
                headers={"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(probe, timeout=60).read()
            except urllib.error.HTTPError as error:
                raise SystemExit(f"this server has no usable generate_stream "
                                 f"({error.code}: {error.read()[:200]!r})") from None
            for streams in [int(item) for item in args.streams.split(",")]:
                for mode, model in ((BATCHED, "textgen"), (ONE_AT_A_TIME, "textgen-one-at-a-time")):
                    rates, firsts = [], []
                    for _ in range(args.repeat):
                        rate, first = server.measure(model, streams, args.max_tokens)
                        rates.append(rate)
                        firsts += first
                    rows.append({"level": "server", "streams": streams, "mode": mode,
                                 "threads": args.threads or os.cpu_count(),
                                 "tokens_per_s": statistics.median(rates),
                                 "ttft_p50_ms": 1000 * percentile(firsts, 0.5),
                                 "ttft_p99_ms": 1000 * percentile(firsts, 0.99)})
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
        finally:
            stop(server.process)
    return rows


def report(rows: list) -> None:
    for level in dict.fromkeys(row["level"] for row in rows):
        table = {(row["streams"], row["mode"]): row for row in rows if row["level"] == level}
        cpu = all("tokens_per_cpu_s" in row for row in table.values())
        threads = sorted({row.get("threads") for row in table.values()}, key=str)
        print(f"\n{level} level ({'/'.join(map(str, threads))} intra-op threads): tokens/s (and "
              f"against one stream), time to first token"
              + ("; tokens per CPU second of the copy" if cpu else ""))
        header = ["streams"]
        for mode in (BATCHED, ONE_AT_A_TIME):
            header += [f"{mode}: tokens/s", "TTFT p50 / p99"] + (["per CPU s"] if cpu else [])
        header.append("together / one at a time")
        print("| " + " | ".join(header) + " |")
        print("| " + " | ".join(["---:"] * len(header)) + " |")
        for streams in sorted({streams for streams, _ in table}):
            cells = [str(streams)]
            for mode in (BATCHED, ONE_AT_A_TIME):
                row, single = table[(streams, mode)], table.get((1, mode))
                ratio = (f" ({row['tokens_per_s'] / single['tokens_per_s']:.2f}x)"
                         if single else "")
                cells += [f"{row['tokens_per_s']:,.0f}{ratio}",
                          f"{row['ttft_p50_ms']:.1f} / {row['ttft_p99_ms']:.1f} ms"]
                if cpu:
                    cpu_ratio = (f" ({row['tokens_per_cpu_s'] / single['tokens_per_cpu_s']:.2f}x)"
                                 if single else "")
                    cells.append(f"{row['tokens_per_cpu_s']:,.0f}{cpu_ratio}")
            gain = table[(streams, BATCHED)]["tokens_per_s"] / \
                table[(streams, ONE_AT_A_TIME)]["tokens_per_s"]
            cells.append(f"{gain:.2f}x")
            print("| " + " | ".join(cells) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", choices=("model", "server", "both"), default="both")
    parser.add_argument("--streams", default="1,2,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0,
                        help="the engine's intra-op threads (0: every core)")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    if not os.path.isfile(os.path.join(PACKAGE, "manifest.json")):
        raise SystemExit(f"no built text generator at {PACKAGE}: build the example models")
    rows = []
    if args.level in ("model", "both"):
        rows += model_level(args)
    if args.level in ("server", "both"):
        rows += server_level(args)
    report(rows)
    if args.json:
        with open(args.json, "w") as file:
            json.dump(rows, file, indent=1)


if __name__ == "__main__":
    main()
