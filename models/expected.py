"""Each example's expected answer (NAME/expected.json) and how an answer is checked against it.

expected.json: {"outputs": {NAME: {"shape": [...], "data": [...], "tolerance": T}}}. Without a
tolerance the data must be equal; a null in "data" is not checked.
"""

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(example: str) -> dict:
    return json.loads((HERE / example / "expected.json").read_text(encoding="utf-8"))


def response_outputs(response: dict) -> dict:
    """A KServe v2 JSON response's outputs as {name: (shape, flat data)}."""
    return {output["name"]: (output["shape"], output["data"]) for output in response["outputs"]}


def differences(expected: dict, outputs: dict) -> list:
    """How `outputs` ({name: (shape, flat data)}) differ from `expected`, as messages."""
    problems = []
    for name, want in expected["outputs"].items():
        if name not in outputs:
            problems.append(f"{name}: missing")
            continue
        shape, data = outputs[name]
        if shape != want["shape"] or len(data) != len(want["data"]):
            problems.append(f"{name}: shape {shape}, expected {want['shape']}")
            continue
        tolerance = want.get("tolerance")
        for index, (got, value) in enumerate(zip(data, want["data"])):
            if value is None:
                continue
            if got != value if tolerance is None else abs(got - value) > tolerance:
                problems.append(f"{name}[{index}]: {got}, expected {value}"
                                + (f" within {tolerance}" if tolerance is not None else ""))
    return problems
