"""Doubles its input, and answers with the id of the interpreter copy that ran it."""

import orochi


class Double:
    def __init__(self, context):
        self.copy = orochi.copy_id()

    def predict(self, inputs):
        return {"y": inputs["x"] * 2, "copy": orochi.tensor([self.copy])}
