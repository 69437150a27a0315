"""orochi.nn.Module behaviour: PyTorch's state_dict keys, load_state_dict rules, repr and the
containers.

Runs inside an interpreter copy, from the repository root:

    build/bin/orochi python -m unittest discover -s tests/python -p 'test_nn*.py'

What PyTorch itself reports for each fixture module (state_dict keys, named_parameters,
named_buffers, repr) is stored in the fixture metadata by fixtures/generate_fixtures.py.
"""

import unittest
from collections import OrderedDict

import orochi
import orochi.nn as nn
import orochi.nn.functional as F

from nn_fixtures import Fixture, compare, fixture_paths


def fixture(name):
    return Fixture(next(path for path in fixture_paths() if path.stem == name))


class MatchesPyTorch(unittest.TestCase):
    """Module structure against what PyTorch reported for the same constructor call."""

    def each_fixture(self):
        for path in fixture_paths():
            case = Fixture(path)
            with self.subTest(case.name):
                yield case, case.build()

    def test_state_dict_keys(self):
        for case, module in self.each_fixture():
            self.assertEqual(list(module.state_dict()), case.description["state_dict_keys"])

    def test_named_parameters_and_buffers(self):
        for case, module in self.each_fixture():
            self.assertEqual([name for name, _ in module.named_parameters()],
                             case.description["named_parameters"])
            self.assertEqual([name for name, _ in module.named_buffers()],
                             case.description["named_buffers"])

    def test_repr(self):
        for case, module in self.each_fixture():
            self.assertEqual(repr(module), case.description["repr"])

    def test_state_dict_shapes_match_the_checkpoint(self):
        for case, module in self.each_fixture():
            state = case.state_dict()
            for key, tensor in module.state_dict().items():
                self.assertEqual(tuple(tensor.shape), tuple(state[key].shape), key)
                self.assertEqual(tensor.dtype, state[key].dtype, key)


class LoadStateDict(unittest.TestCase):
    def test_strict_error_lists_missing_unexpected_and_mis_shaped_keys(self):
        model = nn.Linear(4, 3)
        weight = model.weight
        with self.assertRaises(RuntimeError) as caught:
            model.load_state_dict({"weight": orochi.zeros(3, 5), "extra": orochi.zeros(1)})
        self.assertEqual(
            str(caught.exception),
            'Error(s) in loading state_dict for Linear:\n'
            '\tMissing key(s) in state_dict: "bias". \n'
            '\tUnexpected key(s) in state_dict: "extra". \n'
            '\tsize mismatch for weight: copying a param with shape [3, 5] from checkpoint, '
            'the shape in current model is [3, 4].')
        self.assertIs(model.weight, weight, "a failed load must not bind anything")

    def test_nested_keys_are_named_with_their_dotted_path(self):
        model = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
        state = model.state_dict()
        del state["2.bias"]
        state["1.weight"] = orochi.zeros(1)
        with self.assertRaises(RuntimeError) as caught:
            model.load_state_dict(state)
        message = str(caught.exception)
        self.assertIn("for Sequential:", message)
        self.assertIn('Missing key(s) in state_dict: "2.bias".', message)
        self.assertIn('Unexpected key(s) in state_dict: "1.weight".', message)

    def test_non_strict_returns_missing_and_unexpected_keys(self):
        model = nn.Linear(4, 3)
        weight = orochi.ones(3, 4)
        result = model.load_state_dict({"weight": weight, "extra": orochi.zeros(1)},
                                       strict=False)
        self.assertEqual(result.missing_keys, ["bias"])
        self.assertEqual(result.unexpected_keys, ["extra"])
        self.assertEqual(tuple(result), (["bias"], ["extra"]))
        self.assertIs(model.weight, weight)

    def test_non_strict_still_refuses_mis_shaped_tensors(self):
        model = nn.Linear(4, 3)
        with self.assertRaisesRegex(RuntimeError, "size mismatch for bias: .* shape \\[2\\] "
                                                  "from checkpoint, .* model is \\[3\\]"):
            model.load_state_dict({"bias": orochi.zeros(2)}, strict=False)

    def test_full_match_reports_success(self):
        model = nn.Linear(2, 2)
        result = model.load_state_dict(nn.Linear(2, 2).state_dict())
        self.assertEqual(repr(result), "<All keys matched successfully>")
        self.assertEqual((result.missing_keys, result.unexpected_keys), ([], []))

    def test_loaded_read_only_weights_are_shared_not_copied(self):
        case = fixture("linear")
        state = case.state_dict()
        model = case.build()
        model.load_state_dict(state)
        self.assertIs(model.weight, state["weight"])
        self.assertIs(model.bias, state["bias"])
        self.assertTrue(model.weight.is_read_only)
        self.assertIs(model.state_dict()["weight"], state["weight"])
        self.assertIsInstance(model.weight, nn.Parameter)
        self.assertEqual([id(p) for p in model.parameters()],
                         [id(state["weight"]), id(state["bias"])])

    def test_other_dtypes_are_converted_to_the_module_dtype(self):
        model = nn.Linear(2, 2)
        weight = orochi.ones(2, 2, dtype=orochi.float64)
        model.load_state_dict({"weight": weight, "bias": orochi.zeros(2)})
        self.assertEqual(model.weight.dtype, orochi.float32)
        self.assertEqual(model.weight.tolist(), [[1.0, 1.0], [1.0, 1.0]])

    def test_assign_binds_tensors_as_they_are(self):
        model = nn.Linear(2, 2)
        weight = orochi.ones(2, 2, dtype=orochi.float64)
        model.load_state_dict({"weight": weight, "bias": orochi.zeros(2)}, assign=True)
        self.assertIs(model.weight, weight)

    def test_batch_norm_accepts_a_checkpoint_without_num_batches_tracked(self):
        # As PyTorch does for state dicts without version metadata.
        model = nn.BatchNorm2d(3)
        state = model.state_dict()
        del state["num_batches_tracked"]
        self.assertEqual(model.load_state_dict(state), ([], []))
        self.assertEqual(model.num_batches_tracked.dtype, orochi.int64)

    def test_non_persistent_buffers_are_not_expected(self):
        model = nn.Module()
        model.register_buffer("cache", orochi.zeros(2), persistent=False)
        self.assertEqual(list(model.state_dict()), [])
        self.assertEqual([name for name, _ in model.named_buffers()], ["cache"])
        result = model.load_state_dict({"cache": orochi.zeros(2)}, strict=False)
        self.assertEqual(result.unexpected_keys, ["cache"])


class Registration(unittest.TestCase):
    def test_parameters_buffers_and_plain_tensors(self):
        class Scaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.gain = nn.Parameter(orochi.ones(3))
                self.plain = orochi.zeros(3)  # a plain attribute, as in PyTorch
                self.register_buffer("offset", orochi.zeros(3))
                self.register_parameter("shift", None)
                self.inner = nn.Linear(3, 3)

            def forward(self, x):
                return self.inner(x) * self.gain + self.offset

        model = Scaled()
        self.assertEqual(list(model.state_dict()),
                         ["gain", "offset", "inner.weight", "inner.bias"])
        self.assertEqual([name for name, _ in model.named_parameters()],
                         ["gain", "inner.weight", "inner.bias"])
        self.assertEqual([name for name, _ in model.named_parameters(recurse=False)], ["gain"])
        self.assertEqual([name for name, _ in model.named_parameters(prefix="m")],
                         ["m.gain", "m.inner.weight", "m.inner.bias"])
        self.assertIsNone(model.shift)
        self.assertIsInstance(model.gain, nn.Parameter)
        self.assertNotIsInstance(model.plain, nn.Parameter)
        self.assertEqual([name for name, _ in model.named_children()], ["inner"])
        self.assertEqual([name for name, _ in model.named_modules()], ["", "inner"])
        self.assertEqual(len(list(model.parameters())), 3)
        self.assertEqual(len(list(model.buffers())), 1)
        self.assertEqual(tuple(model(orochi.ones(2, 3)).shape), (2, 3))

    def test_tied_parameters_are_listed_once_and_saved_under_both_keys(self):
        model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
        model[1].weight = model[0].weight
        self.assertEqual([name for name, _ in model.named_parameters()], ["0.weight"])
        self.assertEqual(list(model.state_dict()), ["0.weight", "1.weight"])
        self.assertIs(model.state_dict()["1.weight"], model[0].weight)

    def test_tied_parameters_stay_tied_when_loaded(self):
        model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
        model[1].weight = model[0].weight
        weight = orochi.ones(5, 3)
        result = model.load_state_dict({"0.weight": weight}, strict=False)
        self.assertEqual(result.missing_keys, ["1.weight"])
        self.assertIs(model[0].weight, weight)
        self.assertIs(model[1].weight, weight)
        first, last = orochi.zeros(5, 3), orochi.ones(5, 3)
        model.load_state_dict({"0.weight": first, "1.weight": last})
        self.assertIs(model[0].weight, last)  # the last key wins, as with PyTorch's copies
        self.assertIs(model[1].weight, last)

    def test_registration_errors(self):
        model = nn.Linear(2, 2)
        with self.assertRaises(KeyError):
            model.register_buffer("in_features", orochi.zeros(1))  # an attribute already
        with self.assertRaises(KeyError):
            model.register_parameter("a.b", None)
        with self.assertRaises(TypeError):
            model.register_buffer("b", [1, 2])
        with self.assertRaisesRegex(TypeError, "cannot assign 'int' as parameter 'bias'"):
            model.bias = 5
        with self.assertRaisesRegex(AttributeError, "'Linear' object has no attribute 'nope'"):
            model.nope

    def test_assigning_before_init_is_an_error(self):
        class Broken(nn.Module):
            def __init__(self):
                self.layer = nn.Linear(2, 2)

        with self.assertRaisesRegex(AttributeError, "before Module.__init__"):
            Broken()

    def test_delattr_unregisters(self):
        model = nn.Linear(2, 2)
        del model.bias
        self.assertEqual(list(model.state_dict()), ["weight"])

    def test_apply_visits_children_first(self):
        model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
        seen = []
        self.assertIs(model.apply(lambda m: seen.append(type(m).__name__)), model)
        self.assertEqual(seen, ["Linear", "ReLU", "Sequential", "Sequential"])

    def test_get_submodule(self):
        model = nn.Sequential(OrderedDict([("block", nn.Sequential(nn.Linear(2, 2)))]))
        self.assertIs(model.get_submodule("block.0"), model.block[0])
        with self.assertRaises(AttributeError):
            model.get_submodule("block.7")


class Modes(unittest.TestCase):
    def test_always_in_eval_mode(self):
        model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
        self.assertFalse(model.training)
        self.assertIs(model.eval(), model)
        self.assertIs(model.train(False), model)
        self.assertFalse(model[1].training)
        with self.assertRaisesRegex(NotImplementedError, "inference-only"):
            model.train()
        with self.assertRaises(NotImplementedError):
            model.train(True)
        self.assertIs(model.requires_grad_(False), model)
        self.assertIsNone(model.zero_grad())

    def test_no_grad_as_context_manager_and_decorator(self):
        model = nn.Linear(3, 2)
        x = orochi.ones(1, 3)
        with orochi.no_grad():
            inside = model(x)

        @orochi.no_grad()
        def predict(inputs):
            return model(inputs)

        self.assertEqual(predict(x).tolist(), inside.tolist())

    def test_to_and_half_convert_floating_point_state_only(self):
        model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
        self.assertIs(model.half(), model)
        self.assertEqual(model[0].weight.dtype, orochi.float16)
        self.assertEqual(model[1].running_var.dtype, orochi.float16)
        self.assertEqual(model[1].num_batches_tracked.dtype, orochi.int64)
        self.assertIs(model.to(orochi.float32), model)
        self.assertEqual(model[0].weight.dtype, orochi.float32)
        model.to("cpu")
        self.assertEqual(str(model[0].weight.device), "cpu")
        self.assertIs(model.float(), model)


class Containers(unittest.TestCase):
    def test_sequential(self):
        first, act, last = nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)
        model = nn.Sequential(first, act, last)
        self.assertEqual(len(model), 3)
        self.assertIs(model[0], first)
        self.assertIs(model[-1], last)
        self.assertEqual(list(model), [first, act, last])
        head = model[:2]
        self.assertIsInstance(head, nn.Sequential)
        self.assertEqual(list(head), [first, act])
        self.assertEqual(list(head.state_dict()), ["0.weight", "0.bias"])
        with self.assertRaises(IndexError):
            model[3]
        x = orochi.ones(4, 2)
        self.assertEqual(model(x).tolist(), last(act(first(x))).tolist())
        model.append(nn.Sigmoid())
        self.assertEqual(len(model), 4)
        del model[1]
        self.assertEqual([name for name, _ in model.named_children()], ["0", "1", "2"])
        self.assertIs(model[1], last)

    def test_sequential_from_ordered_dict(self):
        model = nn.Sequential(OrderedDict([("fc", nn.Linear(2, 2)), ("act", nn.Tanh())]))
        self.assertEqual(list(model.state_dict()), ["fc.weight", "fc.bias"])
        self.assertIsInstance(model.act, nn.Tanh)
        self.assertIs(model[1], model.act)
        self.assertEqual(list(model[1:]._modules), ["act"])

    def test_module_list(self):
        layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 3)])
        layers.append(nn.Linear(3, 1))
        layers.extend([nn.ReLU()])
        layers.insert(0, nn.Identity())
        self.assertEqual(len(layers), 5)
        self.assertIsInstance(layers[0], nn.Identity)
        self.assertIsInstance(layers[-1], nn.ReLU)
        self.assertEqual([type(m).__name__ for m in layers[1:3]], ["Linear", "Linear"])
        self.assertEqual(list(layers.state_dict()),
                         ["1.weight", "1.bias", "2.weight", "2.bias", "3.weight", "3.bias"])
        del layers[0]
        self.assertEqual(list(layers.state_dict())[0], "0.weight")
        layers[3] = nn.GELU()
        self.assertIsInstance(layers[3], nn.GELU)

    def test_module_list_repr_folds_repeated_modules_like_pytorch_2(self):
        layers = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU()])
        self.assertEqual(repr(layers),
                         "ModuleList(\n"
                         "  (0-2): 3 x Linear(in_features=2, out_features=2, bias=True)\n"
                         "  (3): ReLU()\n"
                         ")")
        self.assertEqual(repr(nn.ModuleList()), "ModuleList()")

    def test_module_dict(self):
        heads = nn.ModuleDict({"a": nn.Linear(2, 2), "b": nn.Linear(2, 1)})
        heads["c"] = nn.ReLU()
        heads.update([("d", nn.Tanh())])
        self.assertEqual(list(heads), ["a", "b", "c", "d"])
        self.assertEqual(list(heads.keys()), ["a", "b", "c", "d"])
        self.assertIn("a", heads)
        self.assertEqual(len(heads), 4)
        self.assertIsInstance(heads.pop("d"), nn.Tanh)
        self.assertEqual(list(heads.state_dict()), ["a.weight", "a.bias", "b.weight", "b.bias"])
        self.assertIs(heads.b, heads["b"])


class ModelCode(unittest.TestCase):
    def test_parameter_created_in_model_code_loads_pytorch_weights(self):
        # The usual pattern: a custom module whose parameter is made with nn.Parameter.
        class Scale(nn.Module):
            def __init__(self, size):
                super().__init__()
                self.weight = nn.Parameter(orochi.ones(size))

            def forward(self, x):
                return x * self.weight

        model = Scale(4)
        weight = orochi.tensor([1.0, 2.0, 3.0, 4.0])
        model.load_state_dict({"weight": weight})
        self.assertEqual(model(orochi.ones(4)).tolist(), [1.0, 2.0, 3.0, 4.0])

    def test_functional_and_module_agree(self):
        case = fixture("gelu_tanh")
        x = case.inputs()["x"]
        problem = compare(F.gelu(x, approximate="tanh"), case.expected_outputs()[0])
        if problem is not None:
            self.fail(problem)


if __name__ == "__main__":
    unittest.main()
