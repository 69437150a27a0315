"""A model that takes its time: for deadlines, interrupts and graceful shutdown."""

import json
import os
import time


class Slow:
    def __init__(self, context):
        pass

    def predict(self, inputs):
        mode = inputs["mode"][0].decode()
        seconds = float(inputs["seconds"][0])
        if mode == "sleep":  # time.sleep, returns on its own
            time.sleep(seconds)
        elif mode == "spin":  # pure Python that never returns unless interrupted
            while True:
                pass
        elif mode == "fail":
            raise ValueError(f"asked to fail after {seconds} s")
        elif mode == "fail_in_stdlib":  # an exception raised inside the standard library
            json.loads("{")
        elif mode == "csleep":  # C code that ignores interrupts, then returns after all
            import ctypes
            ctypes.CDLL("libc.so.6").sleep(int(seconds))
        elif mode == "block":  # C code that holds the GIL and never looks at interrupts
            sum(range(10**15))
        elif mode == "fork":  # a child process (a copy of the whole server) that outlives it
            if os.fork() == 0:
                time.sleep(seconds)
                os._exit(0)
        return {"done": [True]}
