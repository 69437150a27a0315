"""Module: the base class of every layer and model, as `torch.nn.Module`."""

import collections
from collections import OrderedDict
from collections.abc import Mapping

import orochi
from orochi.nn.parameter import _parameter_marks

__all__ = ["Module"]


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
