"""The README's first command and quickstart, run as a newcomer would: the server is started by
scripts/serve-examples.sh (the first command, with setup already done by the build), every
command of the quickstart section is run with bash against it, and each answer is checked.

A quickstart command without a check below, or a check whose command left the README, fails
the test: the README cannot drift from what Orochi does.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_readme
"""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "models"))
import expected  # noqa: E402

BINARY = Path(os.environ.get("OROCHI_BINARY", ROOT / "build" / "bin" / "orochi")).resolve()
BUILD = BINARY.parent.parent
REPOSITORY = Path(os.environ.get("OROCHI_EXAMPLE_REPOSITORY", BUILD / "model-repository"))
README = ROOT / "README.md"
EXAMPLES = ("digits", "encoder", "resnet", "sentiment", "textgen")


def section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def shell_commands(markdown: str) -> list:
    """The commands of a markdown text's ```sh blocks, a command spanning lines while a quote is
    open or a line ends with a backslash; comment lines are dropped."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        pending = ""
        for line in block.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            pending += line + "\n"
            try:
                shlex.split(pending)
            except ValueError:  # an open quote
                continue
            if not pending.rstrip().endswith("\\"):
                commands.append(pending.strip())
                pending = ""
        assert not pending, f"unterminated command in the README: {pending}"
    return commands


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def json_body(text: str):
    return json.loads(text)


def outputs_of(text: str) -> dict:
    return expected.response_outputs(json.loads(text))


# Each quickstart command, recognised by a pattern, and what its answer must be. A check gets
# (HTTP status or None for pipelines and non-curl commands, output text).
def check_ready(test, status, text):
    test.assertEqual((status, json_body(text)), (200, {"ready": True}))


def check_index(test, status, text):
    test.assertEqual(status, 200)
    test.assertEqual({(m["name"], m["version"], m["state"]) for m in json_body(text)},
                     {(name, "1", "READY") for name in EXAMPLES})


def check_sentiment_metadata(test, status, text):
    metadata = json_body(text)
    test.assertEqual((status, metadata["name"], metadata["versions"]), (200, "sentiment", ["1"]))
    test.assertEqual([i["name"] for i in metadata["inputs"]], ["text"])
    test.assertEqual([o["name"] for o in metadata["outputs"]], ["label", "scores", "keywords"])


def check_digits(test, status, text):
    test.assertEqual(status, 200, text)
    outputs = outputs_of(text)
    test.assertEqual(outputs["digit"], ([1, 1], [2]))
    shape, classes = outputs["probabilities"]  # the 3 likeliest, as "score:digit"
    test.assertEqual(shape, [1, 3])
    score, digit = classes[0].split(":")
    test.assertEqual(digit, "2")
    test.assertGreater(float(score), 0.9)


def check_sentiment(test, status, text):
    test.assertEqual(status, 200, text)
    outputs = outputs_of(text)
    test.assertEqual(outputs["label"], ([2, 1], ["positive", "negative"]))
    keywords = outputs["keywords"][1]
    test.assertIn("loved", keywords[:3])
    test.assertIn("not_good", keywords[3:])


def check_encoder(test, status, text):
    test.assertEqual(status, 200, text)
    outputs = outputs_of(text)
    test.assertEqual(outputs["tokens"], ([1, 1], [14]))
    shape, embedding = outputs["embedding"]
    test.assertEqual(shape, [1, 256])
    test.assertAlmostEqual(sum(v * v for v in embedding), 1.0, places=4)


def check_resnet(test, status, text):
    test.assertEqual(status, 200, text)
    test.assertEqual(expected.differences(expected.load("resnet"), outputs_of(text)), [])


def check_pack(test, status, text):
    test.assertIn("packed digits version 2", text)


def check_deploy(test, status, text):
    test.assertEqual((status, json_body(text)["loaded_versions"]), (200, ["2"]), text)


def check_digits_metadata(test, status, text):
    test.assertEqual((status, json_body(text)["versions"]), (200, ["2"]), text)


def check_metrics(test, status, text):
    counts = {}
    for line in text.splitlines():
        match = re.match(r'orochi_inference_requests_total\{(.*)\} (\S+)', line)
        test.assertTrue(match, line)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        counts[(labels["model"], labels["version"], labels["reason"])] = float(match.group(2))
    for model in EXAMPLES:
        if model == "digits":  # version 1 went with its series when version 2 replaced it
            test.assertNotIn((model, "1", "success"), counts)
            test.assertEqual(counts.get((model, "2", "success")), 0.0, counts)
            test.assertEqual(counts.get((model, "2", "timeout")), 0.0, counts)
        elif model == "textgen":  # a streaming model: the quickstart's infer calls leave it out
            test.assertEqual(counts.get((model, "1", "success")), 0.0, counts)
        else:
            test.assertEqual(counts.get((model, "1", "success")), 1.0, counts)


CHECKS = [
    (r"^curl localhost:8000/v2/health/ready$", check_ready),
    (r"^curl -X POST localhost:8003/v2/repository/index$", check_index),
    (r"^curl localhost:8000/v2/models/sentiment$", check_sentiment_metadata),
    (r"/v2/models/digits/infer", check_digits),
    (r"/v2/models/sentiment/infer", check_sentiment),
    (r"/v2/models/encoder/infer", check_encoder),
    (r"/v2/models/resnet/infer", check_resnet),
    (r"^build/bin/orochi pack ", check_pack),
    (r"^curl -T .* localhost:8003/v2/repository/models/digits/versions/2$", check_deploy),
    (r"^curl localhost:8000/v2/models/digits$", check_digits_metadata),
    (r"localhost:8002/metrics", check_metrics),
]


class ReadmeTest(unittest.TestCase):
    def test_the_first_two_commands(self):
        first_block = shell_commands(README.read_text().split("\n## ", 1)[0])
        self.assertEqual([c.split()[0] for c in first_block],
                         ["scripts/serve-examples.sh", "scripts/test.sh"])
        for command in first_block:
            self.assertTrue(os.access(ROOT / command.split()[0], os.X_OK), command)

    def test_quickstart_commands_against_the_first_commands_server(self):
        commands = shell_commands(section(README.read_text(), "Quickstart"))
        checks = []
        for command in commands:
            matching = [check for pattern, check in CHECKS if re.search(pattern, command)]
            self.assertEqual(len(matching), 1, f"the README command {command!r} has "
                                               f"{len(matching)} checks in {__file__}")
            checks.append(matching[0])
        unused = {check.__name__ for _, check in CHECKS} - {check.__name__ for check in checks}
        self.assertFalse(unused, f"checks for commands no longer in the README: {unused}")

        with tempfile.TemporaryDirectory(prefix="orochi-readme-") as root:
            repository = Path(root) / "repository"
            for name in EXAMPLES:
                (repository / name / "1").mkdir(parents=True)
                shutil.copy(REPOSITORY / name / "1" / "model.orochi",
                            repository / name / "1" / "model.orochi")
            ports = {8000: free_port(), 8001: free_port(), 8003: free_port(), 8002: free_port()}
            log_path = Path(root) / "serve.log"
            with open(log_path, "w") as log:
                server = subprocess.Popen(
                    [str(ROOT / "scripts" / "serve-examples.sh"), "--http-port", str(ports[8000]),
                     "--management-port", str(ports[8003]), "--metrics-port", str(ports[8002]),
                     "--grpc-port", str(ports[8001])],
                    env={**os.environ, "OROCHI_SKIP_SETUP": "1", "OROCHI_BUILD_DIR": str(BUILD),
                         "OROCHI_MODEL_REPOSITORY": str(repository)},
                    stdout=log, stderr=subprocess.STDOUT)
            try:
                self.wait_until_serving(server, log_path)
                for command, check in zip(commands, checks):
                    with self.subTest(command=command):
                        status, text = self.run_command(command, ports)
                        check(self, status, text)
            finally:
                server.send_signal(signal.SIGTERM)
                self.assertEqual(server.wait(timeout=60), 0, log_path.read_text())

    def wait_until_serving(self, server, log_path):
        deadline = time.time() + 120
        while time.time() < deadline:
            if re.search(r" serving inference=http:", log_path.read_text()):
                return
            self.assertIsNone(server.poll(), "the server exited:\n" + log_path.read_text())
            time.sleep(0.1)
        self.fail("the server did not start:\n" + log_path.read_text())

    def run_command(self, command, ports):
        """Runs a README command with bash from the repository root, on this test's ports and
        build; curl commands without a pipe also report their HTTP status."""
        for readme_port, port in ports.items():
            command = command.replace(f"localhost:{readme_port}", f"127.0.0.1:{port}")
        command = re.sub(r"(^|[\s@])build/", lambda m: f"{m.group(1)}{BUILD}/", command)
        measured = command.startswith("curl ") and "|" not in command
        if measured:
            command += " -s -S -w '\\n%{http_code}'"
        result = subprocess.run(["bash", "-c", f"set -o pipefail; {command}"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, f"{command}\n{result.stdout}\n{result.stderr}")
        if not measured:
            return None, result.stdout
        text, _, status = result.stdout.rpartition("\n")
        return int(status), text


if __name__ == "__main__":
    unittest.main()
