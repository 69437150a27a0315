"""What the server's integration tests share: the test models packed into a repository, an
`orochi serve` process on free ports, curl, the requests the tests send, and base classes for
tests that share one server or hold connections.
"""

import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

BINARY = os.environ.get("OROCHI_BINARY", os.path.join(os.path.dirname(__file__), "..", "..",
                                                      "build", "bin", "orochi"))
HERE = os.path.dirname(os.path.abspath(__file__))


def pack_model(repository: str, name: str) -> None:
    """Packs the test model models/NAME into `repository` as version 1."""
    target = os.path.join(repository, name, "1")
    os.makedirs(target)
    subprocess.run([BINARY, "pack", os.path.join(HERE, "models", name), "-o",
                    os.path.join(target, "model.orochi")], check=True, capture_output=True)


def pack_repository(root: str) -> str:
    repository = os.path.join(root, "repository")
    for name in ("echo", "slow", "extra_rows"):
        pack_model(repository, name)
    return repository


def pack_variant(root: str, name: str, code: str) -> str:
    """The slow test model's manifest around `code` (whose entry class is Hangs), as NAME."""
    source = os.path.join(root, f"{name}-source")
    shutil.rmtree(source, ignore_errors=True)  # another variant of the same name before
    shutil.copytree(os.path.join(HERE, "models", "slow"), source)
    with open(os.path.join(source, "code", "model.py"), "w") as file:
        file.write(code)
    manifest_path = os.path.join(source, "manifest.json")
    with open(manifest_path) as file:
        manifest = json.load(file)
    manifest.update(name=name, entry="model:Hangs")
    with open(manifest_path, "w") as file:
        json.dump(manifest, file)
    package = os.path.join(root, f"{name}.orochi")
    subprocess.run([BINARY, "pack", source, "-o", package], check=True, capture_output=True)
    return package


def wait_for_ports(server, process, log_path: str, timeout: float = 60) -> None:
    """Waits for the `serving` line of an `orochi serve` writing its log (text or JSON) to
    log_path, and sets the ports it names and the serving process's pid on `server`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log_path) as log:
            text = log.read()
        match = re.search(r"serving inference=http://[\d.]+:(\d+) metrics=http://[\d.]+:"
                          r"(\d+)/metrics management=http://[\d.]+:(\d+)", text)
        if match:
            server.port, server.metrics_port, server.management_port = map(int, match.groups())
            server.serving_pid = int(re.findall(r" serving .* pid=(\d+)", text)[-1])
            grpc = re.search(r" serving .* grpc=[\d.]+:(\d+)", text)
            server.grpc_port = int(grpc.group(1)) if grpc else None
            return
        match = re.search(r'"inference":"http://[\d.]+:(\d+)","level":"info","management":'
                          r'"http://[\d.]+:(\d+)","message":"serving","metrics":'
                          r'"http://[\d.]+:(\d+)/metrics"', text)  # log.format json
        if match:
            server.port, server.management_port, server.metrics_port = map(int, match.groups())
            server.serving_pid = int(re.findall(r'"message":"serving".*"pid":(\d+)', text)[-1])
            grpc = re.search(r'"grpc":"[\d.]+:(\d+)"', text)
            server.grpc_port = int(grpc.group(1)) if grpc else None
            return
        if process.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError("the server did not start:\n" + open(log_path).read())


class Server:
    """An `orochi serve` process on free ports."""

    def __init__(self, repository: str, config: dict, copies: int = 2, preexec_fn=None,
                 cwd: str | None = None, env: dict | None = None, http_port: int = 0,
                 args: tuple = (), pass_fds: tuple = ()):
        self.directory = tempfile.mkdtemp(prefix="orochi-serve-")
        config_path = os.path.join(self.directory, "config.json")
        # Every request logged, unless a test says otherwise: several read the request lines.
        config = {**config, "log": {"requests": "all", **config.get("log", {})}}
        # No shutdown delay unless a test asks for one: nothing routes to these servers through
        # a load balancer, and every stop() would otherwise wait it out.
        config["http"] = {"shutdown_delay_s": 0, **config.get("http", {})}
        with open(config_path, "w") as file:
            json.dump(config, file)
        self.log_path = os.path.join(self.directory, "serve.log")
        self.log = open(self.log_path, "w+")
        self.process = subprocess.Popen(
            [BINARY, "serve", "--config", config_path, "--model-repository", repository,
             "--http-port", str(http_port), "--grpc-port", "0", "--metrics-port", "0", "--management-port", "0",
             "--copies", str(copies), "--bind",
             "127.0.0.1", *args], stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=preexec_fn,
            pass_fds=pass_fds, cwd=cwd, env={**os.environ, **env} if env else None)
        wait_for_ports(self, self.process, self.log_path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_for_serving(self, count: int, timeout: float = 60) -> None:
        """Waits until the log says `serving` `count` times (a restarted serving process says it
        again), and notes the serving process's pid."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            pids = re.findall(r" serving .* pid=(\d+)", self.log_text())
            if len(pids) >= count:
                self.serving_pid = int(pids[-1])
                return
            time.sleep(0.02)
        raise AssertionError(f"serving was not logged {count} times:\n" + self.log_text())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.directory)
        return code

    def log_text(self) -> str:
        with open(self.log_path) as log:
            return log.read()

    def wait_for_log(self, text: str, timeout: float = 10) -> None:
        """Waits until the log holds `text`. What the serving process logs reaches the log through
        the supervisor, so a line may land just after the answer that it goes with."""
        deadline = time.time() + timeout
        while text not in self.log_text():
            if time.time() > deadline:
                raise AssertionError(f"{text!r} was not logged within {timeout} s:\n"
                                     + self.log_text()[-4000:])
            time.sleep(0.02)


def curl(*args, data: bytes | None = None):
    """(status, headers text, body bytes) of one curl call."""
    command = ["curl", "-s", "-S", "-D", "-", "--max-time", "60", *args]
    if data is not None:
        command += ["--data-binary", "@-"]
    result = subprocess.run(command, input=data, capture_output=True, timeout=90)
    raw = result.stdout
    # The last header block (curl prints one per response, e.g. after 100-continue).
    parts = raw.split(b"\r\n\r\n")
    headers_end = 0
    while raw.startswith(b"HTTP/", headers_end):
        headers_end = raw.index(b"\r\n\r\n", headers_end) + 4
        if not raw.startswith(b"HTTP/", headers_end):
            break
    del parts
    head = raw[:headers_end].decode("latin-1")
    statuses = re.findall(r"HTTP/1\.1 (\d+)", head)
    return (int(statuses[-1]) if statuses else 0), head, raw[headers_end:]


def post_json(server, path, body):
    return curl("-X", "POST", "-H", "Content-Type: application/json", server.url(path),
                data=json.dumps(body).encode())


def echo_request(rows=1, values=None):
    """A JSON request to the echo model with one value per datatype and row."""
    values = values or {}
    data = {
        "BOOL": [True, False], "UINT8": [255, 0], "INT8": [-128, 127], "INT16": [-32768, 5],
        "INT32": [2**31 - 1, -7], "INT64": [2**62 + 1, -3], "FP16": [1.5, -2.0],
        "BF16": [2.0, -0.5], "FP32": [0.25, 3.5], "FP64": [0.1, -1e300],
        "BYTES": ["héllo", ""],
    }
    inputs = []
    for datatype, sample in data.items():
        column = values.get(datatype, [sample[r % 2] for r in range(rows)])
        inputs.append({"name": f"in_{datatype.lower()}", "datatype": datatype,
                       "shape": [rows, 1], "data": column})
    return {"id": "echo-1", "inputs": inputs}


def binary_echo_request() -> tuple[bytes, bytes]:
    """A two-row echo request in the binary extension: its JSON header (the FP32 and BYTES inputs
    as binary data, out_fp32 and out_bytes asked for as binary, out_int8 as JSON) and the binary
    data that follows it (FP32 1.25, -8.0; BYTES b"\\x00\\xff", b"ab")."""
    request = echo_request(rows=2)
    binary = b""
    for entry in request["inputs"]:
        if entry["datatype"] == "FP32":
            raw = struct.pack("<2f", 1.25, -8.0)
        elif entry["datatype"] == "BYTES":
            raw = b"".join(struct.pack("<I", len(item)) + item for item in (b"\x00\xff", b"ab"))
        else:
            continue
        entry.pop("data")
        entry["parameters"] = {"binary_data_size": len(raw)}
        binary += raw
    request["outputs"] = [{"name": "out_fp32", "parameters": {"binary_data": True}},
                          {"name": "out_bytes", "parameters": {"binary_data": True}},
                          {"name": "out_int8"}]
    return json.dumps(request).encode(), binary


class SharedServerTest(unittest.TestCase):
    """Tests that share one server, started with CONFIG and COPIES, which must exit cleanly."""

    CONFIG: dict = {}
    COPIES = 2
    EXTRA_MODELS: tuple = ()  # test models served besides pack_repository's

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix=f"orochi-{cls.__name__}-")
        cls.repository = pack_repository(cls.root)
        for name in cls.EXTRA_MODELS:
            pack_model(cls.repository, name)
        cls.server = Server(cls.repository, cls.CONFIG, copies=cls.COPIES)

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        shutil.rmtree(cls.root)
        assert code == 0, f"orochi serve exited with {code}"


def slow_request(mode: str, seconds: float = 0.0, timeout_us: int | None = None) -> dict:
    body = {"inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1], "data": [mode]},
                       {"name": "seconds", "datatype": "FP64", "shape": [1], "data": [seconds]}]}
    if timeout_us is not None:
        body["parameters"] = {"timeout": timeout_us}
    return body


def metrics_text(server) -> str:
    """What the server's metrics endpoint answers now (Prometheus text format)."""
    _, _, body = curl(f"http://127.0.0.1:{server.metrics_port}/metrics")
    return body.decode()


def metric_series(server, name: str) -> dict[str, float]:
    """Every series of the metric `name`: its labels as written ('model="x",...') -> value."""
    series = {}
    for line in metrics_text(server).splitlines():
        match = re.match(rf"{name}(?:\{{(.*)\}})? (\S+)$", line)
        if match:
            series[match.group(1) or ""] = float(match.group(2))
    return series


def metric(server, name: str, **labels) -> float:
    """The sum of the series of the metric `name` that have `labels`."""
    return sum(value for written, value in metric_series(server, name).items()
               if all(f'{key}="{value}"' in written for key, value in labels.items()))


def start_upload(server, package: str, model: str, version: int = 1):
    """Uploads `package` as `model` version `version` to the management API on a thread of its
    own, so that a test can send other requests meanwhile. Returns (thread, outcome): once the
    thread is done, outcome["answer"] is curl's (status, headers, body) and outcome["seconds"]
    how long the upload took."""
    import threading
    outcome = {}

    def upload():
        began = time.time()
        outcome["answer"] = curl("-T", package, f"http://127.0.0.1:{server.management_port}"
                                 f"/v2/repository/models/{model}/versions/{version}")
        outcome["seconds"] = time.time() - began

    thread = threading.Thread(target=upload)
    thread.start()
    return thread, outcome


def run_at_once(calls) -> list:
    """Runs each zero-argument call on its own thread, released together by a barrier; returns
    their results in order (for races such as concurrent uploads of one version)."""
    import threading
    results = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i):
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def resident_kib(pid: int) -> int:
    """The resident memory of process `pid` (VmRSS of /proc/PID/status), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class HeldConnectionsTest(unittest.TestCase):
    """For tests that hold connections: the test models packed, and `self.sockets`, closed
    after each test."""

    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-connections-test-")
        self.repository = pack_repository(self.root)
        self.sockets = []

    def tearDown(self):
        for sock in self.sockets:
            sock.close()
        shutil.rmtree(self.root)


def read_until_closed(sock) -> bytes:
    """Everything `sock` receives until the other end closes (or resets) it."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def child_pids(pid: int) -> list[int]:
    children = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as file:
            children += [int(child) for child in file.read().split()]
    return children


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def tcp_inodes_on_port(port: int) -> set[str]:
    """Inodes of the TCP sockets (listening or connected) whose local port is `port`."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as file:
            for line in file.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    return inodes
