"""orochi.cuda: the GPUs of the shared engine, with PyTorch's torch.cuda names.

Devices are the process's: every interpreter copy sees the same GPUs, the same memory and the
same cached blocks. Work is queued on a stream of the calling thread, so copies do not wait for
each other; synchronize() waits for the work of every thread on the device.
"""

import _orochi_engine


def is_available() -> bool:
    return _orochi_engine._cuda_device_count() > 0


def device_count() -> int:
    return _orochi_engine._cuda_device_count()


def unavailable_reason() -> str:
    """Why there is no GPU ("" when there is one): no CUDA in this build, no driver, no GPU."""
    return _orochi_engine._cuda_unavailable_reason()


def current_device() -> int:
    _require()
    return 0


def _device(device):
    if device is None:
        return "cuda:0"
    if isinstance(device, int):
        return f"cuda:{device}"
    return device


def _require():
    if not is_available():
        raise RuntimeError(f"CUDA is not available: {unavailable_reason()}")


def synchronize(device=None) -> None:
    _require()
    _orochi_engine._synchronize(_device(device))


def memory_allocated(device=None) -> int:
    """Bytes held by live tensors on the device (the allocator's rounded block sizes)."""
    _require()
    return _orochi_engine._memory_stats(_device(device))["allocated_bytes"]


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds on the device: live tensors plus its cache."""
    _require()
    return _orochi_engine._memory_stats(_device(device))["reserved_bytes"]


def max_memory_allocated(device=None) -> int:
    _require()
    return _orochi_engine._memory_stats(_device(device))["peak_allocated_bytes"]


def memory_stats(device=None) -> dict:
    _require()
    return _orochi_engine._memory_stats(_device(device))


def empty_cache() -> None:
    """Returns the allocator's cached blocks of every GPU to the driver."""
    for index in range(device_count()):
        _orochi_engine._empty_cache(f"cuda:{index}")


class _MatmulBackend:
    """orochi.backends.cuda.matmul: allow_tf32 as torch.backends.cuda.matmul has it."""

    @property
    def allow_tf32(self) -> bool:
        return _orochi_engine._allow_tf32()

    @allow_tf32.setter
    def allow_tf32(self, allow: bool) -> None:
        _orochi_engine._set_allow_tf32(bool(allow))


matmul = _MatmulBackend()
