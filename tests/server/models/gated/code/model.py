"""A model whose load fails while a file exists: the test makes it fail to load into the copy
that replaces a stuck one, then lets it load again."""

import os


class Gated:
    def __init__(self, context):
        gate = os.environ.get("OROCHI_TEST_GATE_FILE", "")
        if gate and os.path.exists(gate):
            raise RuntimeError(f"refused by the test while {gate} exists")

    def predict(self, inputs):
        return {"y": inputs["x"]}
