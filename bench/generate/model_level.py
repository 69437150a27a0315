"""Runs inside an interpreter copy (`orochi python`): the text generator's tokens/s and time to
first token for N sequences arriving together, stepped together (one step() for all live
sequences, as the server's step-level batching does) or one at a time (max_live_sequences 1).
Tokens are counted per second of wall time and per second of CPU time of this process: the
copy's thread and any intra-op threads of the engine it borrowed (a busy machine disturbs that
less than the wall clock). --threads caps the engine's threads for the copy's calls
(orochi.set_num_threads; 0, the default, leaves the engine's own setting: every core); each row
says how many it had. Prints one JSON object per line. Driven by bench_generate.py."""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import orochi

from workload import PROMPTS, percentile


class Context:
    def __init__(self, package: Path):
        self.device = orochi.device("cpu")
        self.manifest = json.loads((package / "manifest.json").read_text())
        self.config = dict(self.manifest.get("parameters", {}))
        self.weights = orochi.load_safetensors(str(package / "weights" / "textgen.safetensors"))


def requests(streams: int, max_tokens: int):
    return [({"text_input": [PROMPTS[i % len(PROMPTS)].encode()]},
             {"max_tokens": max_tokens, "temperature": 0.8, "seed": i}) for i in range(streams)]


def together(model, batch):
    """All sequences started at once, then stepped together until each finishes."""
    started = time.perf_counter()
    live = {index: model.start(inputs, parameters) for index, (inputs, parameters) in
            enumerate(batch)}
    first, tokens = {}, 0
    while live:
        order = list(live)
        results = model.step([live[index] for index in order])
        now = time.perf_counter()
        tokens += len(order)
        for index, (outputs, finished) in zip(order, results):
            if outputs is not None:
                first.setdefault(index, now - started)
            if finished:
                model.finish(live.pop(index))
    return tokens, time.perf_counter() - started, list(first.values())


def one_at_a_time(model, batch):
    """The same sequences, all arrived at once, run one after another."""
    started = time.perf_counter()
    first, tokens = [], 0
    for inputs, parameters in batch:
        state = model.start(inputs, parameters)
        seen = False
        while True:
            ((outputs, finished),) = model.step([state])
            tokens += 1
            if outputs is not None and not seen:
                first.append(time.perf_counter() - started)
                seen = True
            if finished:
                model.finish(state)
                break
    return tokens, time.perf_counter() - started, first


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--package", type=Path, required=True)
    parser.add_argument("--streams", default="1,2,4,8,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    sys.path.insert(0, str(args.package / "code"))
    import model as textgen
    orochi.set_grad_enabled(False)
    if args.threads > 0:
        orochi.set_num_threads(args.threads)
    model = textgen.TextGenerator(Context(args.package))
    model.warmup()
    for streams in [int(item) for item in args.streams.split(",")]:
        for mode, run in (("stepped together", together), ("one at a time", one_at_a_time)):
            rates, cpu_rates, firsts = [], [], []
            for _ in range(args.repeat):
                cpu = time.process_time()
                tokens, seconds, first = run(model, requests(streams, args.max_tokens))
                rates.append(tokens / seconds)
                cpu_rates.append(tokens / (time.process_time() - cpu))
                firsts += first
            print(json.dumps({"streams": streams, "mode": mode,
                              "threads": orochi.get_num_threads(),
                              "tokens_per_s": statistics.median(rates),
                              "tokens_per_cpu_s": statistics.median(cpu_rates),
                              "ttft_p50_ms": 1000 * percentile(firsts, 0.5),
                              "ttft_p99_ms": 1000 * percentile(firsts, 0.99)}), flush=True)


if __name__ == "__main__":
    main()
