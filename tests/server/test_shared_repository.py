"""Three replicas on one shared repository directory behave as one service.

Three `orochi serve` processes in poll mode (`--model-control-mode poll`, a short
`--repository-poll-secs`) on one repository directory, behind Debian's nginx on loopback, with
inference load through nginx the whole time (the echo model throughout; the calculator model
while its versions switch). Through the management API of single replicas:

- version 2 of the calculator deployed through replica 1: every replica serves it within two
  poll intervals, no request fails during the switch, version 1 unloads everywhere;
- a package that does not load, deployed through replica 3: refused, never published, every
  replica goes on serving version 2; one that appears in the directory by other means: every
  replica reports it UNAVAILABLE with the same reason and serves version 2;
- the calculator deleted through replica 2: gone from every replica;
- the same version uploaded through replicas 1 and 2 at once: one 200, one 409 naming the
  version, and every replica serves the winner's package.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_shared_repository
"""

import json
import os
import shutil
import tempfile
import time
import unittest

from fleet import FleetTest, LoadGenerator, free_port
from server_fixtures import Server, curl, echo_request, pack_repository, run_at_once
from test_repository import INFER, make_package

REPLICAS = 3
POLL_SECONDS = 1.0
# Poll mode from the command line; the shutdown delay off (the fleet is not restarted here).
ARGS = ("--model-control-mode", "poll", "--repository-poll-secs", str(POLL_SECONDS))
CONFIG = {"http": {"shutdown_delay_s": 0}}
# The calculator's second score is x[1] + its bias (x = [1, 2, 3, 4]).
BIAS = {1: 0.5, 2: 100.0}


def calculator_check(allowed: dict):
    """A LoadGenerator check accepting the answers of the versions in `allowed` (version ->
    bias), each with its own scores."""
    def check(answer):
        version = int(answer["model_version"])
        if version not in allowed:
            raise AssertionError(f"version {version} answered: {answer!r}")
        if answer["outputs"][0]["data"] != [1.0, 2.0 + allowed[version]]:
            raise AssertionError(f"version {version} answered with other scores: {answer!r}")
    return check


class SharedRepositoryTest(FleetTest):
    def setUp(self):
        super().setUp()
        self.root = tempfile.mkdtemp(prefix="orochi-shared-repository-")
        self.repository = pack_repository(self.root)  # one directory, shared by every replica
        v1 = make_package(self.root, 1, bias=BIAS[1])
        os.makedirs(os.path.join(self.repository, "calculator", "1"))
        shutil.copy(v1, os.path.join(self.repository, "calculator", "1", "model.orochi"))

    def manage(self, replica, method, path, *args):
        status, _, body = curl("-X", method, *args,
                               f"http://127.0.0.1:{replica.management_port}{path}")
        return status, json.loads(body) if body else None

    def deploy(self, replica, package, version):
        status, _, body = curl("-T", package, f"http://127.0.0.1:{replica.management_port}"
                                              f"/v2/repository/models/calculator/versions/{version}")
        return status, json.loads(body)

    def index(self, replica):
        status, answer = self.manage(replica, "POST", "/v2/repository/index")
        self.assertEqual(status, 200, answer)
        return [entry for entry in answer if entry["name"] == "calculator"]

    def serving(self, replica):
        """(status, version, second score) of one calculator inference sent to `replica`."""
        status, _, body = curl("-X", "POST", replica.url("/v2/models/calculator/infer"),
                               data=json.dumps(INFER).encode())
        if status != 200:
            return status, None, None
        answer = json.loads(body)
        return status, answer["model_version"], answer["outputs"][0]["data"][1]

    def wait_for_every_replica(self, what: str, condition) -> float:
        """Seconds until `condition(replica)` holds on every replica; fails after two poll
        intervals, with a margin for loading the model on this loaded machine."""
        started = time.time()
        deadline = started + 2 * POLL_SECONDS + 3
        pending = list(self.replicas)
        while pending:
            pending = [replica for replica in pending if not condition(replica)]
            if pending and time.time() > deadline:
                self.fail(f"{what}: not on {len(pending)} replica(s) after "
                          f"{time.time() - started:.1f} s\n" + pending[0].log_text()[-3000:])
            time.sleep(0.05)
        elapsed = time.time() - started
        print(f"{what}: on every replica {elapsed:.2f} s later", flush=True)
        return elapsed

    def test_replicas_follow_each_other_through_the_shared_repository(self):
        ports = [free_port() for _ in range(REPLICAS)]
        for port in ports:
            self.replicas.append(Server(self.repository, CONFIG, copies=1, http_port=port,
                                        args=ARGS))
        for replica in self.replicas:
            self.wait_until_ready(replica)
            self.assertEqual(self.serving(replica), (200, "1", 2.5))
        # The repository decides what every replica serves: nothing one replica alone would do.
        status, answer = self.manage(self.replicas[0], "POST",
                                     "/v2/repository/models/calculator/unload")
        self.assertEqual(status, 400, answer)
        self.assertIn('cannot unload a model with models.model_control_mode "poll"',
                      answer["error"])
        status, _, body = curl("-T", make_package(self.root, 9, bias=0),
                               f"http://127.0.0.1:{self.replicas[0].management_port}"
                               "/v2/repository/models/calculator/versions/9?load=false")
        self.assertEqual(status, 400, body)
        self.assertIn("load=false cannot be honoured", json.loads(body)["error"])
        balancer = self.start_nginx(ports)
        echo_expected = None

        def echo_check(answer):
            outputs = {o["name"]: o["data"] for o in answer["outputs"] if o["name"] != "batch"}
            if outputs != echo_expected:
                raise AssertionError(f"unexpected answer {answer!r}")

        status, _, body = curl("-X", "POST", self.replicas[0].url("/v2/models/echo/infer"),
                               data=json.dumps(echo_request()).encode())
        self.assertEqual(status, 200, body)
        echo_expected = {o["name"]: o["data"] for o in json.loads(body)["outputs"]
                         if o["name"] != "batch"}
        echo_load = LoadGenerator(balancer, 2, "/v2/models/echo/infer", echo_request(),
                                  echo_check)
        calculator_load = LoadGenerator(balancer, 2, "/v2/models/calculator/infer", INFER,
                                        calculator_check(BIAS))
        try:
            time.sleep(0.5)
            self.assertGreater(calculator_load.count(), 0, calculator_load.failures[:3])

            # Version 2 through replica 1: served at once there, by the others within two
            # poll intervals; version 1 unloads everywhere.
            status, answer = self.deploy(self.replicas[0], make_package(self.root, 2, BIAS[2]),
                                         2)
            self.assertEqual(status, 200, answer)
            self.assertEqual(self.serving(self.replicas[0]), (200, "2", 102.0))
            self.wait_for_every_replica(
                "version 2 deployed through replica 1 serves",
                lambda replica: self.serving(replica) == (200, "2", 102.0)
                and self.index(replica) == [
                    {"name": "calculator", "version": "1", "state": "UNAVAILABLE",
                     "reason": "unloaded"},
                    {"name": "calculator", "version": "2", "state": "READY"}])
            time.sleep(0.5)
            switched = calculator_load.versions.copy()
            print(f"calculator answers through the switch: {dict(switched)}", flush=True)
            self.assertGreater(switched.get("2", 0), 0)

            # A package that does not load, through replica 3: refused, never published.
            broken = make_package(self.root, 3, bias=0, broken=True)
            status, answer = self.deploy(self.replicas[2], broken, 3)
            self.assertEqual(status, 500, answer)
            self.assertIn("broken on purpose", answer["error"])
            self.assertIn("the package was not kept", answer["error"])
            self.assertFalse(os.path.exists(os.path.join(self.repository, "calculator", "3")))

            # One that appears in the directory by other means (a copy, then a rename, as an
            # operator would place it): every replica reports it alike and serves version 2.
            placed = os.path.join(self.repository, "calculator", "4")
            os.makedirs(placed)
            shutil.copy(make_package(self.root, 4, bias=0, broken=True),
                        os.path.join(placed, ".model.orochi.partial"))
            os.rename(os.path.join(placed, ".model.orochi.partial"),
                      os.path.join(placed, "model.orochi"))

            def reports_broken(replica):
                entries = {entry["version"]: entry for entry in self.index(replica)}
                return entries.get("4", {}).get("state") == "UNAVAILABLE" and \
                    "broken on purpose" in entries["4"].get("reason", "")

            self.wait_for_every_replica("a broken version 4 placed in the directory is reported",
                                        reports_broken)
            reasons = {self.index(replica)[-1]["reason"] for replica in self.replicas}
            self.assertEqual(len(reasons), 1, f"the replicas report it differently: {reasons}")
            print(f"every replica reports version 4: {reasons}", flush=True)
            # A replica started now comes to the same answer as those that saw it appear.
            late = Server(self.repository, CONFIG, copies=1, args=ARGS)
            try:
                self.wait_until_ready(late)
                self.assertEqual(self.serving(late), (200, "2", 102.0))
                self.assertEqual({self.index(late)[-1]["reason"]}, reasons)
            finally:
                self.assertEqual(late.stop(), 0)
            time.sleep(POLL_SECONDS)  # the next polls change nothing: 2 goes on serving
            for replica in self.replicas:
                self.assertEqual(self.serving(replica), (200, "2", 102.0))
                self.assertEqual({self.index(replica)[-1]["reason"]}, reasons)
            shutil.rmtree(placed)
            self.wait_for_every_replica("the broken version 4 removed is gone from the index",
                                        lambda replica: len(self.index(replica)) == 2)

            calculator_load.stop()
            # The calculator deleted through replica 2: gone everywhere.
            status, answer = self.manage(self.replicas[1], "DELETE",
                                         "/v2/repository/models/calculator")
            self.assertEqual(status, 200, answer)
            self.wait_for_every_replica(
                "the calculator deleted through replica 2 is gone",
                lambda replica: self.serving(replica)[0] == 404 and self.index(replica) == [])

            # Concurrent uploads of one version through replicas 1 and 2: one wins.
            packages = [make_package(self.root, 1, bias=7.0), make_package(self.root, 1, bias=9.0)]
            results = run_at_once([
                lambda i=i: self.deploy(self.replicas[i], packages[i], 1) for i in range(2)])
            statuses = sorted(status for status, _ in results)
            self.assertEqual(statuses, [200, 409], results)
            winner = [i for i, (status, _) in enumerate(results) if status == 200][0]
            conflict = results[1 - winner][1]["error"]
            self.assertIn("model 'calculator' version 1 is already deployed", conflict)
            print(f"concurrent uploads: replica {winner + 1} won; the other got 409: "
                  f"{conflict}", flush=True)
            with open(packages[winner], "rb") as expected, \
                    open(os.path.join(self.repository, "calculator", "1", "model.orochi"),
                         "rb") as published:
                self.assertEqual(expected.read(), published.read(), "the winner's, whole")
            winner_score = 2.0 + (7.0, 9.0)[winner]
            self.wait_for_every_replica(
                "the winner of the concurrent uploads serves",
                lambda replica: self.serving(replica) == (200, "1", winner_score))
            time.sleep(2 * POLL_SECONDS)
            for replica in self.replicas:
                self.assertEqual(self.serving(replica), (200, "1", winner_score))
            self.assertEqual(os.listdir(os.path.join(self.repository, ".orochi", "uploads")),
                             [])
        finally:
            echo_load.stop()
            calculator_load.stop()

        print(f"under load through nginx: echo {echo_load.count()} answered, "
              f"{len(echo_load.failures)} failed; calculator {calculator_load.count()} answered "
              f"({dict(calculator_load.versions)}), {len(calculator_load.failures)} failed",
              flush=True)
        self.assertEqual(echo_load.failures, [], "\n".join(echo_load.failures[:3]))
        self.assertEqual(calculator_load.failures, [], "\n".join(calculator_load.failures[:3]))
        self.assertGreater(echo_load.count(), 50)
        for replica in self.replicas:
            self.assertEqual(replica.stop(), 0)
        self.replicas = []


if __name__ == "__main__":
    unittest.main()
