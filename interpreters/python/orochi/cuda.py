"""orochi.cuda: what PyTorch code asks about the GPU. This engine build runs on the CPU only."""


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def synchronize(device=None) -> None:
    del device
    raise RuntimeError("CUDA is not available: this build of Orochi's engine runs on the CPU only")
