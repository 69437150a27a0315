"""bench/models_cpu: one layer of the encoder example, part by part, Orochi against PyTorch eager,
at each intra-op thread count, to show which parts gain from more threads and which do not.

The parts are those of a pre-norm nn.TransformerEncoderLayer (models/encoder): the whole layer,
its self-attention block, norm1, linear1 (256 -> 1024), the activation, and linear2 (1024 -> 256),
on [batch, 128, 256] float32 inputs with a padding mask. PyTorch's whole-layer row takes its
fused fast path in eval mode; its part rows, like Orochi's, run the modules one by one.

    /usr/bin/python3.11 bench/models_cpu/encoder_parts.py [--threads 1,2,4] [--batch 8]
        [--seconds 1] [--json results.json]

Runs itself in Orochi (`build/bin/orochi python ... --worker`) and in this Python's PyTorch
(`... --worker --torch`), once per thread count, and prints each part's time in both, their
ratio, and Orochi's speed-up over its first thread count.
"""

import argparse
import json
import os
import platform
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("OROCHI_BUILD", os.path.join(ROOT, "build"))
sys.path.insert(0, os.path.join(ROOT, "bench", "cuda"))

from e2e_models import SEQUENCE, load_as_package, load_model_code, per_call_ms  # noqa: E402


def worker(args) -> None:
    if args.torch:
        os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads[0])  # see e2e_models.py
        sys.path.insert(0, os.path.join(ROOT, "models"))
        from torch_runner import alias_orochi_to_torch  # noqa: PLC0415 (imports torch)

        alias_orochi_to_torch()
    import orochi  # noqa: PLC0415 (Orochi's own, or PyTorch under its name)

    encoder = load_model_code("encoder")
    network = encoder.Encoder().eval()
    if not args.torch:
        load_as_package(orochi, network)
    layer = network.layers[0]
    x = orochi.randn(args.batch, SEQUENCE, encoder.WIDTH)
    padding = orochi.zeros(args.batch, SEQUENCE, dtype=orochi.bool)
    padding[:, SEQUENCE - 16:] = True
    with orochi.no_grad():
        normed = layer.norm1(x)
        hidden = layer.linear1(normed)
        parts = {
            "layer": lambda: layer(x, src_key_padding_mask=padding),
            "self_attention": lambda: layer.self_attn(normed, normed, normed,
                                                      key_padding_mask=padding,
                                                      need_weights=False)[0],
            "norm": lambda: layer.norm1(x),
            "linear1": lambda: layer.linear1(normed),
            "activation": lambda: layer.activation(hidden),
            "linear2": lambda: layer.linear2(hidden),
        }
        for threads in args.threads:
            orochi.set_num_threads(threads)
            for part, call in parts.items():
                ms = per_call_ms(call, lambda: None, args.seconds)
                print(json.dumps({"part": part, "threads": threads, "ms": ms}), flush=True)


def run(torch: bool, args) -> dict:
    command = [sys.executable] if torch else [os.path.join(BUILD, "bin", "orochi"), "python"]
    command += [os.path.abspath(__file__), "--worker", "--threads",
                ",".join(map(str, args.threads)), "--batch", str(args.batch), "--seconds",
                str(args.seconds)] + (["--torch"] if torch else [])
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr}")
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return {(row["part"], row["threads"]): row["ms"] for row in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}",
                        type=lambda text: [int(item) for item in text.split(",")])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--worker", action="store_true", help="time the parts in this process")
    parser.add_argument("--torch", action="store_true", help="as a worker: time PyTorch")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    # One process per thread count: Debian's torch sizes OpenBLAS's own pool as it loads.
    orochi_ms, torch_ms = {}, {}
    for threads in args.threads:
        one = argparse.Namespace(**{**vars(args), "threads": [threads]})
        orochi_ms.update(run(False, one))
        torch_ms.update(run(True, one))
    print(f"{os.cpu_count()} cores ({platform.machine()}), encoder layer, batch {args.batch}")
    print(f"{'part':16} {'threads':>7} {'orochi':>11} {'pytorch':>11} {'orochi/pytorch':>15}"
          f" {'orochi speed-up':>16}")
    rows = []
    for (part, threads), ms in orochi_ms.items():
        theirs = torch_ms[(part, threads)]
        speed_up = orochi_ms[(part, args.threads[0])] / ms
        print(f"{part:16} {threads:7d} {ms:8.3f} ms {theirs:8.3f} ms {ms / theirs:14.2f}x"
              f" {speed_up:15.2f}x")
        rows.append({"part": part, "threads": threads, "orochi_ms": ms, "pytorch_ms": theirs})
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
