"""The OpenAI-compatible endpoint (/v1) against the text generator the build staged
(models/textgen): the official OpenAI client library from npm (client.mjs, pinned by
package-lock.json, installed by run.sh into OROCHI_OPENAI_WORK) and curl -N for the raw
Server-Sent Events, behind the inference port's token.

    OROCHI_BINARY=build/bin/orochi OROCHI_EXAMPLE_REPOSITORY=build/model-repository \\
        OROCHI_OPENAI_WORK=build/tests/openai python3 -m unittest -v test_openai
"""

import json
import os
import subprocess
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from server_fixtures import Server, curl  # noqa: E402

EXAMPLES = os.environ.get("OROCHI_EXAMPLE_REPOSITORY",
                          os.path.join(HERE, "..", "..", "build", "model-repository"))
WORK = os.environ.get("OROCHI_OPENAI_WORK", os.path.join(HERE, "..", "..", "build", "tests",
                                                         "openai"))
TOKEN = "openai-test-token"


class OpenAiEndpointTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.repository = os.path.join(WORK, "repository")
        os.makedirs(os.path.join(cls.repository, "textgen"), exist_ok=True)
        link = os.path.join(cls.repository, "textgen", "1")
        if not os.path.islink(link):
            os.symlink(os.path.join(os.path.abspath(EXAMPLES), "textgen", "1"), link)
        cls.server = Server(cls.repository, {"http": {"token_env": "OROCHI_TEST_OPENAI_TOKEN"}},
                            copies=1, env={"OROCHI_TEST_OPENAI_TOKEN": TOKEN})

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def post(self, path, body, *args):
        return curl("-N", "-X", "POST", "-H", f"Authorization: Bearer {TOKEN}", "-H",
                    "Content-Type: application/json", *args, self.server.url(path),
                    data=json.dumps(body).encode())

    def test_openai_client_library(self):
        result = subprocess.run([os.path.join(HERE, "run.sh"), WORK, self.server.url("/v1"), TOKEN],
                                capture_output=True, text=True, timeout=240)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertRegex(result.stdout, r"# pass [1-9]")
        self.assertIn("# fail 0", result.stdout)

    def test_sse_with_curl(self):
        status, head, body = self.post("/v1/completions", {
            "model": "textgen", "prompt": "You may not ", "max_tokens": 30, "temperature": 0,
            "stream": True})
        self.assertEqual(status, 200, body)
        self.assertIn("text/event-stream", head.lower())
        events = body.decode().split("\n\n")
        self.assertEqual(events[-2:], ["data: [DONE]", ""])
        chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-2]]
        self.assertTrue(all(event.startswith("data: ") for event in events[:-2]))
        text = "".join(chunk["choices"][0]["text"] for chunk in chunks)
        self.assertEqual(len(text.encode()), 30)
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")
        self.assertEqual({chunk["id"] for chunk in chunks}, {chunks[0]["id"]})
        status, _, whole = self.post("/v1/completions", {
            "model": "textgen", "prompt": "You may not ", "max_tokens": 30, "temperature": 0})
        self.assertEqual(json.loads(whole)["choices"][0]["text"], text)

    def test_first_event_before_the_end(self):
        """curl -N prints each event as it comes: the first arrives while the model generates."""
        body = json.dumps({"model": "textgen", "prompt": "Copyright", "max_tokens": 200,
                           "temperature": 0, "stream": True})
        process = subprocess.Popen(
            ["curl", "-s", "-N", "-H", f"Authorization: Bearer {TOKEN}", "-d", body,
             self.server.url("/v1/completions")], stdout=subprocess.PIPE)
        started = time.monotonic()
        first = process.stdout.readline()
        first_at = time.monotonic() - started
        rest = process.stdout.read()
        process.stdout.close()
        ended = time.monotonic() - started
        process.wait(timeout=60)
        self.assertTrue(first.startswith(b"data: {"), first)
        self.assertTrue(rest.endswith(b"data: [DONE]\n\n"), rest[-200:])
        self.assertLess(first_at, ended / 2, f"first event at {first_at:.3f}s of {ended:.3f}s")

    def test_errors_in_openai_shape(self):
        cases = [
            ({"model": "textgen", "prompt": "x", "logit_bias": {}}, 400, "logit_bias"),
            ({"model": "textgen", "prompt": ["a", "b"]}, 400, "prompt"),
            ({"model": "textgen", "prompt": "x", "n": 2}, 400, "n"),
            ({"model": "textgen", "prompt": "x", "stop": ["a", "b"]}, 400, "stop"),
            ({"model": "textgen", "prompt": "x", "temperature": 3}, 400, "temperature"),
            ({"prompt": "x"}, 400, "model"),
            ({"model": "nothing", "prompt": "x"}, 404, "model"),
        ]
        for request, expected, param in cases:
            with self.subTest(request=request):
                status, _, body = self.post("/v1/completions", request)
                self.assertEqual(status, expected, body)
                error = json.loads(body)["error"]
                self.assertEqual(set(error), {"message", "type", "param", "code"})
                self.assertEqual(error["param"], param)
                self.assertEqual(error["type"], "invalid_request_error")
        status, _, body = self.post("/v1/chat/completions", {
            "model": "textgen", "messages": [{"role": "tool", "content": "x"}]})
        self.assertEqual(status, 400, body)
        self.assertEqual(json.loads(body)["error"]["param"], "messages[0].role")
        status, _, body = curl("-H", f"Authorization: Bearer {TOKEN}", "-d", "not json",
                               self.server.url("/v1/completions"))
        self.assertEqual(status, 400, body)
        # The model's own refusal comes back in the same shape, before any event.
        status, head, body = self.post("/v1/completions", {
            "model": "textgen", "prompt": "x", "max_tokens": 100000, "stream": True})
        self.assertEqual(status, 400, body)
        self.assertIn("max_tokens", json.loads(body)["error"]["message"])

    def test_token_required(self):
        status, _, _ = curl(self.server.url("/v1/models"))
        self.assertEqual(status, 401)
        status, _, body = curl("-H", f"Authorization: Bearer {TOKEN}", self.server.url("/v1/models"))
        self.assertEqual(status, 200)
        self.assertEqual([model["id"] for model in json.loads(body)["data"]], ["textgen"])


if __name__ == "__main__":
    unittest.main()
