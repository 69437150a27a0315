"""Asks a server's gRPC port whether it and the given models are ready, with a client generated
from server/grpc/inference.proto: exit status 0 when all are, 1 naming what is not.

    /usr/bin/python3.11 docker/grpc_ready.py localhost:8001 digits sentiment
"""

import importlib
import os
import shutil
import subprocess
import sys
import tempfile

import grpc

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def main() -> int:
    address, models = sys.argv[1], sys.argv[2:]
    stubs = tempfile.mkdtemp(prefix="orochi-grpc-ready-")
    try:
        proto_dir = os.path.join(ROOT, "server", "grpc")
        subprocess.run(["protoc", "-I", proto_dir, f"--python_out={stubs}", f"--grpc_out={stubs}",
                        "--plugin=protoc-gen-grpc=" + shutil.which("grpc_python_plugin"),
                        os.path.join(proto_dir, "inference.proto")], check=True)
        sys.path.insert(0, stubs)
        pb = importlib.import_module("inference_pb2")
        pb_grpc = importlib.import_module("inference_pb2_grpc")
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            if not stub.ServerReady(pb.ServerReadyRequest(), timeout=10).ready:
                print(f"{address}: the server is not ready", file=sys.stderr)
                return 1
            for model in models:
                if not stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=10).ready:
                    print(f"{address}: model {model} is not ready", file=sys.stderr)
                    return 1
        return 0
    except grpc.RpcError as error:
        print(f"{address}: {error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(stubs, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
