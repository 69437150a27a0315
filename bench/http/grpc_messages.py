"""The KServe v2 gRPC messages for the bench/http clients, generated from the server's own proto
(server/grpc/inference.proto) by Debian's protoc into a temporary directory, as
tests/server/test_grpc.py does. The benches call ModelInfer by its method path with bytes in and
bytes out (grpc's serializers left out), so only the messages are generated: requests are
serialized before the clock starts and answers parsed after it stops, as the HTTP bodies are.

Needs protoc (Debian's protobuf-compiler) and python3-protobuf, python3-grpcio.
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.abspath(os.path.join(HERE, "..", "..", "server", "grpc"))
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


def load():
    """Returns the generated inference_pb2 module."""
    stubs = tempfile.mkdtemp(prefix="orochi-bench-grpc-stubs-")
    try:
        subprocess.run(["protoc", "-I", PROTO_DIR, f"--python_out={stubs}",
                        os.path.join(PROTO_DIR, "inference.proto")], check=True)
        sys.path.insert(0, stubs)
        try:
            return importlib.import_module("inference_pb2")
        finally:
            sys.path.remove(stubs)
    finally:
        shutil.rmtree(stubs, ignore_errors=True)
