"""Printing tensors the way PyTorch prints them, so logs and doctests read the same."""

import math

_SUMMARIZE_OVER = 1000  # elements; bigger tensors print their edges only
_EDGE_ITEMS = 3
_LINE_WIDTH = 80
_DEFAULT_DTYPES = ("orochi.float32", "orochi.int64", "orochi.bool")


class _Formatter:
    """Chooses one format for every element so that columns line up."""

    def __init__(self, values, floating: bool):
        self.floating = floating
        finite = [v for v in values if isinstance(v, float) and math.isfinite(v)]
        self.integral = not floating or all(v == int(v) for v in finite)
        self.scientific = False
        if floating and finite and not self.integral:
            magnitudes = [abs(v) for v in finite if v != 0]
            if magnitudes:
                largest, smallest = max(magnitudes), min(magnitudes)
                self.scientific = largest / smallest > 1000 or largest > 1e8 or smallest < 1e-4
        elif floating and finite and self.integral:
            self.scientific = max(abs(v) for v in finite) > 1e8
        # Like PyTorch, columns are as wide as the nonzero finite values need (nan and inf may
        # stick out); integer tensors count every value.
        measured = values if not floating else [v for v in finite if v != 0]
        self.width = max((len(self._text(v)) for v in measured), default=1)

    def _text(self, value) -> str:
        if isinstance(value, bool):
            return "True" if value else "False"
        if not self.floating:
            return str(value)
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if self.scientific:
            return f"{value:.4e}"
        if self.integral:
            return f"{value:.0f}."
        return f"{value:.4f}"

    def format(self, value) -> str:
        return self._text(value).rjust(self.width)


def _summarized(tensor, summarize: bool) -> list:
    """The nested list to print, with None standing for the elided middle of long dims."""
    if tensor.dim() == 0:
        return tensor.item()
    size = tensor.shape[0]
    if summarize and size > 2 * _EDGE_ITEMS:
        indices = list(range(_EDGE_ITEMS)) + [None] + list(range(size - _EDGE_ITEMS, size))
    else:
        indices = list(range(size))
    return [None if i is None else _summarized(tensor[i], summarize) for i in indices]


def _leaves(nested):
    if isinstance(nested, list):
        for item in nested:
            yield from _leaves(item)
    elif nested is not None:
        yield nested


def _render(nested, formatter: _Formatter, indent: int, depth: int) -> str:
    if not isinstance(nested, list):
        return formatter.format(nested)
    if not nested or not isinstance(nested[0], list) and nested[0] is not None or (
        all(not isinstance(item, list) for item in nested)
    ):
        # Innermost dim: elements on one line, wrapped at the line width.
        items = ["..." if item is None else formatter.format(item) for item in nested]
        per_line = max(1, (_LINE_WIDTH - indent) // (formatter.width + 2))
        lines = [", ".join(items[i : i + per_line]) for i in range(0, len(items), per_line)]
        return "[" + (",\n" + " " * (indent + 1)).join(lines) + "]"
    rows = []
    for item in nested:
        rows.append("..." if item is None else _render(item, formatter, indent + 1, depth + 1))
    separator = "," + "\n" * (depth_gap(nested)) + " " * (indent + 1)
    return "[" + separator.join(rows) + "]"


def depth_gap(nested) -> int:
    """Blank lines between rows: one newline per level of nesting below, as PyTorch does."""
    depth = 0
    probe = nested
    while isinstance(probe, list) and probe:
        probe = next((item for item in probe if item is not None), None)
        depth += 1
    return max(1, depth - 1)


def tensor_repr(tensor) -> str:
    dtype_name = repr(tensor.dtype)
    suffix = ""
    if dtype_name not in _DEFAULT_DTYPES:
        suffix += f", dtype={dtype_name}"
    if tensor.is_cuda:
        suffix = f", device='{tensor.device}'" + suffix
    if tensor.numel() == 0:
        size = "" if tensor.dim() == 1 else f", size={tuple(tensor.shape)}"
        return f"tensor([]{size}{suffix})"
    readable = tensor if repr(tensor.dtype) != "orochi.bfloat16" else tensor.float()
    nested = _summarized(readable, tensor.numel() > _SUMMARIZE_OVER)
    values = list(_leaves(nested)) if isinstance(nested, list) else [nested]
    formatter = _Formatter(values, tensor.dtype.is_floating_point)
    body = _render(nested, formatter, len("tensor("), 0)
    return f"tensor({body}{suffix})"
