"""What every example's build script shares: staging a package directory and writing weights.

Build scripts run on Debian's /usr/bin/python3.11 with numpy, never with network access. They
write into an output directory given by the build (`--out`):

    OUT/package/       manifest.json, code/, resources/ copied from the source, weights/ written
    OUT/request.json   the example request (KServe v2 JSON), with expected.json beside the source
"""

import argparse
import json
import shutil
import struct
from pathlib import Path

import numpy as np

_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
                       np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
                       np.dtype(np.float16): "F16", np.dtype(np.uint8): "U8"}


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    return parser.parse_args()


def stage_package(source: Path, out: Path) -> Path:
    """Copies the package sources of `source` into OUT/package and returns that directory."""
    package = out / "package"
    if package.exists():
        shutil.rmtree(package)
    package.mkdir(parents=True)
    shutil.copy2(source / "manifest.json", package / "manifest.json")
    for part in ("code", "resources"):
        if (source / part).is_dir():
            shutil.copytree(source / part, package / part,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (package / "weights").mkdir()
    return package


def write_safetensors(path: Path, tensors: dict) -> None:
    """Writes numpy arrays as a safetensors file, in name order (so the bytes are reproducible)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.asarray(tensors[name])  # (ascontiguousarray would make a scalar 1-d)
        data = array.tobytes()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)))
        file.write(encoded)
        for chunk in chunks:
            file.write(chunk)


def write_json(path: Path, value, compact: bool = False) -> None:
    text = json.dumps(value, separators=(",", ":")) if compact else json.dumps(value, indent=1)
    path.write_text(text + "\n", encoding="utf-8")


def json_request(inputs: list, **extra) -> dict:
    """A KServe v2 request body; `inputs` holds (name, datatype, shape, flat data) tuples."""
    body = {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape), "data": data}
                       for name, datatype, shape, data in inputs]}
    body.update(extra)
    return body


def write_binary_request(out: Path, name: str, datatype: str, array: np.ndarray) -> None:
    """OUT/request.bin: a request with one input sent raw (KServe's binary tensor extension),
    the JSON header then the tensor's bytes; OUT/request.bin.header-length holds the header's
    length, for the request's `Inference-Header-Content-Length`."""
    header = json.dumps({"inputs": [{"name": name, "datatype": datatype,
                                     "shape": list(array.shape),
                                     "parameters": {"binary_data_size": array.nbytes}}]},
                        separators=(",", ":")).encode()
    (out / "request.bin").write_bytes(header + np.ascontiguousarray(array).tobytes())
    (out / "request.bin.header-length").write_text(f"{len(header)}\n")
