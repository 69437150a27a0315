"""Writes the transformer encoder example's package directory with seeded random weights.

The names follow the model's state_dict (PyTorch's nn.TransformerEncoderLayer keys); weights
are scaled as PyTorch initialises them, layer norms start at identity.

Writes OUT/package/ (weights/encoder.safetensors) and OUT/request.json.
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import build_support  # noqa: E402

SEED = 4
WIDTH, LAYERS, FEEDFORWARD, VOCABULARY, POSITIONS, PAD = 256, 4, 1024, 258, 512, 257


def linear(rng, outputs, inputs):
    bound = 1.0 / np.sqrt(inputs)
    return (rng.uniform(-bound, bound, (outputs, inputs)).astype(np.float32),
            rng.uniform(-bound, bound, outputs).astype(np.float32))


def norm(rng, prefix):
    return {f"{prefix}.weight": (1 + rng.randn(WIDTH) * 0.02).astype(np.float32),
            f"{prefix}.bias": (rng.randn(WIDTH) * 0.02).astype(np.float32)}


def weights(rng):
    tokens = (rng.randn(VOCABULARY, WIDTH) * 0.5).astype(np.float32)
    tokens[PAD] = 0
    tensors = {"tokens.weight": tokens,
               "positions.weight": (rng.randn(POSITIONS, WIDTH) * 0.1).astype(np.float32)}
    for index in range(LAYERS):
        prefix = f"layers.{index}"
        projection, projection_bias = linear(rng, 3 * WIDTH, WIDTH)
        tensors[f"{prefix}.self_attn.in_proj_weight"] = projection
        tensors[f"{prefix}.self_attn.in_proj_bias"] = projection_bias
        for name, (outputs, inputs) in (("self_attn.out_proj", (WIDTH, WIDTH)),
                                        ("linear1", (FEEDFORWARD, WIDTH)),
                                        ("linear2", (WIDTH, FEEDFORWARD))):
            weight, bias = linear(rng, outputs, inputs)
            tensors[f"{prefix}.{name}.weight"] = weight
            tensors[f"{prefix}.{name}.bias"] = bias
        tensors.update(norm(rng, f"{prefix}.norm1"))
        tensors.update(norm(rng, f"{prefix}.norm2"))
    tensors.update(norm(rng, "norm"))
    return tensors


def main():
    args = build_support.parse_args(__doc__.splitlines()[0])
    package = build_support.stage_package(HERE, args.out)
    build_support.write_safetensors(package / "weights" / "encoder.safetensors",
                                    weights(np.random.RandomState(SEED)))
    texts = ["Orochi serves Python models from private interpreter copies.",
             "Ein Transformer liest Bytes: ä, ö und ü sind je zwei."]
    build_support.write_json(args.out / "request.json", build_support.json_request(
        [("text", "BYTES", [len(texts), 1], texts)]), compact=True)


if __name__ == "__main__":
    main()
