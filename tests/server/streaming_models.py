"""The streaming test models, written out as packages by the streaming tests.

`tokens`: predict() is a generator yielding `max_tokens` tokens "t0 ", "t1 ", ... `delay_s`
apart (`busy`: spinning in Python meanwhile instead of sleeping); the `mode` parameter makes it hostile ("raise" after two tokens, "malformed" output,
"spin" forever without yielding, "forever" yielding without end). With `marker`, a path, it
writes the exception's name there when one ends it inside its copy (GeneratorExit when it is
closed at a yield, TimeoutError when interrupted), "done" when it ends by itself.

`stepper`: the step interface. start() takes `max_tokens`; step() records how many states it
got and streams "s{i} " with that count as `batch`; finish() appends the sequence's end to
`marker` when given. "raise" makes step() raise once a sequence reached its third token.
"""

import json
import os

MANIFEST_IO = {
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1]}],
}

TOKENS_MANIFEST = {
    "format_version": 1, "name": "tokens", "version": 1, "entry": "model:Tokens",
    "streaming": True, **MANIFEST_IO,
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]}],
}

TOKENS_CODE = '''
import os
import time


class Tokens:
    def __init__(self, context):
        pass

    def predict(self, inputs, parameters):
        count = int(parameters.get("max_tokens", 5))
        delay = float(parameters.get("delay_s", 0.0))
        mode = parameters.get("mode", "")
        marker = parameters.get("marker")
        try:
            if mode == "spin":
                while True:
                    pass
            index = 0
            while mode == "forever" or index < count:
                if mode == "raise" and index == 2:
                    raise RuntimeError("the model failed at token 2")
                if mode == "malformed" and index == 1:
                    yield {"not_declared": 1}
                yield {"text_output": [f"t{index} "]}
                index += 1
                if delay and parameters.get("busy"):  # Python at work, not asleep in C
                    until = time.monotonic() + delay
                    while time.monotonic() < until:
                        pass
                elif delay:
                    time.sleep(delay)
            if marker:
                open(marker + ".tmp", "w").write("done")
                os.rename(marker + ".tmp", marker)
        except BaseException as error:  # GeneratorExit (closed), TimeoutError (interrupted)
            if marker:
                open(marker + ".tmp", "w").write(type(error).__name__)
                os.rename(marker + ".tmp", marker)
            raise
'''

STEPPER_MANIFEST = {
    "format_version": 1, "name": "stepper", "version": 1, "entry": "model:Stepper",
    "streaming": True, "max_live_sequences": 8, **MANIFEST_IO,
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [1]},
                {"name": "batch", "datatype": "INT64", "shape": [1]}],
}

STEPPER_CODE = '''
import time


class Stepper:
    def __init__(self, context):
        pass

    def start(self, inputs, parameters):
        return {"left": int(parameters.get("max_tokens", 5)), "index": 0,
                "delay": float(parameters.get("delay_s", 0.0)),
                "mode": parameters.get("mode", ""), "marker": parameters.get("marker")}

    def step(self, states):
        if states and states[0]["delay"]:
            time.sleep(states[0]["delay"])
        results = []
        for state in states:
            if state["mode"] == "raise" and state["index"] == 2:
                raise ValueError("step failed at the third token")
            text = f"s{state['index']} "
            state["index"] += 1
            state["left"] -= 1
            results.append(({"text_output": [text], "batch": [len(states)]},
                            state["left"] <= 0))
        return results

    def finish(self, state):
        if state["marker"]:
            with open(state["marker"], "a") as marker:
                marker.write(f"finished {state['index']}\\n")
'''


def write_packages(root: str) -> dict:
    """Writes the two packages' directories under `root`; returns {name: directory}."""
    packages = {}
    for name, manifest, code in (("tokens", TOKENS_MANIFEST, TOKENS_CODE),
                                 ("stepper", STEPPER_MANIFEST, STEPPER_CODE)):
        directory = os.path.join(root, "sources", name)
        os.makedirs(os.path.join(directory, "code"))
        with open(os.path.join(directory, "manifest.json"), "w") as file:
            json.dump(manifest, file)
        with open(os.path.join(directory, "code", "model.py"), "w") as file:
            file.write(code)
        packages[name] = directory
    return packages
