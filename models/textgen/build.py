"""Trains the text generator on the licence texts every Debian system ships, and writes its
package directory.

The corpus is /usr/share/common-licenses (package base-files, which every Debian system has):
the licences named in CORPUS, each preceded by the document boundary token. The network of
code/network.py is trained here with Debian's PyTorch (python3-torch), on 2 threads with fixed
seeds, then exported to safetensors; the package serves it under Orochi unchanged.

Training takes a few minutes, so its result is cached in OUT/trained/, keyed by a hash of
everything that decides the weights (the corpus, this script, network.py, the PyTorch version):
a rebuild with the same inputs reuses it.

Writes OUT/package/ (weights/textgen.safetensors), OUT/training.json (corpus, losses, time),
OUT/reference.json (PyTorch's logits and greedy continuations of REFERENCE_PROMPTS with these
weights, which tests/models compares Orochi's KV-cache decoding with), OUT/request.json (a
KServe v2 request) and OUT/generate.json (the same for the generate extension).
"""

import hashlib
import inspect
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

# OpenMP threads that spin while they wait made PyTorch 20x slower on a machine whose cores are
# busy with other work (a build): they sleep instead. Set before PyTorch starts OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE / "code")]
import build_support  # noqa: E402

LICENSES = Path("/usr/share/common-licenses")
# Licences whose texts have not changed in Debian for years (a fixed list, not the directory, so
# that a new licence file does not change the weights).
CORPUS = ("Apache-2.0", "Artistic", "BSD", "GFDL-1.3", "GPL-2", "GPL-3", "LGPL-2.1", "LGPL-3",
          "MPL-2.0")
SEED = 27
THREADS = 2
STEPS = 900
BATCH = 16
LEARNING_RATE = 5e-3
WARMUP = 50
HELD_OUT = 0.05  # the last 5% of each licence: the validation text
REFERENCE_PROMPTS = ("This program is free software", "You may not ", "\n  3. ")
REFERENCE_TOKENS = 48


def load_corpus():
    """(training ids, validation ids, corpus bytes) with the boundary before each licence."""
    import network
    training, validation, raw = [], [], b""
    for name in CORPUS:
        path = LICENSES / name
        if not path.is_file():
            sys.exit(f"build.py: the corpus file {path} is missing (Debian's base-files ships it)")
        text = path.read_bytes()
        raw += text
        split = int(len(text) * (1 - HELD_OUT))
        training += [network.BOUNDARY, *text[:split]]
        validation += [network.BOUNDARY, *text[split:]]
    return np.array(training, np.int64), np.array(validation, np.int64), raw


def cache_key(raw: bytes) -> str:
    """What decides the weights: the corpus, the network, the training code and its settings,
    PyTorch's version. (Not the rest of this script: changing the export retrains nothing.)"""
    import torch
    settings = repr((CORPUS, SEED, THREADS, STEPS, BATCH, LEARNING_RATE, WARMUP, HELD_OUT))
    digest = hashlib.sha256()
    for part in (raw, (HERE / "code" / "network.py").read_bytes(), settings.encode(),
                 *(inspect.getsource(function).encode() for function in (load_corpus, windows, train)),
                 torch.__version__.encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def windows(ids, count, generator):
    import torch
    import network
    starts = torch.randint(0, len(ids) - network.CONTEXT - 1, (count,), generator=generator)
    rows = torch.stack([torch.from_numpy(ids[s:s + network.CONTEXT + 1]) for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def evaluate(model, ids):
    """Mean cross-entropy in bits per byte over consecutive windows of `ids`."""
    import torch
    import network
    losses, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, network.CONTEXT):
            chunk = torch.from_numpy(ids[start:start + network.CONTEXT + 1])
            if len(chunk) < 2:
                break
            logits = model(chunk[None, :-1])[0]
            losses += torch.nn.functional.cross_entropy(logits, chunk[1:], reduction="sum").item()
            count += len(chunk) - 1
    return losses / count / math.log(2)


def train(training, validation):
    import torch
    import network
    torch.manual_seed(SEED)
    model = network.LanguageModel()
    # Small embeddings (as GPT-2 starts them): PyTorch's default N(0, 1) hardly moves under
    # Adam's steps, and random positions that large drown the bytes at the start.
    for embedding in (model.tokens, model.positions):
        torch.nn.init.normal_(embedding.weight, std=0.02)
    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95),
                                  weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(
        (step + 1) / WARMUP, 0.5 * (1 + math.cos(math.pi * step / STEPS))))
    started = time.monotonic()
    model.train()
    for step in range(STEPS):
        inputs, targets = windows(training, BATCH, generator)
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, network.VOCABULARY),
                                                 targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 100 == 0 or step == STEPS - 1:
            print(f"textgen: step {step}/{STEPS}, loss {loss.item() / math.log(2):.3f} bits/byte,"
                  f" {time.monotonic() - started:.0f} s", flush=True)
    seconds = time.monotonic() - started
    model.eval()
    return model, {"steps": STEPS, "batch": BATCH, "window": network.CONTEXT, "seed": SEED,
                   "threads": THREADS, "training_seconds": round(seconds, 1),
                   "training_bits_per_byte": round(evaluate(model, training[:32768]), 4),
                   "validation_bits_per_byte": round(evaluate(model, validation), 4)}


def greedy_reference(model, prompt: str) -> dict:
    """PyTorch's greedy continuation of `prompt`, recomputing the whole sequence for each token,
    with the logits it chose from at each step."""
    import torch
    import network
    ids = [network.BOUNDARY, *prompt.encode()]
    steps = []
    with torch.no_grad():
        for _ in range(REFERENCE_TOKENS):
            logits = model(torch.tensor([ids]))[0, -1]
            steps.append([round(value, 5) for value in logits.tolist()])
            ids.append(int(logits.argmax()))
    return {"prompt": prompt, "tokens": ids[len(prompt.encode()) + 1:], "logits": steps}


def trained_weights(out: Path, training, validation, raw):
    """The state_dict as numpy arrays and the training report, from the cache when it has them."""
    import torch
    torch.set_num_threads(THREADS)
    key = cache_key(raw)
    cached = out / "trained" / f"{key}.safetensors"
    report_path = cached.with_suffix(".json")
    if cached.is_file() and report_path.is_file():
        print(f"textgen: reusing the weights trained from the same inputs ({cached})")
        from torch_runner import read_safetensors
        return {name: tensor.numpy() for name, tensor in read_safetensors(cached).items()}, \
            json.loads(report_path.read_text())
    model, report = train(training, validation)
    weights = {name: tensor.detach().numpy().astype(np.float32)
               for name, tensor in model.state_dict().items()}
    report.update(corpus=[str(LICENSES / name) for name in CORPUS], corpus_bytes=len(raw),
                  corpus_sha256=hashlib.sha256(raw).hexdigest(), torch=torch.__version__)
    cached.parent.mkdir(parents=True, exist_ok=True)
    build_support.write_safetensors(cached, weights)
    build_support.write_json(report_path, report)
    return weights, report


def main():
    args = build_support.parse_args(__doc__.splitlines()[0])
    from torch_runner import alias_orochi_to_torch
    alias_orochi_to_torch()
    import torch
    training, validation, raw = load_corpus()
    weights, report = trained_weights(args.out, training, validation, raw)
    print(f"textgen: {report['validation_bits_per_byte']} bits/byte on the held-out text "
          f"(trained in {report['training_seconds']} s)")

    package = build_support.stage_package(HERE, args.out)
    build_support.write_safetensors(package / "weights" / "textgen.safetensors", weights)
    build_support.write_json(args.out / "training.json", report)

    import network
    model = network.LanguageModel()
    model.load_state_dict({name: torch.from_numpy(array) for name, array in weights.items()})
    model.eval()
    build_support.write_json(args.out / "reference.json", {
        "_": "PyTorch's greedy continuations with these weights, recomputed in full per token",
        "continuations": [greedy_reference(model, prompt) for prompt in REFERENCE_PROMPTS]},
        compact=True)
    prompt, parameters = "This program is free software", {"max_tokens": 64, "temperature": 0}
    build_support.write_json(args.out / "request.json", build_support.json_request(
        [("text_input", "BYTES", [1], [prompt])], parameters=parameters), compact=True)
    build_support.write_json(args.out / "generate.json", {"text_input": prompt, **parameters},
                             compact=True)


if __name__ == "__main__":
    main()
