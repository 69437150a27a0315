"""The HTTP front end's limits: bodies that decompress past http.max_body_bytes, connections
past the server's file descriptors, and http.idle_timeout_s for idle connections and
stalled bodies.

    OROCHI_BINARY=build/bin/orochi python3.11 -m unittest -v test_http_limits
"""

import json
import socket
import time
import unittest

from server_fixtures import (HeldConnectionsTest, Server, SharedServerTest, cpu_seconds, curl,
                             echo_request)


class CompressionLimitsTest(SharedServerTest):
    CONFIG = {"http": {"max_body_bytes": 1 << 20}}

    def test_the_body_limit_holds_for_the_decompressed_size_and_bombs_stop_there(self):
        import gzip
        import zlib
        # 64 MB of zeros is 64 KB of gzip: refused once 1 MB has come out, never inflated whole.
        bomb = gzip.compress(b"0" * (64 << 20), compresslevel=9)
        self.assertLess(len(bomb), 1 << 20)
        started = time.monotonic()
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: gzip",
                               self.server.url("/v2/models/echo/infer"), data=bomb)
        self.assertEqual(status, 413, body)
        self.assertEqual(json.loads(body)["error"],
                         "the request body decompresses (gzip) to more than the limit of "
                         "1048576 bytes (http.max_body_bytes)")
        self.assertLess(time.monotonic() - started, 5)
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: deflate",
                               self.server.url("/v2/models/echo/infer"),
                               data=zlib.compress(b" " * (2 << 20)))
        self.assertEqual(status, 413, body)
        request = json.dumps(echo_request()).encode()
        status, _, body = curl("-X", "POST", "-H", "Content-Encoding: gzip",
                               self.server.url("/v2/models/echo/infer"),
                               data=gzip.compress(request))
        self.assertEqual(status, 200, body)
        self.assertEqual(self.server.process.poll(), None)


class ConnectionFloodTest(HeldConnectionsTest):
    """Many idle connections: the server neither spins nor stops answering once they go."""

    def open_connections(self, port, count):
        for _ in range(count):
            self.sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))

    def assert_not_spinning(self, server):
        before = cpu_seconds(server.serving_pid)
        time.sleep(1.0)
        used = cpu_seconds(server.serving_pid) - before
        self.assertLess(used, 0.3, f"the server used {used:.2f} s of CPU in 1 s while idle")

    def close_connections_then_expect_health(self, server):
        for sock in self.sockets:
            sock.close()
        self.sockets = []
        deadline = time.time() + 10
        while time.time() < deadline:
            if curl("--max-time", "2", server.url("/v2/health/live"))[0] == 200:
                return
            time.sleep(0.1)
        self.fail("the server does not answer health after the clients went away")

    def test_out_of_file_descriptors_backs_off_and_recovers(self):
        import resource
        server = Server(self.repository, {}, copies=1, preexec_fn=lambda: resource.setrlimit(
            resource.RLIMIT_NOFILE, (80, 80)))
        try:
            self.open_connections(server.port, 150)  # more than the server has descriptors
            time.sleep(0.3)
            self.assert_not_spinning(server)
            self.assertIn("cannot accept connections; retrying every 100 ms", server.log_text())
            self.close_connections_then_expect_health(server)
        finally:
            self.assertEqual(server.stop(), 0)


class IdleTimeoutTest(SharedServerTest):
    """http.idle_timeout_s = 1: for idle connections and stalled bodies, not slow ones."""

    CONFIG = {"http": {"idle_timeout_s": 1}}
    COPIES = 1

    def connect(self):
        return socket.create_connection(("127.0.0.1", self.server.port), timeout=10)

    @staticmethod
    def read_all(sock):
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received

    def test_a_body_that_keeps_coming_may_take_longer_than_the_idle_timeout(self):
        body = json.dumps(echo_request()).encode()
        with self.connect() as sock:
            sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nConnection: close"
                         b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            start = time.time()
            step = len(body) // 10 + 1
            for at in range(0, len(body), step):  # 2.5 s in all, 0.25 s between pieces
                sock.sendall(body[at:at + step])
                time.sleep(0.25)
            received = self.read_all(sock)
        self.assertGreater(time.time() - start, 2.0)
        self.assertTrue(received.startswith(b"HTTP/1.1 200"), received[:300])

    def test_a_stalled_body_gets_408(self):
        with self.connect() as sock:
            sock.sendall(b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Length: 100\r\n\r\n{\"inputs\"")
            start = time.time()
            received = self.read_all(sock)
        self.assertTrue(received.startswith(b"HTTP/1.1 408"), received)
        self.assertIn(b"no data of the request body arrived for 1 s", received)
        self.assertLess(time.time() - start, 3)

    def test_an_idle_connection_is_closed_quietly(self):
        with self.connect() as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            first = sock.recv(65536)
            self.assertTrue(first.startswith(b"HTTP/1.1 200"), first)
            start = time.time()
            self.assertEqual(self.read_all(sock), b"", "closed without an answer")
            self.assertLess(time.time() - start, 3)


if __name__ == "__main__":
    unittest.main()
