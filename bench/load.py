"""What the serving benchmarks share: free ports, stopping servers, and wrk POSTing a body.

Needs wrk (Debian).
"""

import json
import os
import re
import signal
import socket
import subprocess


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # A server started in a session of its own (uvicorn and its workers) goes as a group.
        if os.getpgid(process.pid) == process.pid:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
        process.wait()


def wrk(url: str, body_path: str, seconds: float, connections: int, threads: int,
        scratch: str) -> dict:
    script = os.path.join(scratch, "post.lua")
    with open(script, "w") as file:
        # The body is read from the file rather than written into the script as a string
        # literal: LuaJIT has no \u escapes, and resnet's request is half a megabyte.
        file.write('wrk.method = "POST"\n'
                   'wrk.headers["Content-Type"] = "application/json"\n'
                   f"local file = assert(io.open({json.dumps(body_path)}, \"rb\"))\n"
                   'wrk.body = file:read("*a")\n'
                   "file:close()\n")
    # wrk's default 2 s timeout would drop slow answers (resnet at high concurrency) from the
    # latency figures instead of counting them.
    result = subprocess.run(["wrk", f"-t{min(threads, connections)}", f"-c{connections}",
                             f"-d{seconds}s", "--timeout", "60s", "--latency", "-s", script, url],
                            capture_output=True, text=True)
    text = result.stdout
    if result.returncode != 0 or "Requests/sec" not in text:
        raise SystemExit(f"wrk failed ({result.returncode}):\n{text}{result.stderr}")

    def latency_ms(percent):
        match = re.search(rf"^\s+{percent}%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)
        return float(match.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[match.group(2)]

    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), "
                              r"timeout (\d+)", text)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),
            "requests": int(re.search(r"(\d+) requests in", text).group(1)),
            "p50_ms": latency_ms(50), "p99_ms": latency_ms(99),
            "errors": (int(non_2xx.group(1)) if non_2xx else 0)
            + (sum(map(int, socket_errors.groups())) if socket_errors else 0)}
