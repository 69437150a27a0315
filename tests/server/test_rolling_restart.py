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

import json
import tempfile
import time
import unittest

from fleet import FleetTest, LoadGenerator, free_port
from server_fixtures import Server, echo_request, pack_repository, post_json

REPLICAS = 3
LOAD_THREADS = 4
# Short, so the test stays quick; the behaviour does not depend on its length.
CONFIG = {"http": {"shutdown_delay_s": 1, "shutdown_grace_s": 10}}


def without_batch(answer: dict) -> dict:
    """The echo model's answer less its `batch` output: the size of the batch the request was
    run in, which depends on what else was queued with it."""
    return {**answer, "outputs": [o for o in answer.get("outputs", []) if o["name"] != "batch"]}


class RollingRestartTest(FleetTest):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(prefix="orochi-rolling-restart-")
        self.repository = pack_repository(self.root)  # one directory, shared by every replica

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
        expected = without_batch(json.loads(expected))  # what a replica answers directly

        def check(answer):
            if without_batch(answer) != expected:
                raise AssertionError(f"unexpected answer {answer!r}")

        load = LoadGenerator(balancer, LOAD_THREADS, "/v2/models/echo/infer", echo_request(),
                             check)
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

        tried = self.upstreams_tried()
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
