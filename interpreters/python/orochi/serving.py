"""Model packages inside an interpreter copy: isolated imports, the model context, and the
functions the host calls to load a package, run predict() and unload it.

A package's code/ is imported by its own importer: its modules never enter sys.modules, and
their `import` statements find the package's modules first (then the stdlib and orochi), so two
packages that both have a `model.py` live in one copy without seeing each other.
"""

import builtins
import gc
import importlib.util
import json
import linecache
import time
import types

import _orochi
import _orochi_engine
import orochi

__all__ = ["ModelContext", "InputError"]


class InputError(ValueError):
    """Inputs that do not match the manifest; the host answers them as a client error."""

# KServe datatype -> orochi dtype (BYTES travels as Python bytes).
_DTYPES = {
    "BOOL": orochi.bool, "UINT8": orochi.uint8, "INT8": orochi.int8, "INT16": orochi.int16,
    "INT32": orochi.int32, "INT64": orochi.int64, "FP16": orochi.float16,
    "BF16": orochi.bfloat16, "FP32": orochi.float32, "FP64": orochi.float64,
}

_loaded = {}  # model key -> _LoadedModel


class ModelContext:
    """What a model's entry class is built with, once per copy.

    Attributes:
        name, version: the manifest's.
        manifest: the manifest as a dict.
        config: per-model configuration (the manifest's `parameters`, overridden by the
            deployment's), a dict.
        weights: every tensor of the package's weights/*.safetensors by name, read-only and
            shared with every other copy (never copied), already on `device`.
        device: where the manifest places the model (orochi.device); inputs arrive there.
    """

    def __init__(self, key, manifest, config, weights, device=None):
        self._key = key
        self.device = device if device is not None else orochi.device("cpu")
        self.manifest = manifest
        self.name = manifest["name"]
        self.version = manifest["version"]
        self.config = config
        self.weights = weights

    def resource(self, path: str, encoding: str | None = None):
        """The bytes of resources/<path> in the package, or its text when `encoding` is given."""
        data = _orochi.call_host("orochi.model_resource", f"{self._key}\n{path}")
        return data if encoding is None else data.decode(encoding)

    def __repr__(self):
        return f"ModelContext({self.name!r}, version={self.version}, weights={len(self.weights)})"


class _PackageImporter:
    """Imports a package's code/ modules into a private module table."""

    def __init__(self, label: str, sources: dict):
        self.label = label
        self.sources = sources  # "pkg/mod.py" -> bytes
        self.modules = {}
        self.builtins = dict(builtins.__dict__)
        self.builtins["__import__"] = self.import_module
        self.top_level = set()
        for path in sources:
            head, _, rest = path.partition("/")
            self.top_level.add(head.removesuffix(".py") if not rest else head)

    def _locate(self, name: str):
        """(path below code/, is_package) for module `name`, or None."""
        path = name.replace(".", "/")
        if f"{path}/__init__.py" in self.sources:
            return f"{path}/__init__.py", True
        if f"{path}.py" in self.sources:
            return f"{path}.py", False
        prefix = path + "/"
        if any(source.startswith(prefix) for source in self.sources):
            return None, True  # a directory without __init__.py: a namespace package
        return None

    def load(self, name: str):
        if name in self.modules:
            return self.modules[name]
        parent, _, child = name.rpartition(".")
        if parent:
            self.load(parent)
        found = self._locate(name)
        if found is None:
            raise ModuleNotFoundError(f"No module named '{name}' in package {self.label}",
                                      name=name)
        path, is_package = found
        module = types.ModuleType(name)
        filename = f"<{self.label}>/code/{path or name.replace('.', '/') + '/'}"
        module.__file__ = filename
        module.__builtins__ = self.builtins
        module.__package__ = name if is_package else parent
        if is_package:
            module.__path__ = []
        self.modules[name] = module  # before running it, so import cycles resolve
        if path is not None:
            source = self.sources[path]
            lines = source.decode("utf-8", "replace").splitlines(True)
            linecache.cache[filename] = (len(source), None, lines, filename)  # tracebacks
            try:
                exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)
            except BaseException:
                del self.modules[name]
                raise
        if parent:
            setattr(self.modules[parent], child, module)
        return module

    def import_module(self, name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level > 0:
            package = (globals or {}).get("__package__") or ""
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            if not base:
                raise ImportError("attempted relative import with no known parent package")
            name = f"{base}.{name}" if name else base
        elif name.partition(".")[0] not in self.top_level:
            return builtins.__import__(name, globals, locals, fromlist, level)
        module = self.load(name)
        for item in fromlist or ():
            if item != "*" and not hasattr(module, item) and hasattr(module, "__path__"):
                try:
                    self.load(f"{name}.{item}")
                except ModuleNotFoundError:
                    pass  # `from pkg import attribute` that does not exist: Python says so
        if fromlist:
            return module
        if level > 0:
            return module
        return self.modules[name.partition(".")[0]]

    def release(self):
        for module in self.modules.values():
            linecache.cache.pop(module.__file__, None)
            module.__dict__.clear()
        self.modules.clear()


def _model_device(manifest):
    """The manifest's `device`, checked to exist here before any of the model's code runs."""
    name = manifest.get("device", "cpu")
    device = orochi.device(name)
    problem = _orochi_engine._device_problem(name)
    if problem:
        raise RuntimeError(f"the manifest places the model on '{name}', but {device} is not "
                           f"available: {problem}")
    return device


def _check_required_modules(manifest):
    """The modules a package declares it needs from outside itself ("requires"), checked before
    its code runs, so that a server without them says which one is missing."""
    for module in manifest.get("requires", []):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a missing parent package of a dotted name
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"the package requires the Python module '{module}', which this server does "
                "not provide: add the directory that holds it to python.site_packages in the "
                "server config (for Debian's python3-numpy, /usr/lib/python3/dist-packages)",
                name=module)


class _LoadedModel:
    def __init__(self, key, manifest, config, sources, weights):
        self.key = key
        self.manifest = manifest
        self.importer = _PackageImporter(f"package {manifest['name']}:{manifest['version']}",
                                         sources)
        _check_required_modules(manifest)
        self.device = _model_device(manifest)
        if self.device.type != "cpu":
            # Read-only weights are uploaded once per process: every copy's .to() of the same
            # tensor shares that one device copy.
            weights = {name: tensor.to(self.device) for name, tensor in weights.items()}
        module_name, _, class_path = manifest["entry"].partition(":")
        target = self.importer.load(module_name)
        for part in class_path.split("."):
            target = getattr(target, part)
        self.context = ModelContext(key, manifest, config, weights, self.device)
        self.instance = target(self.context)
        if not callable(getattr(self.instance, "predict", None)) and \
                not callable(getattr(self.instance, "step", None)):
            raise TypeError(f"{manifest['entry']} has no predict(inputs) method")
        predict = getattr(self.instance, "predict", None)
        self.takes_parameters = callable(predict) and _takes_parameters(predict)
        self.stateful = "sequence" in manifest
        if self.stateful and not (callable(predict) and _takes_argument(predict, "state")):
            raise TypeError(f"{manifest['entry']} is a stateful model (its manifest declares "
                            "\"sequence\"): its predict must take the sequence's state, as "
                            "predict(self, inputs, state)")
        self.outputs = manifest["outputs"]
        self.batched = manifest.get("max_batch_size", 0) > 0
        self.streaming = bool(manifest.get("streaming", False))
        self.step_interface = self.streaming and callable(getattr(self.instance, "step", None))
        if self.step_interface and not callable(getattr(self.instance, "start", None)):
            raise TypeError(f"{manifest['entry']} has step() but no start(inputs, parameters): "
                            "the step interface needs both")


def _takes_parameters(predict):
    """Whether predict() has a `parameters` argument (or **kwargs) for the request's parameters;
    a model that does not ask for them is called as predict(inputs), as before they existed."""
    return _takes_argument(predict, "parameters")


def _takes_argument(function, name):
    """Whether `function` takes the keyword argument `name` (or **kwargs)."""
    import inspect
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a callable without a signature: inputs only
        return False
    return any(parameter.kind is inspect.Parameter.VAR_KEYWORD or
               (parameter.name == name and
                parameter.kind is not inspect.Parameter.POSITIONAL_ONLY)
               for parameter in signature.parameters.values())


def _check_shape(kind, spec, shape, batched):
    expected = ([-1] if batched else []) + list(spec["shape"])
    if len(shape) != len(expected) or any(e != -1 and e != s for e, s in zip(expected, shape)):
        raise ValueError(f"{kind} '{spec['name']}' has shape {list(shape)}, but the manifest "
                         f"declares {expected} (-1 is any size)")


def _nested(items, shape):
    """A flat list as nested lists of `shape`."""
    if len(shape) <= 1:
        return list(items)
    step = len(items) // shape[0] if shape[0] else 0
    return [_nested(items[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _flatten_bytes(value, name):
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        return [bytes(value, "utf-8") if isinstance(value, str) else bytes(value)], []
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"output '{name}' is BYTES: return bytes, str or (nested) lists of them, "
                        f"not {type(value).__name__}")
    flat, inner = [], None
    for item in value:
        items, shape = _flatten_bytes(item, name)
        if inner is not None and shape != inner:
            raise ValueError(f"output '{name}': the nested lists are ragged")
        inner = shape
        flat.extend(items)
    return flat, [len(value)] + (inner or [])


def _output_value(spec, value, batched):
    name, datatype = spec["name"], spec["datatype"]
    if datatype == "BYTES":
        items, shape = _flatten_bytes(value, name)
        _check_shape("output", spec, shape, batched)
        return [list(shape), items]
    dtype = _DTYPES[datatype]
    if isinstance(value, orochi.Tensor):
        if value.dtype is not dtype:
            raise TypeError(f"output '{name}' is a {value.dtype!r} tensor, but the manifest "
                            f"declares {datatype}")
        tensor = value
    else:
        try:
            tensor = orochi.tensor(value, dtype=dtype)
        except (TypeError, ValueError) as error:
            raise TypeError(f"output '{name}' ({datatype}) cannot be made a tensor: {error}") \
                from None
    _check_shape("output", spec, tensor.shape, batched)
    return tensor.cpu()  # the host encodes responses from host memory


# --- called by the host ---------------------------------------------------------------------

def _load(key, manifest_json, config_json, code, weights):
    """code: [[path below code/, source bytes], ...]; weights: [[name, tensor], ...]."""
    if key in _loaded:
        raise RuntimeError(f"model {key} is already loaded in this copy")
    manifest = json.loads(manifest_json)
    config = dict(manifest.get("parameters", {}))
    config.update(json.loads(config_json))
    sources = {path: bytes(source) for path, source in code}
    model = _LoadedModel(key, manifest, config, sources, dict(weights))
    warmup = getattr(model.instance, "warmup", None)
    if callable(warmup):
        warmup()
    _loaded[key] = model
    return True


def _model(key):
    model = _loaded.get(key)
    if model is None:
        raise LookupError(f"model {key} is not loaded in this copy")
    return model


def _arguments(model, inputs):
    """predict()'s inputs dict from the host's [[name, tensor | [shape, [bytes, ...]]], ...],
    checked against the manifest (InputError for what does not match)."""
    arguments = {}
    specs = {spec["name"]: spec for spec in model.manifest["inputs"]}
    for name, value in inputs:
        spec = specs.get(name)
        if spec is None:
            raise InputError(f"unknown input '{name}' (the model takes {sorted(specs)})")
        if name in arguments:
            raise InputError(f"input '{name}' is given twice")
        if isinstance(value, orochi.Tensor):
            if spec["datatype"] == "BYTES" or value.dtype is not _DTYPES[spec["datatype"]]:
                raise InputError(f"input '{name}' is {value.dtype!r}, but the model expects "
                                 f"{spec['datatype']}")
            shape = value.shape
            arguments[name] = value if model.device.type == "cpu" else value.to(model.device)
        else:
            shape, items = value
            if spec["datatype"] != "BYTES":
                raise InputError(f"input '{name}' is BYTES, but the model expects "
                                 f"{spec['datatype']}")
            arguments[name] = _nested(items, shape)
        try:
            _check_shape("input", spec, shape, model.batched)
        except ValueError as error:
            raise InputError(str(error)) from None
    missing = sorted(set(specs) - set(arguments))
    if missing:
        raise InputError(f"missing inputs {missing}")
    return arguments


def _outputs(model, result, produced_by="predict()"):
    """The host's [[name, value], ...] of a dict of outputs, checked against the manifest."""
    if not isinstance(result, dict):
        raise TypeError(f"{produced_by} must give a dict of outputs, not {type(result).__name__}")
    declared = {spec["name"] for spec in model.outputs}
    # In the dict's order, not sorted: keys that are not strings (1, None) do not sort together.
    unknown = [key for key in result if key not in declared]
    if unknown:
        verb = "returned" if produced_by == "predict()" else "gave"
        raise ValueError(f"{produced_by} {verb} outputs {unknown} that the manifest does not "
                         f"declare (declared: {sorted(declared)})")
    outputs = []
    for spec in model.outputs:
        if spec["name"] not in result:
            raise ValueError(f"{produced_by} did not give output '{spec['name']}'")
        outputs.append([spec["name"], _output_value(spec, result[spec["name"]], model.batched)])
    return outputs


def _predict(key, inputs, parameters=(), sequence=None):
    """inputs: [[name, tensor | [shape, [bytes, ...]]], ...] -> [outputs in the same form,
    [input_ns, output_ns]]: how long making the inputs into predict()'s arguments, and its
    result into outputs, took (the host's compute_input and compute_output statistics);
    parameters: the request's [[name, value], ...], for a predict() that takes them;
    sequence: [id, start, end] for a stateful model (see _sequence_state)."""
    started = time.perf_counter_ns()
    model = _model(key)
    if model.streaming:
        raise InputError(f"model {key} is a streaming model: it answers through generate, "
                         "generate_stream or gRPC ModelStreamInfer")
    if model.stateful != (sequence is not None):
        raise InputError(f"model {key} is stateful: its requests name their sequence"
                         if model.stateful else f"model {key} is not stateful")
    try:
        arguments = _arguments(model, inputs)
        keywords = {}
        if model.takes_parameters:
            keywords["parameters"] = dict(parameters)
        if sequence is not None:
            keywords["state"] = _sequence_state(key, *sequence)
        calling = time.perf_counter_ns()
        result = model.instance.predict(arguments, **keywords)
        returned = time.perf_counter_ns()
        outputs = _outputs(model, result)
    finally:
        if sequence is not None and sequence[2]:  # sequence_end frees it, come what may
            _states.pop((key, sequence[0]), None)
    return [outputs, [calling - started, time.perf_counter_ns() - returned]]


# --- stateful models ----------------------------------------------------------------------
#
# The state of each live sequence of a stateful model is a dict kept here, in the copy that
# holds the sequence (the host sends all its requests to that copy, one at a time, in order):
# sequence_start makes a new empty one, predict() reads and changes it, sequence_end frees it.

_states = {}  # (model key, sequence id) -> dict


def _sequence_state(key, sequence_id, start, end):
    if start:
        _states[(key, sequence_id)] = {}
    state = _states.get((key, sequence_id))
    if state is None:
        raise InputError(f"sequence {sequence_id} of model {key} has no state: its "
                         "sequence_start request never ran (it was cancelled or its deadline "
                         "passed in the queue); start it again with sequence_start")
    return state


def _sequence_drop(key, sequence_ids):
    """Frees the states of sequences that expired or whose end never ran."""
    for sequence_id in sequence_ids:
        _states.pop((key, sequence_id), None)
    return True


# --- streaming models ---------------------------------------------------------------------
#
# A stream is opened once (_stream_open), then advanced by the host: one _stream_next per
# response of a generator, or one _stream_step for every live sequence of a model with the
# step interface. The host closes each stream exactly once it no longer advances it
# (_stream_close): a generator is closed (GeneratorExit at its `yield`), a sequence finished.

class _Sequence:
    """A live stream in this copy: a generator, or a step-interface sequence's state."""

    __slots__ = ("model", "generator", "state", "closed")

    def __init__(self, model, generator=None, state=None):
        self.model = model
        self.generator = generator
        self.state = state
        self.closed = False

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self.generator is not None:
            generator, self.generator = self.generator, None
            generator.close()
            return
        finish = getattr(self.model.instance, "finish", None)
        state, self.state = self.state, None
        if callable(finish):
            finish(state)


_live = {}  # (model key, stream id) -> _Sequence


def _stream_open(key, stream_id, inputs, parameters=()):
    """Starts stream `stream_id`: the step interface's start(), or predict() as a generator.
    Returns "step" or "generator"."""
    model = _model(key)
    if not model.streaming:
        raise InputError(f"model {key} is not a streaming model (its manifest has no "
                         "\"streaming\": true)")
    if (key, stream_id) in _live:
        raise RuntimeError(f"stream {stream_id} of model {key} is already open")
    arguments = _arguments(model, inputs)
    if model.step_interface:
        state = model.instance.start(arguments, dict(parameters))
        _live[(key, stream_id)] = _Sequence(model, state=state)
        return "step"
    if model.takes_parameters:
        generator = model.instance.predict(arguments, parameters=dict(parameters))
    else:
        generator = model.instance.predict(arguments)
    if not isinstance(generator, types.GeneratorType):
        close = getattr(generator, "close", None)
        if callable(close):
            close()
        raise TypeError("predict() of a streaming model must be a generator (use `yield`), "
                        f"not return {type(generator).__name__}")
    _live[(key, stream_id)] = _Sequence(model, generator=generator)
    return "generator"


def _stream_next(key, stream_id):
    """The generator's next response as outputs, or None once it has returned. A generator
    that raises, or yields what the manifest does not declare, is closed and its error raised."""
    sequence = _live.get((key, stream_id))
    if sequence is None or sequence.generator is None:
        raise LookupError(f"stream {stream_id} of model {key} is not open in this copy")
    try:
        result = next(sequence.generator)
    except StopIteration:
        _live.pop((key, stream_id), None)
        sequence.closed = True
        return None
    except BaseException:
        _live.pop((key, stream_id), None)
        sequence.closed = True
        raise
    try:
        return _outputs(sequence.model, result, "a yield of predict()")
    except BaseException:
        _live.pop((key, stream_id), None)
        sequence.close()
        raise


def _stream_step(key, stream_ids):
    """One step() for the live sequences `stream_ids` -> [[outputs or None, finished, error or
    None], ...] in the same order. A sequence that finished, or whose entry was malformed (its
    error given), is finished here. A step() that raises finishes every sequence it was given,
    then raises."""
    model = _model(key)
    sequences = []
    for stream_id in stream_ids:
        sequence = _live.get((key, stream_id))
        if sequence is None or sequence.generator is not None:
            raise LookupError(f"sequence {stream_id} of model {key} is not live in this copy")
        sequences.append(sequence)
    try:
        results = model.instance.step([sequence.state for sequence in sequences])
        if not isinstance(results, (list, tuple)) or len(results) != len(sequences):
            got = len(results) if isinstance(results, (list, tuple)) else type(results).__name__
            raise TypeError(f"step() must return a list with one (outputs, finished) entry per "
                            f"state: {len(sequences)} states, got {got}")
    except BaseException:
        for stream_id in stream_ids:
            _stream_close(key, stream_id)
        raise
    answers = []
    for stream_id, entry in zip(stream_ids, results):
        try:
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise TypeError("each entry of step()'s list must be (outputs or None, "
                                f"finished), not {entry!r:.200}")
            outputs, finished = entry
            if outputs is not None:
                outputs = _outputs(model, outputs, "step()")
            answers.append([outputs, bool(finished), None])
        except Exception as error:  # this sequence's: the others go on
            answers.append([None, True, f"{type(error).__name__}: {error}"])
            finished = True
        if finished:
            _stream_close(key, stream_id)
    return answers


def _stream_close(key, stream_id):
    """Ends stream `stream_id` if it is still open: the generator closed, or the sequence's
    finish() called. Returns whether it was open."""
    sequence = _live.pop((key, stream_id), None)
    if sequence is None:
        return False
    sequence.close()
    return True


def _unload(key):
    model = _loaded.pop(key, None)
    if model is None:
        return False
    for live_key, live_id in [live for live in _live if live[0] == key]:
        try:
            _stream_close(live_key, live_id)
        except Exception:  # noqa: S110 - the model goes regardless of one sequence's finish()
            pass
    for state_key in [state_key for state_key in _states if state_key[0] == key]:
        del _states[state_key]
    close = getattr(model.instance, "close", None)
    try:
        if callable(close):
            close()
    finally:
        model.instance = None
        model.context = None
        model.importer.release()
        gc.collect()
    return True


def _loaded_keys():
    return sorted(_loaded)
