"""bench/cuda: Orochi's CUDA engine against PyTorch on the same GPU, in the same run.

Kernels: runs build/bin/bench_cuda (matmul 4096^3 in fp32, TF32, bf16 and fp16; a ResNet
stage-2 conv2d in fp32, TF32 and bf16; add, softmax, layer_norm), then the same cases with
torch.matmul, F.conv2d, ... on the same GPU, timed the same way (median of 5 trials, the device
synchronised around each), and prints Orochi's throughput over PyTorch's (goal for matmul:
>= 0.95). TF32 is off unless the case says tf32, in both (PyTorch's cuDNN allows TF32 for
convolutions by default; here it follows the case). PyTorch runs eager with its defaults
(cudnn.benchmark off).

Models (--models): the ResNet-style and transformer examples' networks (models/resnet,
models/encoder) end to end, from the same model code: in Orochi through
`orochi python bench/cuda/e2e_models.py`, and in PyTorch eager through
`python3 bench/cuda/e2e_models.py --torch`; prints Orochi's latency over PyTorch's (goal: <= 1.2).
This part needs the Python CUDA API (Tensor.to("cuda"), Module.to, orochi.cuda.synchronize).

    python3 bench/cuda/bench_cuda.py [--seconds 2] [--models] [--batches 1,8]
        [--json results.json]

Needs a build with CUDA (build/bin/bench_cuda, build/bin/orochi) and PyTorch with CUDA in the
Python that runs this script (sys.executable also runs the PyTorch half of --models).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from e2e_models import per_call_ms  # the same timing for both halves

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("OROCHI_BUILD", os.path.join(ROOT, "build"))
MATMUL_GOAL = 0.95  # Orochi's throughput over PyTorch's, at least
MODEL_GOAL = 1.2    # Orochi's latency over PyTorch's, at most


def run_orochi_kernels(seconds: float) -> dict:
    binary = os.path.join(BUILD, "bin", "bench_cuda")
    result = subprocess.run([binary, "--json", "--seconds", str(seconds)], capture_output=True,
                            text=True)
    sys.stderr.write(result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{binary} failed ({result.returncode})")
    return {row["name"]: row for row in map(json.loads, result.stdout.splitlines())}


def torch_kernel_cases(torch):
    """The cases of bench_cuda.cpp in PyTorch: name -> (tf32, setup), where setup() makes the
    inputs and returns the call to time."""
    functional = torch.nn.functional

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, device="cuda", dtype=dtype)

    def matmul(dtype):
        a, b = randn(4096, 4096, dtype=dtype), randn(4096, 4096, dtype=dtype)
        return lambda: torch.matmul(a, b)

    def conv2d(dtype):
        x, w = randn(32, 128, 28, 28, dtype=dtype), randn(128, 128, 3, 3, dtype=dtype)
        return lambda: functional.conv2d(x, w, padding=1)

    def add():
        a, b = randn(1 << 26), randn(1 << 26)
        return lambda: a + b

    def softmax():
        a = randn(4096, 4096)
        return lambda: a.softmax(-1)

    def layer_norm():
        a, w, b = randn(8192, 1024), randn(1024), randn(1024)
        return lambda: functional.layer_norm(a, (1024,), w, b)

    return {
        "matmul_fp32_4096": (False, lambda: matmul(torch.float32)),
        "matmul_tf32_4096": (True, lambda: matmul(torch.float32)),
        "matmul_bf16_4096": (False, lambda: matmul(torch.bfloat16)),
        "matmul_fp16_4096": (False, lambda: matmul(torch.float16)),
        "conv2d_fp32_resnet": (False, lambda: conv2d(torch.float32)),
        "conv2d_tf32_resnet": (True, lambda: conv2d(torch.float32)),
        "conv2d_bf16_resnet": (False, lambda: conv2d(torch.bfloat16)),
        "add_fp32_64M": (False, add),
        "softmax_fp32_4096x4096": (False, softmax),
        "layer_norm_fp32_8192x1024": (False, layer_norm),
    }


def run_torch_kernels(torch, names, seconds: float) -> dict:
    results = {}
    with torch.inference_mode():
        for name, (tf32, setup) in torch_kernel_cases(torch).items():
            if name not in names:
                continue
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
            results[name] = per_call_ms(setup(), torch.cuda.synchronize, seconds)
            torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return results


def run_models(batches: str, seconds: float) -> dict:
    """{(model, batch): {"orochi": ms, "torch": ms}} from e2e_models.py in both frameworks."""
    script = os.path.join(HERE, "e2e_models.py")
    common = ["--batches", batches, "--seconds", str(seconds), "--json"]
    commands = {"orochi": [os.path.join(BUILD, "bin", "orochi"), "python", script] + common,
                "torch": [sys.executable, script, "--torch"] + common}
    results = {}
    for framework, command in commands.items():
        run = subprocess.run(command, capture_output=True, text=True)
        if run.returncode != 0:
            print(f"models in {framework} failed ({run.returncode}):\n{run.stdout}{run.stderr}",
                  file=sys.stderr)
            continue
        for row in map(json.loads, run.stdout.splitlines()):
            results.setdefault((row["model"], row["batch"]), {})[framework] = row["ms"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per case and side")
    parser.add_argument("--models", action="store_true", help="also the end-to-end models")
    parser.add_argument("--batches", default="1,8", help="batch sizes for --models")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args()

    import torch  # noqa: PLC0415 (after the argument check, so --help works without it)
    if not torch.cuda.is_available():
        raise SystemExit("PyTorch sees no CUDA GPU")
    machine = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
               "torch_cuda": torch.version.cuda, "host": platform.node(),
               "date": time.strftime("%Y-%m-%d")}
    print(f"{machine['gpu']}; PyTorch {machine['torch']} (CUDA {machine['torch_cuda']})")

    ours = run_orochi_kernels(args.seconds)
    theirs = run_torch_kernels(torch, set(ours), args.seconds)
    report = {"machine": machine, "kernels": [], "models": []}
    print(f"\n{'case':28} {'orochi':>12} {'pytorch':>12} {'rate':>16} {'orochi/pytorch':>15}")
    for name, row in ours.items():
        ratio = theirs[name] / row["ms"]  # throughput ratio
        goal = " (goal >= 0.95)" if name.startswith("matmul") else ""
        flag = " BELOW GOAL" if goal and ratio < MATMUL_GOAL else ""
        print(f"{name:28} {row['ms']:9.3f} ms {theirs[name]:9.3f} ms "
              f"{row['rate']:9.2f} {row['unit']:6} {ratio:14.2f}x{goal}{flag}")
        report["kernels"].append({"name": name, "orochi_ms": row["ms"], "torch_ms": theirs[name],
                                  "ratio": ratio})

    if args.models:
        print(f"\n{'model':12} {'batch':>5} {'orochi':>12} {'pytorch':>12} {'latency ratio':>14}")
        for (model, batch), times in sorted(run_models(args.batches, args.seconds).items()):
            if len(times) < 2:
                continue
            ratio = times["orochi"] / times["torch"]
            flag = " ABOVE GOAL" if ratio > MODEL_GOAL else ""
            print(f"{model:12} {batch:5} {times['orochi']:9.3f} ms {times['torch']:9.3f} ms "
                  f"{ratio:13.2f}x (goal <= {MODEL_GOAL}){flag}")
            report["models"].append({"model": model, "batch": batch, **times, "ratio": ratio})

    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=2)


if __name__ == "__main__":
    main()
