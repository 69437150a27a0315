"""bench/models_cpu: the example networks on the CPU, Orochi against PyTorch eager, same run.

Runs bench/cuda/e2e_models.py --device cpu in Orochi (`build/bin/orochi python`) and in PyTorch
eager (this Python, with --torch: Debian's python3-torch), at one intra-op thread (one copy per
core, the server's default) and at all of this machine's cores, for each batch size, and prints
Orochi's latency over PyTorch's. Goals: at most 0.9 at one thread, at most 1.0 with all threads.
Both frameworks run the same model code (models/resnet, models/encoder) with the same random
weights' shapes; Orochi's are loaded back read-only, as a package's are.

    /usr/bin/python3.11 bench/models_cpu/models_cpu.py [--batches 1,8] [--seconds 3]
        [--threads 1,N] [--repeats 3] [--before OTHER_BUILD] [--cpu-time] [--json results.json]

Needs build/bin/orochi (OROCHI_BUILD names another build folder). --before also runs another
build's Orochi (e.g. the previous commit's) in the same run, for a before/after column.
--repeats runs each side that many times, alternating, and keeps the median of each case: on a
machine others are using, one run of either side can land on a busy moment (all threads compete
with everything else on the machine, so compare them by wall time over several repeats).
--cpu-time compares CPU time rather than wall time: on a machine others are using, wall times
swing with their load while one thread's CPU time does not (meaningful at one thread only).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("OROCHI_BUILD", os.path.join(ROOT, "build"))
SCRIPT = os.path.join(ROOT, "bench", "cuda", "e2e_models.py")
GOAL_ONE_THREAD = 0.9  # Orochi's latency over PyTorch eager's, at most
GOAL_ALL_THREADS = 1.0


def run(framework: str, threads: int, args, build: str = BUILD) -> dict:
    """{(model, batch): ms} of one framework at `threads` intra-op threads."""
    common = ["--device", "cpu", "--batches", args.batches, "--seconds", str(args.seconds),
              "--threads", str(threads), "--json"] + (["--cpu-time"] if args.cpu_time else [])
    command = ([os.path.join(build, "bin", "orochi"), "python", SCRIPT] if framework == "orochi"
               else [sys.executable, SCRIPT, "--torch"]) + common
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{framework} at {threads} thread(s) failed ({result.returncode}):\n"
                         f"{result.stdout}{result.stderr}")
    return {(row["model"], row["batch"]): row["ms"]
            for row in map(json.loads, result.stdout.splitlines())}


def median_of(runs: list) -> dict:
    """{case: median ms} over runs of one side ({case: ms} each); {} for no runs."""
    cases = runs[0] if runs else {}
    return {case: statistics.median(one[case] for one in runs) for case in cases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seconds", type=float, default=3.0, help="timing per case and side")
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                        help="intra-op thread counts to run (default: 1 and every core)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each side per thread count, alternating; medians kept")
    parser.add_argument("--before", help="another build folder whose Orochi also runs")
    parser.add_argument("--cpu-time", action="store_true",
                        help="CPU time instead of wall time (a busy machine; one thread only)")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()

    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M")}
    print(f"{machine['cores']} cores ({machine['cpu']}), {machine['date']}")
    before_header = f" {'before':>11} {'now/before':>10}" if args.before else ""
    print(f"{'model':8} {'batch':>5} {'threads':>7} {'orochi':>11} {'pytorch':>11} "
          f"{'orochi/pytorch':>15}{before_header}")
    rows = []
    for threads in sorted({int(text) for text in args.threads.split(",")}):
        # Alternating frameworks per thread count keeps both halves of a ratio close in time.
        ours_runs, theirs_runs, before_runs = [], [], []
        for _ in range(args.repeats):
            ours_runs.append(run("orochi", threads, args))
            theirs_runs.append(run("torch", threads, args))
            if args.before:
                before_runs.append(run("orochi", threads, args, args.before))
        ours, theirs, before = (median_of(runs) for runs in (ours_runs, theirs_runs, before_runs))
        goal = GOAL_ONE_THREAD if threads == 1 else GOAL_ALL_THREADS
        for (model, batch), ms in sorted(ours.items()):
            ratio = ms / theirs[(model, batch)]
            flag = "" if ratio <= goal else " ABOVE GOAL"
            row = {"model": model, "batch": batch, "threads": threads, "orochi_ms": ms,
                   "torch_ms": theirs[(model, batch)], "ratio": ratio}
            then = ""
            if (model, batch) in before:
                row["before_ms"] = before[(model, batch)]
                then = f" {row['before_ms']:8.2f} ms {ms / row['before_ms']:9.2f}x"
            print(f"{model:8} {batch:5} {threads:7} {ms:8.2f} ms {theirs[(model, batch)]:8.2f} ms "
                  f"{ratio:14.2f}x{then} (goal <= {goal}){flag}")
            row["repeats"] = args.repeats
            rows.append(row)
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine, "models": rows}, file, indent=2)


if __name__ == "__main__":
    main()
