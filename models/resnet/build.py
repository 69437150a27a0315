"""Writes the ResNet-style example's package directory with seeded random weights.

The weights follow the model's state_dict (torchvision resnet18's names, half the channels):
He-initialised convolutions, batch-norm statistics near identity, and a classifier scaled so
the top classes stand apart. The example image is drawn here too (a lit disc on a gradient).

Writes OUT/package/ (weights/resnet.safetensors), OUT/request.json and OUT/request.bin (the
example image, as JSON and with the binary tensor extension).
"""

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import build_support  # noqa: E402

SEED = 18
WIDTHS = (32, 64, 128, 256)
CLASSES = 1000
SIZE = 224


def conv(rng, outputs, inputs, kernel):
    std = np.sqrt(2.0 / (inputs * kernel * kernel))
    return (rng.randn(outputs, inputs, kernel, kernel) * std).astype(np.float32)


def batch_norm(rng, prefix, channels, scale=1.0):
    return {f"{prefix}.weight": np.full(channels, scale, np.float32),
            f"{prefix}.bias": (rng.randn(channels) * 0.05).astype(np.float32),
            f"{prefix}.running_mean": (rng.randn(channels) * 0.05).astype(np.float32),
            f"{prefix}.running_var": rng.uniform(0.8, 1.2, channels).astype(np.float32),
            f"{prefix}.num_batches_tracked": np.array(0, np.int64)}


def weights(rng):
    tensors = {"conv1.weight": conv(rng, WIDTHS[0], 3, 7), **batch_norm(rng, "bn1", WIDTHS[0])}
    previous = WIDTHS[0]
    for stage, width in enumerate(WIDTHS, start=1):
        for block in range(2):
            prefix = f"layer{stage}.{block}"
            inputs = previous if block == 0 else width
            tensors[f"{prefix}.conv1.weight"] = conv(rng, width, inputs, 3)
            tensors.update(batch_norm(rng, f"{prefix}.bn1", width))
            tensors[f"{prefix}.conv2.weight"] = conv(rng, width, width, 3)
            # A small last scale in each block keeps the residual sum from growing stage by stage.
            tensors.update(batch_norm(rng, f"{prefix}.bn2", width, scale=0.3))
            if block == 0 and stage > 1:
                tensors[f"{prefix}.downsample.0.weight"] = conv(rng, width, inputs, 1)
                tensors.update(batch_norm(rng, f"{prefix}.downsample.1", width))
        previous = width
    tensors["fc.weight"] = (rng.randn(CLASSES, WIDTHS[-1]) * 0.3).astype(np.float32)
    tensors["fc.bias"] = np.zeros(CLASSES, np.float32)
    return tensors


def example_image():
    """A warm disc lit from the upper left on a blue-green gradient: [1, 224, 224, 3] bytes."""
    y, x = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) / (SIZE - 1)
    image = np.stack([40 + 60 * x, 90 + 80 * y, 160 + 60 * (1 - x)], axis=-1)
    distance = np.hypot(x - 0.55, y - 0.5)
    disc = distance < 0.28
    light = np.clip(1.2 - np.hypot(x - 0.45, y - 0.4) * 2.5, 0.2, 1.0)[..., None]
    image[disc] = (np.array([235.0, 150.0, 60.0]) * light)[disc]
    return np.clip(image, 0, 255).astype(np.uint8)[None]


def main():
    args = build_support.parse_args(__doc__.splitlines()[0])
    package = build_support.stage_package(HERE, args.out)
    build_support.write_safetensors(package / "weights" / "resnet.safetensors",
                                    weights(np.random.RandomState(SEED)))
    image = example_image()
    build_support.write_json(args.out / "request.json", build_support.json_request(
        [("image", "UINT8", image.shape, image.ravel().tolist())]), compact=True)
    build_support.write_binary_request(args.out, "image", "UINT8", image)


if __name__ == "__main__":
    main()
