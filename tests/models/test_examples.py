"""The example models (models/), as the build packed them: each answers its example request with
its expected answer through `orochi run` and through the server (JSON and binary requests), the
digit classifier is at least 95% accurate on scikit-learn's held-out split when served, and bad
inputs get clear client errors.

    OROCHI_BINARY=build/bin/orochi OROCHI_EXAMPLES=build/models \
        OROCHI_EXAMPLE_REPOSITORY=build/model-repository python3.11 -m unittest -v test_examples
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "server"), str(HERE.parent.parent / "models")]
import expected  # noqa: E402
from server_fixtures import BINARY, Server, curl  # noqa: E402

BUILD = Path(BINARY).resolve().parent.parent
EXAMPLES = Path(os.environ.get("OROCHI_EXAMPLES", BUILD / "models"))
REPOSITORY = Path(os.environ.get("OROCHI_EXAMPLE_REPOSITORY", BUILD / "model-repository"))
NAMES = ("digits", "sentiment", "resnet", "encoder")
MIN_DIGITS_ACCURACY = 0.95


def package(name: str) -> Path:
    return REPOSITORY / name / "1" / "model.orochi"


class OrochiRunTest(unittest.TestCase):
    def test_each_example_answers_its_request_with_the_expected_answer(self):
        for name in NAMES:
            with self.subTest(model=name):
                result = subprocess.run(
                    [BINARY, "run", str(package(name)), "--request",
                     str(EXAMPLES / name / "request.json")],
                    capture_output=True, text=True, timeout=300)
                self.assertEqual(result.returncode, 0, result.stderr)
                outputs = expected.response_outputs(json.loads(result.stdout))
                self.assertEqual(expected.differences(expected.load(name), outputs), [])


def gpu_count() -> tuple[int, str]:
    """CUDA devices the engine sees here, and why there are none."""
    result = subprocess.run(
        [BINARY, "python", "-c",
         "import orochi; print(orochi.cuda.device_count()); print(orochi.cuda.unavailable_reason())"],
        capture_output=True, text=True, timeout=120, check=True)
    count, _, reason = result.stdout.partition("\n")
    return int(count), reason.strip()


def pack_on_cuda(name: str, directory: Path) -> Path:
    """The example `name` repacked with `"device": "cuda"`, as `NAME-cuda` version 1."""
    source = directory / f"{name}-cuda-source"
    shutil.copytree(EXAMPLES / name / "package", source)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.update(name=f"{name}-cuda", device="cuda")
    (source / "manifest.json").write_text(json.dumps(manifest))
    target = directory / "repository" / f"{name}-cuda" / "1" / "model.orochi"
    target.parent.mkdir(parents=True)
    subprocess.run([BINARY, "pack", str(source), "-o", str(target)], check=True,
                   capture_output=True, timeout=300)
    return target


class CudaExamplesTest(unittest.TestCase):
    """ResNet and the transformer encoder with `device: cuda`: on a GPU they give the CPU's
    answers, from 8 copies at once; without one, loading fails saying why."""

    CUDA_NAMES = ("resnet", "encoder")
    COPIES = 8

    @classmethod
    def setUpClass(cls):
        cls.root = Path(tempfile.mkdtemp(prefix="orochi-cuda-examples-"))
        for name in cls.CUDA_NAMES:
            pack_on_cuda(name, cls.root)
        cls.gpus, cls.reason = gpu_count()
        cls.server = Server(str(cls.root / "repository"), {}, copies=cls.COPIES)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.root)

    def index(self):
        status, _, body = curl("-X", "POST", f"http://127.0.0.1:{self.server.management_port}"
                                             "/v2/repository/index")
        self.assertEqual(status, 200)
        return {model["name"]: model for model in json.loads(body)}

    def test_without_a_gpu_the_models_are_refused_with_the_reason(self):
        if self.gpus:
            self.skipTest(f"this machine has {self.gpus} GPU(s)")
        self.assertTrue(self.reason)
        for name, model in self.index().items():
            self.assertEqual(model["state"], "UNAVAILABLE", name)
            self.assertIn("the manifest places the model on 'cuda', but cuda:0 is not available: "
                          + self.reason, model["reason"])
        log = Path(self.server.log_path).read_text()
        self.assertIn("no GPU available: CPU models only", log)
        status, _, body = curl("-X", "POST", f"http://127.0.0.1:{self.server.management_port}"
                                             "/v2/repository/models/resnet-cuda/load")
        self.assertEqual(status, 503, body)
        self.assertIn("cuda:0 is not available: " + self.reason, body.decode())

    def test_on_a_gpu_eight_copies_at_once_give_the_cpu_answers(self):
        if not self.gpus:
            self.skipTest(f"no CUDA GPU: {self.reason}")
        self.assertEqual({n: m["state"] for n, m in self.index().items()},
                         {f"{n}-cuda": "READY" for n in self.CUDA_NAMES})
        from concurrent.futures import ThreadPoolExecutor
        for name in self.CUDA_NAMES:
            request = (EXAMPLES / name / "request.json").read_bytes()
            url = self.server.url(f"/v2/models/{name}-cuda/infer")
            with ThreadPoolExecutor(self.COPIES) as pool:
                answers = list(pool.map(lambda _: curl("-X", "POST", url, data=request),
                                        range(4 * self.COPIES)))
            for status, _, body in answers:
                self.assertEqual(status, 200, body)
                outputs = expected.response_outputs(json.loads(body))
                self.assertEqual(expected.differences(expected.load(name), outputs), [], name)
        status, _, metrics = curl(f"http://127.0.0.1:{self.server.metrics_port}/metrics")
        self.assertIn('orochi_gpu_memory_used_bytes{device="cuda:0"}', metrics.decode())


class ServedExamplesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-examples-")
        repository = Path(cls.root) / "repository"
        for name in NAMES:
            (repository / name / "1").mkdir(parents=True)
            shutil.copy(package(name), repository / name / "1" / "model.orochi")
        cls.server = Server(str(repository), {}, copies=2)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        shutil.rmtree(cls.root)

    def infer(self, name, body: bytes, *headers):
        header_args = [arg for header in headers for arg in ("-H", header)]
        return curl("-X", "POST", *header_args,
                    self.server.url(f"/v2/models/{name}/infer"), data=body)

    def assert_expected(self, name, status, body):
        self.assertEqual(status, 200, body)
        outputs = expected.response_outputs(json.loads(body))
        self.assertEqual(expected.differences(expected.load(name), outputs), [])

    def test_every_example_is_ready(self):
        status, _, body = curl("-X", "POST", f"http://127.0.0.1:{self.server.management_port}"
                                             "/v2/repository/index")
        self.assertEqual(status, 200)
        states = {model["name"]: model["state"] for model in json.loads(body)}
        self.assertEqual(states, {name: "READY" for name in NAMES})

    def test_each_example_answers_its_json_request(self):
        for name in NAMES:
            with self.subTest(model=name):
                request = (EXAMPLES / name / "request.json").read_bytes()
                self.assert_expected(name, *self.infer(name, request)[::2])

    def test_binary_requests_get_the_same_answers(self):
        for name in ("digits", "resnet"):
            with self.subTest(model=name):
                body = (EXAMPLES / name / "request.bin").read_bytes()
                length = (EXAMPLES / name / "request.bin.header-length").read_text().strip()
                status, _, answer = self.infer(name, body,
                                               f"Inference-Header-Content-Length: {length}")
                self.assert_expected(name, status, answer)

    def test_digits_accuracy_on_the_held_out_split_through_the_server(self):
        heldout = json.loads((EXAMPLES / "digits" / "heldout.json").read_text())
        images, digits = heldout["images"], heldout["digits"]
        self.assertEqual(len(images), 450)  # a quarter of scikit-learn's 1797 digits
        predicted = []
        for start in range(0, len(images), 50):
            rows = images[start:start + 50]
            request = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [len(rows), 64],
                                   "data": [v for row in rows for v in row]}],
                       "outputs": [{"name": "digit"}]}
            status, _, body = self.infer("digits", json.dumps(request).encode())
            self.assertEqual(status, 200, body)
            predicted += json.loads(body)["outputs"][0]["data"]
        accuracy = sum(p == d for p, d in zip(predicted, digits)) / len(digits)
        print(f"\ndigits: {accuracy:.2%} of scikit-learn's {len(digits)} held-out images "
              f"classified correctly by the served model", file=sys.stderr)
        self.assertGreaterEqual(accuracy, MIN_DIGITS_ACCURACY)
        self.assertAlmostEqual(accuracy, heldout["accuracy_in_build"], places=6)

    def test_digits_classes_as_triton_clients_ask_for_them(self):
        # tritonclient's InferRequestedOutput("probabilities", class_count=3): the three most
        # probable digits per image, most probable first, agreeing with the model's own "digit".
        heldout = json.loads((EXAMPLES / "digits" / "heldout.json").read_text())
        rows = heldout["images"][:4]
        request = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [len(rows), 64],
                               "data": [v for row in rows for v in row]}],
                   "outputs": [{"name": "digit"},
                               {"name": "probabilities", "parameters": {"classification": 3}}]}
        status, _, body = self.infer("digits", json.dumps(request).encode())
        self.assertEqual(status, 200, body)
        outputs = {output["name"]: output for output in json.loads(body)["outputs"]}
        classes = outputs["probabilities"]
        self.assertEqual((classes["datatype"], classes["shape"]), ("BYTES", [4, 3]))
        for row in range(4):
            top = [entry.split(":") for entry in classes["data"][3 * row:3 * row + 3]]
            scores = [float(score) for score, _ in top]
            self.assertEqual(scores, sorted(scores, reverse=True))
            self.assertEqual(int(top[0][1]), outputs["digit"]["data"][row])

    def test_bad_inputs_are_client_errors_that_say_why(self):
        too_bright = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 64],
                                  "data": [20] * 64}]}
        status, _, body = self.infer("digits", json.dumps(too_bright).encode())
        self.assertEqual(status, 400, body)
        self.assertIn("grey levels from 0 to 16, got values from 20 to 20", body.decode())

        wrong_size = {"inputs": [{"name": "image", "datatype": "UINT8", "shape": [1, 32, 32, 3],
                                  "data": [0] * 3072}]}
        status, _, body = self.infer("resnet", json.dumps(wrong_size).encode())
        self.assertEqual(status, 400, body)
        self.assertIn("[-1, 224, 224, 3]", body.decode())

        # BYTES with the binary extension: a 4-byte length, then bytes that are not UTF-8.
        text = b"\xff\xfe broken"
        header = json.dumps({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                         "parameters": {"binary_data_size": 4 + len(text)}}]})
        for name in ("sentiment", "encoder"):
            with self.subTest(model=name):
                status, _, body = self.infer(
                    name, header.encode() + len(text).to_bytes(4, "little") + text,
                    f"Inference-Header-Content-Length: {len(header)}")
                self.assertEqual(status, 400, body)
                self.assertIn("'text' must be UTF-8", body.decode())

        # A text model's cost grows with its text: the sentiment model takes requests of 1 MiB
        # at most (a 10 MB review once kept a copy busy for 83 s).
        huge = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1],
                            "data": ["great " * 2_000_000]}]}
        status, _, body = self.infer("sentiment", json.dumps(huge).encode())
        self.assertEqual(status, 413, body)
        self.assertIn("model sentiment takes at most 1048576", body.decode())


if __name__ == "__main__":
    unittest.main()
