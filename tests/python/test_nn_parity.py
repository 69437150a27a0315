"""orochi.nn against PyTorch: every fixture's module, loaded with PyTorch's state_dict, gives
PyTorch's outputs for PyTorch's inputs.

Runs inside an interpreter copy, from the repository root:

    build/bin/orochi python -m unittest discover -s tests/python -p 'test_nn*.py'

One test per fixture (fixtures/generate_fixtures.py writes them).
"""

import unittest

from nn_fixtures import ATOL, RTOL, Fixture, compare, fixture_paths


class FixtureParity(unittest.TestCase):
    """Filled in below with one test_<fixture> method per fixture file."""

    def test_fixtures_are_present(self):
        self.assertGreaterEqual(len(fixture_paths()), 50,
                                "tests/python/fixtures/*.safetensors are missing; run "
                                "tests/python/fixtures/generate_fixtures.py")

    def check_fixture(self, fixture, **call_overrides):
        module = fixture.build_loaded()
        outputs = fixture.call(module, **call_overrides)
        expected = fixture.expected_outputs()
        self.assertEqual(len(outputs), len(expected),
                         f"{fixture.name}: forward returned {len(outputs)} values, "
                         f"PyTorch {len(expected)}")
        for index, (actual, reference) in enumerate(zip(outputs, expected)):
            if reference is None:
                self.assertIsNone(actual, f"{fixture.name}: output {index} should be None")
                continue
            problem = compare(actual, reference, RTOL, ATOL)
            if problem is not None:
                self.fail(f"{fixture.name}: output {index}: {problem}")


def _parity_test(path):
    def test(self):
        self.check_fixture(Fixture(path))

    test.__doc__ = f"{path.stem} matches PyTorch"
    return test


for _path in fixture_paths():
    setattr(FixtureParity, f"test_{_path.stem}", _parity_test(_path))


class CausalHint(unittest.TestCase):
    def test_is_causal_without_a_mask_applies_the_causal_mask(self):
        # PyTorch requires the mask with is_causal; orochi builds it when it is left out.
        fixture = Fixture(next(p for p in fixture_paths() if p.stem == "transformer_gelu_causal"))
        module = fixture.build_loaded()
        (output,) = fixture.call(module, src_mask=None, is_causal=True)
        problem = compare(output, fixture.expected_outputs()[0])
        if problem is not None:
            self.fail(problem)


if __name__ == "__main__":
    unittest.main()
