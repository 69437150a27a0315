"""A model that prints, for the tests of how a server logs what its models write."""

import sys
import threading


class Printer:
    def __init__(self, context):
        print("loading the printer")

    def predict(self, inputs):
        mode = inputs["mode"][0].decode()
        count = int(inputs["count"][0])
        if mode == "lines":  # stdout, stderr, a partial line and one from a thread of its own
            print("hello from predict", count)
            print("a warning", file=sys.stderr)
            sys.stdout.write("no newline")
            sys.stdout.buffer.write("bytes é\n".encode())
            thread = threading.Thread(target=print, args=("from a thread",))
            thread.start()
            thread.join()
        elif mode == "flood":
            for i in range(count):
                print("flood", i)
        elif mode == "long":
            print("x" * count)
        return {"done": [True]}
