"""Replicas behind a real load balancer, for the scale-out tests: Debian's nginx on loopback in
front of several `orochi serve` processes, and a load generator that sends inferences through
it and counts every failure.

Used by test_rolling_restart (replicas restarted under load) and test_shared_repository
(replicas sharing one repository directory in poll mode).
"""

import collections
import http.client
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import unittest

from server_fixtures import Server, curl

NGINX = os.environ.get("OROCHI_NGINX", shutil.which("nginx") or "/usr/sbin/nginx")


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


class LoadGenerator:
    """Threads sending one inference through the balancer on keep-alive connections, counting
    answers (by the `model_version` that answered) and failures: anything but a 200 whose JSON
    `check` accepts (it raises AssertionError otherwise), or a transport error."""

    def __init__(self, port: int, threads: int, path: str, body: dict, check):
        self.port = port
        self.path = path
        self.body = json.dumps(body).encode()
        self.check = check
        self.lock = threading.Lock()
        self.ok = 0
        self.versions: collections.Counter = collections.Counter()
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
                connection.request("POST", self.path, self.body,
                                   {"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    raise AssertionError(f"{response.status}: {body[:200]!r}")
                answer = json.loads(body)
                self.check(answer)
                with self.lock:
                    self.ok += 1
                    self.versions[answer.get("model_version")] += 1
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


class FleetTest(unittest.TestCase):
    """Replicas (self.replicas, Server or None) and nginx in front of them, all stopped in
    tearDown; self.root is removed."""

    root: str

    def setUp(self):
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
        servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
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

    def upstreams_tried(self) -> list[list[str]]:
        """Per request nginx answered, the upstreams it tried ("$upstream_addr" of the access
        log, several when it retried; the last one answered)."""
        with open(os.path.join(self.root, "nginx", "access.log")) as log:
            return [line.split("|")[1].split(", ") for line in log.read().splitlines()]

    def wait_until_ready(self, replica: Server, timeout: float = 60):
        deadline = time.time() + timeout
        while curl(replica.url("/v2/health/ready"))[0] != 200:
            self.assertLess(time.time(), deadline, "not ready:\n" + replica.log_text())
            time.sleep(0.05)
