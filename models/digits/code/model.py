"""Reads an 8x8 handwritten digit (64 grey levels, 0 to 16, row by row, as scikit-learn's
`load_digits` gives them) and says which digit it is."""

import orochi
from orochi.serving import InputError
import orochi.nn as nn

PIXEL_MAX = 16.0


def digits_network() -> nn.Module:
    # The same layers, in the same order, as the network build.py trains: the state_dict keys
    # (net.0.weight, net.2.weight, ...) are those PyTorch would give this Sequential.
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(),
                         nn.Linear(64, 10))


class DigitClassifier:
    def __init__(self, context):
        self.net = digits_network()
        self.net.load_state_dict({name.removeprefix("net."): tensor
                                  for name, tensor in context.weights.items()})
        self.net.eval()

    def predict(self, inputs):
        images = inputs["image"]  # [batch, 64]
        if float(images.amin()) < 0 or float(images.amax()) > PIXEL_MAX:
            raise InputError(
                f"'image' holds grey levels from 0 to {PIXEL_MAX:g}, got values from "
                f"{float(images.amin()):g} to {float(images.amax()):g}")
        with orochi.no_grad():
            probabilities = self.net(images / PIXEL_MAX).softmax(-1)
        return {"digit": probabilities.argmax(-1, keepdim=True),
                "probabilities": probabilities}
