"""Runs an example's own model code under PyTorch, with `orochi` standing for `torch`.

The examples use Orochi's PyTorch-compatible names only, so their code runs unchanged on
Debian's python3-torch. Two things use that: `python3.11 torch_runner.py` recomputes the
expected answers of the examples with random weights from PyTorch (an independent
implementation of every op) and checks the others, and bench/models serves the text model's
code with FastAPI as the baseline. Neither runs in CI (where PyTorch is installed only to
train models/textgen).
"""

import argparse
import json
import struct
import sys
import types
from pathlib import Path

import numpy as np
import torch

import expected as expected_answers

_SAFETENSORS_DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
                       "F16": np.float16, "U8": np.uint8}
_DATATYPES = {"FP32": torch.float32, "FP64": torch.float64, "INT64": torch.int64,
              "INT32": torch.int32, "UINT8": torch.uint8, "BOOL": torch.bool}
EXAMPLES = ("digits", "sentiment", "resnet", "encoder")


class InputError(ValueError):
    pass


def alias_orochi_to_torch():
    """`import orochi` (and orochi.nn, orochi.serving) finds torch from now on."""
    serving = types.ModuleType("orochi.serving")
    serving.InputError = InputError
    torch.serving = serving
    sys.modules.update({"orochi": torch, "orochi.nn": torch.nn,
                        "orochi.nn.functional": torch.nn.functional, "orochi.serving": serving})


def read_safetensors(path: Path) -> dict:
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        array = np.frombuffer(data[8 + length + start:8 + length + end],
                              dtype=_SAFETENSORS_DTYPES[entry["dtype"]])
        tensors[name] = torch.from_numpy(array.reshape(entry["shape"]).copy())
    return tensors


class Context:
    def __init__(self, package: Path, manifest: dict):
        self.manifest = manifest
        self.config = dict(manifest.get("parameters", {}))
        self.weights = {}
        for file in sorted((package / "weights").glob("*.safetensors")):
            self.weights.update(read_safetensors(file))
        self.package = package

    def resource(self, path, encoding=None):
        data = (self.package / "resources" / path).read_bytes()
        return data.decode(encoding) if encoding else data


class TorchModel:
    """A staged package directory (build/models/NAME/package) loaded under PyTorch."""

    def __init__(self, package: Path):
        alias_orochi_to_torch()
        self.manifest = json.loads((package / "manifest.json").read_text())
        module_name, class_name = self.manifest["entry"].split(":")
        sys.path.insert(0, str(package / "code"))
        try:
            module = __import__(module_name)
        finally:
            sys.path.pop(0)
        torch.set_grad_enabled(False)
        self.instance = getattr(module, class_name)(Context(package, self.manifest))

    def infer(self, request: dict) -> dict:
        """A KServe v2 JSON request in, {output name: (shape, flat data)} out."""
        specs = {spec["name"]: spec for spec in self.manifest["inputs"]}
        inputs = {}
        for item in request["inputs"]:
            shape = item["shape"]
            if specs[item["name"]]["datatype"] == "BYTES":
                flat = [value.encode() for value in item["data"]]
                inputs[item["name"]] = [flat[i:i + shape[-1]]
                                        for i in range(0, len(flat), shape[-1])]
            else:
                dtype = _DATATYPES[item["datatype"]]
                inputs[item["name"]] = torch.tensor(item["data"], dtype=dtype).reshape(shape)
        outputs = {}
        for name, value in self.instance.predict(inputs).items():
            if isinstance(value, torch.Tensor):
                outputs[name] = (list(value.shape), value.flatten().tolist())
            else:
                flat = [item for row in value for item in row]
                outputs[name] = ([len(value), len(value[0])],
                                 [item.decode() if isinstance(item, bytes) else item
                                  for item in flat])
        return outputs


def format_expected(expected: dict) -> str:
    """expected.json with one line per output."""
    lines = [f' "{key}": {json.dumps(value)},' for key, value in expected.items()
             if key != "outputs"]
    outputs = [f'  "{name}": {json.dumps(value, separators=(", ", ": "))}'
               for name, value in expected["outputs"].items()]
    return "{\n" + "\n".join(lines) + '\n "outputs": {\n' + ",\n".join(outputs) + "\n }\n}\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--built", type=Path, required=True,
                        help="the build's models directory (build/models)")
    parser.add_argument("--write", nargs="*", default=[], choices=EXAMPLES,
                        help="examples whose expected.json to rewrite from PyTorch's answers")
    args = parser.parse_args()
    args.built = args.built.resolve()
    failed = False
    for example in EXAMPLES:
        request = json.loads((args.built / example / "request.json").read_text())
        outputs = TorchModel(args.built / example / "package").infer(request)
        for name in list(sys.modules):  # each example's `model` module is its own
            if getattr(sys.modules[name], "__file__", "") and \
                    str(args.built) in sys.modules[name].__file__:
                del sys.modules[name]
        expected_path = Path(__file__).parent / example / "expected.json"
        if example in args.write:
            expected = json.loads(expected_path.read_text())
            for name, (shape, data) in outputs.items():
                rounded = [round(v, 6) if isinstance(v, float) else v for v in data]
                expected["outputs"][name].update(shape=shape, data=rounded)
            expected_path.write_text(format_expected(expected))
        problems = expected_answers.differences(expected_answers.load(example), outputs)
        print(f"{example}: {'agrees with expected.json' if not problems else problems[:5]}")
        failed |= bool(problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
