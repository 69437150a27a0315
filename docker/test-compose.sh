#!/usr/bin/env bash
# docker/compose.yaml with a real dockerd and Debian's docker-compose: the file as written must
# pass `docker-compose config` and refuse to start without a management token; then its orochi
# and prometheus services run as the file wires them (the image, the repository volume, the
# token, prometheus.yml scraping `orochi:8002` over the compose network, alerts.yml mounted) and
# are checked from the host: the examples answer, Prometheus scrapes the server and has every
# alert rule loaded and healthy, and the inference counters reach it.
#
# Two changes to a copy of the file, and only these: its host ports become ephemeral ones on
# loopback (a CI machine's 8000 or 9090 may be taken), and the images are local ones: the CPU
# image built from this tree as docker/test.sh builds it, and a Prometheus image made from
# Debian's `prometheus` package, since no registry is reachable here. Grafana is not in Debian
# and has no such stand-in: its service is left out (tests/monitoring checks the dashboard and
# the provisioning files against a real Prometheus).
#   docker/test-compose.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/common.sh
build=${1:-build}
build=$(cd "$build" && pwd)
image=orochi-test:latest
prometheus_image=orochi-test-prometheus:latest
project=orochitest$$
work=$(mktemp -d)
compose=(docker-compose --project-name "$project" --project-directory docker
         -f "$work/compose.yaml")
cleanup() {
  OROCHI_MANAGEMENT_TOKEN=x "${compose[@]}" down -v >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "docker/test-compose.sh: $*" >&2
  OROCHI_MANAGEMENT_TOKEN=x "${compose[@]}" logs --tail 30 >&2 2>&1 || true
  exit 1
}
command -v docker-compose >/dev/null || { echo "docker-compose is not installed" >&2; exit 1; }

ensure_dockerd
ensure_base

# The file as written: valid, and no start without a token.
cp docker/compose.yaml "$work/compose.yaml"
OROCHI_MANAGEMENT_TOKEN=x "${compose[@]}" config -q || fail "docker-compose config refused the file"
if "${compose[@]}" config -q 2>"$work/refused"; then
  fail "docker-compose accepted the file without OROCHI_MANAGEMENT_TOKEN"
fi
grep -q "set a bearer token for port 8003" "$work/refused" ||
  fail "the refusal does not say why: $(cat "$work/refused")"

# The images.
rm -rf "$build/docker-prefix"
cmake --install "$build" --prefix "$build/docker-prefix" --strip >/dev/null
DOCKER_BUILDKIT=1 "$docker" build -q -f docker/Dockerfile --build-arg BASE="$base" \
  --build-arg PREFIX_FROM=prebuilt -t "$image" . >/dev/null
mkdir -p "$work/prometheus-image"
cat >"$work/prometheus-image/Dockerfile" <<EOF
FROM $base
RUN apt-get update && apt-get install -y --no-install-recommends prometheus \
 && rm -rf /var/lib/apt/lists/*
ENTRYPOINT ["/usr/bin/prometheus"]
EOF
"$docker" build -q -t "$prometheus_image" "$work/prometheus-image" >/dev/null

# The copy: local images, ephemeral loopback ports, no grafana.
/usr/bin/python3.11 - "$work/compose.yaml" "$image" "$prometheus_image" <<'EOF'
import sys
import yaml

path, image, prometheus_image = sys.argv[1:]
with open(path) as file:
    compose = yaml.safe_load(file)
services = compose["services"]
del services["grafana"]
compose["volumes"].pop("grafana-data")
services["orochi"]["image"] = image
del services["orochi"]["build"]
services["prometheus"]["image"] = prometheus_image
for service in services.values():
    service["ports"] = ["127.0.0.1::" + port.split("#")[0].strip().rsplit(":", 1)[-1]
                        for port in service["ports"]]
with open(path, "w") as file:
    yaml.safe_dump(compose, file)
EOF

# The examples on the repository volume, writable by the image's user.
mkdir -p "$work/models"
cp -r "$build"/model-repository/* "$work/models/"
chown -R 10001:10001 "$work/models"
export OROCHI_MANAGEMENT_TOKEN=s3cret-$$ OROCHI_MODELS="$work/models"
"${compose[@]}" up -d orochi prometheus >/dev/null 2>&1 || fail "docker-compose up failed"
port() { "${compose[@]}" port "$1" "$2" | sed 's/.*://'; }
http=$(port orochi 8000) management=$(port orochi 8003) prometheus=$(port prometheus 9090)

for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$http/v2/health/ready")" = 200 ] && break
  sleep 0.5
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$http/v2/health/ready")" = 200 ] ||
  fail "orochi did not become ready"
for model in digits sentiment encoder; do
  status=$(curl -s -o "$work/answer" -w '%{http_code}' -X POST \
    "localhost:$http/v2/models/$model/infer" --data-binary @"$build/models/$model/request.json")
  [ "$status" = 200 ] || fail "$model answered $status: $(head -c 300 "$work/answer")"
done
status=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $OROCHI_MANAGEMENT_TOKEN" \
  -X POST "localhost:$management/v2/repository/index")
[ "$status" = 200 ] || fail "the management API with the token answered $status"

# Prometheus, as compose wired it: the target up, every rule loaded and healthy, the counters in.
/usr/bin/python3.11 - "$prometheus" <<'EOF' || fail "Prometheus does not see the server as it should"
import json
import sys
import time
import urllib.parse
import urllib.request

base = f"http://127.0.0.1:{sys.argv[1]}"


def api(path, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.load(answer)["data"]
    except OSError:
        return None


def wait_for(what, check, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(1)
    sys.exit(f"timed out waiting for {what}")


targets = wait_for("the orochi target to be up", lambda: [
    target for target in (api("/api/v1/targets") or {}).get("activeTargets", [])
    if target["health"] == "up"])
assert [t["scrapeUrl"] for t in targets] == ["http://orochi:8002/metrics"], targets
rules = wait_for("the alert rules", lambda: [
    rule for group in (api("/api/v1/rules") or {}).get("groups", []) for rule in group["rules"]
    if rule.get("lastEvaluation", "").startswith("2") and not rule["lastEvaluation"].startswith("0001")])
names = {rule["name"] for rule in rules}
with open("docker/prometheus/alerts.yml") as file:
    expected = set(line.split(":", 1)[1].strip() for line in file if line.strip().startswith("- alert:"))
assert names == expected, (names, expected)
assert all(rule["health"] == "ok" for rule in rules), rules
requests = wait_for("the inference counters", lambda: [
    series for series in (api("/api/v1/query", query='orochi_inference_requests_total{reason="success"} > 0')
                          or {}).get("result", [])])
assert {series["metric"]["model"] for series in requests} == {"digits", "sentiment", "encoder"}, requests
print(f"docker/test-compose.sh: Prometheus scrapes orochi:8002, {len(rules)} alert rules healthy")
EOF
echo "docker/test-compose.sh: the compose stack (orochi, prometheus) serves and is scraped"
