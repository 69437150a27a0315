"""Reads the PyTorch reference fixtures (fixtures/*.safetensors) for the orochi.nn tests.

See fixtures/generate_fixtures.py for what a fixture holds.
"""

import json
import math
import struct
from pathlib import Path

import orochi
import orochi.nn as nn
import orochi.nn.functional as F

import nn_models

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"
RTOL = 1e-4
ATOL = 1e-5


def fixture_paths():
    return sorted(FIXTURES_DIR.glob("*.safetensors"))


def module_classes():
    """The classes a fixture spec may name: orochi.nn's and the composite test models."""
    classes = {name: getattr(nn, name) for name in nn.__all__ if name != "functional"}
    classes.update(nn_models.define_models(orochi, nn, F))
    return classes


def read_metadata(path):
    """The fixture description, read from the safetensors header with the stdlib alone."""
    with open(path, "rb") as file:
        (header_size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(header_size))
    return json.loads(header["__metadata__"]["orochi_fixture"])


class Fixture:
    def __init__(self, path):
        self.path = Path(path)
        self.name = self.path.stem
        self.description = read_metadata(self.path)
        self._tensors = None

    @property
    def tensors(self):
        if self._tensors is None:
            self._tensors = orochi.load_safetensors(str(self.path))
        return self._tensors

    def _with_prefix(self, prefix):
        return {key[len(prefix):]: value for key, value in self.tensors.items()
                if key.startswith(prefix)}

    def state_dict(self):
        return self._with_prefix("state.")

    def inputs(self):
        return self._with_prefix("input.")

    def build(self):
        return nn_models.build_module(self.description["module"], module_classes())

    def build_loaded(self):
        module = self.build()
        module.load_state_dict(self.state_dict(), strict=True)
        return module

    def call(self, module, **overrides):
        """Runs forward as the generator did; overrides replace keyword arguments (a value of
        None drops one). Always returns a tuple."""
        inputs = self.inputs()

        def resolve(arg):
            if isinstance(arg, dict) and "tensor" in arg:
                return inputs[arg["tensor"]]
            return arg

        call = self.description["call"]
        args = [resolve(arg) for arg in call["args"]]
        kwargs = {key: resolve(arg) for key, arg in call["kwargs"].items()}
        kwargs.update(overrides)
        kwargs = {key: value for key, value in kwargs.items() if value is not None}
        outputs = module(*args, **kwargs)
        return outputs if isinstance(outputs, tuple) else (outputs,)

    def expected_outputs(self):
        """The reference outputs, None where PyTorch returned None."""
        return [self.tensors[f"output.{index}"] if kind == "tensor" else None
                for index, kind in enumerate(self.description["outputs"])]


def compare(actual, expected, rtol=RTOL, atol=ATOL):
    """None when actual matches expected elementwise (|a - e| <= atol + rtol * |e|), else a
    message with the shapes or the worst element."""
    if not orochi.is_tensor(actual):
        return f"expected a tensor, got {type(actual).__name__}"
    if tuple(actual.shape) != tuple(expected.shape):
        return f"shape {list(actual.shape)} != expected {list(expected.shape)}"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype} != expected {expected.dtype}"
    got = actual.reshape(-1).tolist()
    want = expected.reshape(-1).tolist()
    bad = 0
    worst = (-1.0, None)
    for index, (a, e) in enumerate(zip(got, want)):
        if a == e:  # also equal infinities
            continue
        error = abs(a - e)
        if not math.isfinite(error):  # a NaN, or an infinity where a number was expected
            error = math.inf
        if error == math.inf or error > atol + rtol * abs(e):
            bad += 1
        if error > worst[0]:
            worst = (error, index)
    if bad == 0:
        return None
    error, index = worst
    return (f"{bad} of {len(want)} elements differ; max abs error {error:.3g} at flat index "
            f"{index} (got {got[index]!r}, expected {want[index]!r}; rtol={rtol}, atol={atol})")
