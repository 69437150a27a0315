"""A rolling restart of three replicas behind a real load balancer loses no request.

Three `orochi serve` processes on one shared repository directory, behind Debian's nginx on
loopback, with inference load running through nginx the whole time. Each replica in turn gets
SIGTERM, is waited for (it must exit 0), is started again on the same port and waited for until
ready. Every request the load generator sent must have been answered 200 with the model's
output.

What makes it lossless: during `http.shutdown_delay_s` a stopping replica still accepts and
serves; once it stops accepting, nginx's `proxy_next_upstream` sends what it could not deliver
(connection refused, or reset while queued in the closed listener's backlog) to another
replica. `non_idempotent` is needed for the latter: nginx would not retry a POST it had already
written to a socket, and a KServe v2 inference has no side effects that would make a retry
wrong.
"""

import http.client
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import unittest

from server_fixtures import Server, curl, echo_request, pack_repository, post_json

NGINX = os.environ.get("OROCHI_NGINX", shutil.which("nginx") or "/usr/sbin/nginx")
REPLICAS = 3
LOAD_THREADS = 4
# Short, so the test stays quick; the behaviour does not depend on its length.
CONFIG = {"http": {"shutdown_delay_s": 1, "shutdown_grace_s": 10}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


NGINX_CONF = """
{user}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    log_format upstreams '$status|$upstream_addr|$upstream_status';
    access_log {prefix}/access.log upstreams;
    upstream orochi {{
        # A replica that refused a connection is left alone for a moment, then tried again:
        # by then it is usually back.
{servers}
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://orochi;
            proxy_next_upstream error timeout non_idempotent;
            proxy_next_upstream_timeout 10s;
            proxy_connect_timeout 2s;
            proxy_read_timeout 30s;
        }}
    }}
}}
"""


def without_batch(answer: dict) -> dict:
    """The echo model's answer less its `batch` output: the size of the batch the request was
    run in, which depends on what else was queued with it."""
    return {**answer, "outputs": [o for o in answer.get("outputs", []) if o["name"] != "batch"]}


class LoadGenerator:
    """Threads sending echo inferences through the balancer on keep-alive connections, counting
    answers and failures (anything but a 200 with the model's outputs, or a transport error)."""

    def __init__(self, port: int, threads: int, expected: dict):
        self.port = port
        self.body = json.dumps(echo_request()).encode()
        self.expected = without_batch(expected)  # what a replica answers directly
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.running = True
        self.threads = [threading.Thread(target=self.run) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def run(self):
        connection = None
        while self.running:
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                connection.request("POST", "/v2/models/echo/infer", self.body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    raise AssertionError(f"{response.status}: {body[:200]!r}")
                if without_batch(json.loads(body)) != self.expected:
                    raise AssertionError(f"unexpected answer ({len(body)} bytes) {body!r}")
                with self.lock:
                    self.ok += 1
            except Exception as error:  # every kind of failure counts
                with self.lock:
                    self.failures.append(f"{time.strftime('%T')} {error!r}")
                if connection is not None:
                    connection.close()
                connection = None
        if connection is not None:
            connection.close()

    def count(self) -> int:
        with self.lock:
            return self.ok

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join(timeout=60)


class RollingRestartTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp(prefix="orochi-rolling-restart-")
        self.repository = pack_repository(self.root)  # one directory, shared by every replica
        self.replicas: list[Server | None] = []
        self.nginx = None

    def tearDown(self):
        if self.nginx is not None and self.nginx.poll() is None:
            self.nginx.terminate()
            self.nginx.wait(timeout=30)
        for replica in self.replicas:
            if replica is not None and replica.process.poll() is None:
                replica.process.kill()
                replica.process.wait()
        shutil.rmtree(self.root)

    def start_nginx(self, ports: list[int]) -> int:
        prefix = os.path.join(self.root, "nginx")
        os.makedirs(prefix)
        port = free_port()
        # max_fails=0: a replica that reset one connection while closing is not taken out of
        # the rotation for a while; with every replica restarted within seconds, those pauses
        # overlapped and left nginx with no upstream at all. Retries (proxy_next_upstream) are
        # what carry a refused request to another replica.
        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;"
                            for p in ports)
        # As root, the workers would otherwise run as nobody and could not use the temp paths.
        user = "user root;" if os.geteuid() == 0 else ""
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as file:
            file.write(NGINX_CONF.format(user=user, prefix=prefix, servers=servers, port=port))
        self.nginx = subprocess.Popen([NGINX, "-p", prefix, "-c", conf],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while curl(f"http://127.0.0.1:{port}/v2/health/live")[0] != 200:
            self.assertIsNone(self.nginx.poll(), "nginx did not start: " + self.nginx_errors())
            self.assertLess(time.time(), deadline, "nginx did not answer: " + self.nginx_errors())
            time.sleep(0.1)
        return port

    def nginx_errors(self) -> str:
        path = os.path.join(self.root, "nginx", "error.log")
        return open(path).read() if os.path.exists(path) else ""

    def wait_until_ready(self, replica: Server, timeout: float = 60):
        deadline = time.time() + timeout
        while curl(replica.url("/v2/health/ready"))[0] != 200:
            self.assertLess(time.time(), deadline, "not ready:\n" + replica.log_text())
            time.sleep(0.05)

    def test_rolling_restart_under_load_fails_no_request(self):
        ports = [free_port() for _ in range(REPLICAS)]
        for port in ports:
            self.replicas.append(Server(self.repository, CONFIG, http_port=port))
        for replica in self.replicas:
            self.wait_until_ready(replica)
        balancer = self.start_nginx(ports)

        status, _, expected = post_json(self.replicas[0], "/v2/models/echo/infer",
                                        echo_request())
        self.assertEqual(status, 200, expected)
        load = LoadGenerator(balancer, LOAD_THREADS, json.loads(expected))
        try:
            time.sleep(1)
            before = load.count()
            self.assertGreater(before, 0, "no load went through: " + str(load.failures[:5]))
            started = time.time()
            for index, port in enumerate(ports):
                replica = self.replicas[index]
                stop_started = time.time()
                code = replica.stop()  # SIGTERM to the supervisor, then waits for its exit
                self.replicas[index] = None
                stopped_in = time.time() - stop_started
                self.assertEqual(code, 0, f"replica {index} exited with {code}")
                # Within delay + grace, with room for a loaded machine.
                self.assertLess(stopped_in, 1 + 10 + 5)
                restarted = Server(self.repository, CONFIG, http_port=port)
                self.replicas[index] = restarted
                self.wait_until_ready(restarted)
                print(f"replica {index} (port {port}): stopped in {stopped_in:.1f} s, ready "
                      f"{time.time() - stop_started:.1f} s after SIGTERM; "
                      f"{load.count()} answered so far", flush=True)
            rolled_in = time.time() - started
            during = load.count() - before
            time.sleep(1)  # load on the restarted fleet too
        finally:
            load.stop()
        total = load.count()

        with open(os.path.join(self.root, "nginx", "access.log")) as log:
            lines = log.read().splitlines()
        # "$status|$upstream_addr|$upstream_status", with several upstreams ("a, b") when nginx
        # retried; the last one answered.
        tried = [line.split("|")[1].split(", ") for line in lines]
        retried = sum(1 for upstreams in tried if len(upstreams) > 1)
        served_by = {port: sum(1 for upstreams in tried if upstreams[-1] == f"127.0.0.1:{port}")
                     for port in ports}
        print(f"rolling restart of {REPLICAS} replicas in {rolled_in:.1f} s under load: "
              f"{total} requests answered ({during} during the restart), "
              f"{len(load.failures)} failed, {retried} retried by nginx on another replica",
              flush=True)
        nginx_errors = "\n".join(line for line in self.nginx_errors().splitlines()
                                 if "no live upstreams" not in line)
        self.assertEqual(load.failures, [],
                         "\n".join(load.failures[:3]) + "\n" + nginx_errors[-3000:])
        self.assertGreater(during, 10 * REPLICAS, "too little load ran during the restart")
        for port, count in served_by.items():
            self.assertGreater(count, 0, f"the replica on port {port} served nothing")
        for replica in self.replicas:
            self.assertEqual(replica.stop(), 0)
        self.replicas = []


if __name__ == "__main__":
    unittest.main()
