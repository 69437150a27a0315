"""KServe v2 over gRPC against the real `orochi serve`, with a client generated from the
server's own proto by Debian's protoc and grpcio: every RPC, raw and typed contents for every
datatype, classification and output selection, errors and their status codes, deadlines,
cancellation, streams (100 at once, flow control), the repository calls and their access rules,
tokens, and hostile messages after which the server still serves.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_grpc
"""

import atexit
import concurrent.futures
import importlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

from server_fixtures import (Server, SharedServerTest, curl, pack_model, pack_repository, post_json,
                             read_until_closed)

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.path.join(HERE, "..", "..", "server", "grpc")
STUBS = tempfile.mkdtemp(prefix="orochi-grpc-stubs-")
atexit.register(shutil.rmtree, STUBS, True)
subprocess.run(["protoc", "-I", PROTO_DIR, f"--python_out={STUBS}", f"--grpc_out={STUBS}",
                "--plugin=protoc-gen-grpc=" + os.environ.get("OROCHI_GRPC_PYTHON_PLUGIN",
                                                             shutil.which("grpc_python_plugin")),
                os.path.join(PROTO_DIR, "inference.proto")], check=True)
sys.path.insert(0, STUBS)
pb = importlib.import_module("inference_pb2")
pb_grpc = importlib.import_module("inference_pb2_grpc")

# The echo model's datatypes: (name, little-endian struct format of one value, two values).
ECHO = [("BOOL", "?", [True, False]), ("UINT8", "B", [255, 0]), ("INT8", "b", [-128, 127]),
        ("INT16", "h", [-32768, 5]), ("INT32", "i", [2**31 - 1, -7]),
        ("INT64", "q", [2**62 + 1, -3]), ("FP16", "e", [1.5, -2.0]),
        ("FP32", "f", [0.25, 3.5]), ("FP64", "d", [0.1, -1e300])]
BF16 = [0x4000, 0xBF00]  # 2.0 and -0.5 as bfloat16 bits


def bytes_raw(items):
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def echo_raw_request(rows=2, request_id="grpc-1"):
    """An echo request with every input's values in raw_input_contents."""
    request = pb.ModelInferRequest(model_name="echo", id=request_id)
    for datatype, fmt, values in ECHO:
        column = [values[r % 2] for r in range(rows)]
        request.inputs.add(name=f"in_{datatype.lower()}", datatype=datatype, shape=[rows, 1])
        request.raw_input_contents.append(struct.pack(f"<{rows}{fmt}", *column))
    request.inputs.add(name="in_bf16", datatype="BF16", shape=[rows, 1])
    request.raw_input_contents.append(struct.pack(f"<{rows}H", *[BF16[r % 2] for r in range(rows)]))
    request.inputs.add(name="in_bytes", datatype="BYTES", shape=[rows, 1])
    request.raw_input_contents.append(bytes_raw([[b"h\xc3\xa9llo", b""][r % 2]
                                                 for r in range(rows)]))
    return request


def slow_request(mode, seconds=0.0, timeout_us=None):
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="mode", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(bytes_raw([mode.encode()]))
    request.inputs.add(name="seconds", datatype="FP64", shape=[1])
    request.raw_input_contents.append(struct.pack("<d", seconds))
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    return request


def outputs_by_name(response):
    return {output.name: (output, raw) for output, raw
            in zip(response.outputs, response.raw_output_contents)}


class GrpcClient:
    """Mixed into a test class before the class whose setUpClass starts `cls.server`: a channel
    to the server's gRPC port (cls.channel) and the inference service's stub on it (cls.stub)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        super().tearDownClass()


class GrpcServerTest(GrpcClient, SharedServerTest):
    """One server with the echo, slow and extra_rows models, and a channel to its gRPC port."""

    CONFIG: dict = {"grpc": {"max_message_bytes": 1 << 20, "max_stream_in_flight": 4},
                    "http": {"allow_shared_memory": True}}

    def assertCode(self, call, code, message_part=None):
        with self.assertRaises(grpc.RpcError) as caught:
            call()
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        if message_part is not None:
            self.assertIn(message_part, caught.exception.details())
        return caught.exception.details()

    def metrics(self):
        return curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")[2].decode()


class HealthAndMetadataTest(GrpcServerTest):
    def test_health(self):
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.assertTrue(self.stub.ServerReady(pb.ServerReadyRequest()).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="echo")).ready)
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="echo", version="1")).ready)
        # Not loaded is an answer, as Triton gives it; a malformed version is an error.
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="nope")).ready)
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="echo", version="9")).ready)
        self.assertCode(lambda: self.stub.ModelReady(pb.ModelReadyRequest(name="echo",
                                                                          version="x1")),
                        grpc.StatusCode.INVALID_ARGUMENT, "positive integer")

    def test_server_metadata_lists_what_is_served_over_grpc(self):
        metadata = self.stub.ServerMetadata(pb.ServerMetadataRequest())
        self.assertEqual(metadata.name, "orochi")
        self.assertRegex(metadata.version, r"^\d+\.\d+")
        self.assertIn("classification", metadata.extensions)
        self.assertIn("model_repository", metadata.extensions)
        self.assertNotIn("binary_tensor_data", metadata.extensions)  # HTTP's

    def test_model_metadata_matches_http(self):
        metadata = self.stub.ModelMetadata(pb.ModelMetadataRequest(name="echo"))
        _, _, body = curl(self.server.url("/v2/models/echo"))
        http_metadata = json.loads(body)
        self.assertEqual(metadata.name, "echo")
        self.assertEqual(list(metadata.versions), http_metadata["versions"])
        self.assertEqual(metadata.platform, http_metadata["platform"])
        for tensors, http_tensors in ((metadata.inputs, http_metadata["inputs"]),
                                      (metadata.outputs, http_metadata["outputs"])):
            self.assertEqual([(t.name, t.datatype, list(t.shape)) for t in tensors],
                             [(t["name"], t["datatype"], t["shape"]) for t in http_tensors])
        self.assertEqual(list(metadata.inputs[0].shape), [-1, -1])  # batch dim first
        self.assertCode(lambda: self.stub.ModelMetadata(pb.ModelMetadataRequest(name="nope")),
                        grpc.StatusCode.NOT_FOUND, "'nope'")

    def test_model_config(self):
        config = self.stub.ModelConfig(pb.ModelConfigRequest(name="echo")).config
        self.assertEqual(config.name, "echo")
        self.assertEqual(config.max_batch_size, 64)
        self.assertEqual(config.backend, "orochi")
        types = {tensor.name: pb.DataType.Name(tensor.data_type) for tensor in config.input}
        self.assertEqual(types["in_fp32"], "TYPE_FP32")
        self.assertEqual(types["in_bytes"], "TYPE_STRING")
        self.assertEqual(types["in_bf16"], "TYPE_BF16")
        self.assertEqual(list(config.input[0].dims), [-1])
        self.assertEqual(config.instance_group[0].count, self.COPIES)
        self.assertEqual(config.instance_group[0].kind, pb.ModelInstanceGroup.KIND_CPU)
        self.assertTrue(config.HasField("dynamic_batching"))
        slow = self.stub.ModelConfig(pb.ModelConfigRequest(name="slow", version="1")).config
        self.assertEqual(slow.max_batch_size, 0)
        self.assertFalse(slow.HasField("dynamic_batching"))

    def test_statistics_count_grpc_inferences(self):
        before = self.stub.ModelStatistics(pb.ModelStatisticsRequest(name="extra_rows"))
        self.assertEqual(len(before.model_stats), 1)
        request = pb.ModelInferRequest(model_name="extra_rows")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(1)
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INTERNAL)
        after = self.stub.ModelStatistics(pb.ModelStatisticsRequest(name="extra_rows"))
        stats = after.model_stats[0].inference_stats
        self.assertEqual(stats.fail.count, before.model_stats[0].inference_stats.fail.count + 1)
        # compute_input, compute_infer and compute_output: one of each per batch (the failed
        # one too: its rows were checked as its outputs were split), in all and by batch size.
        self.stub.ModelInfer(echo_raw_request(rows=2))
        every = self.stub.ModelStatistics(pb.ModelStatisticsRequest())
        self.assertEqual(sorted(s.name for s in every.model_stats),
                         ["echo", "extra_rows", "slow"])
        for model in every.model_stats:
            if model.name == "slow":
                continue
            self.assertGreater(model.execution_count, 0, model.name)
            for field in ("compute_input", "compute_infer", "compute_output"):
                duration = getattr(model.inference_stats, field)
                self.assertEqual(duration.count, model.execution_count, (model.name, field))
                self.assertGreater(duration.ns, 0, (model.name, field))
                by_size = [getattr(batch, field) for batch in model.batch_stats]
                self.assertEqual(sum(d.count for d in by_size), model.execution_count,
                                 (model.name, field))
                self.assertTrue(all(d.ns > 0 for d in by_size), (model.name, field))
        self.assertCode(lambda: self.stub.ModelStatistics(pb.ModelStatisticsRequest(name="nope")),
                        grpc.StatusCode.NOT_FOUND)


class InferTest(GrpcServerTest):
    def test_raw_contents_of_every_datatype_come_back_unchanged(self):
        request = echo_raw_request(rows=3)
        response = self.stub.ModelInfer(request)
        self.assertEqual(response.model_name, "echo")
        self.assertEqual(response.model_version, "1")
        self.assertEqual(response.id, "grpc-1")
        outputs = outputs_by_name(response)
        for tensor, raw in zip(request.inputs, request.raw_input_contents):
            output, output_raw = outputs["out_" + tensor.name[3:]]
            self.assertEqual(output.datatype, tensor.datatype)
            self.assertEqual(list(output.shape), [3, 1])
            self.assertEqual(output_raw, raw, tensor.name)
        batch, raw = outputs["batch"]
        self.assertEqual(struct.unpack("<3q", raw), (3, 3, 3))

    def test_typed_contents(self):
        request = pb.ModelInferRequest(model_name="echo")
        contents = {"BOOL": ("bool_contents", [True, False]), "UINT8": ("uint_contents", [255, 0]),
                    "INT8": ("int_contents", [-128, 127]), "INT16": ("int_contents", [-32768, 5]),
                    "INT32": ("int_contents", [2**31 - 1, -7]),
                    "INT64": ("int64_contents", [2**62 + 1, -3]),
                    "FP32": ("fp32_contents", [0.25, 3.5]), "FP64": ("fp64_contents", [0.1, -1e300]),
                    "BYTES": ("bytes_contents", [b"a", b"bc"])}
        for datatype, (field, values) in contents.items():
            tensor = request.inputs.add(name=f"in_{datatype.lower()}", datatype=datatype,
                                        shape=[2, 1])
            getattr(tensor.contents, field).extend(values)
        # FP16 and BF16 have no typed field: a request that needs them sends raw contents.
        request.inputs.add(name="in_fp16", datatype="FP16", shape=[2, 1])
        details = self.assertCode(lambda: self.stub.ModelInfer(request),
                                  grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents")
        self.assertIn("in_fp16", details)
        # Values in the wrong field, or out of the datatype's range, are named.
        wrong = pb.ModelInferRequest(model_name="extra_rows")
        wrong.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.int_contents.append(1)
        self.assertCode(lambda: self.stub.ModelInfer(wrong), grpc.StatusCode.INVALID_ARGUMENT,
                        "contents.int_contents (expected contents.fp32_contents)")
        short = pb.ModelInferRequest(model_name="extra_rows")
        short.inputs.add(name="x", datatype="FP32", shape=[2, 1]).contents.fp32_contents.append(1)
        self.assertCode(lambda: self.stub.ModelInfer(short), grpc.StatusCode.INVALID_ARGUMENT,
                        "has 1 values, but shape [2, 1] needs 2")

    def test_int8_out_of_range_is_refused_as_http_refuses_it(self):
        request = echo_raw_request()
        del request.raw_input_contents[:]
        for tensor in request.inputs:
            tensor.ClearField("contents")
        request.inputs[2].contents.int_contents.extend([300, 1])
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT)

    def test_output_selection_and_classification(self):
        request = echo_raw_request(rows=2)
        request.outputs.add(name="out_int32")
        classified = request.outputs.add(name="out_fp32")
        classified.parameters["classification"].int64_param = 1
        response = self.stub.ModelInfer(request)
        self.assertEqual([output.name for output in response.outputs], ["out_int32", "out_fp32"])
        outputs = outputs_by_name(response)
        self.assertEqual(outputs["out_fp32"][0].datatype, "BYTES")
        # Each row's one class: "score:index".
        raw = outputs["out_fp32"][1]
        first_length = struct.unpack("<I", raw[:4])[0]
        self.assertEqual(raw[4:4 + first_length], b"0.25:0")
        bad = echo_raw_request()
        bad.outputs.add(name="out_bytes").parameters["classification"].int64_param = 1
        self.assertCode(lambda: self.stub.ModelInfer(bad), grpc.StatusCode.INVALID_ARGUMENT,
                        "classification needs an output of scores")
        unknown = echo_raw_request()
        unknown.outputs.add(name="nope")
        self.assertCode(lambda: self.stub.ModelInfer(unknown), grpc.StatusCode.INVALID_ARGUMENT,
                        "unexpected requested output 'nope'")

    def test_model_parameters_reach_predict_and_unsupported_ones_are_refused(self):
        request = echo_raw_request()
        request.parameters["priority"].int64_param = 1
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        '"priority" is not supported')
        request = echo_raw_request()
        request.parameters["sequence_id"].int64_param = 7
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "model echo is not stateful")
        request = echo_raw_request()
        request.inputs[0].parameters["shared_memory_region"].string_param = "r"
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "shared_memory_region needs shared_memory_byte_size")
        request = echo_raw_request()
        request.inputs[0].parameters["binary_data_size"].int64_param = 2
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.UNIMPLEMENTED,
                        "parameter 'binary_data_size' belongs to HTTP's binary extension")
        request = echo_raw_request()
        request.parameters["binary_data_output"].bool_param = True
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.UNIMPLEMENTED,
                        "parameter 'binary_data_output' belongs to HTTP's binary extension")
        request = echo_raw_request()
        request.parameters["empty"].CopyFrom(pb.InferParameter())
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "parameter 'empty' has no value")
        request = echo_raw_request()
        request.parameters["user_flag"].bool_param = True  # a model's own: passed along
        self.stub.ModelInfer(request)

    def test_errors_and_their_codes(self):
        self.assertCode(lambda: self.stub.ModelInfer(pb.ModelInferRequest(model_name="nope")),
                        grpc.StatusCode.NOT_FOUND, "model 'nope' is not loaded")
        request = echo_raw_request()
        request.model_version = "5"
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.NOT_FOUND,
                        "version 5")
        request = echo_raw_request()
        request.inputs[4].datatype = "FP32"
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "input 'in_int32' has datatype FP32, but the model expects INT32")
        request = echo_raw_request()
        del request.inputs[-1]
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "raw_input_contents has 11 entries, but the request has 10 inputs")
        # A lying size: the shape says 2 INT32 values, the raw bytes hold 3.
        request = echo_raw_request()
        request.raw_input_contents[4] = struct.pack("<3i", 1, 2, 3)
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "raw_input_contents is 12 bytes, but shape [2, 1] of INT32 needs 8")
        request = echo_raw_request()
        request.raw_input_contents[-1] = struct.pack("<I", 100) + b"short"
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "runs past its data")
        request = echo_raw_request()
        request.inputs[0].shape[:] = [-1, 1]
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "non-negative")
        request = echo_raw_request()
        request.inputs[0].shape[:] = [100, 1]
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "batch of 100; the model takes 1 to 64")
        # A model error: INTERNAL with the model's traceback, as Triton answers it.
        request = pb.ModelInferRequest(model_name="extra_rows")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 1]).contents.fp32_contents.append(1)
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.INTERNAL)

    def test_unknown_fields_are_refused_not_dropped(self):
        raw = echo_raw_request().SerializeToString()
        # Field 99, varint 1: a field this schema does not have.
        hostile = pb.ModelInferRequest.FromString(raw + b"\x98\x06\x01")
        self.assertCode(lambda: self.stub.ModelInfer(hostile), grpc.StatusCode.INVALID_ARGUMENT,
                        "field 99")
        nested = echo_raw_request()
        nested.inputs[3].MergeFromString(b"\xa0\x01\x05")  # field 20 inside an input
        self.assertCode(lambda: self.stub.ModelInfer(nested), grpc.StatusCode.INVALID_ARGUMENT,
                        "inputs[3].20")
        in_parameter = echo_raw_request()
        in_parameter.parameters["user_flag"].MergeFromString(b"\xb0\x02\x01")  # field 38
        self.assertCode(lambda: self.stub.ModelInfer(in_parameter),
                        grpc.StatusCode.INVALID_ARGUMENT, "parameters[user_flag].38")

    def test_oversized_messages_are_refused_and_the_server_stays_up(self):
        request = pb.ModelInferRequest(model_name="extra_rows")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
        request.raw_input_contents.append(b"\0" * (2 << 20))  # over max_message_bytes (1 MiB)
        self.assertCode(lambda: self.stub.ModelInfer(request), grpc.StatusCode.RESOURCE_EXHAUSTED)
        # Garbage bytes where a message should be: the library refuses them.
        garbage = self.channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                           request_serializer=lambda raw: raw,
                                           response_deserializer=lambda raw: raw)
        with self.assertRaises(grpc.RpcError):
            garbage(b"\xff\xff\xff\xff\xff\xff")
        unknown_method = self.channel.unary_unary("/inference.GRPCInferenceService/Nope",
                                                  request_serializer=lambda raw: raw,
                                                  response_deserializer=lambda raw: raw)
        self.assertCode(lambda: unknown_method(b""), grpc.StatusCode.UNIMPLEMENTED)
        self.assertTrue(self.stub.ServerLive(pb.ServerLiveRequest()).live)
        self.stub.ModelInfer(echo_raw_request())

    def test_metrics_count_grpc_calls_and_inferences(self):
        self.stub.ModelInfer(echo_raw_request())
        self.assertCode(lambda: self.stub.ModelInfer(pb.ModelInferRequest(model_name="nope")),
                        grpc.StatusCode.NOT_FOUND)
        text = self.metrics()
        self.assertRegex(text, r'orochi_grpc_requests_total\{code="OK",method="ModelInfer"\} \d+')
        self.assertRegex(text, r'orochi_grpc_requests_total\{code="NOT_FOUND",'
                               r'method="ModelInfer"\} \d+')
        self.assertRegex(text, r'orochi_inference_requests_total\{model="echo",reason="success",'
                               r'version="1"\} \d+')


class SharedMemoryAndSettingsTest(GrpcServerTest):
    def test_system_shared_memory_over_grpc(self):
        from multiprocessing import shared_memory
        region = shared_memory.SharedMemory(create=True, size=64)
        try:
            key = "/" + region.name.lstrip("/")
            self.stub.SystemSharedMemoryRegister(pb.SystemSharedMemoryRegisterRequest(
                name="grpc-region", key=key, offset=0, byte_size=64))
            self.assertCode(lambda: self.stub.SystemSharedMemoryRegister(
                pb.SystemSharedMemoryRegisterRequest(name="grpc-region", key=key, byte_size=64)),
                grpc.StatusCode.ALREADY_EXISTS)
            status = self.stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest())
            self.assertEqual(status.regions["grpc-region"].byte_size, 64)
            self.assertEqual(status.regions["grpc-region"].key, key)
            # Registered over gRPC, visible over HTTP: one registry.
            _, _, body = curl(self.server.url("/v2/systemsharedmemory/status"))
            self.assertIn(b"grpc-region", body)
            # INT32 input at offset 0 (2 values), INT32 output at offset 16 (2 values).
            region.buf[0:8] = struct.pack("<2i", 41, -5)
            request = echo_raw_request(rows=2)
            index = [t.name for t in request.inputs].index("in_int32")
            del request.raw_input_contents[index]
            tensor = request.inputs[index]
            tensor.parameters["shared_memory_region"].string_param = "grpc-region"
            tensor.parameters["shared_memory_byte_size"].int64_param = 8
            output = request.outputs.add(name="out_int32")
            output.parameters["shared_memory_region"].string_param = "grpc-region"
            output.parameters["shared_memory_offset"].uint64_param = 16
            output.parameters["shared_memory_byte_size"].uint64_param = 8
            request.outputs.add(name="out_int8")
            response = self.stub.ModelInfer(request)
            self.assertEqual(struct.unpack("<2i", bytes(region.buf[16:24])), (41, -5))
            outputs = outputs_by_name(response)  # in the manifest's order
            written, raw = outputs["out_int32"]
            self.assertEqual(written.parameters["shared_memory_byte_size"].uint64_param, 8)
            self.assertEqual(raw, b"")  # an empty entry keeps the others' positions
            self.assertEqual(outputs["out_int8"][1], struct.pack("<2b", -128, 127))
            # A region too small for the output: refused before anything is written elsewhere.
            output.parameters["shared_memory_byte_size"].uint64_param = 4
            self.assertCode(lambda: self.stub.ModelInfer(request),
                            grpc.StatusCode.INVALID_ARGUMENT, "shared_memory_byte_size")
            self.assertCode(lambda: self.stub.SystemSharedMemoryStatus(
                pb.SystemSharedMemoryStatusRequest(name="nope")), grpc.StatusCode.NOT_FOUND)
            self.stub.SystemSharedMemoryUnregister(
                pb.SystemSharedMemoryUnregisterRequest(name="grpc-region"))
            self.assertEqual(len(self.stub.SystemSharedMemoryStatus(
                pb.SystemSharedMemoryStatusRequest()).regions), 0)
            # As over HTTP (400): the request names a region that is not there.
            self.assertCode(lambda: self.stub.ModelInfer(request),
                            grpc.StatusCode.INVALID_ARGUMENT,
                            "unable to find shared memory region: 'grpc-region'")
        finally:
            region.close()
            region.unlink()

    def test_cuda_shared_memory_without_a_cuda_device_is_refused_clearly(self):
        # test_cuda_shared_memory has the extension on a (real or emulated) GPU.
        if "cuda_shared_memory" in self.stub.ServerMetadata(pb.ServerMetadataRequest()).extensions:
            self.skipTest("the server has a CUDA device: test_cuda_shared_memory covers it")
        self.assertEqual(len(self.stub.CudaSharedMemoryStatus(
            pb.CudaSharedMemoryStatusRequest()).regions), 0)
        self.assertCode(lambda: self.stub.CudaSharedMemoryRegister(
            pb.CudaSharedMemoryRegisterRequest(name="x", raw_handle=bytes(64), byte_size=8)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "'device_id' 0 names no device: this server has no CUDA device")
        self.stub.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest())

    def test_log_settings(self):
        settings = self.stub.LogSettings(pb.LogSettingsRequest()).settings
        self.assertEqual(settings["log_file"].string_param, "")
        self.assertTrue(settings["log_error"].bool_param)
        request = pb.LogSettingsRequest()
        request.settings["log_verbose_level"].uint32_param = 1
        changed = self.stub.LogSettings(request).settings
        self.assertEqual(changed["log_verbose_level"].uint32_param, 1)
        request.settings["log_verbose_level"].uint32_param = 0
        self.stub.LogSettings(request)
        refused = pb.LogSettingsRequest()
        refused.settings["log_file"].string_param = "/tmp/x.log"
        self.assertCode(lambda: self.stub.LogSettings(refused), grpc.StatusCode.INVALID_ARGUMENT,
                        "log_file")

    def test_trace_setting(self):
        settings = self.stub.TraceSetting(pb.TraceSettingRequest()).settings
        self.assertEqual(list(settings["trace_level"].value), ["OFF"])
        request = pb.TraceSettingRequest()
        request.settings["trace_level"].value.append("TIMESTAMPS")
        self.assertCode(lambda: self.stub.TraceSetting(request), grpc.StatusCode.INVALID_ARGUMENT,
                        "Orochi does not trace requests")
        self.assertCode(lambda: self.stub.TraceSetting(pb.TraceSettingRequest(model_name="echo")),
                        grpc.StatusCode.UNIMPLEMENTED)


class DeadlineAndCancellationTest(GrpcServerTest):
    def test_timeout_parameter(self):
        start = time.time()
        self.assertCode(lambda: self.stub.ModelInfer(slow_request("spin", timeout_us=300_000)),
                        grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.time() - start, 10)

    def test_client_deadline_interrupts_the_model(self):
        start = time.time()
        self.assertCode(lambda: self.stub.ModelInfer(slow_request("spin"), timeout=0.5),
                        grpc.StatusCode.DEADLINE_EXCEEDED)
        self.assertLess(time.time() - start, 10)
        self.assertCopiesFree()

    def test_cancelled_call_frees_its_copy(self):
        futures = [self.stub.ModelInfer.future(slow_request("spin")) for _ in range(self.COPIES)]
        time.sleep(0.5)
        for future in futures:
            future.cancel()
        self.assertCopiesFree()
        text = self.metrics()
        self.assertRegex(text, r'orochi_inference_requests_total\{model="slow",'
                               r'reason="client_gone",version="1"\} [1-9]')

    def assertCopiesFree(self):
        # Both copies answer a quick request promptly once the spinning ones are interrupted.
        deadline = time.time() + 10
        while True:
            try:
                results = [self.stub.ModelInfer.future(slow_request("sleep", 0.0), timeout=2)
                           for _ in range(self.COPIES)]
                for result in results:
                    result.result()
                return
            except grpc.RpcError:
                if time.time() > deadline:
                    raise


class StreamTest(GrpcServerTest):
    def test_each_request_of_a_stream_gets_its_answer_and_errors_keep_it_open(self):
        def requests():
            for i in range(10):
                yield echo_raw_request(request_id=f"s{i}")
            yield pb.ModelInferRequest(model_name="nope", id="bad")
            yield echo_raw_request(request_id="last")
        answers = list(self.stub.ModelStreamInfer(requests()))
        self.assertEqual(len(answers), 12)
        errors = [a for a in answers if a.error_message]
        self.assertEqual(len(errors), 1)
        self.assertEqual(errors[0].infer_response.id, "bad")
        self.assertIn("model 'nope' is not loaded", errors[0].error_message)
        ids = sorted(a.infer_response.id for a in answers if not a.error_message)
        self.assertEqual(ids, sorted([f"s{i}" for i in range(10)] + ["last"]))

    def test_a_hundred_concurrent_streams(self):
        def one_stream(index):
            answers = list(self.stub.ModelStreamInfer(
                echo_raw_request(request_id=f"{index}-{i}") for i in range(5)))
            return sorted(a.infer_response.id for a in answers if not a.error_message)
        with concurrent.futures.ThreadPoolExecutor(100) as pool:
            results = list(pool.map(one_stream, range(100)))
        for index, ids in enumerate(results):
            self.assertEqual(ids, sorted(f"{index}-{i}" for i in range(5)))

    def test_flow_control_holds_back_a_client_that_does_not_read(self):
        # Each answer is 512 KB, past a stream's HTTP/2 window: while the client reads nothing,
        # the server can write little, so at most max_stream_in_flight (4) requests are read
        # and not yet answered, and the stream is not read further. Nothing is queued without
        # bound, and nothing is lost once the client reads.
        def big_request(i):
            request = echo_raw_request(rows=1, request_id=str(i))
            request.raw_input_contents[-1] = bytes_raw([b"x" * (512 << 10)])
            return request

        def echo_successes():
            stats = self.stub.ModelStatistics(pb.ModelStatisticsRequest(name="echo"))
            return stats.model_stats[0].inference_stats.success.count

        before = echo_successes()
        stream = self.stub.ModelStreamInfer(big_request(i) for i in range(80))
        time.sleep(2)
        ran_while_not_reading = echo_successes() - before
        time.sleep(1)
        # Stalled, not slow: no progress while the client reads nothing. What ran is the limit
        # plus the answers the transports' windows and buffers took (a few MB), far from all.
        self.assertEqual(echo_successes() - before, ran_while_not_reading)
        self.assertLess(ran_while_not_reading, 30)
        answers = list(stream)
        self.assertEqual(sorted(int(a.infer_response.id) for a in answers), list(range(80)))
        self.assertTrue(all(not a.error_message for a in answers))
        self.assertEqual(echo_successes() - before, 80)

    def test_cancelling_a_stream_interrupts_its_running_request(self):
        stream = self.stub.ModelStreamInfer(iter([slow_request("spin")]))
        time.sleep(0.5)
        stream.cancel()
        deadline = time.time() + 10
        while True:
            try:
                self.stub.ModelInfer(slow_request("sleep", 0.0), timeout=2)
                break
            except grpc.RpcError:
                self.assertLess(time.time(), deadline)


class StreamAnswerBudgetTest(GrpcClient, SharedServerTest):
    """A server whose buffer budget (http.max_buffered_body_bytes) is 8 MiB, whose streams may
    have 16 requests in flight each, and whose hostile model answers as much as it is asked."""

    CONFIG: dict = {"grpc": {"max_message_bytes": 1 << 20, "max_stream_in_flight": 16},
                    "http": {"max_buffered_body_bytes": 8 << 20}}
    EXTRA_MODELS = ("hostile",)

    def test_answers_a_client_does_not_read_are_held_within_the_buffer_budget(self):
        # Answers waiting for a client that read none were held without a bound: 64 MiB and 8
        # MiB each over two streams took 1.1 GB, and the memory guard then refused every other
        # client. They count against the buffer budget now; one past it is answered with an
        # error instead, so every request still gets its answer, in the stream, by its id.
        def big_request(stream, i):  # a small request, and an answer of 512 KiB
            request = pb.ModelInferRequest(model_name="hostile", id=f"{stream}-{i}")
            request.inputs.add(name="mode", datatype="BYTES", shape=[1])
            request.raw_input_contents.append(bytes_raw([b"answer:131072"]))
            return request

        def requests(stream):
            return (big_request(stream, i) for i in range(16))

        streams = [self.stub.ModelStreamInfer(requests(s)) for s in range(6)]  # 48 MiB of
        time.sleep(3)  # answers, unread for a while
        answers = [answer for stream in streams for answer in stream]
        self.assertEqual(sorted(a.infer_response.id for a in answers),
                         sorted(f"{s}-{i}" for s in range(6) for i in range(16)))
        dropped = [a for a in answers if a.error_message]
        self.assertGreater(len(dropped), 0)
        self.assertIn("was dropped: the server holds", dropped[0].error_message)
        self.assertIn("http.max_buffered_body_bytes (8388608); read the stream's answers as they "
                      "come", dropped[0].error_message)
        self.assertIn("a stream's answer was dropped: the buffer budget is spent",
                      self.server.log_text())
        # What was held is given back: a client that reads gets every answer again.
        answers = list(self.stub.ModelStreamInfer(requests("again")))
        self.assertEqual(len(answers), 16)
        self.assertTrue(all(not a.error_message for a in answers),
                        [a.error_message for a in answers if a.error_message][:1])


class RepositoryTest(GrpcServerTest):
    def test_index_unload_and_load_from_loopback(self):
        index = self.stub.RepositoryIndex(pb.RepositoryIndexRequest())
        self.assertEqual(sorted((m.name, m.version, m.state) for m in index.models),
                         [("echo", "1", "READY"), ("extra_rows", "1", "READY"),
                          ("slow", "1", "READY")])
        self.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="extra_rows"))
        self.assertFalse(self.stub.ModelReady(pb.ModelReadyRequest(name="extra_rows")).ready)
        ready = self.stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
        self.assertNotIn("extra_rows", [m.name for m in ready.models])
        self.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="extra_rows"))
        self.assertTrue(self.stub.ModelReady(pb.ModelReadyRequest(name="extra_rows")).ready)
        self.assertCode(lambda: self.stub.RepositoryModelLoad(
            pb.RepositoryModelLoadRequest(model_name="nope")), grpc.StatusCode.NOT_FOUND)
        # Triton's config override, read as HTTP's load reads it: applied, or refused by name.
        self.stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="echo"))
        request = pb.RepositoryModelLoadRequest(model_name="echo")
        request.parameters["config"].string_param = json.dumps(
            {"dynamic_batching": {"max_queue_delay_microseconds": 1500},
             "instance_group": [{"count": 1}]})
        self.stub.RepositoryModelLoad(request)
        config = self.stub.ModelConfig(pb.ModelConfigRequest(name="echo")).config
        self.assertEqual(config.dynamic_batching.max_queue_delay_microseconds, 1500)
        self.assertEqual(config.instance_group[0].count, 1)
        request.parameters["config"].string_param = json.dumps({"backend": "python"})
        self.assertCode(lambda: self.stub.RepositoryModelLoad(request),
                        grpc.StatusCode.INVALID_ARGUMENT, "backend")
        files = pb.RepositoryModelLoadRequest(model_name="echo")
        files.parameters["file:1/model.py"].bytes_param = b"print(1)"
        self.assertCode(lambda: self.stub.RepositoryModelLoad(files),
                        grpc.StatusCode.INVALID_ARGUMENT, "file:1/model.py")
        unload = pb.RepositoryModelUnloadRequest(model_name="echo")
        unload.parameters["unload_dependents"].bool_param = True
        self.stub.RepositoryModelUnload(unload)
        self.stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="echo"))
        self.assertEqual(self.stub.ModelConfig(pb.ModelConfigRequest(name="echo"))
                         .config.instance_group[0].count, self.COPIES)
        self.assertCode(lambda: self.stub.RepositoryIndex(
            pb.RepositoryIndexRequest(repository_name="other")), grpc.StatusCode.INVALID_ARGUMENT)


# What a client sends to open an HTTP/2 connection: the preface and an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


class ConnectionFloodTest(SharedServerTest):
    """Connections that open HTTP/2 and then say nothing cannot take the gRPC listener (and the
    process's descriptors) from other clients: grpc.max_connections_per_client and
    grpc.max_connections close the ones past them at once."""

    CONFIG = {"grpc": {"max_connections": 70, "max_connections_per_client": 50}}
    COPIES = 1

    def setUp(self):
        self.sockets = []

    def tearDown(self):
        for sock in self.sockets:
            sock.close()

    def flood(self, source: str, count: int) -> tuple[list, list]:
        """Opens `count` connections from `source` that send the preface and SETTINGS, then
        nothing; returns (those the server keeps open, those it closed)."""
        opened = []
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", self.server.grpc_port), timeout=5,
                                            source_address=(source, 0))
            self.sockets.append(sock)
            opened.append(sock)
            try:
                sock.sendall(HTTP2_PREFACE)
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed already
        time.sleep(1)  # the server has accepted them, and answered or closed each
        kept, closed = [], []
        for sock in opened:
            (closed if self.closed_by_server(sock) else kept).append(sock)
        return kept, closed

    @staticmethod
    def closed_by_server(sock: socket.socket) -> bool:
        sock.setblocking(False)
        try:
            while sock.recv(65536):
                pass  # the server's SETTINGS: a connection gRPC took
            return True
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True

    def grpc_live(self) -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            return stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live

    def test_one_address_cannot_take_every_connection(self):
        kept, closed = self.flood("127.0.0.2", 60)
        self.assertEqual((len(kept), len(closed)), (50, 10))
        # Other addresses are served: gRPC from 127.0.0.1, and HTTP's health checks.
        self.assertTrue(self.grpc_live())
        self.assertEqual(curl(f"http://127.0.0.1:{self.server.port}/v2/health/ready")[0], 200)
        # Past the listener's limit (70), new connections from any address are closed; the
        # channel above may still hold one for a moment.
        kept, closed = self.flood("127.0.0.3", 30)
        self.assertIn(len(kept), (19, 20))
        self.assertEqual(len(kept) + len(closed), 30)
        self.assertEqual(len(self.flood("127.0.0.4", 1)[1]), 1)
        self.assertEqual(curl(f"http://127.0.0.1:{self.server.port}/v2/health/ready")[0], 200)
        with open(self.server.log_path) as log:
            refusals = log.read().count("too many gRPC connections")
        self.assertEqual(refusals, 2)  # once per episode: the first refusals, then after one kept
        # Once the flood lets go, its connections no longer count.
        for sock in self.sockets:
            sock.close()
        self.sockets = []
        deadline = time.time() + 10
        while time.time() < deadline:
            kept, closed = self.flood("127.0.0.2", 1)
            if kept:
                break
        self.assertEqual(len(kept), 1)
        self.assertTrue(self.grpc_live())


class IdleConnectionTest(SharedServerTest):
    """A gRPC connection without a call is closed after http.idle_timeout_s, as HTTP's are."""

    CONFIG = {"http": {"idle_timeout_s": 2}}
    COPIES = 1

    def test_an_idle_connection_is_closed_after_the_idle_timeout(self):
        with socket.create_connection(("127.0.0.1", self.server.grpc_port), timeout=10) as sock:
            sock.sendall(HTTP2_PREFACE)
            start = time.time()
            received = read_until_closed(sock)
            elapsed = time.time() - start
        self.assertGreater(elapsed, 1.5)
        self.assertLess(elapsed, 8)
        self.assertIn(7, frame_types(received))  # GOAWAY, before the close


def frame_types(received: bytes) -> list[int]:
    """The types of the HTTP/2 frames in what a server sent."""
    types, offset = [], 0
    while offset + 9 <= len(received):
        types.append(received[offset + 3])
        offset += 9 + int.from_bytes(received[offset:offset + 3], "big")
    return types


class ShutdownTest(unittest.TestCase):
    def test_an_idle_stream_does_not_hold_the_shutdown_and_a_busy_one_is_answered(self):
        root = tempfile.mkdtemp(prefix="orochi-grpc-shutdown-")
        try:
            server = Server(pack_repository(root), {"http": {"shutdown_grace_s": 30}}, copies=2)
            channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            idle_sent = threading.Event()
            hold = threading.Event()

            def idle_requests():  # one request, then the stream stays open, sending nothing
                yield echo_raw_request(request_id="idle")
                idle_sent.set()
                hold.wait(60)

            idle = stub.ModelStreamInfer(idle_requests())
            self.assertEqual(next(idle).infer_response.id, "idle")
            busy = stub.ModelStreamInfer(iter([slow_request("sleep", 2.0)]))
            time.sleep(0.5)  # the slow request is running
            start = time.time()
            server.process.send_signal(signal.SIGTERM)
            answers = list(busy)
            self.assertEqual(len(answers), 1)
            self.assertEqual(answers[0].error_message, "")
            with self.assertRaises(grpc.RpcError):
                list(idle)  # ended by the server, not left open until the grace
            hold.set()
            code = server.process.wait(timeout=60)
            self.assertLess(time.time() - start, 15)
            channel.close()
            self.assertEqual(server.stop(), 0)
            self.assertEqual(code, 0)
        finally:
            shutil.rmtree(root)


class TokenTest(unittest.TestCase):
    """Tokens on the inference port apply to gRPC; repository calls need the management one,
    and without it are for loopback callers only."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-grpc-tokens-")
        cls.repository = pack_repository(cls.root)
        os.environ["OROCHI_TEST_GRPC_INFERENCE"] = "inference-secret"
        os.environ["OROCHI_TEST_GRPC_MANAGEMENT"] = "management-secret"
        cls.server = Server(cls.repository, {
            "http": {"token_env": "OROCHI_TEST_GRPC_INFERENCE"},
            "management": {"token_env": "OROCHI_TEST_GRPC_MANAGEMENT"}}, copies=1)
        cls.channel = grpc.insecure_channel(f"127.0.0.1:{cls.server.grpc_port}")
        cls.stub = pb_grpc.GRPCInferenceServiceStub(cls.channel)

    @classmethod
    def tearDownClass(cls):
        cls.channel.close()
        assert cls.server.stop() == 0
        shutil.rmtree(cls.root)

    def code_of(self, call, **kwargs):
        try:
            call(**kwargs)
            return grpc.StatusCode.OK
        except grpc.RpcError as error:
            return error.code()

    def test_tokens(self):
        live = lambda **kw: self.stub.ServerLive(pb.ServerLiveRequest(), **kw)  # noqa: E731
        self.assertEqual(self.code_of(live), grpc.StatusCode.UNAUTHENTICATED)
        self.assertEqual(self.code_of(live, metadata=[("authorization", "Bearer nope")]),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.code_of(live, metadata=[("authorization",
                                                       "bearer inference-secret")]),
                         grpc.StatusCode.OK)
        stream = self.stub.ModelStreamInfer(iter([echo_raw_request()]))
        self.assertEqual(self.code_of(lambda: list(stream)), grpc.StatusCode.UNAUTHENTICATED)
        index = lambda **kw: self.stub.RepositoryIndex(pb.RepositoryIndexRequest(), **kw)  # noqa
        self.assertEqual(self.code_of(index, metadata=[("authorization",
                                                        "Bearer inference-secret")]),
                         grpc.StatusCode.PERMISSION_DENIED)
        self.assertEqual(self.code_of(index, metadata=[("authorization",
                                                        "Bearer management-secret")]),
                         grpc.StatusCode.OK)


class ShutdownDelayTest(unittest.TestCase):
    def test_server_ready_is_false_but_new_channels_are_served_during_the_delay(self):
        root = tempfile.mkdtemp(prefix="orochi-grpc-shutdown-delay-")
        try:
            delay = 3
            server = Server(pack_repository(root), {"http": {"shutdown_delay_s": delay}})
            self.addCleanup(lambda: server.process.poll() is None and server.process.kill())
            target = f"127.0.0.1:{server.grpc_port}"
            with grpc.insecure_channel(target) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                self.assertTrue(stub.ServerReady(pb.ServerReadyRequest()).ready)
                start = time.time()
                server.process.send_signal(signal.SIGTERM)
                while stub.ServerReady(pb.ServerReadyRequest()).ready:
                    self.assertLess(time.time() - start, 1.5, "still ready after SIGTERM")
                    time.sleep(0.02)
            # A channel opened now (a new connection, as from a client that has not yet
            # learnt of the shutdown) is still served.
            with grpc.insecure_channel(target) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                self.assertFalse(stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready)
                self.assertTrue(stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live)
                response = stub.ModelInfer(echo_raw_request(), timeout=5)
                self.assertEqual(response.model_name, "echo")
            self.assertLess(time.time() - start, delay, "the checks ran past the delay")
            self.assertEqual(server.process.wait(timeout=delay + 30), 0, server.log_text())
            self.assertGreaterEqual(time.time() - start, delay)
            server.stop()
        finally:
            shutil.rmtree(root)


class GrpcAcrossRestartsTest(unittest.TestCase):
    """The gRPC port is the supervisor's, as the HTTP ports are: while a crashed serving process
    restarts, gRPC clients' connections wait in its backlog instead of being refused (which
    would send a client into seconds of reconnection backoff)."""

    def test_a_call_made_during_a_restart_is_answered_by_the_next_process(self):
        root = tempfile.mkdtemp(prefix="orochi-grpc-restart-")
        try:
            repository = pack_repository(root)
            pack_model(repository, "hostile")
            server = Server(repository, {}, copies=1)
            try:
                before = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
                self.assertTrue(pb_grpc.GRPCInferenceServiceStub(before).ServerLive(
                    pb.ServerLiveRequest(), timeout=10).live)
                first = server.serving_pid
                status, _, _ = post_json(server, "/v2/models/hostile/infer", {"inputs": [
                    {"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["segfault"]}]})
                self.assertEqual(status, 0, "the serving process died without an answer")
                # A new connection (its own subchannel, not the one that just broke), without
                # wait_for_ready: a refused connection would fail the call at once.
                during = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}",
                                               options=[("grpc.use_local_subchannel_pool", 1)])
                started = time.monotonic()
                answer = pb_grpc.GRPCInferenceServiceStub(during).ModelInfer(
                    echo_raw_request(rows=1), timeout=60)
                waited = time.monotonic() - started
                server.wait_for_serving(2)
                self.assertNotEqual(server.serving_pid, first)
                self.assertEqual(answer.model_name, "echo")
                print(f"\na gRPC call made during the restart waited {waited:.2f} s", flush=True)
                # The channel made before the crash works again too.
                self.assertTrue(pb_grpc.GRPCInferenceServiceStub(before).ServerLive(
                    pb.ServerLiveRequest(), timeout=30, wait_for_ready=True).live)
                before.close()
                during.close()
            finally:
                self.assertEqual(server.stop(), 0)
        finally:
            shutil.rmtree(root)


if __name__ == "__main__":
    unittest.main()
