"""The text generator (models/textgen) inside an interpreter copy, as the build staged it:
its key/value-cache decoding against a full recompute and against PyTorch, one batched step of
several sequences against each sequence alone, its parameters, and whether its text is
corpus-like. Runs in a copy, not under the system Python:

    OROCHI_EXAMPLES=build/models build/bin/orochi python -m unittest -v test_textgen
"""

import collections
import gc
import json
import os
import random
import re
import unittest
from pathlib import Path

import orochi
from orochi.serving import InputError

BUILT = Path(os.environ.get("OROCHI_EXAMPLES", "../../build/models")).resolve() / "textgen"
PACKAGE = BUILT / "package"
MANIFEST = json.loads((PACKAGE / "manifest.json").read_text())
# The package's code, imported as the server does not (under its own names): this test only.
import sys  # noqa: E402
sys.path.insert(0, str(PACKAGE / "code"))
import model as textgen  # noqa: E402
import network  # noqa: E402

LOGIT_TOLERANCE = 2e-4
WORD = re.compile(r"[A-Za-z]{2,}")
# The corpus-likeness check: the share of generated words (2 letters or more) that occur in the
# corpus. The trained model must reach the first (67% when written); bytes drawn at random with
# the corpus's byte frequencies must stay below the second.
CORPUS_WORDS_TRAINED = 0.6
CORPUS_WORDS_BASELINE = 0.35


class Context:
    """What the server gives the entry class: weights mapped read-only, the manifest's config."""

    def __init__(self, weights=None):
        self.device = orochi.device("cpu")
        self.manifest = MANIFEST
        self.config = dict(MANIFEST.get("parameters", {}))
        self.weights = weights if weights is not None else orochi.load_safetensors(
            str(PACKAGE / "weights" / "textgen.safetensors"))


def generate(model, prompt, **parameters):
    """The text predict() streams, and its pieces."""
    pieces = [outputs["text_output"][0]
              for outputs in model.predict({"text_input": [prompt.encode()]}, parameters)]
    return b"".join(pieces).decode(), pieces


def corpus_words():
    training = json.loads((BUILT / "training.json").read_text())
    words = set()
    for path in training["corpus"]:
        words.update(word.lower() for word in WORD.findall(Path(path).read_text()))
    return words


def share_of_corpus_words(text, words):
    found = [word.lower() for word in WORD.findall(text)]
    return sum(word in words for word in found) / max(len(found), 1), len(found)


class TextGeneratorTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        orochi.set_grad_enabled(False)
        cls.model = textgen.TextGenerator(Context())
        cls.reference = json.loads((BUILT / "reference.json").read_text())["continuations"]

    def tearDown(self):
        gc.collect()
        self.assertEqual(self.model.cache.live, 0, "a sequence kept its cache slot")

    def test_cached_decoding_matches_a_full_recompute(self):
        for prompt in ("This program is free software", "", "Licensor"):
            state = self.model.start({"text_input": [prompt.encode()]}, {"temperature": 0,
                                                                          "max_tokens": 60})
            ids = [network.BOUNDARY, *prompt.encode()]
            worst = 0.0
            while True:
                recomputed = self.model.network(orochi.tensor([ids]))[0, -1]
                worst = max(worst, float((recomputed - state.logits).abs().max()))
                ids.append(int(state.logits.argmax()))
                (_, finished), = self.model.step([state])
                if finished:
                    break
            self.model.finish(state)
            self.assertLess(worst, LOGIT_TOLERANCE, prompt)
            self.assertGreater(len(ids), len(prompt) + 10)

    def test_logits_and_greedy_text_match_pytorch(self):
        for reference in self.reference:
            prompt = reference["prompt"]
            state = self.model.start({"text_input": [prompt.encode()]},
                                     {"temperature": 0, "max_tokens": len(reference["tokens"])})
            for step, (expected, token) in enumerate(zip(reference["logits"],
                                                         reference["tokens"])):
                difference = (state.logits - orochi.tensor(expected)).abs().max()
                self.assertLess(float(difference), LOGIT_TOLERANCE, (prompt, step))
                chosen = int(state.logits.argmax())
                if chosen != token:
                    # Only a tie within the tolerance may choose differently; the texts part
                    # there, so the comparison ends.
                    best, second = sorted(expected, reverse=True)[:2]
                    self.assertLess(best - second, 2 * LOGIT_TOLERANCE, (prompt, step))
                    break
                (_, finished), = self.model.step([state])
                if finished:  # at max_tokens, or at the end of a document
                    self.assertTrue(step == len(reference["tokens"]) - 1
                                    or token == network.BOUNDARY, (prompt, step))
                    break
            self.model.finish(state)

    def test_one_step_for_many_sequences_equals_each_alone(self):
        requests = [("This program is free software", {"temperature": 0, "max_tokens": 40}),
                    ("You may", {"temperature": 0.9, "seed": 7, "max_tokens": 70}),
                    ("", {"temperature": 1.0, "top_p": 0.8, "seed": 3, "max_tokens": 25}),
                    ("the terms of the GNU General Public License", {"temperature": 0.7,
                                                                     "seed": 11, "stop": "e"}),
                    ("Copyright", {"temperature": 0, "max_tokens": 90, "stop": ["\n\n"]}),
                    ("  2. ", {"temperature": 1.2, "seed": 5, "max_tokens": 55})]
        alone = [generate(self.model, prompt, **parameters)[1] for prompt, parameters in requests]
        # Together: the first three start at once, the others join after 4 and 9 steps, and
        # each leaves when it finishes (as the server's scheduler admits and retires them).
        pieces = [[] for _ in requests]
        live, joining, steps = {}, {0: [0, 1, 2], 4: [3], 9: [4, 5]}, 0
        while live or joining:
            for index in joining.pop(steps, []):
                prompt, parameters = requests[index]
                live[index] = self.model.start({"text_input": [prompt.encode()]}, parameters)
            order = list(live)
            for index, (outputs, finished) in zip(order, self.model.step(
                    [live[index] for index in order])):
                if outputs is not None:
                    pieces[index].append(outputs["text_output"][0])
                if finished:
                    self.model.finish(live.pop(index))
            steps += 1
        self.assertEqual(pieces, alone)
        self.assertTrue(all(alone))

    def test_sequences_in_any_slot_order(self):
        # Slots not in order and with gaps: the decode's scattered path.
        greedy = {"temperature": 0, "max_tokens": 20}
        first = [self.model.start({"text_input": [b"GNU"]}, greedy) for _ in range(4)]
        for state in first[::2]:
            self.model.finish(state)
        late = self.model.start({"text_input": [b"The Program"]}, greedy)
        states = [late, first[3], first[1]]
        self.assertNotEqual([state.slot for state in states],
                            sorted(state.slot for state in states))
        pieces = [[], [], []]
        for step in range(20):
            for row, (outputs, finished) in enumerate(self.model.step(states)):
                pieces[row].append(outputs["text_output"][0] if outputs else b"")
                self.assertEqual(finished, step == 19)
        for state in states:
            self.model.finish(state)
        self.assertEqual(b"".join(pieces[0]), generate(self.model, "The Program", temperature=0,
                                                       max_tokens=20)[0].encode())
        self.assertEqual(pieces[1], pieces[2])
        self.assertEqual(b"".join(pieces[1]), generate(self.model, "GNU", temperature=0,
                                                       max_tokens=20)[0].encode())

    def test_generated_text_is_corpus_like(self):
        words = corpus_words()
        text = ""
        for prompt in ("This program is free software", "You may", "The Licensor ", ""):
            text += generate(self.model, prompt, temperature=0, max_tokens=200)[0] + "\n"
        for seed in (1, 2, 3):
            text += generate(self.model, "The ", temperature=0.8, seed=seed,
                             max_tokens=200)[0] + "\n"
        share, count = share_of_corpus_words(text, words)
        # The baseline: as many bytes drawn from the corpus's own byte frequencies.
        corpus = b"".join(Path(path).read_bytes() for path in json.loads(
            (BUILT / "training.json").read_text())["corpus"])
        counts = collections.Counter(corpus)
        drawn = bytes(random.Random(0).choices(list(counts), list(counts.values()),
                                               k=len(text.encode())))
        baseline, baseline_count = share_of_corpus_words(drawn.decode("latin-1"), words)
        print(f"\n{share:.1%} of {count} generated words are corpus words "
              f"({baseline:.1%} of {baseline_count} for bytes drawn by their frequency):\n"
              f"{text[:600]}", file=sys.stderr)
        self.assertGreaterEqual(count, 100)
        self.assertGreaterEqual(share, CORPUS_WORDS_TRAINED)
        self.assertLess(baseline, CORPUS_WORDS_BASELINE)

    def test_parameters(self):
        text, pieces = generate(self.model, "This program is free software", temperature=0,
                                max_tokens=30)
        self.assertEqual(len(text.encode()), 30)  # the corpus is ASCII: one byte per token
        self.assertEqual(len(pieces), 30)
        # stop: generation ends before the stop string, which is not returned, even when it
        # spans pieces (what might start one is held back until it cannot).
        stop = text[10:14]
        stopped, pieces = generate(self.model, "This program is free software", temperature=0,
                                   max_tokens=30, stop=["zzz", stop])
        self.assertEqual(stopped, text[:text.find(stop)])
        # seeds: the same seed, the same text; top_p near 0 leaves only the likeliest token
        sampled = [generate(self.model, "You ", temperature=1.0, seed=seed, max_tokens=80)[0]
                   for seed in (1, 1, 2)]
        self.assertEqual(sampled[0], sampled[1])
        self.assertNotEqual(sampled[0], sampled[2])
        self.assertEqual(generate(self.model, "You ", temperature=1.5, top_p=1e-6, seed=4,
                                  max_tokens=40)[0],
                         generate(self.model, "You ", temperature=0, max_tokens=40)[0])
        # the manifest's default max_tokens, cut to what the context leaves
        self.assertEqual(len(generate(self.model, "x" * 250, temperature=0)[0].encode()), 6)

    def test_bad_requests_are_input_errors_that_say_why(self):
        cases = [({"max_tokens": 0}, "'max_tokens' must be from 1 to"),
                 ({"max_tokens": 2.5}, "'max_tokens' must be an integer"),
                 ({"temperature": -1}, "'temperature' must be from 0"),
                 ({"top_p": 0}, "'top_p' must be from 0 to 1 (not 0)"),
                 ({"stop": ""}, "'stop' must be a non-empty string"),
                 ({"stop": [1]}, "'stop' must be"),
                 ({"seed": "x"}, "'seed' must be an integer"),
                 ({"max_token": 5}, "unknown parameter(s) 'max_token'")]
        for parameters, message in cases:
            with self.subTest(parameters=parameters):
                with self.assertRaises(InputError) as raised:
                    self.model.start({"text_input": [b"GPL"]}, parameters)
                self.assertIn(message, str(raised.exception))
        with self.assertRaisesRegex(InputError, "'max_tokens' must be from 1 to 56"):
            self.model.start({"text_input": [b"x" * 200]}, {"max_tokens": 57})
        with self.assertRaisesRegex(InputError, "context holds 256 bytes"):
            self.model.start({"text_input": [b"x" * 256]}, {})
        with self.assertRaisesRegex(InputError, "must be UTF-8"):
            self.model.start({"text_input": [b"\xff"]}, {})

    def test_dropped_states_give_their_slots_back(self):
        states = [self.model.start({"text_input": [b"GPL"]}, {}) for _ in range(9)]
        self.assertEqual(self.model.cache.live, 9)
        self.assertGreaterEqual(self.model.cache.slots, 9)  # the cache grew
        self.model.finish(states[0])
        self.model.finish(states[0])  # a second finish changes nothing
        self.assertEqual(self.model.cache.live, 8)
        del states
        gc.collect()
        self.assertEqual(self.model.cache.live, 0)
        with self.assertRaisesRegex(RuntimeError, "already finished"):
            state = self.model.start({"text_input": [b"GPL"]}, {"max_tokens": 1})
            self.model.step([state])
            try:
                self.model.step([state])
            finally:
                self.model.finish(state)


if __name__ == "__main__":
    unittest.main()
