"""Orochi's Python API, importable in every interpreter copy.

This package grows with the engine bindings; today it exposes the copy's identity and the
functions the host registered for it.
"""

import _orochi

__version__ = "0.1.0"

ABI_VERSION = _orochi.ABI_VERSION


def copy_id() -> int:
    """The number of the interpreter copy this code runs in."""
    return _orochi.copy_id()


def call_host(name: str, payload: bytes | str = b""):
    """Calls the host function registered under `name`.

    The copy's GIL stays held for the whole call; host functions are expected to return quickly.
    """
    return _orochi.call_host(name, payload)
