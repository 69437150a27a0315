"""Trains the digit classifier on scikit-learn's digits and writes its package directory.

The dataset is the one scikit-learn ships in its Debian package (1797 8x8 images, no network
needed). A quarter of it is held out with scikit-learn's `train_test_split` (stratified, fixed
seed); the network is trained with plain numpy on the rest, and the held-out accuracy is printed
here and measured again through the server by tests/models.

Writes OUT/package/ (weights/digits.safetensors), OUT/heldout.json (the held-out split),
OUT/request.json and OUT/request.bin (the example request, as JSON and with binary data).
"""

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import build_support  # noqa: E402

SKLEARN_PATH = os.environ.get("OROCHI_SKLEARN_PATH",
                              "/opt/orochi/python-sklearn/usr/lib/python3/dist-packages")
SEED = 0
HIDDEN = (128, 64)
EPOCHS = 60
BATCH = 32
LEARNING_RATE = 2e-3


def load_split():
    sys.path.insert(0, SKLEARN_PATH)
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError as error:
        sys.exit(f"build.py: scikit-learn is needed to build the digits model ({error}); "
                 f"scripts/install-deps.sh unpacks it into {SKLEARN_PATH}")
    digits = load_digits()
    return train_test_split(digits.data.astype(np.float32), digits.target.astype(np.int64),
                            test_size=0.25, random_state=SEED, stratify=digits.target)


def init_layers(rng, sizes):
    """Weights as PyTorch's nn.Linear lays them out: weight [out, in], bias [out]."""
    layers = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        bound = 1.0 / np.sqrt(fan_in)
        layers.append([rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
                       rng.uniform(-bound, bound, fan_out).astype(np.float32)])
    return layers


def forward(layers, x):
    activations = [x]
    for index, (weight, bias) in enumerate(layers):
        x = x @ weight.T + bias
        if index < len(layers) - 1:
            x = np.maximum(x, 0)
        activations.append(x)
    return activations


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def train(x, y, rng):
    """Mini-batch Adam on the cross-entropy, all in numpy."""
    layers = init_layers(rng, [x.shape[1], *HIDDEN, 10])
    moments = [[np.zeros_like(p) for p in layer] for layer in layers]
    squares = [[np.zeros_like(p) for p in layer] for layer in layers]
    beta1, beta2, step = 0.9, 0.999, 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(x))
        for start in range(0, len(x), BATCH):
            batch = order[start:start + BATCH]
            activations = forward(layers, x[batch])
            grad = softmax(activations[-1])
            grad[np.arange(len(batch)), y[batch]] -= 1
            grad /= len(batch)
            step += 1
            for index in reversed(range(len(layers))):
                weight, _ = layers[index]
                grads = [grad.T @ activations[index], grad.sum(axis=0)]
                if index > 0:
                    grad = (grad @ weight) * (activations[index] > 0)
                for p, g, m, v in zip(layers[index], grads, moments[index], squares[index]):
                    m *= beta1
                    m += (1 - beta1) * g
                    v *= beta2
                    v += (1 - beta2) * g * g
                    m_hat = m / (1 - beta1 ** step)
                    v_hat = v / (1 - beta2 ** step)
                    p -= (LEARNING_RATE * m_hat / (np.sqrt(v_hat) + 1e-8)).astype(np.float32)
    return layers


def main():
    args = build_support.parse_args(__doc__.splitlines()[0])
    x_train, x_test, y_train, y_test = load_split()
    rng = np.random.RandomState(SEED)
    layers = train(x_train / 16.0, y_train, rng)
    predicted = forward(layers, x_test / 16.0)[-1].argmax(axis=1)
    accuracy = float((predicted == y_test).mean())
    print(f"digits: held-out accuracy {accuracy:.2%} ({int((predicted == y_test).sum())} of "
          f"{len(y_test)} scikit-learn test images), trained on {len(y_train)}")

    package = build_support.stage_package(HERE, args.out)
    # Sequential(Linear, ReLU, Linear, ReLU, Linear): the Linear layers are items 0, 2 and 4.
    tensors = {}
    for position, (weight, bias) in zip((0, 2, 4), layers):
        tensors[f"net.{position}.weight"] = weight
        tensors[f"net.{position}.bias"] = bias
    build_support.write_safetensors(package / "weights" / "digits.safetensors", tensors)

    build_support.write_json(args.out / "heldout.json", {
        "images": x_test.astype(int).tolist(), "digits": y_test.tolist(),
        "accuracy_in_build": accuracy}, compact=True)
    example = x_test[:2]
    build_support.write_json(args.out / "request.json", build_support.json_request(
        [("image", "FP32", example.shape, example.astype(int).ravel().tolist())]), compact=True)
    build_support.write_binary_request(args.out, "image", "FP32", example)


if __name__ == "__main__":
    main()
