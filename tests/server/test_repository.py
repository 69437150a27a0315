"""The model repository API with the real server and curl: deploy, versions, zero-downtime
switches, persistence across restarts, crash safety of uploads, and authentication.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_repository
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from server_fixtures import BINARY, Server, curl, resident_kib, run_at_once  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packaging"))
from test_package_commands import hostile_cases, safetensors  # noqa: E402

CALCULATOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packaging",
                          "models", "calculator")


def make_package(root: str, version: int, bias: float, padding_bytes: int = 0,
                 broken: bool = False) -> str:
    """The calculator test model as version `version`; its second score is x[1] + bias.
    A broken one packs and validates, but its code raises on import."""
    directory = os.path.join(root, f"calculator-{version}-{bias}-{padding_bytes}-{broken}")
    shutil.copytree(CALCULATOR, directory, ignore=shutil.ignore_patterns("__pycache__"))
    if broken:
        with open(os.path.join(directory, "code", "model.py"), "a") as file:
            file.write("\nraise RuntimeError('broken on purpose')\n")
    manifest_path = os.path.join(directory, "manifest.json")
    with open(manifest_path) as file:
        manifest = json.load(file)
    manifest["version"] = version
    with open(manifest_path, "w") as file:
        json.dump(manifest, file)
    os.makedirs(os.path.join(directory, "weights"))
    with open(os.path.join(directory, "weights", "model.safetensors"), "wb") as file:
        file.write(safetensors({"linear.weight": ([2, 4], [1, 0, 0, 0, 0, 1, 0, 0]),
                                "linear.bias": ([2], [0.0, bias])}))
    if padding_bytes:
        with open(os.path.join(directory, "resources", "padding.bin"), "wb") as file:
            file.write(os.urandom(padding_bytes))  # incompressible: a big upload
    path = os.path.join(root, f"calculator-v{version}-{bias}-{padding_bytes}-{broken}.orochi")
    subprocess.run([BINARY, "pack", directory, "-o", path], check=True, capture_output=True)
    return path


INFER = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                    {"name": "text", "datatype": "BYTES", "shape": [1, 1], "data": ["hi"]}]}


class RepositoryTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-repository-test-")
        self.repository = os.path.join(self.root, "repository")
        os.makedirs(self.repository)
        self.servers = []

    def tearDown(self):
        for server in self.servers:
            if server.process.poll() is None:
                server.stop()
        shutil.rmtree(self.root)

    def start(self, config=None, preexec_fn=None):
        server = Server(self.repository, config or {}, copies=2, preexec_fn=preexec_fn)
        self.servers.append(server)
        return server

    def manage(self, server, method, path, *args, data=None, token=None):
        headers = ["-H", f"Authorization: Bearer {token}"] if token else []
        status, _, body = curl("-X", method, *headers, *args,
                               f"http://127.0.0.1:{server.management_port}{path}", data=data)
        return status, json.loads(body) if body else None

    def deploy(self, server, package, version, query="", token=None):
        headers = ["-H", f"Authorization: Bearer {token}"] if token else []
        status, _, body = curl("-T", package, *headers,
                               f"http://127.0.0.1:{server.management_port}/v2/repository/models/"
                               f"calculator/versions/{version}{query}")
        return status, json.loads(body)

    def infer(self, server, version=None):
        path = "/v2/models/calculator" + (f"/versions/{version}" if version else "") + "/infer"
        status, _, body = curl("-X", "POST", server.url(path), data=json.dumps(INFER).encode())
        return status, json.loads(body)

    def test_deploy_list_infer_switch_unload_delete(self):
        server = self.start()
        v1 = make_package(self.root, 1, bias=0.5)
        v2 = make_package(self.root, 2, bias=100.0)
        status, answer = self.deploy(server, v1, 1)
        self.assertEqual((status, answer["loaded_versions"]), (200, ["1"]), answer)
        self.assertEqual(self.manage(server, "POST", "/v2/repository/index")[1],
                         [{"name": "calculator", "version": "1", "state": "READY"}])
        status, answer = self.infer(server)
        self.assertEqual((status, answer["model_version"], answer["outputs"][0]["data"]),
                         (200, "1", [1.0, 2.5]))
        status, answer = self.deploy(server, v2, 2)
        self.assertEqual((status, answer["loaded_versions"]), (200, ["2"]))  # latest policy
        status, answer = self.infer(server)
        self.assertEqual((answer["model_version"], answer["outputs"][0]["data"]), ("2", [1.0, 102.0]))
        self.assertEqual(self.infer(server, version=1)[0], 404)
        index = self.manage(server, "POST", "/v2/repository/index")[1]
        self.assertEqual([(e["version"], e["state"]) for e in index], [("1", "UNAVAILABLE"), ("2", "READY")])

        self.assertEqual(self.manage(server, "POST", "/v2/repository/models/calculator/unload")[0], 200)
        self.assertEqual(self.infer(server)[0], 404)
        self.assertEqual(self.manage(server, "POST", "/v2/repository/models/calculator/load")[0], 200)
        self.assertEqual(self.infer(server)[1]["model_version"], "2")

        self.assertEqual(self.manage(server, "DELETE", "/v2/repository/models/calculator/versions/1")[0], 200)
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator", "1")))
        self.assertEqual(self.infer(server)[1]["model_version"], "2")
        self.assertEqual(self.manage(server, "DELETE", "/v2/repository/models/calculator")[0], 200)
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator")))
        self.assertEqual(self.infer(server)[0], 404)
        self.assertEqual(self.manage(server, "POST", "/v2/repository/index")[1], [])

    def test_load_applies_a_config_override_or_refuses_it_naming_the_field(self):
        # Triton's load with a JSON model config: what maps onto Orochi's settings is applied to
        # the versions the load loads, the rest refused, never answered 200 and ignored.
        server = self.start()
        package = make_package(self.root, 1, bias=0.5)
        self.assertEqual(self.deploy(server, package, 1, query="?load=false")[0], 200)

        def load(config=None, parameters=None):
            body = {"parameters": parameters if parameters is not None else
                    {"config": json.dumps(config)}}
            return self.manage(server, "POST", "/v2/repository/models/calculator/load",
                               data=json.dumps(body).encode())

        refusals = [
            ({"parameters": {"greeting": {"string_value": "hi"}}},
             "config: parameters is not supported by Orochi"),
            ({"max_batch_size": 4}, "config: max_batch_size 4 cannot be applied: model "
                                    "'calculator' version 1 has max_batch_size 8"),
            ({"dynamic_batching": {"priority_levels": 2}},
             "config: dynamic_batching.priority_levels is not supported"),
            ({"dynamic_batching": {"preferred_batch_size": [16]}},
             "preferred_batch_size 16 is larger than the max_batch_size 8"),
            ({"instance_group": [{"count": 1, "kind": "KIND_GPU"}]},
             "config: instance_group[0].kind is not supported"),
            ({"instance_group": [{"count": 9}]}, "instance_group count 9 is more than the "
                                                 "server's 2 interpreter copies"),
            ({"sequence_batching": {}}, "config: sequence_batching is not supported"),
            ({"name": "other"}, 'config: name "other" is not the model\'s'),
        ]
        for config, message in refusals:
            status, answer = load(config)
            self.assertEqual(status, 400, (config, answer))
            self.assertIn(message, answer["error"])
        status, answer = load(parameters={"file:1/model.py": "aW1wb3J0IG9z"})
        self.assertEqual(status, 400, answer)
        self.assertIn('parameter "file:1/model.py" is not supported', answer["error"])
        self.assertEqual(self.infer(server)[0], 404)  # nothing was loaded by the refusals

        config = {"name": "calculator", "max_batch_size": 8,
                  "dynamic_batching": {"max_queue_delay_microseconds": 1500,
                                       "preferred_batch_size": [2, 4]},
                  "instance_group": [{"count": 1}]}
        status, answer = load(config)
        self.assertEqual(status, 200, answer)
        status, _, body = curl(server.url("/v2/models/calculator/config"))
        applied = json.loads(body)
        self.assertEqual(applied["dynamic_batching"],
                         {"max_queue_delay_microseconds": 1500, "preferred_batch_size": [2, 4]})
        self.assertEqual(applied["instance_group"][0]["count"], 1)
        self.assertEqual(self.infer(server)[0], 200)
        # The same settings again: nothing to do. Others: the loaded version would keep its
        # own, so the load is refused until it is unloaded.
        self.assertEqual(load(config)[0], 200)
        status, answer = load({"instance_group": [{"count": 2}]})
        self.assertEqual(status, 409, answer)
        self.assertIn("already loaded, with instance_group count 1; unload it first",
                      answer["error"])
        self.assertEqual(self.manage(server, "POST", "/v2/repository/models/calculator/unload",
                                     data=b'{"parameters": {"unload_dependents": false}}')[0], 200)
        self.assertEqual(load({"instance_group": [{"count": 2}]})[0], 200)
        status, _, body = curl(server.url("/v2/models/calculator/config"))
        self.assertEqual(json.loads(body)["instance_group"][0]["count"], 2)
        status, answer = self.manage(server, "POST", "/v2/repository/models/calculator/unload",
                                     data=b'{"parameters": {"force": true}}')
        self.assertEqual(status, 400, answer)
        self.assertIn('parameter "force" of the unload request is not supported',
                      answer["error"])

    def test_deploy_errors(self):
        server = self.start()
        garbage = os.path.join(self.root, "garbage.orochi")
        with open(garbage, "wb") as file:
            file.write(b"not a zip" * 100)
        status, answer = self.deploy(server, garbage, 1)
        self.assertEqual(status, 400)
        self.assertIn("not a zip archive", answer["error"])
        v1 = make_package(self.root, 1, bias=0.5)
        status, answer = self.deploy(server, v1, 3)
        self.assertEqual(status, 400)
        self.assertIn("manifest says calculator version 1, but it was uploaded as calculator "
                      "version 3", answer["error"])
        self.assertEqual(self.deploy(server, v1, 1)[0], 200)
        status, answer = self.deploy(server, v1, 1)
        self.assertEqual(status, 409)
        self.assertIn("already deployed", answer["error"])
        status, _, body = curl("-T", v1, f"http://127.0.0.1:{server.management_port}"
                                         "/v2/repository/models/../versions/1")
        self.assertIn(status, (400, 404))
        # Refused by the handler before Deploy sees the file: the transport still removes it.
        status, _, body = curl("-T", v1, f"http://127.0.0.1:{server.management_port}"
                                         "/v2/repository/models/calculator/versions/0")
        self.assertEqual(status, 400, body)
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [],
                         "failed uploads leave no file")

    def test_names_that_leave_the_repository_are_refused(self):
        server = self.start()
        # What `..` would reach from the repository: <root>/1 and <root> itself.
        outside = os.path.join(self.root, "1")
        os.makedirs(outside)
        with open(os.path.join(outside, "model.orochi"), "wb") as file:
            file.write(b"not ours")
        for method, path in (("DELETE", "/v2/repository/models/../versions/1"),
                             ("DELETE", "/v2/repository/models/.."),
                             ("POST", "/v2/repository/models/../load"),
                             ("POST", "/v2/repository/models/../unload"),
                             ("POST", "/v2/repository/models/.orochi/unload"),
                             ("DELETE", "/v2/repository/models/a%2F..")):
            with self.subTest(method=method, path=path):
                status, answer = self.manage(server, method, path, "--path-as-is")
                self.assertEqual(status, 400, answer)
                self.assertIn("is not a valid model name", answer["error"])
        self.assertTrue(os.path.exists(os.path.join(outside, "model.orochi")))
        self.assertTrue(os.path.isdir(os.path.join(self.repository, ".orochi")))
        # Unloading a model the server has never heard of is a 404 and is not remembered.
        status, answer = self.manage(server, "POST", "/v2/repository/models/nope/unload")
        self.assertEqual(status, 404, answer)
        self.assertIn("model 'nope' is not in the repository", answer["error"])
        state = os.path.join(self.repository, ".orochi", "state.json")
        if os.path.exists(state):
            with open(state) as file:
                self.assertNotIn("nope", json.load(file)["unloaded"])

    def test_deleting_the_served_version_serves_the_next_one(self):
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 2, bias=2.0), 2)[0], 200)
        self.assertEqual(self.deploy(server, make_package(self.root, 3, bias=3.0), 3)[0], 200)
        self.assertEqual(self.infer(server)[1]["model_version"], "3")
        status, answer = self.manage(server, "DELETE", "/v2/repository/models/calculator/versions/3")
        self.assertEqual(status, 200, answer)
        # The latest policy picks version 2 again: the model stays served.
        status, answer = self.infer(server)
        self.assertEqual((status, answer.get("model_version")), (200, "2"), answer)
        self.assertEqual(self.manage(server, "POST", "/v2/repository/index")[1],
                         [{"name": "calculator", "version": "2", "state": "READY"}])
        self.assertEqual(server.stop(), 0)
        self.servers.remove(server)
        restarted = self.start()
        self.assertEqual(self.infer(restarted)[1]["model_version"], "2", "the same after a restart")
        # An unloaded model stays unloaded when one of its versions goes.
        self.assertEqual(self.deploy(restarted, make_package(self.root, 4, bias=4.0), 4)[0], 200)
        self.assertEqual(self.manage(restarted, "POST", "/v2/repository/models/calculator/unload")[0], 200)
        self.assertEqual(self.manage(restarted, "DELETE", "/v2/repository/models/calculator/versions/4")[0], 200)
        self.assertEqual(self.infer(restarted)[0], 404)

    def test_deleting_the_served_version_under_load_fails_no_request(self):
        # Once: 4 of 132k requests failed ("model calculator:3 is not loaded", "... is being
        # unloaded"), resolved to the version that was going between their lookup and their
        # queueing. A request that names no version goes to whichever version serves now.
        server = self.start()
        for version in (2, 3, 4, 5):
            package = make_package(self.root, version, bias=float(version))
            self.assertEqual(self.deploy(server, package, version)[0], 200)
        stop = threading.Event()
        answered, failures = [], []

        def hammer():
            while not stop.is_set():
                status, answer = self.infer(server)
                (answered if status == 200 else failures).append((status, answer))

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        try:
            for version in (5, 4, 3):  # each the served one when it goes
                time.sleep(0.3)
                status, answer = self.manage(
                    server, "DELETE", f"/v2/repository/models/calculator/versions/{version}")
                self.assertEqual(status, 200, answer)
            time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        self.assertEqual(failures, [])
        self.assertGreater(len(answered), 20)
        self.assertEqual(answered[-1][1]["model_version"], "2")

    def test_an_upload_gets_100_continue_at_once(self):
        server = self.start()
        package = make_package(self.root, 1, bias=0.5)
        self.assertGreater(os.path.getsize(package), 1024)  # curl sends Expect: 100-continue
        start = time.time()
        status, headers, body = curl("-T", package, f"http://127.0.0.1:{server.management_port}"
                                                    "/v2/repository/models/calculator/versions/1")
        self.assertEqual(status, 200, body)
        self.assertIn("HTTP/1.1 100 Continue", headers)
        self.assertLess(time.time() - start, 0.9, "curl waited 1 s for the 100")

    def test_load_false_and_upload_limit(self):
        server = self.start({"management": {"max_upload_bytes": 200000}})
        v1 = make_package(self.root, 1, bias=0.5)
        status, answer = self.deploy(server, v1, 1, query="?load=false")
        self.assertEqual((status, answer["loaded_versions"]), (200, []))
        self.assertEqual(self.manage(server, "POST", "/v2/repository/index")[1][0]["state"], "UNAVAILABLE")
        self.assertEqual(self.infer(server)[0], 404)
        big = make_package(self.root, 2, bias=0.5, padding_bytes=300000)
        status, answer = self.deploy(server, big, 2)
        self.assertEqual(status, 413)
        self.assertIn("larger than the limit of 200000 bytes", answer["error"])
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator", "2")))
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [])

    def test_zero_downtime_version_switch(self):
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        v2 = make_package(self.root, 2, bias=100.0)
        stop = threading.Event()
        seen, failures = {}, []

        def hammer(client):
            seen[client] = []
            while not stop.is_set():
                status, answer = self.infer(server)
                if status != 200:
                    failures.append((status, answer))
                else:
                    seen[client].append(answer["model_version"])

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)
        self.assertEqual(self.deploy(server, v2, 2)[0], 200)
        time.sleep(0.5)
        stop.set()
        for thread in threads:
            thread.join()
        self.assertEqual(failures, [])
        for client, versions in seen.items():
            switch = versions.index("2")
            # Each client's answers change from version 1's to version 2's exactly once.
            self.assertGreater(switch, 0, f"client {client} saw version 1")
            self.assertEqual(set(versions[:switch]), {"1"})
            self.assertEqual(set(versions[switch:]), {"2"}, f"client {client} went back to v1")

    def test_a_package_that_does_not_load_is_not_kept(self):
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        status, answer = self.deploy(server, make_package(self.root, 2, bias=0, broken=True), 2)
        self.assertEqual(status, 500, answer)
        self.assertIn("broken on purpose", answer["error"])
        self.assertIn("the package was not kept", answer["error"])
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator", "2")))
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [])
        status, answer = self.infer(server)
        self.assertEqual((status, answer["model_version"]), (200, "1"), "version 1 goes on serving")
        # Kept, the broken version would be selected at startup and stop the server starting.
        self.assertEqual(server.stop(), 0)
        self.servers.remove(server)
        restarted = self.start()
        status, answer = self.infer(restarted)
        self.assertEqual((status, answer["model_version"]), (200, "1"))

    def test_models_come_back_after_a_restart_as_they_were(self):
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        self.assertEqual(self.deploy(server, make_package(self.root, 2, bias=7.0), 2)[0], 200)
        self.assertEqual(server.stop(), 0)
        self.servers.remove(server)
        restarted = self.start()
        status, answer = self.infer(restarted)
        self.assertEqual((status, answer["model_version"]), (200, "2"))
        self.assertEqual(self.manage(restarted, "POST", "/v2/repository/models/calculator/unload")[0], 200)
        self.assertEqual(restarted.stop(), 0)
        self.servers.remove(restarted)
        again = self.start()
        self.assertEqual(self.infer(again)[0], 404, "an unloaded model stays unloaded")
        self.assertEqual(self.manage(again, "POST", "/v2/repository/index")[1][1]["state"], "UNAVAILABLE")

    def test_an_upload_cut_short_leaves_the_repository_as_it_was(self):
        server = self.start()
        big = make_package(self.root, 1, bias=0.5, padding_bytes=3_000_000)
        # The client goes away half way: the partial upload is removed at once.
        subprocess.run(["curl", "-s", "--limit-rate", "1M", "--max-time", "1", "-T", big,
                        f"http://127.0.0.1:{server.management_port}/v2/repository/models/"
                        "calculator/versions/1"], capture_output=True)
        time.sleep(0.3)
        uploads = os.path.join(self.repository, ".orochi", "uploads")
        self.assertEqual(os.listdir(uploads), [])
        # The server is killed half way: nothing visible, and the leftover goes at startup.
        uploader = subprocess.Popen(["curl", "-s", "--limit-rate", "1M", "-T", big,
                                     f"http://127.0.0.1:{server.management_port}/v2/repository/"
                                     "models/calculator/versions/1"], stdout=subprocess.DEVNULL)
        time.sleep(1.0)
        self.assertEqual(len(os.listdir(uploads)), 1, "the upload is under way")
        server.process.send_signal(signal.SIGKILL)
        server.process.wait()
        uploader.wait()
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator")))
        server.stop()
        self.servers.remove(server)
        restarted = self.start()
        self.assertEqual(os.listdir(uploads), [])
        self.assertEqual(self.manage(restarted, "POST", "/v2/repository/index")[1], [])
        self.assertEqual(self.infer(restarted)[0], 404)


    def test_a_full_disk_gives_507_and_nothing_partial(self):
        # RLIMIT_FSIZE: writes past 30 MB fail as on a full disk (the copies' own files, in
        # memory, stay under it).
        limit = 30_000_000
        server = self.start(preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,
                                                                   (limit, limit)))
        big = make_package(self.root, 1, bias=0.5, padding_bytes=40_000_000)
        status, answer = self.deploy(server, big, 1)
        self.assertEqual(status, 507, answer)
        self.assertIn("cannot store the upload", answer["error"])
        self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator")))
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [])
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200,
                         "the server is healthy and a small package still deploys")
        self.assertEqual(self.infer(server)[0], 200)

    def test_an_unload_that_cannot_be_remembered_changes_nothing(self):
        # Once: the state file could not be written (a full disk), the answer was 500, yet the
        # model was unloaded, and came back at the next restart.
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        blocker = os.path.join(self.repository, ".orochi", "state.json")
        if os.path.exists(blocker):
            os.remove(blocker)
        os.mkdir(blocker)  # a directory: the state file cannot be renamed into place
        status, answer = self.manage(server, "POST", "/v2/repository/models/calculator/unload")
        self.assertEqual(status, 500, answer)
        self.assertIn("the model stays loaded: cannot write", answer["error"])
        self.assertEqual(self.infer(server)[0], 200)
        os.rmdir(blocker)
        status, answer = self.manage(server, "POST", "/v2/repository/models/calculator/unload")
        self.assertEqual(status, 200, answer)
        self.assertEqual(self.infer(server)[0], 404)

    def metrics(self, server):
        return curl(f"http://127.0.0.1:{server.metrics_port}/metrics")[2].decode()

    def test_unload_and_load_cycles_do_not_grow_memory(self):
        # Each load used to leave behind, in every copy, the Python thread state of the thread
        # that ran it (and the frame stack chunk it had touched): 4-5 KB a copy, about 10 KB a
        # cycle with two copies, for as long as the copies lived. What remains per cycle is the
        # allocator's noise (under 1 KB measured over 150 cycles); 3 KB is a third of the leak.
        # Without the supervisor's liveness probe, whose connections (four a second) warm their
        # own pools during the first seconds of a server and would be counted here.
        server = self.start({"supervisor": {"liveness_timeout_s": 0}})
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        path = "/v2/repository/models/calculator"

        def cycles(count):
            for _ in range(count):
                self.assertEqual(self.manage(server, "POST", path + "/unload")[0], 200)
                self.assertEqual(self.manage(server, "POST", path + "/load")[0], 200)

        cycles(30)  # the allocator's pools and caches reach their working size first
        before = resident_kib(server.serving_pid)
        count = 150
        cycles(count)
        growth = (resident_kib(server.serving_pid) - before) / count
        self.assertLess(growth, 3.0, f"{growth:.1f} KB of resident memory more per cycle")
        self.assertEqual(self.infer(server)[0], 200)

    def test_metrics_alerts_can_trust(self):
        server = self.start()
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        metrics = self.metrics(server)
        # Every failure series a rule reads exists at 0 from the moment the version is known.
        for reason in ("timeout", "model_error", "queue_full", "out_of_memory", "unavailable"):
            self.assertIn(f'orochi_inference_requests_total{{model="calculator",reason="{reason}"'
                          f',version="1"}} 0', metrics)
        self.assertIn('orochi_model_loads_total{model="calculator",result="failure",version="1"} '
                      '0', metrics)
        self.assertIn('orochi_model_load_failed{model="calculator",version="1"} 0', metrics)
        # The queue's capacity beside its depth, so that an alert compares the two.
        self.assertIn('orochi_queue_capacity{model="calculator",version="1"} 1024', metrics)
        # A failed load is a state an alert can see, not only a counter that starts at 1.
        status, _ = self.deploy(server, make_package(self.root, 2, bias=0, broken=True), 2)
        self.assertEqual(status, 500)
        metrics = self.metrics(server)
        self.assertIn('orochi_model_load_failed{model="calculator",version="2"} 1', metrics)
        self.assertIn('orochi_model_loads_total{model="calculator",result="failure",version="2"} '
                      '1', metrics)
        # The upload was not kept: the series of its requests, which can never come, are gone.
        self.assertNotIn('version="2"', "\n".join(
            line for line in metrics.splitlines()
            if not line.startswith(("orochi_model_load", "#"))))
        # Requests for unknown models are counted, in one series whatever the name.
        for name in ("nope", "other"):
            self.assertEqual(curl("-X", "POST", server.url(f"/v2/models/{name}/infer"),
                                  data=b"{}")[0], 404)
        self.assertIn('orochi_inference_requests_total{model="",reason="unknown_model",'
                      'version=""} 2', self.metrics(server))
        # A replaced version's series go.
        self.assertEqual(self.deploy(server, make_package(self.root, 3, bias=3.0), 3)[0], 200)
        metrics = self.metrics(server)
        self.assertNotIn('model="calculator",reason="success",version="1"', metrics)
        self.assertIn('orochi_inference_requests_total{model="calculator",reason="success",'
                      'version="3"} 0', metrics)
        # The refused upload's load series lasted until this next load of the model, not on.
        self.assertNotIn('version="2"', metrics)

    def test_only_failed_requests_are_logged_by_default(self):
        server = self.start({"log": {"requests": "errors"}})
        self.assertEqual(self.deploy(server, make_package(self.root, 1, bias=0.5), 1)[0], 200)
        self.assertEqual(self.infer(server)[0], 200)
        self.assertEqual(curl(server.url("/v2/models/nope"))[0], 404)
        log = server.log_text()
        self.assertIn("target=/v2/models/nope status=404", log)
        self.assertNotIn("target=/v2/models/calculator/infer", log)

    def test_every_hostile_package_is_refused_over_rest(self):
        server = self.start()
        cases = hostile_cases(self.root)
        for name, path, expected in cases:
            with self.subTest(name):
                status, _, body = curl("-T", path, f"http://127.0.0.1:{server.management_port}"
                                                   "/v2/repository/models/hostile/versions/1")
                self.assertEqual(status, 400, body)
                self.assertIn(expected, json.loads(body)["error"])
        self.assertEqual(sorted(os.listdir(self.repository)), [".orochi"])
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [])

    def test_concurrent_uploads_of_one_version_one_wins(self):
        server = self.start()
        packages = [make_package(self.root, 1, bias=float(i)) for i in range(4)]
        results = run_at_once([
            lambda i=i: self.deploy(server, packages[i], 1) for i in range(4)])
        statuses = sorted(status for status, _ in results)
        self.assertEqual(statuses, [200, 409, 409, 409])
        winner = [i for i, (status, _) in enumerate(results) if status == 200][0]
        for status, answer in results:
            if status == 409:
                self.assertIn("already deployed", answer["error"])
        with open(packages[winner], "rb") as expected, \
                open(os.path.join(self.repository, "calculator", "1", "model.orochi"), "rb") as got:
            self.assertEqual(expected.read(), got.read(), "the repository holds the winner whole")
        self.assertEqual(self.infer(server)[1]["outputs"][0]["data"], [1.0, 2.0 + winner])
        self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")), [])


class AuthenticationTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-auth-test-")
        self.repository = os.path.join(self.root, "repository")
        os.makedirs(self.repository)
        self.token_file = os.path.join(self.root, "token")
        with open(self.token_file, "w") as file:
            file.write("s3cret-token\n")

    def tearDown(self):
        shutil.rmtree(self.root)

    def test_tokens_on_the_management_and_inference_ports(self):
        server = Server(self.repository, {"management": {"token_file": self.token_file},
                                          "http": {"token_file": self.token_file}})
        try:
            index = f"http://127.0.0.1:{server.management_port}/v2/repository/index"
            status, headers, body = curl("-X", "POST", index)
            self.assertEqual(status, 401)
            self.assertRegex(headers, r"(?i)www-authenticate: Bearer")
            self.assertIn("authentication required", json.loads(body)["error"])
            status, _, body = curl("-X", "POST", "-H", "Authorization: Bearer wrong", index)
            self.assertEqual((status, json.loads(body)["error"]), (403, "the bearer token is not valid"))
            status, _, body = curl("-X", "POST", "-H", "Authorization: Bearer s3cret-token", index)
            self.assertEqual((status, json.loads(body)), (200, []))
            # The scheme is case-insensitive (RFC 9110); the token is not.
            for scheme in ("bearer", "BEARER", "Bearer "):
                status, _, _ = curl("-X", "POST", "-H", f"Authorization: {scheme} s3cret-token",
                                    index)
                self.assertEqual(status, 200, scheme)
            for value in ("Bearer S3CRET-TOKEN", "Bearers3cret-token", "Basic s3cret-token",
                          "Bearer"):
                status, _, _ = curl("-X", "POST", "-H", f"Authorization: {value}", index)
                self.assertEqual(status, 403, value)
            # An upload without the token is refused before anything is stored.
            package = make_package(self.root, 1, bias=0.5)
            status, _, _ = curl("-T", package, f"http://127.0.0.1:{server.management_port}"
                                               "/v2/repository/models/calculator/versions/1")
            self.assertEqual(status, 401)
            self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator")))
            self.assertEqual(curl(server.url("/v2/health/live"))[0], 401)
            self.assertEqual(curl("-H", "Authorization: Bearer s3cret-token",
                                  server.url("/v2/health/live"))[0], 200)
            self.assertNotIn("s3cret-token", server.log_text())
        finally:
            self.assertEqual(server.stop(), 0)

    def test_repository_calls_on_the_inference_port(self):
        # Off (the default): a clear answer naming the management port, not 404.
        server = Server(self.repository, {})
        try:
            status, _, body = curl("-X", "POST", server.url("/v2/repository/index"))
            self.assertEqual(status, 403, body)
            self.assertIn(f"the model repository API is served on port {server.management_port} "
                          "(management)", json.loads(body)["error"])
            self.assertIn("http.repository_on_inference_port", json.loads(body)["error"])
            status, _, body = curl(server.url("/v2"))
            self.assertNotIn("model_repository", json.loads(body)["extensions"])
        finally:
            self.assertEqual(server.stop(), 0)
        # On, it needs the management token, which those calls must carry.
        failed = subprocess.run(
            [BINARY, "serve", "--model-repository", self.repository, "--http-port", "0",
             "--metrics-port", "0", "--management-port", "0", "--config",
             self._config({"http": {"repository_on_inference_port": True}})],
            capture_output=True, text=True, timeout=60)
        self.assertNotEqual(failed.returncode, 0)
        self.assertIn("http.repository_on_inference_port needs a management token",
                      failed.stdout + failed.stderr)
        with open(os.path.join(self.root, "inference-token"), "w") as file:
            file.write("inference-token\n")
        server = Server(self.repository, {
            "management": {"token_file": self.token_file},
            "http": {"repository_on_inference_port": True,
                     "token_file": os.path.join(self.root, "inference-token")}})
        try:
            index = server.url("/v2/repository/index")
            self.assertEqual(curl("-X", "POST", index)[0], 401)
            self.assertEqual(curl("-X", "POST", "-H", "Authorization: Bearer inference-token",
                                  index)[0], 403)
            status, _, body = curl("-X", "POST", "-H", "Authorization: Bearer s3cret-token", index)
            self.assertEqual((status, json.loads(body)), (200, []))
            package = make_package(self.root, 1, bias=0.5)
            status, _, _ = curl("-T", package, "-H", "Authorization: Bearer s3cret-token",
                                f"http://127.0.0.1:{server.management_port}"
                                "/v2/repository/models/calculator/versions/1?load=false")
            self.assertEqual(status, 200)
            auth = ["-H", "Authorization: Bearer s3cret-token"]
            status, _, body = curl("-X", "POST", *auth,
                                   server.url("/v2/repository/models/calculator/load"))
            self.assertEqual(status, 200, body)
            status, _, body = curl("-H", "Authorization: Bearer inference-token",
                                   server.url("/v2/models/calculator/ready"))
            self.assertEqual(status, 200, body)
            status, _, body = curl("-X", "POST", *auth,
                                   server.url("/v2/repository/models/calculator/unload"))
            self.assertEqual(status, 200, body)
            status, _, body = curl("-H", "Authorization: Bearer inference-token", server.url("/v2"))
            self.assertIn("model_repository", json.loads(body)["extensions"])
        finally:
            self.assertEqual(server.stop(), 0)

    def _config(self, config):
        path = os.path.join(self.root, "config.json")
        with open(path, "w") as file:
            json.dump(config, file)
        return path

    def test_an_unauthenticated_upload_is_refused_before_its_body_is_read(self):
        os.environ["OROCHI_TEST_MGMT_TOKEN"] = "s3cret-token"
        server = Server(self.repository, {"management": {"token_env": "OROCHI_TEST_MGMT_TOKEN"}})
        try:
            big = os.path.join(self.root, "5mb.bin")
            with open(big, "wb") as file:
                file.write(os.urandom(5_000_000))
            uploads = os.path.join(self.repository, ".orochi", "uploads")
            url = (f"http://127.0.0.1:{server.management_port}/v2/repository/models/evil/"
                   "versions/1")
            # Without `Expect: 100-continue` the body follows the header at once: still nothing
            # of it is stored, and the 401 arrives.
            for token, expected in ((None, 401), ("wrong", 403)):
                headers = ["-H", f"Authorization: Bearer {token}"] if token else []
                start = time.time()
                status, _, body = curl("-T", big, "-H", "Expect:", *headers, url)
                self.assertEqual(status, expected, body)
                self.assertEqual(os.listdir(uploads), [], "no upload file, not even for a moment")
                self.assertLess(time.time() - start, 3)
            # With it (curl's default), the answer comes before the body is sent.
            start = time.time()
            status, headers, _ = curl("-T", big, url)
            self.assertEqual(status, 401)
            self.assertNotIn("100 Continue", headers)
            self.assertLess(time.time() - start, 0.9, "curl waits 1 s for a 100 that never comes")
            self.assertEqual(os.listdir(uploads), [])
            self.assertFalse(os.path.exists(os.path.join(self.repository, "evil")))
            # Refusals are logged and counted like any answer.
            self.assertRegex(server.log_text(), r"request listener=management method=PUT "
                                                r"target=/v2/repository/models/evil/versions/1 "
                                                r"status=401")
            _, _, metrics = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
            self.assertRegex(metrics.decode(), r'orochi_http_requests_total\{method="PUT",'
                                               r'route="/v2/repository/models/\{model\}/versions/'
                                               r'\{version\}",status="403"\} 1')
        finally:
            del os.environ["OROCHI_TEST_MGMT_TOKEN"]
            self.assertEqual(server.stop(), 0)

    def test_an_open_management_port_needs_a_token(self):
        result = subprocess.run([BINARY, "serve", "--model-repository", self.repository,
                                 "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--management-port",
                                 "0", "--copies", "1", "--config", "/dev/stdin"],
                                input=json.dumps({"management": {"bind_address": "0.0.0.0"}}),
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 1)
        self.assertIn("the management API would listen on 0.0.0.0 without a token",
                      result.stderr)


if __name__ == "__main__":
    unittest.main()
