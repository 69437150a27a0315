"""bench/cuda: what one call of a small op costs on the GPU, Orochi against PyTorch.

Ops too small to keep the GPU busy (a ResNet's convolutions at batch 1, an add of 64 items) cost
what their host side costs: the time per call here is the engine's and the libraries' work per
call. Each op runs 300 times after 10 warm-up calls, the device synchronised around them.

    build/bin/orochi python bench/cuda/op_latency.py     (Orochi)
    python3 bench/cuda/op_latency.py --torch             (PyTorch, with CUDA)
"""

import sys
import time

TORCH = "--torch" in sys.argv
if TORCH:
    import torch as orochi
    import torch.nn.functional as F
else:
    import orochi
    import orochi.nn.functional as F

CALLS = 300


def per_call_us(call) -> float:
    for _ in range(10):
        call()
    orochi.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    orochi.cuda.synchronize()
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    device = "cuda"
    image = orochi.randn(1, 64, 56, 56).to(device)
    images = orochi.randn(8, 64, 56, 56).to(device)
    filters = orochi.randn(64, 64, 3, 3).to(device)
    pointwise = orochi.randn(64, 64, 1, 1).to(device)
    bias = orochi.randn(64).to(device)
    vector = orochi.randn(64).to(device)
    weight = orochi.randn(64, 64).to(device)
    cases = {
        "add [64]": lambda: vector + vector,
        "relu [1, 64, 56, 56]": lambda: F.relu(image),
        "conv2d 3x3, batch 1": lambda: F.conv2d(image, filters, bias, padding=1),
        "conv2d 3x3, batch 8": lambda: F.conv2d(images, filters, bias, padding=1),
        "conv2d 1x1, batch 1": lambda: F.conv2d(image, pointwise),
        "linear [1, 64] x [64, 64]": lambda: F.linear(vector.reshape(1, 64), weight),
    }
    framework = "pytorch" if TORCH else "orochi"
    with orochi.no_grad():
        for name, call in cases.items():
            print(f"{framework:8} {name:28} {per_call_us(call):8.1f} us per call", flush=True)


if __name__ == "__main__":
    main()
