"""Model code that misbehaves on request, for the tests that the server survives it: each mode
is something a model's code may do that reaches past the model (the process, its descriptors,
its working directory, the modules every model shares)."""

import os
import sys


class Hostile:
    def __init__(self, context):
        pass

    def predict(self, inputs):
        mode = inputs["mode"][0].decode()
        if mode == "exit":
            os._exit(7)
        elif mode == "abort":
            os.abort()
        elif mode == "close_stderr":
            os.close(2)
        elif mode == "close_std_range":
            os.closerange(0, 1024)
        elif mode == "close_stderr_file":  # frees descriptor 2 past the guard on os.close
            os.fdopen(2, "wb").close()
        elif mode == "forget_serving":  # the module that holds every model of the copy
            del sys.modules["orochi.serving"]
        elif mode == "chdir":
            os.chdir("/")
        elif mode == "huge_error":
            raise ValueError("x" * (16 << 20))
        elif mode == "segfault":  # a native crash, as a C extension's bug would make one
            import ctypes
            ctypes.string_at(0)
        elif mode == "stack_overflow":  # C recursion that the raised recursion limit lets run
            sys.setrecursionlimit(1 << 30)
            nested = []
            for _ in range(1 << 20):
                nested = [nested]
            repr(nested)
        elif mode == "exhaust_descriptors":  # leaks files until the process has none left
            kept = []
            try:
                while True:
                    kept.append(open("/dev/null"))
            except OSError:
                pass
            import time
            time.sleep(1)  # held across several repository polls
            for file in kept:
                file.close()
        elif mode == "terminate_self":  # as `kill` of the server would: a graceful stop
            import signal
            os.kill(os.getpid(), signal.SIGTERM)
        elif mode == "terminate_supervisor":
            import signal
            os.kill(os.getppid(), signal.SIGTERM)
        elif mode == "stop_process":  # freezes the whole process; nothing in it can continue it
            import signal
            os.kill(os.getpid(), signal.SIGSTOP)
        elif mode == "write_fds":  # past sys.stdout, straight to the process's descriptors
            os.write(2, b"to descriptor 2\n")
            os.write(1, b"y" * 10000 + b"\n")
        elif mode == "flood_fds":
            for _ in range(5000):
                os.write(1, b"flood\n")
        elif mode == "odd_keys":
            return {"out": [1.0], 1: [2.0], None: [3.0]}
        return {"out": [1.0]}
