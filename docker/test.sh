#!/usr/bin/env bash
# The CPU image with a real dockerd, over loopback: builds it from the tree BUILD_DIR holds
# (`cmake --install --strip` into build/docker-prefix, docker/Dockerfile's prebuilt stage), runs
# it with the example models on a volume, and checks health, an inference per example, an upload
# with the management token and a refusal without it, metrics, a non-root process, `docker stop`
# answering the request in flight and exiting 0 within the grace, a restarted container serving
# the uploaded model from the volume, a start refused without a token, and the image's size.
# Starts dockerd if none answers; where the base image is absent and no registry is reachable,
# makes one with debootstrap from the archive apt is configured with.
#   docker/test.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/common.sh
build=${1:-build}
image=orochi-test:latest
name=orochi-test-$$
work=$(mktemp -d)
cleanup() {
  "$docker" rm -f "$name" "$name-refused" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "docker/test.sh: $*" >&2; "$docker" logs "$name" 2>&1 | tail -30 >&2 || true; exit 1; }

ensure_dockerd
ensure_base

rm -rf "$build/docker-prefix"
cmake --install "$build" --prefix "$build/docker-prefix" --strip >/dev/null
DOCKER_BUILDKIT=1 "$docker" build -q -f docker/Dockerfile --build-arg BASE="$base" \
  --build-arg PREFIX_FROM=prebuilt -t "$image" . >/dev/null
size=$("$docker" image inspect -f '{{.Size}}' "$image")
echo "docker/test.sh: image $image is $((size / 1000000)) MB"
[ "$size" -le 250000000 ] || fail "the image is larger than 250 MB"

# The examples on a volume the container's user owns.
mkdir -p "$work/models/slow/1"
cp -r "$build"/model-repository/* "$work/models/"
# The test suite's slow model, for a request still running when the container is stopped.
"$build/bin/orochi" pack tests/server/models/slow -o "$work/models/slow/1/model.orochi" >/dev/null
chown -R 10001:10001 "$work/models"
token=s3cret-$$
port() { "$docker" port "$name" "$1/tcp" | head -1 | sed 's/.*://'; }
start() {
  "$docker" run -d --name "$name" -e OROCHI_MANAGEMENT_TOKEN="$token" -v "$work/models:/models" \
    -p 127.0.0.1::8000 -p 127.0.0.1::8001 -p 127.0.0.1::8002 -p 127.0.0.1::8003 "$@" "$image" \
    >/dev/null
}
wait_ready() {
  for _ in $(seq 1 120); do
    [ "$("$docker" inspect -f '{{.State.Running}}' "$name")" = true ] ||
      fail "the container stopped: $("$docker" logs "$name" 2>&1 | tail -5)"
    http=$(port 8000) metrics=$(port 8002) management=$(port 8003)
    [ "$(curl -s -o /dev/null -w '%{http_code}' "localhost:$http/v2/health/ready")" = 200 ] && return
    sleep 0.5
  done
  fail "the container did not become ready"
}
expect() {  # expect STATUS CURL_ARGS...: curl answers STATUS
  local want=$1
  shift
  local got
  got=$(curl -s -o "$work/answer" -w '%{http_code}' "$@")
  [ "$got" = "$want" ] || fail "curl $* answered $got, expected $want: $(head -c 300 "$work/answer")"
}

start
wait_ready
for model in digits sentiment encoder; do
  expect 200 -X POST "localhost:$http/v2/models/$model/infer" \
    --data-binary @"$build/models/$model/request.json"
done
# KServe v2 over gRPC from outside the container (the image carries gRPC's libraries).
/usr/bin/python3.11 docker/grpc_ready.py "localhost:$(port 8001)" digits sentiment encoder resnet ||
  fail "the image's gRPC port does not serve"
expect 200 -X POST "localhost:$http/v2/models/resnet/infer" \
  --data-binary @"$build/models/resnet/request.bin" \
  -H "Inference-Header-Content-Length: $(cat "$build/models/resnet/request.bin.header-length")"
"$build/bin/orochi" pack "$build/models/digits/package" --set-version 2 -o "$work/digits-2.orochi" \
  >/dev/null
expect 401 -T "$work/digits-2.orochi" "localhost:$management/v2/repository/models/digits/versions/2"
expect 200 -T "$work/digits-2.orochi" -H "Authorization: Bearer $token" \
  "localhost:$management/v2/repository/models/digits/versions/2"
expect 200 "localhost:$metrics/metrics"
grep -q '^orochi_inference_requests_total' "$work/answer" || fail "no inference metrics"
uid=$("$docker" exec "$name" id -u)
[ "$uid" != 0 ] || fail "the server runs as root"

# docker stop during a request (2 s of it): it is answered, and the server exits 0 within the
# grace.
curl -s -o "$work/in-flight" -w '%{http_code}' -X POST "localhost:$http/v2/models/slow/infer" \
  -d '{"inputs": [{"name": "mode", "datatype": "BYTES", "shape": [1], "data": ["sleep"]},
                  {"name": "seconds", "datatype": "FP64", "shape": [1], "data": [2]}]}' \
  >"$work/in-flight-status" &
in_flight=$!
sleep 0.5
stop_start=$(date +%s)
"$docker" stop -t 40 "$name" >/dev/null
wait "$in_flight" || true
stopped_in=$(($(date +%s) - stop_start))
[ "$(cat "$work/in-flight-status")" = 200 ] || fail "the request in flight got $(cat "$work/in-flight-status")"
exit_code=$("$docker" inspect -f '{{.State.ExitCode}}' "$name")
[ "$exit_code" = 0 ] || fail "docker stop: exit code $exit_code"
[ "$stopped_in" -lt 35 ] || fail "docker stop took $stopped_in s"
grep -q '"done"' "$work/in-flight" || fail "the request in flight was not answered in full"

# The uploaded version is on the volume: a new start serves it.
"$docker" start "$name" >/dev/null
wait_ready
expect 200 "localhost:$http/v2/models/digits/versions/2"
"$docker" stop -t 40 "$name" >/dev/null

# Reachable from outside the container, the management API needs a token: no start without.
"$docker" run -d --name "$name-refused" -v "$work/models:/models" "$image" >/dev/null
"$docker" wait "$name-refused" >"$work/refused-code"
[ "$(cat "$work/refused-code")" != 0 ] || fail "the server started without a management token"
"$docker" logs "$name-refused" 2>&1 | grep -q "token variable OROCHI_MANAGEMENT_TOKEN is not set" ||
  fail "the refusal does not say why: $("$docker" logs "$name-refused" 2>&1 | tail -3)"
echo "docker/test.sh: the image serves, stops and restarts as it should (stopped in ${stopped_in} s)"
