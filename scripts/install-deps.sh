#!/usr/bin/env bash
# Installs every Debian package that Orochi's build, tests and benchmarks need.
# Idempotent; runs as root or through sudo.
set -euo pipefail

packages=(
  # toolchain
  build-essential g++ cmake ninja-build ccache binutils file git curl
  clang-format clang-tidy
  # the fuzzers (scripts/fuzz.sh): clang with libFuzzer and the sanitizers' runtimes
  clang libclang-rt-14-dev
  # the interpreter copies: libpython3.11-pic.a, headers, the stdlib and the
  # Python used at build time to compile the stdlib to .pyc
  python3.11 libpython3.11-dev libpython3.11-stdlib
  # CPython's regression tests, run inside a copy
  libpython3.11-testsuite
  # command line
  libcli11-dev
  # the Python API of the engine, compiled into every copy
  pybind11-dev
  # model packages: zip (deflate) and the manifest
  zlib1g-dev
  # the server: Boost.Beast/Asio (1.81), Prometheus metrics; promtool and wrk for tests and bench
  libboost1.81-dev prometheus-cpp-dev prometheus wrk
  # KServe v2 over gRPC: gRPC C++, protobuf and their code generators; grpcio for the tests'
  # and benchmarks' client
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc python3-grpcio
  python3-protobuf
  # the tensor engine: BLAS for GEMM-shaped work, oneDNN (2.x) for float32 convolution and
  # linear, SLEEF for its vectorised math (exp, log, tanh, erf, ...) on AVX2 and AVX-512;
  # Debian's oneDNN was built with its OpenCL GPU runtime, so its CMake package asks for OpenCL's
  # headers and loader (which libdnnl-dev does not depend on)
  libopenblas-dev libdnnl-dev libsleef-dev nlohmann-json3-dev ocl-icd-opencl-dev
  # tests and benchmarks
  googletest libgtest-dev libgmock-dev libbenchmark-dev strace procps iproute2
  # the rolling-restart test's load balancer (tests/server/test_rolling_restart.py)
  nginx
  # the Kubernetes manifests' validator (tests/kubernetes) and the OpenAI client check
  # (tests/openai): npm packages, run by node; and
  # PyYAML for the test that starts the server as the KServe runtime's manifest says
  nodejs python3-yaml
  # the image tests (docker/test*.sh): a real dockerd, debootstrap for a base image where no
  # registry can be reached, and docker-compose for docker/compose.yaml
  docker.io debootstrap docker-compose
  # numpy's own test suite, run inside a copy (tests/interpreters/test_numpy_suite.py)
  python3-pytest python3-hypothesis
  # the example models' build scripts (numpy; scikit-learn's runtime dependencies, see below),
  # and bench/: the FastAPI + uvicorn baseline and matplotlib's plots
  python3-numpy python3-joblib python3-threadpoolctl python3-decorator liblbfgsb0
  # models/textgen trains its weights with PyTorch; models/torch_runner.py checks the examples
  python3-torch
  python3-matplotlib python3-fastapi python3-uvicorn
)

if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1; then
  sudo=(sudo)
else
  echo "install-deps: run as root or install sudo" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

# The test suite must match the libpython we link exactly, so the python3.11 packages are
# upgraded together whenever anything is missing.
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${packages[@]}"
fi
echo "install-deps: all ${#packages[@]} packages present"
# Debian's nodejs comes without npm, which is a package of its own there; other builds of
# nodejs (NodeSource's) include it, and Debian's npm package would clash with them.
if ! command -v npm >/dev/null 2>&1; then
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends npm
fi

# scikit-learn (for its digits dataset and train/test split) cannot be installed with apt here:
# python3-scipy depends on python3-pythran, which pulls in libboost1.74-dev, and that conflicts
# with the libboost1.81-dev the server needs. Nothing in scipy or scikit-learn uses pythran or
# Boost at run time, so their Debian packages are unpacked into a prefix of their own, used only
# through OROCHI_SKLEARN_PATH by models/digits/build.py. Their other dependencies are above.
sklearn_prefix=${OROCHI_SKLEARN_PREFIX:-/opt/orochi/python-sklearn}
sklearn_debs=(python3-scipy python3-sklearn python3-sklearn-lib)
wanted=$(apt-cache policy "${sklearn_debs[@]}" | awk '/Candidate:/ {print $2}' | paste -sd' ')
if [ "$(cat "$sklearn_prefix/.versions" 2>/dev/null)" != "$wanted" ]; then
  download=$(mktemp -d)
  chmod 777 "$download"  # apt downloads as its own _apt user
  (cd "$download" && apt-get download "${sklearn_debs[@]}")
  "${sudo[@]}" rm -rf "$sklearn_prefix"
  "${sudo[@]}" mkdir -p "$sklearn_prefix"
  for deb in "$download"/*.deb; do
    "${sudo[@]}" dpkg-deb -x "$deb" "$sklearn_prefix"
  done
  echo "$wanted" | "${sudo[@]}" tee "$sklearn_prefix/.versions" >/dev/null
  rm -rf "$download"
fi
echo "install-deps: scikit-learn unpacked in $sklearn_prefix ($wanted)"

# CPython's sqlite3 regression tests (Lib/test/test_sqlite3), run inside a copy by
# tests/cpython/run_regrtest.sh: Debian's libpython3.11-testsuite leaves them out, so they come
# from the upstream source tarball of the same CPython release in Debian's archive, checked
# against its published digest. Only that one test package is kept.
cpython_tests=${OROCHI_CPYTHON_TESTS:-/opt/orochi/cpython-tests}
cpython_release=3.11.2
cpython_sha256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849
if [ ! -f "$cpython_tests/$cpython_release/test_sqlite3/__init__.py" ]; then
  # The archives this machine's apt uses (OROCHI_DEBIAN_MIRROR first, when set): the one that
  # serves python3.11's own package, then every configured one. No host is named here.
  mapfile -t mirrors < <({
    [ -n "${OROCHI_DEBIAN_MIRROR:-}" ] && echo "$OROCHI_DEBIAN_MIRROR"
    apt-get download --print-uris python3.11 2>/dev/null | sed -nE "s|^'([^']*)/pool/.*|\1|p"
    apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | sed 's|/$||'
  } | awk 'NF && !seen[$0]++')
  download=$(mktemp -d)
  fetched=false
  for mirror in "${mirrors[@]}"; do
    if curl -fsS -o "$download/cpython.tar.gz" \
      "$mirror/pool/main/p/python3.11/python3.11_${cpython_release}.orig.tar.gz"; then
      fetched=true
      break
    fi
  done
  if [ "$fetched" != true ]; then
    echo "install-deps: CPython $cpython_release's source is in none of apt's archives" \
      "(${mirrors[*]:-none configured}); set OROCHI_DEBIAN_MIRROR" >&2
    exit 1
  fi
  echo "$cpython_sha256  $download/cpython.tar.gz" | sha256sum -c --quiet
  tar -xzf "$download/cpython.tar.gz" -C "$download" "Python-$cpython_release/Lib/test/test_sqlite3"
  "${sudo[@]}" mkdir -p "$cpython_tests/$cpython_release"
  "${sudo[@]}" cp -r "$download/Python-$cpython_release/Lib/test/test_sqlite3" \
    "$cpython_tests/$cpython_release/"
  rm -rf "$download"
fi
echo "install-deps: CPython $cpython_release's test_sqlite3 in $cpython_tests/$cpython_release"
