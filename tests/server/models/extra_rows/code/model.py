"""A model with a batch dimension that answers more rows than it was given."""

import orochi


class ExtraRows:
    def __init__(self, context):
        pass

    def predict(self, inputs):
        return {"y": orochi.zeros((inputs["x"].shape[0] + 2, 1))}
