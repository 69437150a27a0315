"""The monitoring stack of docker/ against the real thing: promtool checks the alert rules and runs
their unit tests, and a real Prometheus scrapes a real `orochi serve` through successes, bad
requests, a model crash, a failed upload, a copy stuck in C code and a streaming model's streams;
then every query of the Grafana dashboard and every alert rule is evaluated through Prometheus's
HTTP API, and the alerts those events must raise are checked to fire (and the others not to).

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_monitoring
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(TESTS, "server"))
from server_fixtures import (BINARY, HERE as SERVER_TESTS, Server, curl, echo_request,  # noqa: E402
                         pack_repository, post_json, slow_request)
from streaming_models import write_packages  # noqa: E402
from test_repository import make_package  # noqa: E402

ROOT = os.path.dirname(TESTS)
PROMETHEUS_DIR = os.path.join(ROOT, "docker", "prometheus")
ALERTS = os.path.join(PROMETHEUS_DIR, "alerts.yml")
DASHBOARD = os.path.join(ROOT, "docker", "grafana", "dashboards", "orochi.json")
DATASOURCE = {"type": "prometheus", "uid": "orochi-prometheus"}
ROWS = ["Traffic", "Latency", "Batching and queues", "Streaming", "Copies", "Models", "Process",
        "GPU"]
ALERT_NAMES = {"OrochiDown", "OrochiModelLoadFailed", "OrochiHighErrorRatio",
               "OrochiQueueSaturated", "OrochiCopiesReplaced", "OrochiCopiesStuck",
               "OrochiServerRestarted", "OrochiModelCrashed"}
# What the events below raise; OrochiDown and OrochiQueueSaturated must stay quiet.
EXPECTED_FIRING = ALERT_NAMES - {"OrochiDown", "OrochiQueueSaturated"}
# The alert rules' windows (10 and 15 minutes, 5 for the error ratio) in the fast copy. The events
# must come within this much of the check, and Prometheus must have scraped the server for longer
# than this before them (the rules that look back with `offset` need it).
WINDOW_S = 25
RATE_INTERVAL = "30s"  # what Grafana's $__rate_interval stands for here


def promtool(*args, cwd=None):
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def metric_names(expr: str) -> set:
    """The metrics a PromQL expression selects."""
    names = set(re.findall(r"\b(?:orochi|process)_[a-z_]+\b", expr))
    if re.search(r"\bup\b", expr):
        names.add("up")
    return names


def dashboard_targets(dashboard: dict):
    """(row title, panel, target) for every query of the dashboard."""
    row = None
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel.get("targets", []):
            yield row, panel, target


def substitute(expr: str, model: str, version: str) -> str:
    return (expr.replace("$__rate_interval", RATE_INTERVAL).replace("$model", model)
            .replace("$version", version))


def selections(row: str):
    """The (model, version) selections a row's queries are checked with: every model, and one
    model that has the row's series (only streaming models have the Streaming row's)."""
    return ((".*", ".*"), ("tokens" if row == "Streaming" else "echo", "1"))


def optional(expr: str) -> bool:
    """GPU series (other than orochi_gpus) are absent without a GPU and NVML."""
    return re.search(r"\borochi_gpu_", expr) is not None


class StaticTest(unittest.TestCase):
    """The files themselves: promtool's checks and unit tests, the dashboard's structure."""

    @classmethod
    def setUpClass(cls):
        with open(DASHBOARD) as file:
            cls.dashboard = json.load(file)

    def test_promtool_checks_the_rules_and_the_config(self):
        result = promtool("check", "rules", ALERTS)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("SUCCESS: 8 rules found", result.stdout)
        result = promtool("check", "config", os.path.join(PROMETHEUS_DIR, "prometheus.yml"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_promtool_unit_tests_of_the_alerts(self):
        result = promtool("test", "rules", "alerts_test.yml", cwd=PROMETHEUS_DIR)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("SUCCESS", result.stdout)
        # Every alert is tested firing.
        with open(os.path.join(PROMETHEUS_DIR, "alerts_test.yml")) as file:
            tests = file.read()
        tested = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:", tests))
        self.assertEqual(tested, ALERT_NAMES)

    def test_every_alert_has_for_severity_summary_and_description(self):
        with open(ALERTS) as file:
            rules = re.split(r"\n      - alert: ", file.read())[1:]
        self.assertEqual({rule.split("\n")[0] for rule in rules}, ALERT_NAMES)
        for rule in rules:
            name = rule.split("\n")[0]
            self.assertRegex(rule, r"\n        for: \d+[smh]\n", name)
            self.assertRegex(rule, r"\n          severity: (critical|warning)\n", name)
            self.assertRegex(rule, r"\n          summary: ", name)
            self.assertRegex(rule, r"\n          description: ", name)
            if "orochi_model_load_failed" in rule or "orochi_queue_depth" in rule or \
                    "orochi_inference_requests_total" in rule:
                self.assertIn("{{ $labels.model }} version {{ $labels.version }}", rule, name)

    def test_dashboard_structure(self):
        dashboard = self.dashboard
        self.assertGreaterEqual(dashboard["schemaVersion"], 36)
        panels = dashboard["panels"]
        ids = [panel["id"] for panel in panels]
        self.assertEqual(len(ids), len(set(ids)), "panel ids are unique")
        self.assertEqual([p["title"] for p in panels if p["type"] == "row"], ROWS)
        cells = {}
        for panel in panels:
            grid = panel["gridPos"]
            self.assertEqual(set(grid), {"h", "w", "x", "y"}, panel["title"])
            self.assertLessEqual(grid["x"] + grid["w"], 24, panel["title"])
            for x in range(grid["x"], grid["x"] + grid["w"]):
                for y in range(grid["y"], grid["y"] + grid["h"]):
                    self.assertNotIn((x, y), cells,
                                     f"{panel['title']} overlaps {cells.get((x, y))}")
                    cells[(x, y)] = panel["title"]
            if panel["type"] == "row":
                continue
            self.assertEqual(panel["datasource"], DATASOURCE, panel["title"])
            self.assertTrue(panel["targets"], panel["title"])
            refs = [target["refId"] for target in panel["targets"]]
            self.assertEqual(len(refs), len(set(refs)), panel["title"])
        for _, panel, target in dashboard_targets(dashboard):
            self.assertEqual(target["datasource"], DATASOURCE, panel["title"])
            self.assertTrue(target["expr"].strip(), panel["title"])
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        self.assertEqual(set(variables), {"model", "version"})
        for variable in variables.values():
            self.assertEqual(variable["datasource"], DATASOURCE)
            self.assertRegex(variable["definition"], r"^label_values\(.+, \w+\)$")

    def test_metrics_named_in_queries_are_documented(self):
        with open(os.path.join(ROOT, "docs", "METRICS.md")) as file:
            documented = set(re.findall(r"^\| `(\w+)` \|", file.read(), re.MULTILINE))
        with open(ALERTS) as file:
            exprs = [file.read()]
        exprs += [target["expr"] for _, _, target in dashboard_targets(self.dashboard)]
        for expr in exprs:
            for name in metric_names(expr) - {"up"}:
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                self.assertTrue(name in documented or base in documented, name)


class LiveTest(unittest.TestCase):
    """A real Prometheus scraping a real server every second, with a fast copy of alerts.yml."""

    @classmethod
    def setUpClass(cls):
        cls.root = tempfile.mkdtemp(prefix="orochi-monitoring-test-")
        cls.server = cls.prometheus = cls.prometheus_log = None
        try:
            cls.start()
            cls.generate_events()
            cls.collect()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.stop_load = True
        if cls.prometheus is not None and cls.prometheus.poll() is None:
            cls.prometheus.terminate()
            cls.prometheus.wait(timeout=30)
        if cls.prometheus_log is not None:
            cls.prometheus_log.close()
        if cls.server is not None:
            cls.server.stop()
        shutil.rmtree(cls.root, ignore_errors=True)

    # --- setting up ---------------------------------------------------------------------------

    @classmethod
    def start(cls):
        repository = pack_repository(cls.root)
        target = os.path.join(repository, "hostile", "1")
        os.makedirs(target)
        subprocess.run([BINARY, "pack", os.path.join(SERVER_TESTS, "models", "hostile"), "-o",
                        os.path.join(target, "model.orochi")], check=True, capture_output=True)
        target = os.path.join(repository, "tokens", "1")
        os.makedirs(target)
        subprocess.run([BINARY, "pack", write_packages(cls.root)["tokens"], "-o",
                        os.path.join(target, "model.orochi")], check=True, capture_output=True)
        cls.broken_package = make_package(cls.root, 1, bias=0, broken=True)
        # A stuck copy is replaced 300 ms after its deadline.
        cls.server = Server(repository, {"models": {"execution_grace_ms": 300}}, copies=2)

        # The repository's alerts.yml as it is, and a fast copy of it (group `orochi-fast`) whose
        # alerts are checked to fire: every `for:` is 0s, and every range and offset is WINDOW_S,
        # since the real ones (1 to 5 minutes pending, 10 and 15 minutes of window) would make
        # this test last half an hour. Only the copy's alerts can fire within the test.
        with open(ALERTS) as file:
            rules = file.read()
        fast, fors = re.subn(r"\n(\s+)for: \S+\n", r"\n\1for: 0s\n", rules)
        fast, ranges = re.subn(r"\[\d+[smh]\]", f"[{WINDOW_S}s]", fast)
        fast, offsets = re.subn(r"\boffset \d+[smh]\b", f"offset {WINDOW_S}s", fast)
        fast = fast.replace("  - name: orochi\n", "  - name: orochi-fast\n")
        assert fors == len(ALERT_NAMES) and ranges >= 5 and offsets >= 2, (fors, ranges, offsets)
        fast_alerts = os.path.join(cls.root, "alerts-fast.yml")
        with open(fast_alerts, "w") as file:
            file.write(fast)
        cls.fast_alerts = fast_alerts

        config = os.path.join(cls.root, "prometheus.yml")
        with open(config, "w") as file:
            json.dump({  # JSON is YAML
                "global": {"scrape_interval": "1s", "scrape_timeout": "900ms",
                           "evaluation_interval": "1s"},
                "rule_files": [ALERTS, fast_alerts],
                "scrape_configs": [{"job_name": "orochi", "static_configs": [
                    {"targets": [f"127.0.0.1:{cls.server.metrics_port}"]}]}],
            }, file)
        cls.prometheus_log = open(os.path.join(cls.root, "prometheus.log"), "w+")
        # The port free_port found may be taken by another test's server before Prometheus binds
        # it (tests run in parallel): Prometheus then exits, and starts again on another port.
        for attempt in range(3):
            port = free_port()
            cls.prometheus_url = f"http://127.0.0.1:{port}"
            cls.prometheus = subprocess.Popen(
                ["prometheus", f"--config.file={config}",
                 f"--storage.tsdb.path={os.path.join(cls.root, 'prometheus-data')}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=cls.prometheus_log, stderr=subprocess.STDOUT)
            try:
                cls.wait_for(lambda: cls.query('up{job="orochi"} == 1'), 30, "the first scrape")
                break
            except AssertionError:
                if cls.prometheus.poll() is None or attempt == 2:
                    raise
        cls.first_scrape = time.time()

    @classmethod
    def api(cls, path: str, **params):
        url = cls.prometheus_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:  # 400 for a query that does not parse
            body = error.read()
            try:
                return json.loads(body)
            except ValueError:  # not Prometheus's answer: something else has the port
                return {"status": "not prometheus", "body": body[:200].decode(errors="replace")}
        except (urllib.error.URLError, ConnectionError):
            return {"status": "unreachable"}

    @classmethod
    def query(cls, expr: str):
        """The result of an instant query; None when it failed."""
        answer = cls.api("/api/v1/query", query=expr)
        return answer["data"]["result"] if answer.get("status") == "success" else None

    @classmethod
    def wait_for(cls, condition, timeout: float, what: str):
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = condition()
            if value:
                return value
            if cls.prometheus.poll() is not None:
                break
            time.sleep(0.25)
        cls.prometheus_log.seek(0)
        raise AssertionError(f"timed out waiting for {what}; prometheus log:\n"
                             + cls.prometheus_log.read()[-4000:])

    # --- the events -----------------------------------------------------------------------------

    @classmethod
    def echo_load(cls):
        """Successful requests, ten a second, for the whole test (through the restart too)."""
        while not cls.stop_load:
            post_json(cls.server, "/v2/models/echo/infer", echo_request(rows=3))
            time.sleep(0.1)

    @classmethod
    def generate_events(cls):
        server = cls.server
        cls.stop_load = False
        threading.Thread(target=cls.echo_load, daemon=True).start()
        for _ in range(3):
            status, _, body = post_json(server, "/v2/models/slow/infer",
                                        slow_request("sleep", 0.05))
            assert status == 200, body
        status, _, _ = curl("-X", "POST", server.url("/v2/models/nope/infer"), data=b"{}")
        assert status == 404, status  # counted as model="", reason="unknown_model"
        # Long enough for the rules that look back WINDOW_S to see the server before the events.
        time.sleep(max(0.0, cls.first_scrape + WINDOW_S + 2 - time.time()))

        # A native crash in model code: the supervisor restarts the serving process.
        status, _, _ = post_json(server, "/v2/models/hostile/infer", {"inputs": [
            {"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["segfault"]}]})
        assert status == 0, status  # no answer: the process died
        server.wait_for_serving(2)
        cls.events_start = time.time()
        # Streams of a streaming model (after the restart, which starts its metrics afresh).
        for _ in range(3):
            status, _, body = post_json(server, "/v2/models/tokens/generate_stream",
                                        {"text_input": "x", "max_tokens": 4, "delay_s": 0.01})
            assert status == 200 and body.count(b"data: ") == 4, body
        # A bad request (1 in ~100 of echo's), model errors and a failed upload.
        bad = echo_request()
        bad["inputs"][0]["shape"] = [7, 1]
        status, _, body = post_json(server, "/v2/models/echo/infer", bad)
        assert status == 400, body
        for _ in range(2):
            status, _, body = post_json(server, "/v2/models/slow/infer", slow_request("fail"))
            assert status == 500, body
        status, _, body = curl("-T", cls.broken_package,
                               f"http://127.0.0.1:{server.management_port}"
                               "/v2/repository/models/calculator/versions/1")
        assert status == 500 and b"broken on purpose" in body, body
        # Last, as it takes a core for good: a copy stuck in C code past its deadline, replaced
        # and abandoned.
        status, _, body = post_json(server, "/v2/models/slow/infer",
                                    slow_request("block", timeout_us=200000))
        assert status == 504, body

    @classmethod
    def collect(cls):
        """Waits for Prometheus to scrape and evaluate it all, then takes the alerts and the
        answer to every query at once (the fast rules forget the events after WINDOW_S)."""
        for expr in ('orochi_interpreter_copies{state="abandoned"} > 0',
                     'orochi_copies_replaced_total > 0',
                     'orochi_model_load_failed{model="calculator"} == 1',
                     'orochi_model_crashes_total{model="hostile"} > 0',
                     # The streams, in a scrape after them (their series are there, at 0, from
                     # the load on, so one scrape is enough for rate()).
                     'increase(orochi_stream_responses_total{model="tokens"}[30s]) > 0'):
            cls.wait_for(lambda: cls.query(expr), 15, expr)

        def firing():
            answer = cls.api("/api/v1/alerts")
            alerts = answer["data"]["alerts"] if answer.get("status") == "success" else []
            names = {a["labels"]["alertname"] for a in alerts if a["state"] == "firing"}
            return alerts if EXPECTED_FIRING <= names else None
        try:
            cls.alerts = cls.wait_for(firing, 15, "the alerts to fire")
        except AssertionError:
            cls.alerts = cls.api("/api/v1/alerts")["data"]["alerts"]
        cls.rules = cls.api("/api/v1/rules")["data"]["groups"]
        with open(DASHBOARD) as file:
            cls.dashboard = json.load(file)
        cls.answers = {}
        for row, _, target in dashboard_targets(cls.dashboard):
            for model, version in selections(row):
                expr = substitute(target["expr"], model, version)
                cls.answers[expr] = cls.api("/api/v1/query", query=expr)
        for group in cls.rules:
            for rule in group["rules"]:
                cls.answers[rule["query"]] = cls.api("/api/v1/query", query=rule["query"])
        cls.collected_within = time.time() - cls.events_start
        cls.stop_load = True

    # --- the checks ---------------------------------------------------------------------------

    def test_the_events_were_checked_within_the_fast_rules_window(self):
        self.assertLess(self.collected_within, WINDOW_S)

    def test_every_alert_rule_loaded_with_its_labels_and_annotations(self):
        groups = {(os.path.basename(g["file"]), g["name"]): g for g in self.rules}
        self.assertEqual(set(groups), {("alerts.yml", "orochi"),
                                       ("alerts-fast.yml", "orochi-fast")})
        for group in groups.values():
            self.assertEqual({rule["name"] for rule in group["rules"]}, ALERT_NAMES)
            for rule in group["rules"]:
                self.assertEqual(rule["health"], "ok", rule)
                self.assertIn(rule["labels"]["severity"], ("critical", "warning"))
                self.assertEqual(set(rule["annotations"]), {"summary", "description"})
        real = groups[("alerts.yml", "orochi")]["rules"]
        self.assertTrue(all(rule["duration"] >= 60 for rule in real), real)

    def test_the_expected_alerts_fire_and_name_what_failed(self):
        firing = {}
        for alert in self.alerts:
            if alert["state"] == "firing":
                firing.setdefault(alert["labels"]["alertname"], []).append(alert)
        self.assertEqual(set(firing), EXPECTED_FIRING, json.dumps(self.alerts, indent=1))
        self.assertEqual([(a["labels"]["model"], a["labels"]["version"])
                          for a in firing["OrochiModelLoadFailed"]], [("calculator", "1")])
        self.assertIn("Model calculator version 1 failed to load",
                      firing["OrochiModelLoadFailed"][0]["annotations"]["summary"])
        # slow's errors (2 of its few requests in the window) but not echo's (1 in ~100).
        self.assertEqual([(a["labels"]["model"], a["labels"]["version"])
                          for a in firing["OrochiHighErrorRatio"]], [("slow", "1")])
        self.assertEqual([a["labels"]["model"] for a in firing["OrochiModelCrashed"]], ["hostile"])
        self.assertEqual([a["value"] for a in firing["OrochiCopiesStuck"]], ["1e+00"])
        for alerts in firing.values():
            for alert in alerts:
                self.assertIn(alert["labels"]["severity"], ("critical", "warning"))
                self.assertNotIn("{{", alert["annotations"]["description"])
        # The real rules wait before firing; none has yet.
        self.assertFalse([a for a in self.alerts
                          if a["labels"]["alertname"] in ("OrochiDown", "OrochiQueueSaturated")])

    def test_every_alert_expression_evaluates(self):
        for group in self.rules:
            for rule in group["rules"]:
                answer = self.answers[rule["query"]]
                with self.subTest(f"{group['name']} / {rule['name']}: {rule['query']}"):
                    self.assertEqual(answer.get("status"), "success", answer)
                    if group["name"] == "orochi-fast":
                        expected = rule["name"] in EXPECTED_FIRING
                        self.assertEqual(bool(answer["data"]["result"]), expected)
                    for name in metric_names(rule["query"]):
                        self.assertTrue(self.query(f"count({name})"), f"no series {name}")

    def test_every_dashboard_query_returns_data(self):
        for row, panel, target in dashboard_targets(self.dashboard):
            for model, version in selections(row):
                expr = substitute(target["expr"], model, version)
                answer = self.answers[expr]
                where = f"{row} / {panel['title']} / {target['refId']}: {expr}"
                with self.subTest(where):
                    self.assertEqual(answer.get("status"), "success", answer)
                    self.assertEqual(answer["data"]["resultType"], "vector")
                    result = answer["data"]["result"]
                    if optional(expr):
                        continue  # GPU series: present only on a machine with a GPU
                    if model == "echo" and "orochi_model_crashes_total" in expr:
                        # echo never crashed: its series exists, at 0 (known since its load)
                        self.assertEqual([r["value"][1] for r in result], ["0"])
                        continue
                    self.assertTrue(result, "no data")

    def test_the_dashboard_variables_list_the_models_and_versions(self):
        values = {}
        for variable in self.dashboard["templating"]["list"]:
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["definition"])
            selector = substitute(match.group(1), ".*", ".*")
            answer = self.api("/api/v1/series", **{"match[]": selector})
            self.assertEqual(answer["status"], "success", answer)
            regex = variable["regex"].strip("/")
            values[variable["name"]] = {series.get(match.group(2), "") for series in answer["data"]
                                        if re.fullmatch(regex, series.get(match.group(2), ""))}
        self.assertLessEqual({"echo", "slow", "extra_rows", "hostile", "calculator", "tokens"},
                             values["model"])
        self.assertNotIn("", values["model"])  # requests for unknown models
        self.assertEqual(values["version"], {"1"})


if __name__ == "__main__":
    unittest.main()
