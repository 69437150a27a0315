"""Parameter: marks a tensor as a module parameter, as `torch.nn.Parameter`."""

import weakref

import orochi

__all__ = ["Parameter"]


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
