"""uvicorn's command line with two fixes to how `--workers N` (N > 1) shares its port.

With several workers, uvicorn's supervisor binds one socket (Config.bind_socket) and every
worker listens on that same socket. Two things then go wrong under a few keep-alive clients:

- Nagle stays on. The socket is created with `proto` 0; accepted sockets copy it, and asyncio
  only sets TCP_NODELAY on sockets whose proto is IPPROTO_TCP. Each response (headers and body
  written separately) then waits ~40 ms for the client's delayed ACK, whatever the model costs
  (Kludex/uvicorn#3149; `--workers 1` builds its socket another way and is not affected).
- One worker takes every connection. asyncio accepts up to `backlog` connections each time
  the socket is readable, so the first worker to wake takes a whole burst: wrk's 8
  connections all land on one of 2 workers and the other idles.

So each worker here listens on a socket of its own, labelled IPPROTO_TCP, bound to the same
address with SO_REUSEPORT, and the kernel spreads new connections over the workers (by a hash
of the address pair, so unevenly when there are few connections per worker).

    /usr/bin/python3.11 uvicorn_workers.py APP --workers N ...   (uvicorn's own options)
"""

import socket

import uvicorn.config
import uvicorn.main
import uvicorn.server

_bind_socket = uvicorn.config.Config.bind_socket
_startup = uvicorn.server.Server.startup


def _reuse_port_socket(address, family) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def _is_tcp(sock: socket.socket) -> bool:
    return sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM


def _bind_shared_port(self) -> socket.socket:
    """In the supervisor: the port stays bound (never listening, so it takes no connections),
    with SO_REUSEPORT so that the workers can bind it too."""
    sock = _bind_socket(self)  # keeps uvicorn's checks and its "running on" line
    if not _is_tcp(sock):
        return sock
    address, family = sock.getsockname(), sock.family
    sock.close()
    sock = _reuse_port_socket(address, family)
    sock.set_inheritable(True)
    return sock


async def _startup_on_own_socket(self, sockets=None):
    """In each worker: its own listening socket in place of the shared one."""
    if sockets:
        own = []
        for sock in sockets:
            if _is_tcp(sock):
                address, family = sock.getsockname(), sock.family
                sock.close()
                sock = _reuse_port_socket(address, family)
            own.append(sock)
        sockets = own
    return await _startup(self, sockets)


uvicorn.config.Config.bind_socket = _bind_shared_port
uvicorn.server.Server.startup = _startup_on_own_socket

if __name__ == "__main__":  # the workers (multiprocessing spawn) import this file again
    uvicorn.main.main()
