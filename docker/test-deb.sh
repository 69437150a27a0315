#!/usr/bin/env bash
# The Debian package, end to end: `cpack -G DEB` in BUILD_DIR makes orochi_<version>_amd64.deb;
# its control data is checked (the conffiles, dependencies computed from the binaries, no
# development files) and its unit verified by systemd-analyze where the host has it; then
# `apt-get install ./orochi_*.deb` in a fresh Debian container (docker/common.sh's base image)
# must pull in everything it needs and no compiler, and create the user orochi and
# /var/lib/orochi. Containers run no systemd, so the server is started as the unit would:
# its ExecStart, User, EnvironmentFile and LimitNOFILE read from the installed unit, with the
# root file system read-only but for the state directory and a private /tmp (ProtectSystem=
# strict, StateDirectory=, PrivateTmp=), no capabilities (CapabilityBoundingSet=) and
# no_new_privs (NoNewPrivileges=). The example models are uploaded with `curl -T` to the
# management port and each must answer its request with its expected answer; `docker stop`
# (SIGTERM, as `systemctl stop`) must end it with status 0. Then, where this machine lets a
# container run systemd as PID 1, the same under the unit itself with all its hardening
# (`systemctl enable --now`), plus C extension modules imported in its sandbox, a restart after
# a crash and the maintainer scripts with systemd running. Last, `dpkg -r` must keep the
# conffiles and the models, a reinstall must keep an edited conffile, and `dpkg --purge` must
# remove both.
#   docker/test-deb.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/common.sh
build=$(cd "${1:-build}" && pwd)
name=orochi-deb-$$
image=orochi-deb-test:$$
work=$(mktemp -d)
cleanup() {
  "$docker" rm -f -v "$name" "$name-serve" "$name-systemd" >/dev/null 2>&1 || true
  "$docker" rmi "$image" "$image-systemd" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "docker/test-deb.sh: $*" >&2
  if [ -n "${target:-}" ]; then
    "$docker" logs "$target" 2>&1 | tail -30 >&2 || true
    "$docker" exec "$target" journalctl -u orochi --no-pager 2>/dev/null | tail -30 >&2 || true
  fi
  exit 1
}
started=$(date +%s)
in_root() { "$docker" exec "$name" "$@"; }           # the container apt installs into
in_server() { "$docker" exec "$target" "$@"; }      # the one serving now (target)

# --- the package ----------------------------------------------------------------------------
(cd "$build" && cpack -G DEB -B "$work/package") >"$work/cpack.log" 2>&1 ||
  { tail -30 "$work/cpack.log" >&2; fail "cpack -G DEB failed"; }
version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$build/CPackConfig.cmake")
deb=$work/package/orochi_${version}_amd64.deb
[ -f "$deb" ] || fail "no $(basename "$deb"): $(ls "$work/package")"
echo "docker/test-deb.sh: $(basename "$deb"), $(($(stat -c %s "$deb") / 1000000)) MB"

dpkg-deb --ctrl-tarfile "$deb" | tar -xO ./conffiles >"$work/conffiles"
grep -qx /etc/orochi/orochi.json "$work/conffiles" ||
  fail "orochi.json is no conffile: $(cat "$work/conffiles")"
grep -qx /etc/default/orochi "$work/conffiles" || fail "/etc/default/orochi is no conffile"
depends=$(dpkg-deb -f "$deb" Depends)
# From dpkg-shlibdeps: prometheus-cpp and libstdc++ (the binary), expat (the embedded copy
# library), oneDNN (the engine); declared: what is loaded by name or path, and adduser.
for dependency in libprometheus-cpp-core1.0 libstdc++6 libc6 libexpat1 zlib1g libopenblas0 \
  libdnnl2 libsleef3 libpython3.11-stdlib adduser; do
  [[ ",$depends," == *[\ ,]"$dependency"[\ ,\|]* ]] || fail "Depends lacks $dependency: $depends"
done
dpkg-deb -c "$deb" | awk '{print $6}' >"$work/contents"
for path in ./usr/bin/orochi ./usr/bin/orochi-python ./usr/lib/liborochi_engine.so \
  ./lib/systemd/system/orochi.service ./etc/orochi/orochi.json; do
  grep -qx "$path" "$work/contents" || fail "the package lacks $path"
done
! grep -q '^\./usr/include/\|\.a$' "$work/contents" || fail "the package holds development files"

dpkg-deb -x "$deb" "$work/root"
unit=$work/root/lib/systemd/system/orochi.service
if command -v systemd-analyze >/dev/null; then
  # Against the package's root, with the host's own units for the targets it names.
  cp -an /lib/systemd/system/. "$work/root/lib/systemd/system/"
  systemd-analyze verify --root="$work/root" orochi.service >"$work/verify.log" 2>&1 ||
    fail "systemd-analyze verify: $(cat "$work/verify.log")"
  echo "docker/test-deb.sh: systemd-analyze: $(systemd-analyze security --offline=yes \
    --root="$work/root" orochi.service 2>/dev/null | grep -o 'Overall exposure level.*')"
fi
unit_value() { sed -n "s/^$1=//p" "$unit" | tail -1; }
exec_start=$(unit_value ExecStart)
user=$(unit_value User)
limit_nofile=$(unit_value LimitNOFILE)
state_directory=/var/lib/$(unit_value StateDirectory | cut -d' ' -f1)
environment_file=$(unit_value EnvironmentFile)
environment_file=${environment_file#-}
if [ -z "$exec_start" ] || [ "$user" != orochi ] || [ "$state_directory" != /var/lib/orochi ]; then
  fail "unexpected unit: ExecStart=$exec_start User=$user state in $state_directory"
fi

# --- installed into a fresh Debian root -----------------------------------------------------
ensure_dockerd
ensure_base
"$docker" run -d --name "$name" "$base" sleep infinity >/dev/null
"$docker" cp "$deb" "$name:/tmp/"
# The sources are the base image's, i.e. the archive this machine's apt uses.
in_root sh -c "cd /tmp && apt-get update -q >/tmp/apt.log 2>&1 &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    ./$(basename "$deb") >>/tmp/apt.log 2>&1" ||
  fail "apt-get install: $(in_root tail -20 /tmp/apt.log)"
for compiler in cc gcc c++ g++ clang; do
  ! in_root sh -c "command -v $compiler" >/dev/null ||
    fail "installing pulled in a compiler ($compiler)"
done
in_root getent passwd orochi >"$work/passwd" || fail "no user orochi"
IFS=: read -r _ _ uid _ _ home shell <"$work/passwd"
if [ "$uid" -ge 1000 ] || [ "$home" != /var/lib/orochi ] || [ "$shell" != /usr/sbin/nologin ]; then
  fail "orochi is no system user: $(cat "$work/passwd")"
fi
[ "$(in_root stat -c %U:%a /var/lib/orochi/models)" = orochi:750 ] ||
  fail "/var/lib/orochi/models: $(in_root stat -c %U:%a /var/lib/orochi/models)"
# curl for the uploads and requests below, after the package: its dependencies must not have
# completed the package's.
in_root sh -c "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends curl \
  >>/tmp/apt.log 2>&1" || fail "apt-get install curl: $(in_root tail -20 /tmp/apt.log)"
"$docker" commit "$name" "$image" >/dev/null

wait_ready() {  # wait_ready CHECK: until readiness, while CHECK (a command) succeeds
  for _ in $(seq 1 120); do
    "$@" || fail "the server stopped"
    [ "$(in_server curl -s -o /dev/null -w '%{http_code}' localhost:8000/v2/health/ready)" = 200 ] &&
      return
    sleep 0.5
  done
  fail "the server did not become ready"
}
copy_in() { "$docker" exec -i "$target" sh -c "cat >$2" <"$1"; }  # copy_in FILE PATH
expect() {  # expect STATUS CURL_ARGS...: curl in the serving container answers STATUS
  local want=$1 got
  shift
  got=$(in_server curl -s -o /tmp/answer -w '%{http_code}' "$@")
  in_server cat /tmp/answer >"$work/answer"
  [ "$got" = "$want" ] || fail "curl $* answered $got, expected $want: $(head -c 300 "$work/answer")"
}
models=(digits sentiment encoder resnet)
# Uploads each example with `curl -T` to the management port; each must answer its request with
# its expected answer.
serve_examples() {
  local model
  for model in "${models[@]}"; do
    copy_in "$build/model-repository/$model/1/model.orochi" "/tmp/$model.orochi"
    expect 200 -T "/tmp/$model.orochi" "localhost:8003/v2/repository/models/$model/versions/1"
    in_server test -f "$state_directory/models/$model/1/model.orochi" ||
      fail "the upload of $model is not in $state_directory/models"
  done
  for model in "${models[@]}"; do
    if [ "$model" = resnet ]; then  # binary tensor extension: a JSON header, then the bytes
      copy_in "$build/models/resnet/request.bin" /tmp/request
      expect 200 -X POST localhost:8000/v2/models/resnet/infer --data-binary @/tmp/request \
        -H "Inference-Header-Content-Length: $(cat "$build/models/resnet/request.bin.header-length")"
    else
      copy_in "$build/models/$model/request.json" /tmp/request
      expect 200 -X POST "localhost:8000/v2/models/$model/infer" --data-binary @/tmp/request
    fi
    /usr/bin/python3.11 - "$model" "$work/answer" <<'PYTHON' || fail "$model answered wrongly"
import json, sys
sys.path.insert(0, "models")
import expected
model, answer = sys.argv[1], sys.argv[2]
with open(answer, encoding="utf-8") as f:
    problems = expected.differences(expected.load(model), expected.response_outputs(json.load(f)))
for problem in problems:
    print(f"{model}: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
PYTHON
  done
}

# --- started as the unit starts it ----------------------------------------------------------
# A fresh volume at the state directory starts with the image's /var/lib/orochi (its owner
# included), as StateDirectory= hands the service its directory.
environment=()
[ -z "$environment_file" ] || environment=(--env-file "$work/root$environment_file")
# A container cannot raise its open-files limit above the daemon's own hard limit.
hard_nofile=$(ulimit -Hn)
if [ "$hard_nofile" != unlimited ] && [ "$hard_nofile" -lt "$limit_nofile" ]; then
  echo "docker/test-deb.sh: LimitNOFILE=$limit_nofile lowered to this machine's hard limit, $hard_nofile"
  limit_nofile=$hard_nofile
fi
# shellcheck disable=SC2086  # ExecStart is split into words, as systemd splits it
"$docker" run -d --name "$name-serve" --user "$user" --workdir "$state_directory" \
  "${environment[@]}" --ulimit "nofile=$limit_nofile:$limit_nofile" \
  --read-only --tmpfs /tmp --mount "type=volume,dst=$state_directory" \
  --cap-drop ALL --security-opt no-new-privileges "$image" $exec_start >/dev/null
target=$name-serve
running() { [ "$("$docker" inspect -f '{{.State.Running}}' "$target")" = true ]; }
wait_ready running
[ "$(in_server id -un)" = orochi ] || fail "the server does not run as orochi"
serve_examples

# systemctl stop: SIGTERM to the main process (KillMode=mixed), a graceful exit with status 0.
"$docker" stop -t 40 "$name-serve" >/dev/null
exit_code=$("$docker" inspect -f '{{.State.ExitCode}}' "$name-serve")
[ "$exit_code" = 0 ] || fail "stopped with status $exit_code"

# --- under systemd, where this machine lets a container run it -------------------------------
# The unit itself, hardening included: systemd as the container's PID 1 (it needs CAP_SYS_ADMIN,
# no seccomp profile and the cgroup file system), `systemctl enable --now`, the examples, the
# sandbox the serving process got, a restart after a crash (Restart=on-failure), `systemctl
# stop`, and the maintainer scripts with a running systemd. Where dockerd refuses such a
# container or systemd does not come up, the run above stands alone, and the output says so.
"$docker" run --name "$name-systemd" "$image" sh -c "DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends systemd systemd-sysv >/tmp/systemd.log 2>&1" ||
  fail "apt-get install systemd: $("$docker" cp "$name-systemd:/tmp/systemd.log" - | tail -c 1000)"
"$docker" commit "$name-systemd" "$image-systemd" >/dev/null
"$docker" rm "$name-systemd" >/dev/null
target=$name-systemd
systemd_state=$("$docker" run -d --name "$target" --cap-add SYS_ADMIN \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --tmpfs /run \
  --tmpfs /run/lock -v /sys/fs/cgroup:/sys/fs/cgroup:ro "$image-systemd" /lib/systemd/systemd \
  2>&1 >/dev/null) || true
if [ -z "$systemd_state" ]; then
  # Until systemd listens for systemctl, or its container is gone.
  for _ in $(seq 1 60); do
    in_server test -S /run/systemd/private 2>/dev/null && break
    [ "$("$docker" inspect -f '{{.State.Running}}' "$target")" = true ] || break
    sleep 0.5
  done
  systemd_state=$(in_server timeout 60 systemctl is-system-running --wait 2>&1) || true
fi
if [[ "$systemd_state" == running || "$systemd_state" == degraded ]]; then
  unit_active() { [ "$(in_server systemctl is-active orochi.service || true)" = active ]; }
  in_server systemctl enable --now orochi.service >/dev/null 2>&1 || fail "systemctl enable --now failed"
  wait_ready unit_active
  pid=$(in_server systemctl show -p MainPID --value orochi.service)
  [ "$(in_server stat -c %U "/proc/$pid")" = orochi ] || fail "the unit's server does not run as orochi"
  in_server grep -E '^(NoNewPrivs|CapBnd|Seccomp):' "/proc/$pid/status" | tr -s '\t' ' ' >"$work/sandbox"
  printf 'NoNewPrivs: 1\nCapBnd: 0000000000000000\nSeccomp: 2\n' | sort | diff - <(sort "$work/sandbox") ||
    fail "the unit's sandbox: $(cat "$work/sandbox")"
  # shellcheck disable=SC2016  # awk's fields
  root_mount=$(in_server awk '$5 == "/" {print $6}' "/proc/$pid/mountinfo")
  [[ "$root_mount" == ro,* ]] || fail "ProtectSystem=strict: / is mounted $root_mount"
  serve_examples
  # The examples import no C extension module, but models do (the stdlib's lib-dynload,
  # numpy): a copy imports some under the same sandbox, i.e. the unit with another ExecStart, as
  # a oneshot. MemoryDenyWriteExecute=yes, for one, fails here.
  sed -e 's|^ExecStart=.*|ExecStart=/usr/bin/orochi python -c "import _json, _decimal, _ctypes"|' \
    -e 's|^Type=.*|Type=oneshot|' -e '/^Restart/d' -e '/^\[Install\]/,$d' "$unit" |
    "$docker" exec -i "$target" sh -c \
      'cat >/etc/systemd/system/orochi-imports.service && systemctl daemon-reload'
  in_server systemctl start orochi-imports.service ||
    fail "a copy cannot import C extension modules in the unit's sandbox: $(in_server \
      journalctl -u orochi-imports.service --no-pager -o cat | grep -m 3 Error)"
  # A crash of the whole server (SIGKILL to the supervisor): systemd starts it again, and it
  # loads the uploaded models from /var/lib/orochi.
  in_server sh -c "kill -KILL $pid"
  for _ in $(seq 1 40); do
    new_pid=$(in_server systemctl show -p MainPID --value orochi.service)
    [ "$new_pid" != 0 ] && [ "$new_pid" != "$pid" ] && break
    sleep 0.25
  done
  if [ "$new_pid" = 0 ] || [ "$new_pid" = "$pid" ]; then
    fail "Restart=on-failure did not restart the server"
  fi
  wait_ready unit_active
  expect 200 localhost:8000/v2/models/digits/versions/1/ready
  # An upgrade (the same package again: its postinst runs as for one) restarts the running
  # service onto the new files.
  # (Into /root: systemd emptied /tmp when it booted.)
  "$docker" cp "$deb" "$target:/root/"
  in_server dpkg -i "/root/$(basename "$deb")" >"$work/dpkg.log" 2>&1 ||
    fail "dpkg -i over the running service: $(cat "$work/dpkg.log")"
  [ "$(in_server systemctl show -p MainPID --value orochi.service)" != "$new_pid" ] ||
    fail "an upgrade did not restart the running service"
  wait_ready unit_active
  expect 200 localhost:8000/v2/models/digits/versions/1/ready
  in_server systemctl stop orochi.service
  result=$(in_server systemctl show -p Result -p ExecMainStatus --value orochi.service | paste -sd' ')
  [ "$result" = "success 0" ] || fail "systemctl stop: result and status $result"
  # dpkg -r stops the running service; --purge removes the enablement link.
  in_server systemctl start orochi.service
  in_server dpkg -r orochi >"$work/dpkg.log" 2>&1 || fail "dpkg -r under systemd: $(cat "$work/dpkg.log")"
  ! unit_active || fail "dpkg -r left the service running"
  in_server dpkg --purge orochi >"$work/dpkg.log" 2>&1 || fail "dpkg --purge: $(cat "$work/dpkg.log")"
  ! in_server test -L /etc/systemd/system/multi-user.target.wants/orochi.service ||
    fail "dpkg --purge left the unit's enablement link"
  systemd_note="and under systemd"
else
  echo "docker/test-deb.sh: no systemd in a container here, its run skipped: $systemd_state"
  systemd_note="(systemd could not run in a container here)"
fi
target=

# --- removed, reinstalled, purged -----------------------------------------------------------
in_root sh -c 'echo "{}" >/var/lib/orochi/models/kept && sed -i "s/\"errors\"/\"all\"/" /etc/orochi/orochi.json'
in_root dpkg -r orochi >"$work/dpkg.log" 2>&1 || fail "dpkg -r: $(cat "$work/dpkg.log")"
! in_root test -e /usr/bin/orochi || fail "dpkg -r left /usr/bin/orochi"
in_root test -f /etc/orochi/orochi.json || fail "dpkg -r removed the conffile /etc/orochi/orochi.json"
in_root test -f /var/lib/orochi/models/kept || fail "dpkg -r removed /var/lib/orochi"
in_root dpkg -i "/tmp/$(basename "$deb")" >"$work/dpkg.log" 2>&1 || fail "reinstall: $(cat "$work/dpkg.log")"
in_root grep -q '"all"' /etc/orochi/orochi.json || fail "a reinstall replaced the edited conffile"
in_root dpkg --purge orochi >"$work/dpkg.log" 2>&1 || fail "dpkg --purge: $(cat "$work/dpkg.log")"
for path in /etc/orochi/orochi.json /etc/default/orochi /var/lib/orochi; do
  ! in_root test -e "$path" || fail "dpkg --purge left $path"
done
echo "docker/test-deb.sh: the package installs, serves ${models[*]} as its unit would" \
  "$systemd_note, and removes and purges cleanly ($(($(date +%s) - started)) s)"
