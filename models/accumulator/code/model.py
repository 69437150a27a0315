"""A running sum per sequence: the smallest stateful model.

Its manifest declares "sequence", so every request names its sequence (Triton's sequence_id,
with sequence_start on the first request and sequence_end on the last), and predict() receives
that sequence's state: a dict, empty at sequence_start, that stays in the interpreter copy
holding the sequence and that predict() updates in place.
"""


class Accumulator:
    def __init__(self, context):
        pass

    def predict(self, inputs, state):
        state["total"] = state.get("total", 0.0) + float(inputs["value"][0])
        state["count"] = state.get("count", 0) + 1
        return {"total": [state["total"]], "count": [state["count"]]}
