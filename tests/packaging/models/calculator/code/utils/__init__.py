from .text import normalise  # a relative import inside the package

WHICH = "calculator"
