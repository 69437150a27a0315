"""PyTorch's per-op cost for the calls bench_python_api times, on the same machine and run.

Run by bench_python_api with Debian's /usr/bin/python3.11 when python3-torch is installed;
prints "torch VERSION", then one "name nanoseconds" line per case. Mirrors the Python half of bench_python_api.cpp.
"""

import sys
import time

import torch

torch.set_num_threads(1)
ITERATIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
TRIALS = 7


def per_call_ns(statement, namespace):
    code = compile(f"for _ in range({ITERATIONS}):\n    {statement}\n", "<bench>", "exec")
    best = []
    for _ in range(TRIALS):
        start = time.perf_counter_ns()
        exec(code, namespace)
        best.append((time.perf_counter_ns() - start) / ITERATIONS)
    best.sort()
    return best[len(best) // 2]


print("torch", torch.__version__)
with torch.inference_mode():
    space = {
        "a": torch.ones(1), "b": torch.ones(1), "F": torch.nn.functional,
        "x": torch.ones(1, 16), "w": torch.ones(16, 16), "bias": torch.ones(16),
        "layer": torch.nn.Linear(16, 16).eval(),
    }
    for name, statement in [("loop", "pass"), ("add", "a + b"), ("linear", "F.linear(x, w, bias)"),
                            ("module", "layer(x)")]:
        print(name, f"{per_call_ns(statement, space):.1f}")
