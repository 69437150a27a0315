"""bench/cuda end to end: the example models' networks on the GPU, from the examples' own code.

Runs in Orochi (`orochi python bench/cuda/e2e_models.py`) or, with --torch, in PyTorch eager
(`python3 bench/cuda/e2e_models.py --torch`), where `orochi` stands for `torch` as in
models/torch_runner.py. Both build the same modules with their default (random) weights, move
them with Module.to(device), and time forward passes on random inputs with the device
synchronised around each trial (median of 5). Both compute in full float32 unless --tf32 allows
TF32 tensor cores in both (Orochi's one switch; PyTorch's matmul and cuDNN switches, of which
PyTorch's default turns on only cuDNN's). Prints one JSON line per model and batch size:
{"model", "batch", "ms"}; bench_cuda.py --models runs both and compares.

  resnet:  models/resnet's ResNet on [batch, 3, 224, 224] float32 images.
  encoder: models/encoder's four pre-norm transformer layers and final norm on [batch, 128,
           256] float32 embeddings with a padding mask (the token and position embeddings, a
           lookup, are left out so that both frameworks time the same dense layers).

    orochi python bench/cuda/e2e_models.py [--batches 1,8] [--seconds 3] [--device cuda]
        [--tf32] [--threads 1] [--json]

In Orochi the weights are then saved and loaded back as a package's are (read-only, memory
mapped), so that kernels which prepare weights once per weight tensor (oneDNN's convolution
layouts) run as they do in the server; PyTorch eager keeps its modules' own tensors. --threads
sets both frameworks' intra-op threads (default 1: one copy per core); --cpu-time times with
the process's CPU time instead of the wall clock (steadier on a busy machine; at one thread the
same figure, with more threads their sum).

It uses Orochi's Python CUDA API (Tensor.to("cuda"), Module.to, orochi.cuda.synchronize); with
--device cpu it runs anywhere, which checks the script itself.
"""

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.abspath(os.path.join(HERE, "..", "..", "models"))
TRIALS = 5
SEQUENCE = 128


def load_model_code(example: str):
    """models/<example>/code/model.py as a module of its own name (both files are model.py)."""
    path = os.path.join(MODELS, example, "code", "model.py")
    spec = importlib.util.spec_from_file_location(f"{example}_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_call_ms(call, synchronize, seconds: float, clock=time.perf_counter) -> float:
    for _ in range(3):  # warm up: handles, allocator caches, clocks
        call()
    synchronize()

    def timed(iterations):
        start = clock()
        for _ in range(iterations):
            call()
        synchronize()
        return (clock() - start) / iterations

    iterations = max(3, int(seconds / TRIALS / max(timed(2), 1e-6)))
    trials = sorted(timed(iterations) for _ in range(TRIALS))
    return trials[len(trials) // 2] * 1e3


def load_as_package(orochi, network) -> None:
    """Binds `network` to its own weights saved and loaded back as a package's: read-only."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "weights.safetensors")
        orochi.save_safetensors(network.state_dict(), path)
        network.load_state_dict(orochi.load_safetensors(path))  # mapped: the file may go


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", action="store_true", help="run in PyTorch eager instead")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 for float32 in both")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads, both frameworks")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time with the process's CPU time (all its threads) instead of the "
                             "wall clock: steadier on a shared machine, for CPU runs")
    parser.add_argument("--json", action="store_true", help="JSON lines only")
    args = parser.parse_args()
    if args.torch:
        # Debian's torch runs its GEMMs on OpenBLAS's own thread pool, which
        # torch.set_num_threads does not size: without this its "one thread" runs matmuls on
        # every core. Read by OpenBLAS as it loads, so set before torch is imported.
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
        sys.path.insert(0, MODELS)
        from torch_runner import alias_orochi_to_torch  # noqa: PLC0415 (imports torch)

        alias_orochi_to_torch()
    import orochi  # noqa: PLC0415 (Orochi's own, or PyTorch under its name)

    orochi.backends.cuda.matmul.allow_tf32 = args.tf32
    if args.torch:
        orochi.backends.cudnn.allow_tf32 = args.tf32

    device = args.device
    synchronize = orochi.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    resnet = load_model_code("resnet")
    encoder = load_model_code("encoder")
    networks = {"resnet": resnet.ResNet().eval().to(device),
                "encoder": encoder.Encoder().eval().to(device)}
    orochi.set_num_threads(args.threads)
    if not args.torch and device == "cpu":
        for network in networks.values():
            load_as_package(orochi, network)
    # As models/resnet's ImageClassifier does once its weights are loaded, in both frameworks.
    networks["resnet"].fold_batch_norms()

    def resnet_call(batch):
        images = orochi.randn(batch, 3, 224, 224).to(device)
        return lambda: networks["resnet"](images)

    def encoder_call(batch):
        body = networks["encoder"]
        states = orochi.randn(batch, SEQUENCE, encoder.WIDTH).to(device)
        padding = orochi.zeros(batch, SEQUENCE, dtype=orochi.bool)
        padding[:, SEQUENCE - 16:] = True  # some padding, so the mask is used
        padding = padding.to(device)

        def forward():
            x = states
            for layer in body.layers:
                x = layer(x, src_key_padding_mask=padding)
            return body.norm(x)
        return forward

    calls = {"resnet": resnet_call, "encoder": encoder_call}
    framework = "torch" if args.torch else "orochi"
    with orochi.no_grad():
        for model, make_call in calls.items():
            for batch in (int(text) for text in args.batches.split(",")):
                ms = per_call_ms(make_call(batch), synchronize, args.seconds,
                                 time.process_time if args.cpu_time else time.perf_counter)
                row = {"model": model, "batch": batch, "ms": ms, "framework": framework,
                       "threads": args.threads}
                print(json.dumps(row) if args.json else
                      f"{framework:6} {model:8} batch {batch:3}: {ms:8.3f} ms")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
