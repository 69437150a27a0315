"""Inference-only neural-network modules with PyTorch's names, arguments and state_dict keys.

A model written against `torch.nn` runs here once `torch` is replaced by `orochi`, and a
PyTorch `state_dict` exported to safetensors loads unchanged: every module registers its
parameters and buffers under the same names, in the same order, as its PyTorch namesake.

Orochi only runs inference, so modules are always in eval mode, there is no autograd and
`train(True)` refuses. `load_state_dict` binds the given tensors instead of copying into the
module's own, so read-only weights memory-mapped from a safetensors file are shared by every
interpreter copy without a copy.
"""

import collections
import itertools
import math
import operator
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping

import orochi
from orochi.nn import functional as F

__all__ = [
    "Parameter", "Module", "Identity", "Linear", "Conv1d", "Conv2d", "BatchNorm1d",
    "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "Dropout", "ReLU", "GELU", "SiLU",
    "Tanh", "Sigmoid", "Softmax", "Flatten", "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d",
    "Sequential", "ModuleList", "ModuleDict", "MultiheadAttention", "TransformerEncoderLayer",
]


# --------------------------------------------------------------------------------------------
# Parameters


class _ParameterMarks:
    """Remembers which tensors were made by `Parameter(...)`, without keeping them alive.

    `Module.__setattr__` needs to tell `self.w = Parameter(t)` (a registered parameter) from
    `self.w = t` (a plain attribute), as PyTorch does, but `Parameter(t)` returns `t` itself.
    Entries are keyed by id() and hold a weak reference, so a dead tensor's id that Python hands
    out again is never mistaken for a parameter; no hashing or `==` of tensors is involved.
    """

    def __init__(self):
        self._refs = {}

    def add(self, tensor, keep_alive=True):
        key = id(tensor)
        try:
            self._refs[key] = weakref.ref(tensor, lambda _, key=key: self._refs.pop(key, None))
        except TypeError:
            # Not weak-referenceable: keeping the tensor alive is the only way to keep its id
            # unique. Only done for Parameter(...) calls, which are few, never when loading.
            if keep_alive:
                self._refs[key] = lambda: tensor

    def __contains__(self, obj):
        ref = self._refs.get(id(obj))
        return ref is not None and ref() is obj


_parameter_marks = _ParameterMarks()


class _ParameterMeta(type):
    def __instancecheck__(cls, obj):
        return obj in _parameter_marks


class Parameter(metaclass=_ParameterMeta):
    """Marks a tensor as a module parameter: `self.weight = Parameter(tensor)`.

    Unlike PyTorch's, it is not a tensor subclass: `Parameter(t)` returns `t` itself (there is
    no autograd, so there is nothing to add to it), and `isinstance(t, Parameter)` is true for
    tensors made this way or bound by `load_state_dict`.
    """

    def __new__(cls, data=None, requires_grad=True):
        del requires_grad  # inference only: nothing is ever differentiated
        if data is None:
            data = orochi.empty(0)
        if not orochi.is_tensor(data):
            raise TypeError(f"Parameter() expects a tensor, got {type(data).__name__}")
        _parameter_marks.add(data)
        return data


# --------------------------------------------------------------------------------------------
# Helpers


def _ntuple(n, name):
    def parse(x):
        if isinstance(x, Iterable) and not isinstance(x, str):
            return tuple(x)
        return tuple(itertools.repeat(x, n))

    parse.__name__ = name
    return parse


_single = _ntuple(1, "_single")
_pair = _ntuple(2, "_pair")


def _factory(dtype):
    return {} if dtype is None else {"dtype": dtype}


def _place(tensor, device):
    return tensor if device is None else tensor.to(device)


def _uniform(shape, bound, device, dtype):
    """U(-bound, bound), like PyTorch's initialisers.

    The values only matter until real weights are loaded. Without a seed, orochi.rand takes the
    next one of the copy's sequence, so orochi.manual_seed() makes initialisation repeatable,
    as torch.manual_seed() does.
    """
    noise = orochi.rand(*shape, **_factory(dtype))
    return _place((noise * 2.0 - 1.0) * bound, device)


def _kaiming_uniform_bound(fan_in):
    # PyTorch's kaiming_uniform_(a=sqrt(5)) and its bias init both reduce to 1/sqrt(fan_in).
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


def _ones(shape, device, dtype):
    return _place(orochi.ones(*shape, **_factory(dtype)), device)


def _zeros(shape, device, dtype):
    return _place(orochi.zeros(*shape, **_factory(dtype)), device)


def _floating_dtypes():
    return (orochi.float16, orochi.bfloat16, orochi.float32, orochi.float64)


def _is_floating(tensor):
    return any(tensor.dtype == dtype for dtype in _floating_dtypes())


def _is_dtype(value):
    all_dtypes = _floating_dtypes() + (orochi.int64, orochi.int32, orochi.int16, orochi.int8,
                                       orochi.uint8, orochi.bool)
    return any(value is dtype or (type(value) is type(dtype) and value == dtype)
               for dtype in all_dtypes)


def _shape_str(shape):
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _addindent(text, spaces):
    """Indents every line but the first (PyTorch's repr helper)."""
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * spaces + line for line in lines[1:])


class _IncompatibleKeys(collections.namedtuple("IncompatibleKeys",
                                               ["missing_keys", "unexpected_keys"])):
    __slots__ = ()

    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class _LoadState:
    """What one load_state_dict pass found, before anything is bound."""

    def __init__(self, state_dict, assign):
        self.state_dict = state_dict
        self.assign = assign
        self.consumed = set()  # keys some module looked for, found or not
        self.missing = []
        self.errors = []
        self.slots = []  # every (registry dict, name, current tensor, is a parameter) visited
        self.values = {}  # id(current tensor) -> the tensor to bind in its place


# --------------------------------------------------------------------------------------------
# Module


class Module:
    """Base class of every layer and model, as `torch.nn.Module` (inference only)."""

    # Orochi is inference-only; a class attribute keeps `if self.training:` branches working.
    training = False

    def __init__(self):
        # object.__setattr__: our own __setattr__ needs these dicts to exist first.
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "_modules", OrderedDict())

    def forward(self, *args, **kwargs):
        raise NotImplementedError(
            f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- registration ------------------------------------------------------------------------

    def _check_new_name(self, name, kind, registry):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
        if hasattr(self, name) and name not in registry:
            raise KeyError(f"attribute '{name}' already exists")

    def register_parameter(self, name, param):
        """Adds a parameter (a tensor, or None for an absent optional one such as a bias)."""
        self._check_new_name(name, "parameter", self._parameters)
        if param is not None and not orochi.is_tensor(param):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter "
                            f"'{name}' (tensor or None required)")
        if param is not None:
            _parameter_marks.add(param)
        self._parameters[name] = param

    def register_buffer(self, name, tensor, persistent=True):
        """Adds a buffer: state that is not a parameter (e.g. BatchNorm's running statistics).

        Non-persistent buffers are left out of state_dict().
        """
        self._check_new_name(name, "buffer", self._buffers)
        if tensor is not None and not orochi.is_tensor(tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer "
                            f"'{name}' (tensor or None required)")
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_module(self, name, module):
        """Adds a child module, reachable as an attribute and named in state_dict keys."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_new_name(name, "module", self._modules)
        self._modules[name] = module

    add_module = register_module

    def __setattr__(self, name, value):
        def remove_from(*registries):
            for registry in registries:
                if name in registry:
                    if registry is self._buffers:
                        self._non_persistent_buffers_set.discard(name)
                    del registry[name]

        params = self.__dict__.get("_parameters")
        if params is None:
            # PyTorch's rule: state can only be registered once Module.__init__ has run.
            if isinstance(value, Module) or value in _parameter_marks:
                kind = "module" if isinstance(value, Module) else "parameters"
                raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
            object.__setattr__(self, name, value)
            return

        def refuse(kind, wanted):
            raise TypeError(f"cannot assign '{type(value).__name__}' as {kind} '{name}' "
                            f"({wanted} or None expected)")

        if isinstance(value, Module):
            remove_from(self.__dict__, params, self._buffers)
            self._modules[name] = value
        elif value in _parameter_marks:
            remove_from(self.__dict__, self._buffers, self._modules)
            params[name] = value
        elif name in params:
            # A new value for an existing parameter; weight tying such as
            # `head.weight = embed.weight` assigns a registered tensor by name.
            if value is not None and not orochi.is_tensor(value):
                refuse("parameter", "a tensor")
            params[name] = value
        elif name in self._modules:
            if value is not None:
                refuse("child module", "a Module")
            self._modules[name] = None
        elif name in self._buffers:
            if value is not None and not orochi.is_tensor(value):
                refuse("buffer", "a tensor")
            self._buffers[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # Only called when normal lookup fails: parameters, buffers and children live in dicts.
        state = self.__dict__
        for registry in ("_parameters", "_buffers", "_modules"):
            if registry in state and name in state[registry]:
                return state[registry][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for registry in (self._parameters, self._buffers, self._modules):
            if name in registry:
                del registry[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        names = set(super().__dir__())
        names.update(self._parameters, self._buffers, self._modules)
        return sorted(name for name in names if not name[0].isdigit())

    # -- traversal ---------------------------------------------------------------------------

    def _named_members(self, get_members, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = (self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate)
                   if recurse else [(prefix, self)])
        for module_prefix, module in modules:
            for name, value in get_members(module):
                if value is None:
                    continue
                if remove_duplicate:
                    if id(value) in memo:
                        continue
                    memo.add(id(value))
                yield (module_prefix + "." if module_prefix else "") + name, value

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        """Yields (dotted name, tensor); a tensor shared by several modules comes once."""
        yield from self._named_members(lambda m: m._parameters.items(), prefix, recurse,
                                       remove_duplicate)

    def parameters(self, recurse=True):
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        yield from self._named_members(lambda m: m._buffers.items(), prefix, recurse,
                                       remove_duplicate)

    def buffers(self, recurse=True):
        for _, buffer in self.named_buffers(recurse=recurse):
            yield buffer

    def named_children(self):
        seen = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in seen:
                seen.add(id(module))
                yield name, module

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        """Yields (dotted name, module) for this module and every descendant, parents first."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            child_prefix = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, child_prefix, remove_duplicate)

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def get_submodule(self, target):
        """The descendant named by a dotted path such as "layers.0.attn"."""
        module = self
        if target == "":
            return module
        for item in target.split("."):
            if not isinstance(module._modules.get(item), Module):
                raise AttributeError(f"{module._get_name()} has no submodule `{item}`")
            module = module._modules[item]
        return module

    def apply(self, fn):
        """Calls fn on every descendant, children first, then on self; returns self."""
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    # -- state dict --------------------------------------------------------------------------

    def _local_state(self):
        """This module's own (name, registry, tensor) entries that belong in a state_dict."""
        for name, param in self._parameters.items():
            if param is not None:
                yield name, self._parameters, param
        for name, buffer in self._buffers.items():
            if buffer is not None and name not in self._non_persistent_buffers_set:
                yield name, self._buffers, buffer

    def state_dict(self, *, destination=None, prefix="", keep_vars=False):
        """An OrderedDict of every parameter and persistent buffer, under PyTorch's keys.

        The values are the module's tensors themselves (no copy).
        """
        del keep_vars  # no autograd: there is no difference between a tensor and its data
        if destination is None:
            destination = OrderedDict()
        for name, _, tensor in self._local_state():
            destination[prefix + name] = tensor
        for name, module in self._modules.items():
            if module is not None:
                module.state_dict(destination=destination, prefix=prefix + name + ".")
        return destination

    def _optional_state(self):
        """Names of this module's state entries that a checkpoint may leave out."""
        return ()

    def _load_from_state_dict(self, load, prefix):
        """Checks this module's own entries of load.state_dict and queues their bindings."""
        for name, registry, current in self._local_state():
            key = prefix + name
            load.consumed.add(key)
            load.slots.append((registry, name, current, registry is self._parameters))
            if key not in load.state_dict:
                if name not in self._optional_state():
                    load.missing.append(key)
                continue
            value = load.state_dict[key]
            if not orochi.is_tensor(value):
                load.errors.append(f'While copying the parameter named "{key}", expected a '
                                   f"tensor from checkpoint but received {type(value)}")
                continue
            if tuple(value.shape) != tuple(current.shape):
                load.errors.append(
                    f"size mismatch for {key}: copying a param with shape "
                    f"{_shape_str(value.shape)} from checkpoint, the shape in current model is "
                    f"{_shape_str(current.shape)}.")
                continue
            if not load.assign:
                # Like PyTorch's copy_, the module keeps its dtype and device; only a tensor
                # that already matches is bound as it is, sharing its memory.
                if value.dtype != current.dtype:
                    value = value.to(current.dtype)
                if str(value.device) != str(current.device):
                    value = value.to(current.device)
            # Keyed by the current tensor, so that tied weights stay tied (see load_state_dict).
            load.values[id(current)] = value

    def load_state_dict(self, state_dict, strict=True, assign=False):
        """Binds the tensors of state_dict to this module's parameters and buffers.

        A tensor whose dtype and device match the module's is bound as it is, not copied, so
        read-only memory-mapped weights stay shared; others are converted to the module's
        dtype and device, as PyTorch's copy would (assign=True binds every tensor as it is).
        Nothing is bound unless the whole load succeeds. A tensor that several modules share
        (tied weights) is replaced everywhere, so they stay tied, as PyTorch's in-place copy
        keeps them; when several keys name it, the last one wins, as in PyTorch.

        Raises RuntimeError naming every missing, unexpected (strict only) and mis-shaped key.
        Returns (missing_keys, unexpected_keys).
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        load = _LoadState(state_dict, assign)

        def visit(module, prefix):
            module._load_from_state_dict(load, prefix)
            for name, child in module._modules.items():
                if child is not None:
                    visit(child, prefix + name + ".")

        visit(self, "")
        unexpected = [key for key in state_dict if key not in load.consumed]

        messages = []
        if strict:
            if load.missing:
                messages.append("Missing key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{key}"' for key in load.missing)))
            if unexpected:
                messages.append("Unexpected key(s) in state_dict: {}. ".format(
                    ", ".join(f'"{key}"' for key in unexpected)))
        messages += load.errors
        if messages:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                self._get_name(), "\n\t".join(messages)))

        for registry, name, current, is_parameter in load.slots:
            value = load.values.get(id(current))  # the ids stay valid: current is still held
            if value is not None:
                if is_parameter:
                    _parameter_marks.add(value, keep_alive=False)
                registry[name] = value
        return _IncompatibleKeys(load.missing, unexpected)

    # -- modes and conversions ---------------------------------------------------------------

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        if mode:
            raise NotImplementedError(
                "Orochi is inference-only: modules are always in eval mode and cannot be "
                "trained; train(True) is not supported (eval() and train(False) are)")
        return self

    def eval(self):
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        del requires_grad  # no autograd
        return self

    def zero_grad(self, set_to_none=True):
        del set_to_none  # no gradients to clear

    def _apply(self, fn):
        for module in self.children():
            module._apply(fn)
        for registry in (self._parameters, self._buffers):
            for name, tensor in registry.items():
                if tensor is not None:
                    converted = fn(tensor)
                    if registry is self._parameters and converted is not tensor:
                        _parameter_marks.add(converted, keep_alive=False)
                    registry[name] = converted
        return self

    def to(self, *args, **kwargs):
        """Moves and/or casts parameters and buffers: to(device), to(dtype), to(tensor).

        As in PyTorch, a dtype only applies to floating-point tensors (BatchNorm's integer
        num_batches_tracked stays int64). Returns self.
        """
        device = kwargs.pop("device", None)
        dtype = kwargs.pop("dtype", None)
        kwargs.pop("non_blocking", None)
        if kwargs:
            raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
        for arg in args:
            if arg is None:
                continue
            if orochi.is_tensor(arg):
                device, dtype = arg.device, arg.dtype
            elif _is_dtype(arg):
                dtype = arg
            else:
                device = arg  # a device string such as "cuda:0", or a device object
        if dtype is not None and not any(dtype == d for d in _floating_dtypes()):
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got {dtype}")

        def convert(tensor):
            if dtype is not None and _is_floating(tensor) and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
            if device is not None and str(tensor.device) != str(device):
                tensor = tensor.to(device)
            return tensor

        return self._apply(convert)

    def _cast_floating(self, dtype):
        return self._apply(lambda t: t.to(dtype) if _is_floating(t) and t.dtype != dtype else t)

    def float(self):
        return self._cast_floating(orochi.float32)

    def double(self):
        return self._cast_floating(orochi.float64)

    def half(self):
        return self._cast_floating(orochi.float16)

    def bfloat16(self):
        return self._cast_floating(orochi.bfloat16)

    def cpu(self):
        return self.to("cpu")

    def cuda(self, device=None):
        return self.to("cuda" if device is None else f"cuda:{int(device)}")

    # -- repr --------------------------------------------------------------------------------

    def _get_name(self):
        return type(self).__name__

    def extra_repr(self):
        """This module's own settings for repr(); subclasses override it."""
        return ""

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _addindent(repr(module), 2)
                       for name, module in self._modules.items()]
        lines = extra_lines + child_lines
        text = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                text += extra_lines[0]
            else:
                text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"


# --------------------------------------------------------------------------------------------
# Simple layers


class Identity(Module):
    def __init__(self, *args, **kwargs):
        del args, kwargs  # accepted and ignored, as by PyTorch
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        bound = _kaiming_uniform_bound(in_features)
        self.weight = Parameter(_uniform((out_features, in_features), bound, device, dtype))
        if bias:
            self.bias = Parameter(_uniform((out_features,), bound, device, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class NonDynamicallyQuantizableLinear(Linear):
    """MultiheadAttention's out_proj; PyTorch's class name shows in repr()."""


class _ConvNd(Module):
    _to_tuple = None  # _single or _pair
    _functional = ""  # the name of the F function, looked up at call time

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, padding_mode, device, dtype):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            if padding_mode in ("reflect", "replicate", "circular"):
                raise NotImplementedError(
                    f"padding_mode='{padding_mode}' is not supported yet; only 'zeros' is")
            raise ValueError(f"padding_mode must be one of 'zeros', 'reflect', 'replicate' or "
                             f"'circular', but got padding_mode='{padding_mode}'")
        to_tuple = type(self)._to_tuple
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = to_tuple(kernel_size)
        self.stride = to_tuple(stride)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 "{'valid', 'same'}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
            self.padding = padding
        else:
            self.padding = to_tuple(padding)
        self.dilation = to_tuple(dilation)
        self.transposed = False
        self.output_padding = to_tuple(0)
        self.groups = groups
        self.padding_mode = padding_mode

        fan_in = in_channels // groups * math.prod(self.kernel_size)
        bound = _kaiming_uniform_bound(fan_in)
        shape = (out_channels, in_channels // groups) + self.kernel_size
        self.weight = Parameter(_uniform(shape, bound, device, dtype))
        if bias:
            self.bias = Parameter(_uniform((out_channels,), bound, device, dtype))
        else:
            self.register_parameter("bias", None)

    def forward(self, input):
        conv = getattr(F, self._functional)
        return conv(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                    self.groups)

    def extra_repr(self):
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * len(self.padding):
            text += f", padding={self.padding}"
        if self.dilation != (1,) * len(self.dilation):
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        if self.padding_mode != "zeros":
            text += f", padding_mode={self.padding_mode}"
        return text


class Conv1d(_ConvNd):
    _to_tuple = staticmethod(_single)
    _functional = "conv1d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


class Conv2d(_ConvNd):
    _to_tuple = staticmethod(_pair)
    _functional = "conv2d"

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


# --------------------------------------------------------------------------------------------
# Normalisation


class _BatchNorm(Module):
    _input_dims = ()  # the input ranks this flavour accepts

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, device=None, dtype=None):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = Parameter(_ones((num_features,), device, dtype))
            self.bias = Parameter(_zeros((num_features,), device, dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", _zeros((num_features,), device, dtype))
            self.register_buffer("running_var", _ones((num_features,), device, dtype))
            self.register_buffer("num_batches_tracked",
                                 _place(orochi.tensor(0, dtype=orochi.int64), device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def _optional_state(self):
        # As PyTorch does for state dicts without version metadata (every safetensors file),
        # a missing num_batches_tracked is not an error: it only counts training steps.
        return ("num_batches_tracked",)

    def forward(self, input):
        if input.dim() not in self._input_dims:
            wanted = " or ".join(f"{d}D" for d in self._input_dims)
            raise ValueError(f"expected {wanted} input (got {input.dim()}D input)")
        mean, var = self.running_mean, self.running_var
        if mean is None:
            mean, var = self._batch_statistics(input)
        return F.batch_norm(input, mean, var, self.weight, self.bias, eps=self.eps)

    def _batch_statistics(self, input):
        """Per-channel mean and biased variance of this batch.

        Without running statistics PyTorch normalises with the batch's own, even in eval mode.
        Computed here, the functional only ever normalises with given statistics.
        """
        channels = input.shape[1]
        values = input.transpose(0, 1).reshape(channels, -1)  # (C, N * spatial)
        mean = values.mean(dim=1)
        centered = values - mean.unsqueeze(1)
        return mean, (centered * centered).mean(dim=1)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    _input_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    _input_dims = (4,)


def _normalized_shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 device=None, dtype=None):
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_ones(self.normalized_shape, device, dtype))
            if bias:
                self.bias = Parameter(_zeros(self.normalized_shape, device, dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, input):
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


class RMSNorm(Module):
    """torch.nn.RMSNorm (PyTorch >= 2.4): eps=None means torch.finfo(input.dtype).eps."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None,
                 dtype=None):
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = Parameter(_ones(self.normalized_shape, device, dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, input):
        return F.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, "
                f"elementwise_affine={self.elementwise_affine}")


# --------------------------------------------------------------------------------------------
# Embedding


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 _freeze=False, device=None, dtype=None):
        super().__init__()
        if max_norm is not None:
            # max_norm renormalises rows of the weight in place on every lookup.
            raise NotImplementedError("Embedding(max_norm=...) is not supported")
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            if padding_idx < 0:
                padding_idx += num_embeddings
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is None:
            weight = orochi.randn(num_embeddings, embedding_dim, **_factory(dtype))
            if padding_idx is not None:
                weight[padding_idx] = 0.0  # PyTorch zeroes the padding row at init
            self.weight = Parameter(_place(weight, device))
        else:
            if tuple(_weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError("Shape of weight does not match num_embeddings and "
                                 "embedding_dim")
            self.weight = Parameter(_weight)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        if embeddings.dim() != 2:
            raise ValueError("Embeddings parameter is expected to be 2-dimensional")
        rows, cols = embeddings.shape
        return cls(rows, cols, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                   scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=embeddings,
                   _freeze=freeze)

    def forward(self, input):
        return F.embedding(input, self.weight, self.padding_idx)

    def extra_repr(self):
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.max_norm is not None:
            text += f", max_norm={self.max_norm}"
        if self.norm_type != 2:
            text += f", norm_type={self.norm_type}"
        if self.scale_grad_by_freq is not False:
            text += f", scale_grad_by_freq={self.scale_grad_by_freq}"
        if self.sparse is not False:
            text += ", sparse=True"
        return text


# --------------------------------------------------------------------------------------------
# Activations and shape helpers


class Dropout(Module):
    """Identity at inference; kept so models and their reprs match PyTorch's."""

    def __init__(self, p=0.5, inplace=False):
        super().__init__()
        if p < 0 or p > 1:
            raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
        self.p = p
        self.inplace = inplace

    def forward(self, input):
        return input

    def extra_repr(self):
        return f"p={self.p}, inplace={self.inplace}"


class ReLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.relu(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class GELU(Module):
    def __init__(self, approximate="none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate argument must be either none or tanh, "
                             f"got {approximate!r}")
        self.approximate = approximate

    def forward(self, input):
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    def __init__(self, inplace=False):
        super().__init__()
        self.inplace = inplace

    def forward(self, input):
        return F.silu(input, inplace=self.inplace)

    def extra_repr(self):
        return "inplace=True" if self.inplace else ""


class Tanh(Module):
    def forward(self, input):
        return F.tanh(input)


class Sigmoid(Module):
    def forward(self, input):
        return F.sigmoid(input)


class Softmax(Module):
    def __init__(self, dim=None):
        super().__init__()
        self.dim = dim

    def forward(self, input):
        dim = self.dim
        if dim is None:
            # PyTorch's legacy implicit dim (it warns; so should callers' code reviewers).
            dim = 0 if input.dim() in (0, 1, 3) else 1
        return F.softmax(input, dim)

    def extra_repr(self):
        return f"dim={self.dim}"


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, input):
        return input.flatten(self.start_dim, self.end_dim)

    def extra_repr(self):
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


# --------------------------------------------------------------------------------------------
# Pooling


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False,
                 ceil_mode=False):
        super().__init__()
        if return_indices:
            raise NotImplementedError("MaxPool2d(return_indices=True) is not supported")
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.dilation = dilation
        self.return_indices = return_indices
        self.ceil_mode = ceil_mode

    def forward(self, input):
        # Options left at their defaults are not passed, so only a model that needs them
        # depends on the functional supporting them.
        options = {}
        if _pair(self.dilation) != (1, 1):
            options["dilation"] = self.dilation
        if self.ceil_mode:
            options["ceil_mode"] = True
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, **options)

    def extra_repr(self):
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False,
                 count_include_pad=True, divisor_override=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode = ceil_mode
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input):
        options = {}  # as in MaxPool2d: only the non-default ones
        if self.ceil_mode:
            options["ceil_mode"] = True
        if not self.count_include_pad:
            options["count_include_pad"] = False
        if self.divisor_override is not None:
            options["divisor_override"] = self.divisor_override
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, **options)

    def extra_repr(self):
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, input):
        return F.adaptive_avg_pool2d(input, self.output_size)

    def extra_repr(self):
        return f"output_size={self.output_size}"


# --------------------------------------------------------------------------------------------
# Containers


def _abs_index(index, length):
    index = operator.index(index)
    if not -length <= index < length:
        raise IndexError(f"index {index} is out of range")
    return index % length


class Sequential(Module):
    """Calls its children in order: Sequential(a, b, c) or Sequential(OrderedDict(...))."""

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, module in args[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(args):
                self.add_module(str(index), module)

    def _key(self, index):
        return list(self._modules)[_abs_index(index, len(self))]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(OrderedDict(list(self._modules.items())[index]))
        return self._modules[self._key(index)]

    def __setitem__(self, index, module):
        self.add_module(self._key(index), module)

    def __delitem__(self, index):
        if isinstance(index, slice):
            for key in list(self._modules)[index]:
                del self._modules[key]
        else:
            del self._modules[self._key(index)]
        # Renumber so that str(i) keys stay consecutive, as PyTorch does.
        modules = list(self._modules.values())
        self._modules.clear()
        for position, module in enumerate(modules):
            self._modules[str(position)] = module

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        for module in modules:
            self.append(module)
        return self

    def insert(self, index, module):
        if not isinstance(module, Module):
            raise AssertionError(f"module should be of type: {Module}")
        length = len(self._modules)
        if not -length <= index <= length:
            raise IndexError(f"Index out of range: {index}")
        if index < 0:
            index += length
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for position, child in enumerate(modules):
            self._modules[str(position)] = child
        return self

    def forward(self, input):
        for module in self:
            input = module(input)
        return input


class ModuleList(Module):
    """A list of modules registered as children "0", "1", ..."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return type(self)(list(self._modules.values())[index])
        return self._modules[str(_abs_index(index, len(self)))]

    def __setitem__(self, index, module):
        self.add_module(str(_abs_index(index, len(self))), module)

    def __delitem__(self, index):
        if isinstance(index, slice):
            for key in list(self._modules)[index]:
                del self._modules[key]
        else:
            del self._modules[str(_abs_index(index, len(self)))]
        modules = list(self._modules.values())
        self._modules.clear()
        for position, module in enumerate(modules):
            self._modules[str(position)] = module

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules.values())

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        return type(self)(itertools.chain(self, other))

    def append(self, module):
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules):
        if not isinstance(modules, Iterable):
            raise TypeError("ModuleList.extend should be called with an iterable, but got " +
                            type(modules).__name__)
        for module in modules:
            self.append(module)
        return self

    def insert(self, index, module):
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        for position, child in enumerate(modules):
            self.add_module(str(position), child)

    def __repr__(self):
        # PyTorch >= 2.0 folds runs of identical children: "(0-2): 3 x Linear(...)".
        reprs = [repr(module) for module in self]
        if not reprs:
            return self._get_name() + "()"
        runs = []  # [first index, last index, repr]
        for index, text in enumerate(reprs):
            if runs and runs[-1][2] == text:
                runs[-1][1] = index
            else:
                runs.append([index, index, text])
        lines = []
        for first, last, text in runs:
            if first == last:
                line = f"({first}): {text}"
            else:
                line = f"({first}-{last}): {last - first + 1} x {text}"
            lines.append(_addindent(line, 2))
        return self._get_name() + "(\n  " + "\n  ".join(lines) + "\n)"

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleList has no forward(); iterate over its modules")


class ModuleDict(Module):
    """An ordered dict of modules registered as children under their keys."""

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key):
        return self._modules[key]

    def __setitem__(self, key, module):
        self.add_module(key, module)

    def __delitem__(self, key):
        del self._modules[key]

    def __len__(self):
        return len(self._modules)

    def __iter__(self):
        return iter(self._modules)

    def __contains__(self, key):
        return key in self._modules

    def clear(self):
        self._modules.clear()

    def pop(self, key):
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules):
        if isinstance(modules, (Mapping, ModuleDict)):
            for key, module in modules.items():
                self[key] = module
        else:
            for index, pair in enumerate(modules):
                if len(pair) != 2:
                    raise ValueError(f"ModuleDict update sequence element #{index} has length "
                                     f"{len(pair)}; 2 is required")
                self[pair[0]] = pair[1]

    def forward(self, *args, **kwargs):
        raise NotImplementedError("ModuleDict has no forward(); index it by key")


# --------------------------------------------------------------------------------------------
# Attention and transformer


def _additive_mask(mask, dtype):
    """PyTorch's MHA masks as an additive float mask: bool True means "may NOT attend"."""
    if mask.dtype == orochi.bool:
        return orochi.zeros(*mask.shape, dtype=dtype, device=mask.device).masked_fill(
            mask, float("-inf"))
    if not _is_floating(mask):
        raise AssertionError("only bool and floating types of masks are supported")
    return mask if mask.dtype == dtype else mask.to(dtype)


def _causal_mask(length, source_length, device):
    """Bool (L, S) on `device`, True above the diagonal: the positions a causal query may not
    see."""
    rows = orochi.arange(length, device=device).reshape(length, 1)
    cols = orochi.arange(source_length, device=device).reshape(1, source_length)
    return cols > rows


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention with equal query, key and value sizes.

    Masks follow PyTorch's MHA convention (bool True = not allowed; float masks are added),
    and are turned into the additive form that scaled_dot_product_attention takes.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
                 add_zero_attn=False, kdim=None, vdim=None, batch_first=False, device=None,
                 dtype=None):
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got "
                             f"embed_dim={embed_dim} and num_heads={num_heads} instead")
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if not self._qkv_same_embed_dim:
            raise NotImplementedError("MultiheadAttention with kdim or vdim different from "
                                      "embed_dim is not supported")
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError("MultiheadAttention(add_bias_kv=True or "
                                      "add_zero_attn=True) is not supported")
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")

        # Xavier-uniform over the (3E, E) packed projection, as PyTorch initialises it.
        bound = math.sqrt(6.0 / (4 * embed_dim))
        self.in_proj_weight = Parameter(_uniform((3 * embed_dim, embed_dim), bound, device,
                                                 dtype))
        if bias:
            self.in_proj_bias = Parameter(_zeros((3 * embed_dim,), device, dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias,
                                                        device=device, dtype=dtype)
        if bias:
            self.out_proj.bias.zero_()  # as PyTorch's _reset_parameters
        self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn

    def _project(self, query, key, value):
        weight, bias = self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:
            # Self-attention: one GEMM for the three projections.
            return F.linear(query, weight, bias).chunk(3, dim=-1)
        weights = weight.chunk(3)
        biases = bias.chunk(3) if bias is not None else (None, None, None)
        return tuple(F.linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """Returns (output, weights): weights averaged over heads unless average_attn_weights
        is False, None unless need_weights. is_causal without attn_mask applies a causal mask.
        """
        batched = query.dim() == 3
        self_attention = query is key and key is value
        if not batched:
            # Unbatched (L, E): work on a batch of one.
            query, key, value = (x.unsqueeze(0) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif not self.batch_first:
            # (L, N, E) -> (N, L, E)
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))
        if self_attention:
            key = value = query

        batch, length, _ = query.shape
        source_length = key.shape[1]
        heads, head_dim = self.num_heads, self.head_dim
        q, k, v = self._project(query, key, value)
        q, k, v = (x.reshape(batch, -1, heads, head_dim).permute(0, 2, 1, 3) for x in (q, k, v))

        if attn_mask is None and is_causal:
            attn_mask = _causal_mask(length, source_length, q.device)
        mask = None
        if attn_mask is not None:
            mask = _additive_mask(attn_mask, q.dtype)
            if mask.dim() == 2:
                mask = mask.reshape(1, 1, length, source_length)
            else:  # (N * heads, L, S)
                mask = mask.reshape(batch, heads, length, source_length)
        if key_padding_mask is not None:
            padding = _additive_mask(key_padding_mask, q.dtype).reshape(batch, 1, 1,
                                                                        source_length)
            mask = padding if mask is None else mask + padding

        if need_weights:
            scores = (q * (1.0 / math.sqrt(head_dim))) @ k.transpose(-2, -1)
            if mask is not None:
                scores = scores + mask
            weights = scores.softmax(-1)
            output = weights @ v
            if average_attn_weights:
                weights = weights.mean(dim=1)
        else:
            output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            weights = None

        output = output.permute(0, 2, 1, 3).reshape(batch, length, self.embed_dim)
        output = self.out_proj(output)
        if not batched:
            output = output.squeeze(0)
            if weights is not None:
                weights = weights.squeeze(0)
        elif not self.batch_first:
            output = output.transpose(0, 1)
        return output, weights


def _activation_fn(name):
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {name}")


class TransformerEncoderLayer(Module):
    """torch.nn.TransformerEncoderLayer: self-attention then feed-forward, post- or pre-norm."""

    def __init__(self, d_model, nhead, dim_feedforward=2048, dropout=0.1, activation="relu",
                 layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True,
                 device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                            batch_first=batch_first, **factory)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        if isinstance(activation, str):
            activation = _activation_fn(activation)
        # A module (e.g. GELU()) becomes a child, as in PyTorch; a function stays an attribute.
        self.activation = activation

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal=False):
        x = src
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        return self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                              need_weights=False, is_causal=is_causal)[0]

    def _ff_block(self, x):
        return self.linear2(self.activation(self.linear1(x)))
