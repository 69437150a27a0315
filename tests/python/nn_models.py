"""Model code shared by the fixture generator (under PyTorch) and the tests (under Orochi).

The same source builds the reference module with `torch.nn` and the module under test with
`orochi.nn`, which is the promise of the API: model code written for PyTorch runs unchanged.
This file imports neither library; callers pass theirs in.

A fixture describes its module as a JSON "spec": {"class": name, "args": [...], "kwargs": {...}}.
In argument values, JSON lists stand for tuples, {"module": spec} for a nested module and
{"ordered_dict": [[key, value], ...]} for an OrderedDict (Sequential's second constructor).
"""

from collections import OrderedDict


def define_models(torch, nn, F):
    """Returns {class name: class} for the composite models used by the fixtures."""

    class BasicBlock(nn.Module):
        """torchvision's ResNet BasicBlock, with its 1x1 conv + BN shortcut built in."""

        def __init__(self, inplanes, planes, stride=1):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = None  # a plain attribute until a module replaces it
            if stride != 1 or inplanes != planes:
                self.downsample = nn.Sequential(
                    nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                    nn.BatchNorm2d(planes))

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return self.relu(out + identity)

    class TinyNet(nn.Module):
        """Every container, a tied weight and both kinds of buffer, with three outputs."""

        def __init__(self, vocab=10, width=8):
            super().__init__()
            self.embed = nn.Embedding(vocab, width, padding_idx=0)
            self.blocks = nn.ModuleList([nn.Linear(width, width), nn.Linear(width, width,
                                                                             bias=False)])
            self.heads = nn.ModuleDict({
                "cls": nn.Linear(width, 3),
                "reg": nn.Sequential(OrderedDict([("fc", nn.Linear(width, 4)),
                                                  ("act", nn.Tanh())])),
            })
            self.norm = nn.LayerNorm(width)
            self.register_buffer("scale", torch.ones(1) * 2.0)
            self.register_buffer("cache", torch.zeros(2), persistent=False)
            self.bn = nn.BatchNorm1d(width)
            self.out = nn.Linear(width, vocab, bias=False)
            self.out.weight = self.embed.weight  # tied, as language models do

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = F.gelu(block(x))
            x = self.norm(x) * self.scale
            pooled = self.bn(x.mean(dim=1))
            return self.heads["cls"](pooled), self.heads["reg"](pooled), self.out(x)

    return {"BasicBlock": BasicBlock, "TinyNet": TinyNet}


def decode_value(value, classes):
    """A spec argument as the Python value a constructor takes (see the module docstring)."""
    if isinstance(value, list):
        return tuple(decode_value(item, classes) for item in value)
    if isinstance(value, dict):
        if set(value) == {"module"}:
            return build_module(value["module"], classes)
        if set(value) == {"ordered_dict"}:
            return OrderedDict((key, decode_value(item, classes))
                               for key, item in value["ordered_dict"])
        raise ValueError(f"unknown spec value {value!r}")
    return value


def build_module(spec, classes):
    """Builds the module a spec describes; classes maps class names to classes."""
    cls = classes[spec["class"]]
    args = [decode_value(arg, classes) for arg in spec.get("args", [])]
    kwargs = {key: decode_value(arg, classes) for key, arg in spec.get("kwargs", {}).items()}
    return cls(*args, **kwargs)
