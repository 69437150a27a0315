"""The server started the way KServe starts the ClusterServingRuntime of
docker/kubernetes/kserve/: its container's command and arguments, read from that file, with
{{.Name}} replaced by an InferenceService's name and /mnt/models by a directory laid out as
KServe's storage initializer leaves it (a single .orochi package, or a repository). Only the
port numbers are replaced (by 0: free ports), so that the test can run beside others.
"""

import os
import shutil
import signal
import subprocess
import tempfile
import unittest

import yaml

from server_fixtures import BINARY, HERE, curl, echo_request, post_json, wait_for_ports

RUNTIME = os.path.join(HERE, "..", "..", "docker", "kubernetes", "kserve",
                       "clusterservingruntime.yaml")
PORT_FLAGS = ("--http-port=", "--grpc-port=", "--metrics-port=", "--management-port=")


def runtime_command(name: str, model_dir: str) -> list[str]:
    """The runtime container's command line for InferenceService `name`, models in model_dir."""
    with open(RUNTIME) as file:
        runtime = yaml.safe_load(file)
    container = next(c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container")
    command = container["command"] + container["args"]
    assert command[0] == "orochi", command
    assert "--model-name={{.Name}}" in command and "--model-dir=/mnt/models" in command, command
    assert all(any(a.startswith(flag) for a in command) for flag in PORT_FLAGS), command
    resolved = [BINARY]
    for argument in command[1:]:
        argument = argument.replace("{{.Name}}", name).replace("/mnt/models", model_dir)
        if argument.startswith(PORT_FLAGS):
            argument = argument.split("=")[0] + "=0"
        resolved.append(argument)
    return resolved


def pack(model: str, output: str) -> None:
    subprocess.run([BINARY, "pack", os.path.join(HERE, "models", model), "-o", output],
                   check=True, capture_output=True)


class RuntimeContainer:
    """`orochi serve` as the runtime's container runs it, with TMPDIR as its /tmp emptyDir."""

    def __init__(self, name: str, model_dir: str, root: str, underscores: bool = False):
        self.tmp = os.path.join(root, "tmp")
        os.makedirs(self.tmp, exist_ok=True)
        descriptor, self.log_path = tempfile.mkstemp(prefix="serve-", suffix=".log", dir=root)
        os.close(descriptor)
        self.log = open(self.log_path, "w+")
        command = runtime_command(name, model_dir)
        if underscores:  # KServe's own runtimes spell them --model_name and --model_dir
            command = [a.replace("--model-name=", "--model_name=")
                       .replace("--model-dir=", "--model_dir=") for a in command]
        self.process = subprocess.Popen(command, stdout=self.log,
                                        stderr=subprocess.STDOUT,
                                        env={**os.environ, "TMPDIR": self.tmp})

    def start(self) -> "RuntimeContainer":
        wait_for_ports(self, self.process, self.log_path)
        return self

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def log_text(self) -> str:
        with open(self.log_path) as log:
            return log.read()

    def stop(self) -> int:
        # SIGINT: what SIGTERM does, without the shutdown delay that a balancer needs.
        self.process.send_signal(signal.SIGINT)
        code = self.process.wait(timeout=60)
        self.log.close()
        return code

    def failure(self) -> tuple[int, str]:
        code = self.process.wait(timeout=60)
        self.log.close()
        return code, self.log_text()


class KServeRuntimeTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-kserve-")
        self.models = os.path.join(self.root, "mnt", "models")
        os.makedirs(self.models)
        # Cleanups run last in, first out: this one after each server's.
        self.addCleanup(shutil.rmtree, self.root)

    def infer_echo(self, server, name: str) -> None:
        status, _, body = post_json(server, f"/v2/models/{name}/infer", echo_request(rows=2))
        self.assertEqual(status, 200, body)
        self.assertIn(b'"model_name":"' + name.encode() + b'"', body)
        self.assertIn(b'"out_fp32"', body)

    def serve(self, name: str, underscores: bool = False):
        """Starts the runtime on self.models, and checks afterwards that it exited 0, wrote
        nothing into the model directory and left nothing in its /tmp."""
        before = snapshot(self.models)
        server = RuntimeContainer(name, self.models, self.root, underscores).start()

        def finish():
            self.assertEqual(server.stop(), 0, server.log_text())
            self.assertEqual(snapshot(self.models), before)
            self.assertEqual(os.listdir(server.tmp), [])
        self.addCleanup(finish)
        return server

    def test_single_package_served_under_the_inference_service_name(self):
        pack("echo", os.path.join(self.models, "model.orochi"))
        server = self.serve("my-echo")
        self.infer_echo(server, "my-echo")
        status, _, _ = curl(server.url("/v2/models/echo"))
        self.assertEqual(status, 404)  # the manifest's name is not served
        status, _, body = curl(server.url("/v2/models/my-echo"))
        self.assertEqual(status, 200)
        self.assertIn(b'"versions":["1"]', body)
        status, _, _ = curl(server.url("/v2/health/ready"))
        self.assertEqual(status, 200)

    def test_single_package_whose_manifest_has_the_name(self):
        pack("echo", os.path.join(self.models, "echo.orochi"))
        server = self.serve("echo")
        self.infer_echo(server, "echo")

    def test_kserve_spelling_of_the_flags(self):
        pack("echo", os.path.join(self.models, "model.orochi"))
        server = self.serve("spelt", underscores=True)
        self.infer_echo(server, "spelt")

    def test_repository_models_keep_their_names(self):
        for model in ("echo", "slow"):
            os.makedirs(os.path.join(self.models, model, "1"))
            pack(model, os.path.join(self.models, model, "1", "model.orochi"))
        server = self.serve("my-service")
        self.infer_echo(server, "echo")
        status, _, body = curl(server.url("/v2/models/slow"))
        self.assertEqual(status, 200, body)
        status, _, _ = curl(server.url("/v2/models/my-service"))
        self.assertEqual(status, 404)
        self.assertIn("its models keep their own names", server.log_text())

    def test_directories_that_are_neither_are_refused(self):
        cases = {
            "empty": ([], "holds neither a .orochi package nor a repository (it is empty)"),
            "other files": (["README.md", "weights/"],
                            "holds neither a .orochi package nor a repository (it holds "
                            "README.md, weights)"),
            "two packages": (["a.orochi", "b.orochi"], "holds 2 packages (a.orochi, b.orochi)"),
            "package and repository": (["a.orochi", "echo/1/model.orochi"],
                                       "holds both a package (a.orochi) and a repository's "
                                       "models (echo)"),
        }
        for case, (files, message) in cases.items():
            with self.subTest(case):
                shutil.rmtree(self.models)
                os.makedirs(self.models)
                for path in files:
                    target = os.path.join(self.models, path)
                    if path.endswith("/"):
                        os.makedirs(target)
                        continue
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    if path.endswith(".orochi"):
                        pack("echo", target)
                    else:
                        open(target, "w").close()
                code, log = RuntimeContainer("svc", self.models, self.root).failure()
                self.assertEqual(code, 1, log)
                self.assertIn(message, log)
                self.assertIn("a model directory holds either one .orochi package or a "
                              "repository (<name>/<version>/model.orochi)", log)
        code, log = RuntimeContainer("svc", os.path.join(self.root, "absent"),
                                     self.root).failure()
        self.assertEqual(code, 1, log)
        self.assertIn("absent is not a directory", log)

    def test_a_broken_package_is_refused(self):
        with open(os.path.join(self.models, "model.orochi"), "wb") as file:
            file.write(b"not a package")
        code, log = RuntimeContainer("svc", self.models, self.root).failure()
        self.assertEqual(code, 1, log)
        self.assertIn("model.orochi: not a zip archive", log)

    def test_a_name_kserve_could_not_give_is_refused(self):
        pack("echo", os.path.join(self.models, "model.orochi"))
        code, log = RuntimeContainer("bad/name", self.models, self.root).failure()
        self.assertEqual(code, 1, log)
        self.assertIn("the model name 'bad/name' is not valid", log)

    def test_model_dir_and_repository_exclude_each_other(self):
        result = subprocess.run([BINARY, "serve", "--model-dir", self.models,
                                 "--model-repository", self.models], capture_output=True,
                                text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("excludes", result.stderr)


def snapshot(directory: str) -> dict:
    """Every path below `directory` with its bytes (None for a directory)."""
    contents = {}
    for parent, directories, files in os.walk(directory):
        for name in directories:
            contents[os.path.relpath(os.path.join(parent, name), directory)] = None
        for name in files:
            with open(os.path.join(parent, name), "rb") as file:
                contents[os.path.relpath(os.path.join(parent, name), directory)] = file.read()
    return contents


if __name__ == "__main__":
    unittest.main()
