#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora, tests/fuzz/corpus/<target>/: a few valid and invalid inputs
each, in the input format its target's header comment describes. The seeds are committed; run
this again after changing a format (the package seeds need `orochi pack`).

    tests/fuzz/make_corpus.py [OROCHI_BINARY]     (default build/bin/orochi)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")

# The requests the integration tests send, so that the seeds are theirs.
sys.path.insert(0, os.path.join(ROOT, "tests", "server"))
from server_fixtures import binary_echo_request, echo_request  # noqa: E402


def write(target: str, name: str, data: bytes) -> None:
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as file:
        file.write(data)


def json_seeds():
    target = "json_pull_parser"
    write(target, "echo_request", json.dumps(echo_request(rows=2)).encode())
    write(target, "nested", b'{"a": [1, -0, 2.5e-3, 1E+2, true, false, null, {"b": [[], {}]}]}')
    write(target, "strings", '["plain", "esc\\"\\\\\\/\\b\\f\\n\\r\\t", '
                             '"\\u00e9\\ud83d\\ude00", "héllo 😀"]'.encode())
    write(target, "numbers",
          b"[9223372036854775807, -9223372036854775808, 18446744073709551615, "
          b"18446744073709551616, 1.7976931348623157e308, 5e-324, 1e-400, -0.0]")
    write(target, "nan_and_infinity", b"[NaN, Infinity, -Infinity, 1]")  # server options only
    write(target, "bom", b"\xef\xbb\xbf {\"k\": \"v\"} \n")
    write(target, "deep", b"[" * 70 + b"]" * 70)  # past the server's depth of 64
    write(target, "invalid_trailing_comma", b'{"a": [1, 2,], }')
    write(target, "invalid_string", b'["lone surrogate \\ud800", "\xc0\xaf", "tab\tin"]')
    write(target, "invalid_unterminated", b'{"inputs": [{"data": [1, 2')
    write(target, "invalid_number", b"[01, 1., .5, -, 1e, 0x10]")


def kserve_seeds():
    target = "kserve_request"

    def seed(name, manifest, body: bytes, json_length=None):
        flags = manifest | (4 if json_length is not None else 0)
        length = json_length or 0
        write(target, name, bytes([flags, length & 0xFF, length >> 8]) + body)

    echo, fixed, images, scalar = range(4)
    seed("echo_json", echo, json.dumps(echo_request(rows=2)).encode())

    # The binary extension, as the integration tests send it.
    header, binary = binary_echo_request()
    seed("echo_binary", echo, header + binary, json_length=len(header))

    # Data before the name and shape (read again from the text), nested data, classification,
    # model parameters and a timeout.
    body = (b'{"id": "f", "parameters": {"timeout": 5000, "greeting": "hi", "n": 2.5},'
            b' "inputs": [{"data": [[1, 2, 3], [4, 5, 6e0]], "datatype": "FP32",'
            b' "name": "x", "shape": [2, 3]}, {"name": "text", "datatype": "BYTES",'
            b' "shape": [2], "data": ["a", "\\u00e9"]}], "outputs": [{"name": "scores",'
            b' "parameters": {"classification": 3}}, {"name": "y",'
            b' "parameters": {"binary_data": true}}]}')
    seed("fixed_classification", fixed, body)
    image = bytes(range(48))
    header = json.dumps({"inputs": [
        {"name": "image", "datatype": "UINT8", "shape": [1, 4, 4, 3],
         "parameters": {"binary_data_size": len(image)}},
        {"name": "mask", "datatype": "BOOL", "shape": [1, 2, 2],
         "data": [[[True, False], [False, True]]]},
        {"name": "ids", "datatype": "INT64", "shape": [1, 3], "data": [1, -2, 3]}],
        "parameters": {"binary_data_output": True}}).encode()
    seed("images_binary", images, header + image, json_length=len(header))
    seed("scalar", scalar,
         b'{"inputs": [{"name": "n", "datatype": "INT32", "shape": [], "data": 7}]}')
    # Refusals: a wrong datatype, data that does not follow the shape, a length past the body.
    seed("invalid_datatype", fixed,
         b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [2, 3], "data": [1]}]}')
    seed("invalid_ragged", fixed,
         b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3],'
         b' "data": [[1, 2, 3], [4, 5]]}, {"name": "text", "datatype": "BYTES", "shape": [2],'
         b' "data": ["a", 7]}]}')
    seed("invalid_length", echo, b'{"inputs": []}', json_length=4000)


def package_seeds(orochi: str):
    target = "package"
    with tempfile.TemporaryDirectory() as temporary:
        # `orochi pack` on the integration tests' echo model, and on the packaging tests'
        # calculator (code in a subpackage, labels, weights), as a whole file each.
        echo = os.path.join(temporary, "echo.orochi")
        subprocess.run([orochi, "pack", os.path.join(ROOT, "tests/server/models/echo"), "-o",
                        echo], check=True, capture_output=True)
        with open(echo, "rb") as file:
            write(target, "echo_package", b"\x00" + file.read())
        calculator = os.path.join(temporary, "calculator")
        shutil.copytree(os.path.join(ROOT, "tests/packaging/models/calculator"), calculator,
                        ignore=shutil.ignore_patterns("__pycache__"))
        os.makedirs(os.path.join(calculator, "weights"))
        with open(os.path.join(calculator, "weights", "model.safetensors"), "wb") as file:
            file.write(safetensors({"linear.weight": ("F32", [2, 4], struct.pack("<8f", *range(8))),
                                    "linear.bias": ("F32", [2], struct.pack("<2f", 0, 0.5))}))
        packed = os.path.join(temporary, "calculator.orochi")
        subprocess.run([orochi, "pack", calculator, "-o", packed], check=True, capture_output=True)
        with open(packed, "rb") as file:
            write(target, "calculator_package", b"\x00" + file.read())
        # Deflated, with a directory entry: what other zip tools write.
        other = os.path.join(temporary, "other.orochi")
        with zipfile.ZipFile(other, "w", zipfile.ZIP_DEFLATED) as archive:
            def member(name, text):  # dated, so that the seed is the same every time
                archive.writestr(zipfile.ZipInfo(name, (2024, 1, 1, 0, 0, 0)), text,
                                 zipfile.ZIP_DEFLATED)
            member("code/", "")
            member("manifest", json.dumps({
                "format_version": 1, "name": "m", "version": 3, "entry": "model:Model",
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [2]}]}))
            member("code/model.py", "class Model:\n    pass\n")
        with open(other, "rb") as file:
            write(target, "deflated_zip", b"\x00" + file.read())

    # Manifests, in a package the fuzzer builds around them.
    manifest = {
        "format_version": 1, "name": "fuzzed", "version": 1, "entry": "model:Model",
        "description": "d", "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]},
                                       {"name": "t", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "labels": "labels.txt"}],
        "max_batch_size": 8, "instances": 2, "device": "cpu", "requires": ["numpy"],
        "parameters": {"greeting": "hello"}}
    write(target, "manifest", b"\x01" + json.dumps(manifest, indent=1).encode())
    write(target, "manifest_invalid",
          b'\x01{"format_version": 1, "name": "../x", "name": 2, "inputs": [{"shape": [0]}]}')
    # Weights, in a package the fuzzer builds around them.
    write(target, "weights", b"\x02" + safetensors({
        "a": ("F16", [2, 2], struct.pack("<4e", 1, 2, 3, 4)),
        "b": ("I64", [3], struct.pack("<3q", -1, 0, 1)),
        "c": ("BOOL", [], b"\x01")}))
    write(target, "weights_invalid", b"\x02" + struct.pack("<Q", 1 << 40) + b"{}")


def safetensors(tensors: dict) -> bytes:
    """A safetensors image: {name: (dtype, shape, raw bytes)}."""
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def http_seeds():
    target = "http_request"

    def seed(name, data: bytes, header_limit=0, uploads=False, pieces=0):
        write(target, name, bytes([header_limit | (4 if uploads else 0), pieces]) + data)

    body = json.dumps(echo_request()).encode()
    seed("get_health", b"GET /v2/health/ready HTTP/1.1\r\nHost: localhost:8000\r\n\r\n")
    seed("post_json_in_pieces",
         b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\n\r\n%s" % (len(body), body), pieces=7)
    seed("pipelined_keep_alive",
         b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"
         b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
         b"GET /metrics HTTP/1.0\r\n\r\n")
    seed("chunked_with_trailers",
         b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
         b"Trailer: X-Checksum\r\n\r\n"
         b"5;ext=1\r\n{\"inp\r\n0A\r\nuts\": []} \r\n0\r\nX-Checksum: abc\r\nX-More: 1\r\n\r\n",
         pieces=3)
    seed("expect_continue",
         b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
         b"Content-Length: 2\r\nAuthorization: Bearer token\r\n\r\n{}")
    seed("upload_chunked",
         b"PUT /v2/repository/models/echo/versions/2 HTTP/1.1\r\nHost: x\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n4\r\nPK\x03\x04\r\n0\r\n\r\n", uploads=True)
    seed("upload_content_length",
         b"PUT /v2/repository/models/echo/versions/2 HTTP/1.1\r\nHost: x\r\n"
         b"Content-Length: 4\r\n\r\nPK\x05\x06", uploads=True, header_limit=1)
    # A trailer past the header limit of 1 KiB, which must end as an error, not an exception.
    seed("long_trailer",
         b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n"
         b"X-Long: " + b"t" * 1200 + b"\r\n\r\n", header_limit=1)
    seed("invalid_transfer_encoding",
         b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc")
    seed("invalid_chunk_size",
         b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n")
    seed("invalid_header",
         b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n"
         b" folded\r\nBad Name: v\r\n\r\n")


def main():
    orochi = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "bin", "orochi")
    shutil.rmtree(CORPUS, ignore_errors=True)
    json_seeds()
    kserve_seeds()
    package_seeds(orochi)
    http_seeds()


if __name__ == "__main__":
    main()
