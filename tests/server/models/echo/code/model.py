"""Echoes every input back, for the server's datatype, binary and batching tests."""

import math

import orochi


class Echo:
    def __init__(self, context):
        self.names = [spec["name"] for spec in context.manifest["inputs"]]

    def predict(self, inputs, parameters):
        outputs = {name.replace("in_", "out_", 1): value for name, value in inputs.items()}
        # The request's parameter "add" shifts out_int64, to show whose parameters a row ran with.
        if "add" in parameters:
            outputs["out_int64"] = inputs["in_int64"] + parameters["add"]
        rows = inputs["in_int64"].shape[0]
        # The sign of the parameter "zero" as out_fp64, to show whose zero a row ran with (0.0
        # and -0.0 are equal numbers, but not the same value to copysign).
        if "zero" in parameters:
            outputs["out_fp64"] = [[math.copysign(1.0, parameters["zero"])]] * rows
        outputs["batch"] = orochi.full((rows, 1), rows)  # how many rows ran together
        return outputs
