"""A small model for the package tests: every part of the entry contract in a few lines."""

import orochi
import orochi.nn as nn

from utils import normalise, WHICH


class Calculator:
    def __init__(self, context):
        self.linear = nn.Linear(4, 2)
        self.linear.load_state_dict(
            {"weight": context.weights["linear.weight"], "bias": context.weights["linear.bias"]})
        self.labels = context.resource("labels.txt", encoding="utf-8").split()
        self.greeting = context.config["greeting"]
        assert WHICH == "calculator"
        self.warmed_up = False

    def warmup(self):
        self.warmed_up = True

    def predict(self, inputs):
        if not self.warmed_up:
            raise RuntimeError("warmup() was not called")
        x = inputs["x"]
        if float(x.sum()) < -1000:
            raise ValueError("a deliberately failing input")
        scores = self.linear(x)
        best = scores.argmax(dim=-1).tolist()
        return {
            "scores": scores,
            "label": [[self.labels[i]] for i in best],
            "words": [[normalise(text.decode()) for text in row] for row in inputs["text"]],
            "copy": [[orochi.copy_id()] for _ in best],
        }
