"""bench/models: the example models' throughput in `orochi serve` by copies, and vs FastAPI.

Measures how the four examples scale through `orochi serve` as interpreter copies are added,
and the text model against FastAPI + uvicorn running the same model code, in the same run.

For each copy count (1, 2, 4, ... up to the core count by default) it starts `orochi serve`
on build/model-repository with that many copies and drives each of the four examples (digits,
sentiment, resnet, encoder) with wrk, sending the example's own KServe v2 JSON request
(build/models/<model>/request.json) over 4 keep-alive connections per copy. It reports req/s,
p50 and p99 latency, the scaling against the smallest copy count, and from Orochi's metrics the
requests per executed batch (dynamic batching) and how busy the copies were.

For the sentiment model (heavy pure-Python preprocessing) it also starts FastAPI + uvicorn with
as many workers as copies (fastapi_sentiment.py: the staged package loaded through
models/torch_runner.py on PyTorch, one intra-op thread per worker), checks that both servers
give the same labels for the request, then drives it the same way and reports the Orochi /
FastAPI req/s ratio per worker count. uvicorn starts through uvicorn_workers.py, which fixes
two ways its --workers N shares the port that would otherwise decide the result: Nagle left
on (~40 ms per request) and one worker taking all of wrk's connections (--stock-uvicorn shows
them).

Every run also reports the CPU the server and wrk used, in cores: with wrk on the same machine,
that (not the server) often caps the top copy count on a small machine.

    /usr/bin/python3.11 bench/models/bench_models.py [--seconds 5] [--copies 1,2]
        [--plot docs/performance/models.png] [--json results.json]

Needs a built build/bin/orochi with build/model-repository and build/models (the build makes
both), wrk, and Debian's python3-fastapi, python3-uvicorn, python3-torch and
python3-matplotlib (hence /usr/bin/python3.11).
"""

import argparse
import contextlib
import datetime
import json
import os
import re
import resource
import shutil
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
from load import free_port, stop, wrk  # noqa: E402
BINARY = os.environ.get("OROCHI_BINARY", os.path.join(BUILD, "bin", "orochi"))
REPOSITORY = os.path.join(BUILD, "model-repository")
MODELS = ("digits", "sentiment", "resnet", "encoder")
TEXT_MODEL = "sentiment"


def default_copies() -> list[int]:
    cores = os.cpu_count() or 1
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == cores else counts + [cores]


def parse_copies(text: str) -> list[int]:
    counts = sorted({int(item) for item in text.split(",") if item.strip()})
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError("copy counts are positive integers, e.g. 1,2,4")
    return counts


def request_body(model: str) -> str:
    return os.path.join(BUILD, "models", model, "request.json")


def rows_per_request(model: str) -> int:
    """Rows (dim 0) in the example request, to turn Orochi's rows per batch into requests."""
    with open(request_body(model)) as file:
        return json.load(file)["inputs"][0]["shape"][0]


def post(url: str, body_path: str, timeout: float = 60) -> dict:
    with open(body_path, "rb") as file:
        body = file.read()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def output(response: dict, name: str) -> list:
    return next(item["data"] for item in response["outputs"] if item["name"] == name)


def machine() -> dict:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as file:
        for line in file:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "commit": commit or None,
            "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}


def log_tail(path: str) -> str:
    with open(path, errors="replace") as file:
        return "".join(file.readlines()[-20:])


def wait_until_ready(process, log_path: str, what: str, ready, seconds: float) -> None:
    """Polls `ready()` until it holds; stops the run if `process` exits or takes too long."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited ({process.returncode}):\n" + log_tail(log_path))
        if ready():
            return
        time.sleep(0.1)
    stop(process)
    raise SystemExit(f"{what} did not become ready:\n" + log_tail(log_path))


class OrochiServer:
    """`orochi serve` on free ports with `copies` copies of every example model."""

    name = "orochi"

    def __init__(self, copies: int, scratch: str):
        self.count = copies
        port, metrics_port, management_port = free_port(), free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.log_path = os.path.join(scratch, f"orochi-{copies}.log")
        # A repository of its own: the server keeps state in its repository (.orochi/), and the
        # build's repository is the one the README serves.
        repository = os.path.join(scratch, f"repository-{copies}")
        for model in MODELS:
            os.makedirs(os.path.join(repository, model, "1"))
            shutil.copy(os.path.join(REPOSITORY, model, "1", "model.orochi"),
                        os.path.join(repository, model, "1", "model.orochi"))
        # Warning level: at info every request writes a log line, which is not what we measure.
        # That also hides the `serving ...` line with the ports, hence ports chosen here.
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [BINARY, "serve", "--model-repository", repository, "--copies", str(copies),
                 "--http-port", str(port), "--grpc-port", "0", "--metrics-port", str(metrics_port),
                 "--management-port", str(management_port), "--bind", "127.0.0.1",
                 "--log-level", "warning"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            # The port opens only once every model is loaded into every copy.
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2) as reply:
                    return reply.status == 200
            return False

        wait_until_ready(self.process, self.log_path, "orochi serve", ready, seconds=120)

    def infer_url(self, model: str) -> str:
        return f"{self.url}/v2/models/{model}/infer"

    def counters(self, model: str) -> dict:
        """Orochi's batch-size sum and count for `model` and the copies' total busy seconds."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as reply:
            text = reply.read().decode()

        def total(pattern):
            return sum(float(value) for value in re.findall(pattern, text, re.M))

        labels = rf'\{{[^}}]*model="{model}"[^}}]*\}}'
        return {"batch_rows": total(rf"^orochi_batch_size_sum{labels} (\S+)$"),
                "batches": total(rf"^orochi_batch_size_count{labels} (\S+)$"),
                "busy_s": total(r"^orochi_copy_busy_seconds_total\{[^}]*\} (\S+)$")}

    def close(self) -> None:
        stop(self.process)


class UvicornServer:
    """uvicorn serving fastapi_sentiment.py with `workers` worker processes, through
    uvicorn_workers.py (a port of its own per worker, Nagle off) unless `stock`."""

    name = "fastapi"

    def __init__(self, workers: int, scratch: str, stock: bool = False):
        self.count = workers
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = os.path.join(scratch, f"fastapi-{workers}.log")
        launcher = ["-m", "uvicorn"] if stock else [os.path.join(HERE, "uvicorn_workers.py")]
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [sys.executable, *launcher, "fastapi_sentiment:app",
                 "--workers", str(workers), "--host", "127.0.0.1", "--port", str(port),
                 "--log-level", "info", "--no-access-log"],
                cwd=HERE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        # The parent's socket accepts as soon as one worker is up; a run started then would
        # give the others' share to it. Each worker loads the model at import and logs
        # "Application startup complete." after, so wait for one per worker.

        def ready():
            with open(self.log_path, errors="replace") as log:
                return log.read().count("Application startup complete.") >= workers

        wait_until_ready(self.process, self.log_path, "uvicorn", ready, seconds=180)

    def infer_url(self, model: str) -> str:
        return f"{self.url}/v2/models/{model}/infer"

    def counters(self, model: str) -> None:
        return None  # uvicorn has no metrics of its own

    def close(self) -> None:
        stop(self.process)


def session_cpu_seconds(session: int) -> float:
    """CPU time of every live process in `session`: a server and, for uvicorn, its workers."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as file:
                stat = file.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # from field 3 (state) on
        if int(fields[3]) == session:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(server, model: str, args, scratch: str) -> dict:
    """A warm-up run (discarded), then the timed run."""
    connections = args.connections or 4 * server.count
    url, body = server.infer_url(model), request_body(model)
    if args.warmup > 0:
        wrk(url, body, args.warmup, connections, args.wrk_threads, scratch)
    before = server.counters(model)
    # On a small machine wrk's share of the cores explains much of the scaling, so measure it:
    # the servers are never reaped during a run, so RUSAGE_CHILDREN grows by wrk's time only.
    server_cpu, wrk_cpu = session_cpu_seconds(server.process.pid), children_cpu_seconds()
    started = time.monotonic()
    result = wrk(url, body, args.seconds, connections, args.wrk_threads, scratch)
    elapsed = time.monotonic() - started
    result.update(server=server.name, model=model, copies=server.count,
                  connections=connections, seconds=args.seconds,
                  server_cores=(session_cpu_seconds(server.process.pid) - server_cpu) / elapsed,
                  wrk_cores=(children_cpu_seconds() - wrk_cpu) / elapsed)
    if before is not None:
        after = server.counters(model)
        batches = after["batches"] - before["batches"]
        rows = after["batch_rows"] - before["batch_rows"]
        result["requests_per_batch"] = rows / batches / rows_per_request(model) if batches else None
        result["busy"] = (after["busy_s"] - before["busy_s"]) / (elapsed * server.count)
    return result


def check_labels(orochi: "OrochiServer", fastapi: "UvicornServer | None") -> dict:
    """The sentiment request through both servers: labels must agree before anything is timed."""
    body = request_body(TEXT_MODEL)
    ours = post(orochi.infer_url(TEXT_MODEL), body)
    check = {"orochi_labels": output(ours, "label")}
    if fastapi is not None:
        theirs = post(fastapi.infer_url(TEXT_MODEL), body)
        check["fastapi_labels"] = output(theirs, "label")
        if check["orochi_labels"] != check["fastapi_labels"]:
            raise SystemExit(f"the servers disagree on {TEXT_MODEL}: Orochi says "
                             f"{check['orochi_labels']}, FastAPI {check['fastapi_labels']}")
        check["max_score_difference"] = max(
            abs(a - b) for a, b in zip(output(ours, "scores"), output(theirs, "scores")))
    return check


def smoke_test(orochi: "OrochiServer", models) -> None:
    for model in models:
        try:
            response = post(orochi.infer_url(model), request_body(model))
        except urllib.error.HTTPError as error:
            raise SystemExit(f"{model}: orochi answered {error.code}: {error.read()[:500]!r}")
        if not response.get("outputs"):
            raise SystemExit(f"{model}: orochi's answer has no outputs: {response}")


def print_table(runs: list[dict], info: dict, args, label_check: dict | None) -> None:
    base = min(args.copies)
    connections = (f"{args.connections} connections" if args.connections
                   else "4 connections per copy or worker")
    print(f"bench/models  {info['date']}  {info['cpu']}, {info['cores']} cores"
          + (f"  commit {info['commit']}" if info["commit"] else ""))
    threads = f"{args.wrk_threads} thread{'s' if args.wrk_threads > 1 else ''}"
    print(f"wrk {threads}, {connections} (keep-alive), {args.seconds} s per run "
          f"after {args.warmup} s warm-up; body: build/models/<model>/request.json")
    print("cores: CPU used by the server's processes and by wrk, in cores; busy: Orochi copies' "
          "time in model code; req/batch: dynamic batching")

    def row(first: str, run: dict, reference: dict) -> str:
        per_batch = run.get("requests_per_batch")
        busy = run.get("busy")
        return (f"{first:<10} {run['copies']:>7} {run['connections']:>5} {run['rps']:>9.1f} "
                f"{run['rps'] / reference['rps']:>5.2f} {run['p50_ms']:>8.2f} "
                f"{run['p99_ms']:>8.2f} {f'{per_batch:.2f}' if per_batch else '-':>9} "
                f"{f'{busy:.0%}' if busy is not None else '-':>5} {run['server_cores']:>6.2f} "
                f"{run['wrk_cores']:>5.2f} {run['errors']:>6}")

    def header(count: str) -> str:
        return (f"{count:>7} {'conns':>5} {'req/s':>9} {f'x{base}':>5} {'p50 ms':>8} "
                f"{'p99 ms':>8} {'req/batch':>9} {'busy':>5} {'server':>6} {'wrk':>5} "
                f"{'errors':>6}")

    print()
    print(f"{'Orochi':<10} {header('copies')}")
    orochi = [run for run in runs if run["server"] == "orochi"]
    for model in args.models:
        mine = [run for run in orochi if run["model"] == model]
        for run in mine:
            print(row(model if run is mine[0] else "", run, mine[0]))

    fastapi = [run for run in runs if run["server"] == "fastapi"]
    if not fastapi:
        return
    print()
    print(f"{TEXT_MODEL}: as many Orochi copies as FastAPI + uvicorn workers, same requests, same "
          f"model code (FastAPI: on PyTorch, 1 thread per worker"
          f"{', stock uvicorn' if args.stock_uvicorn else ', uvicorn_workers.py'})")
    if label_check:
        print(f"labels agree: {', '.join(label_check['fastapi_labels'])} "
              f"(scores differ by at most {label_check['max_score_difference']:.1e})")
    print(f"{'server':<10} {header('workers')}  Orochi/FastAPI")
    ours = {run["copies"]: run for run in orochi if run["model"] == TEXT_MODEL}
    for theirs in fastapi:
        mine = ours[theirs["copies"]]
        print(row("orochi", mine, ours[base]))
        print(row("fastapi", theirs, fastapi[0])
              + f"  {mine['rps'] / theirs['rps']:>13.2f}x")


def plot(runs: list[dict], info: dict, args, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = min(args.copies)
    fastapi = [run for run in runs if run["server"] == "fastapi"]
    figure, axes = plt.subplots(1, 2 if fastapi else 1, figsize=(9, 4), dpi=100, squeeze=False)
    left = axes[0][0]
    left.plot(args.copies, [count / base for count in args.copies], ":", color="grey",
              label="ideal")
    for model in args.models:
        mine = [run for run in runs if run["server"] == "orochi" and run["model"] == model]
        left.plot([run["copies"] for run in mine], [run["rps"] / mine[0]["rps"] for run in mine],
                  "o-", label=model)
    left.set_title(f"Orochi throughput vs copies (x {base} cop{'y' if base == 1 else 'ies'})",
                   fontsize=10)
    left.set_xlabel("interpreter copies")
    left.set_ylabel(f"req/s relative to {base} cop{'y' if base == 1 else 'ies'}")
    left.legend(fontsize=8)

    if fastapi:
        right = axes[0][1]
        ours = [run for run in runs if run["server"] == "orochi" and run["model"] == TEXT_MODEL]
        right.plot([run["copies"] for run in ours], [run["rps"] for run in ours], "o-",
                   label="Orochi copies")
        right.plot([run["copies"] for run in fastapi], [run["rps"] for run in fastapi], "s-",
                   label="FastAPI + uvicorn workers")
        for mine, theirs in zip(ours, fastapi):
            right.annotate(f"{mine['rps'] / theirs['rps']:.1f}x", (mine["copies"], mine["rps"]),
                           textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        right.set_title(f"{TEXT_MODEL}, same model code (labels: Orochi / FastAPI)",
                        fontsize=10)
        right.set_xlabel("copies / workers")
        right.set_ylabel("req/s")
        right.set_ylim(bottom=0, top=max(run["rps"] for run in ours + fastapi) * 1.15)
        right.legend(fontsize=8, loc="best")

    for axis in axes[0]:
        axis.set_xticks(args.copies)
        if len(args.copies) > 2 and args.copies[-1] / args.copies[0] >= 8:
            axis.set_xscale("log", base=2)
            axis.set_xticks(args.copies, [str(count) for count in args.copies])
        axis.grid(alpha=0.3)
    figure.suptitle(f"{info['cpu']}, {info['cores']} cores, {info['date']}, "
                    f"{args.seconds} s per point", fontsize=8)
    figure.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5, help="timed seconds per run")
    parser.add_argument("--warmup", type=int, default=1, help="untimed seconds before each run")
    parser.add_argument("--copies", type=parse_copies, default=default_copies(),
                        help="comma-separated copy (and worker) counts; default 1, 2, 4, ... "
                             "up to the core count, and the core count itself")
    parser.add_argument("--connections", type=int, default=0,
                        help="keep-alive connections per run; default 4 per copy or worker")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--models", type=lambda text: [m for m in text.split(",") if m],
                        default=list(MODELS), help="comma-separated subset of " + ",".join(MODELS))
    parser.add_argument("--no-fastapi", action="store_true", help="skip the FastAPI baseline")
    parser.add_argument("--stock-uvicorn", action="store_true",
                        help="run `python -m uvicorn` as shipped: with --workers N, Nagle "
                             "stays on and one worker takes every connection "
                             "(see uvicorn_workers.py)")
    parser.add_argument("--plot", default=os.path.join(ROOT, "docs", "performance", "models.png"),
                        help="PNG to draw; '' for none")
    parser.add_argument("--json", help="file to write every run's results to")
    args = parser.parse_args()
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models: {', '.join(sorted(unknown))}")
    args.models = [model for model in MODELS if model in args.models]
    with_fastapi = TEXT_MODEL in args.models and not args.no_fastapi
    missing = [path for path in [BINARY] + [os.path.join(REPOSITORY, model, "1", "model.orochi")
                                            for model in args.models] if not os.path.exists(path)]
    if missing or not shutil.which("wrk"):
        raise SystemExit(f"missing: {', '.join(missing) or 'wrk'} (build first; apt install wrk)")

    info = machine()
    runs, label_check = [], None
    scratch = tempfile.mkdtemp(prefix="orochi-bench-models-")
    try:
        for count in args.copies:
            with contextlib.ExitStack() as servers:
                orochi = OrochiServer(count, scratch)
                servers.callback(orochi.close)
                smoke_test(orochi, args.models)
                fastapi = None
                if with_fastapi:
                    fastapi = UvicornServer(count, scratch, args.stock_uvicorn)
                    servers.callback(fastapi.close)
                if TEXT_MODEL in args.models:
                    label_check = check_labels(orochi, fastapi)
                # Both servers are up, but only the one being driven uses any CPU.
                for model in args.models:
                    runs.append(measure(orochi, model, args, scratch))
                    print(f"  orochi  {model:<10} {count:>3} copies  {runs[-1]['rps']:>9.1f} "
                          f"req/s", file=sys.stderr, flush=True)
                if fastapi is not None:
                    runs.append(measure(fastapi, TEXT_MODEL, args, scratch))
                    print(f"  fastapi {TEXT_MODEL:<10} {count:>3} workers {runs[-1]['rps']:>9.1f} "
                          f"req/s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    print_table(runs, info, args, label_check if with_fastapi else None)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": info, "settings": {
                "seconds": args.seconds, "warmup": args.warmup, "copies": args.copies,
                "connections": args.connections or "4 per copy", "wrk_threads": args.wrk_threads,
                "stock_uvicorn": args.stock_uvicorn},
                "label_check": label_check, "runs": runs}, file, indent=1)
    if args.plot:
        plot(runs, info, args, args.plot)


if __name__ == "__main__":
    main()
