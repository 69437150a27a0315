"""What the system and CUDA shared-memory tests share: one server per test class with shared
memory allowed, the HTTP calls of one extension, and the parameters that name a region."""

import json
import shutil
import tempfile

from server_fixtures import Server, curl, echo_request, pack_repository, post_json


def shm(region: str, byte_size: int, offset: int | None = None) -> dict:
    """The parameters of an input or output that lies in the registered `region`."""
    parameters = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset is not None:
        parameters["shared_memory_offset"] = offset
    return parameters


def fp32_input_in_region(parameters: dict, shape: list[int] | None = None,
                         data: list | None = None) -> dict:
    """An echo request (one row) whose in_fp32 input is read from shared memory as `parameters`
    say, with `shape` where given; `data` beside the parameters, where given, is a refusal."""
    request = echo_request(1)
    for item in request["inputs"]:
        if item["name"] == "in_fp32":
            del item["data"]
            item["parameters"] = parameters
            if shape is not None:
                item["shape"] = shape
            if data is not None:
                item["data"] = data
    return request


class SharedMemoryServer:
    """Mixed into a unittest.TestCase: a server (two copies, shared memory allowed) for the
    class's tests, whose regions of EXTENSION ("systemsharedmemory" or "cudasharedmemory") are
    unregistered after each test."""

    EXTENSION = ""
    CONFIG: dict = {"http": {"allow_shared_memory": True}}

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix=f"orochi-{cls.EXTENSION}-")
        cls.server = Server(pack_repository(cls.root), cls.CONFIG, copies=2)

    @classmethod
    def tearDownClass(cls):
        # Regions still registered are the server's to close as it exits: it must exit cleanly.
        code = cls.server.stop()
        shutil.rmtree(cls.root)
        assert code == 0, f"orochi serve exited with {code}"

    def tearDown(self):
        self.post(f"/v2/{self.EXTENSION}/unregister")

    def get(self, path):
        status, _, body = curl(self.server.url(path))
        return status, json.loads(body)

    def post(self, path, body=None):
        status, _, answer = curl("-X", "POST", self.server.url(path),
                                 data=b"" if body is None else json.dumps(body).encode())
        return status, json.loads(answer)

    def register_region(self, name: str, body: dict):
        """POSTs `body` to the extension's register endpoint for `name`."""
        return self.post(f"/v2/{self.EXTENSION}/region/{name}/register", body)

    def infer(self, body, model="echo"):
        status, _, answer = post_json(self.server, f"/v2/models/{model}/infer", body)
        return status, json.loads(answer)
